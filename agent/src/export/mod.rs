//! What leaves the agent: metric families, the exposition, HTTP, JSON lines.

pub mod exposition;
pub mod http;
pub mod ib_cm_counters;
pub mod jsonl;
pub mod metrics;
