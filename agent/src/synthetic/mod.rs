//! The agent's own RDMA probes, and their cross-check against the hooks.

pub mod crosscheck;
pub mod discovery;
pub mod mesh;
pub mod prober;
