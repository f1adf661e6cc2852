//! The kernel side: BTF, offsets, the hooks and their policy, the tracer that
//! attaches them, and RDMA netlink.

pub mod btf;
pub mod cgroup;
pub mod hooks;
pub mod offsets;
pub mod rdma;
pub mod tracer;
