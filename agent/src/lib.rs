//! qpwatch: eBPF observability for the RDMA queue pair lifecycle.
//!
//! The binary is a thin wrapper over [`daemon::run`]; the modules below are
//! split by concern so that the pure ones (BTF, decoding, correlation,
//! metrics) are testable on any host.

pub mod btf;
pub mod cm;
pub mod config;
pub mod correlator;
pub mod daemon;
pub mod events;
pub mod exposition;
pub mod http;
pub mod ib_cm_counters;
pub mod install;
pub mod jsonl;
pub mod logging;
pub mod metrics;
pub mod offsets;
pub mod pipeline;
pub mod probes;
pub mod probing;
pub mod rdma;
pub mod systemd;
pub mod tracer;
