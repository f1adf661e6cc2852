//! qpwatch: eBPF observability for the RDMA queue pair lifecycle.
//!
//! The layers, in the order an event travels:
//! - [`kernel`]: the kernel side — BTF and the offsets read from it, the hook
//!   table, loading and attaching the eBPF programs, RDMA netlink.
//! - [`model`]: decoding ring-buffer records into events and the QP and CM
//!   state machines that turn them into observations.
//! - [`export`]: metric families, the Prometheus exposition, HTTP, JSON lines.
//! - [`synthetic`]: the agent's own RDMA probes and their cross-check against
//!   what the hooks saw.
//! - [`service`]: configuration, the daemon loop, systemd, install, logging.
//!
//! The binary is a thin wrapper over [`service::daemon::run`].

pub mod export;
pub mod file_id;
pub mod kernel;
pub mod model;
pub mod service;
pub mod synthetic;
