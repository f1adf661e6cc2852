//! From ring-buffer records to observations: decoding, the QP state machine
//! and its peers, the CM correlator, and the pipeline that drives them.

pub mod cgroups;
pub mod cm;
pub mod events;
pub mod peers;
pub mod pipeline;
pub mod qp;
pub mod qp_errors;
