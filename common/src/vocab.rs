//! RDMA vocabulary shared by the agent and rdma-probe: QP states and types as
//! the kernel numbers them, errno names, RDMA CM event names, GIDs. One definition
//! each; the metric label values of the agent come from here.
//!
//! Plain `core` code: it builds for the eBPF target with the rest of the crate.

pub mod cm_event;
mod errno;
mod gid;
mod qp;

pub use cm_event::{cm_event_name, CmEventKind};
pub use errno::{errno_label, errno_name};
pub use gid::Gid;
pub use qp::{QpState, QpType};
