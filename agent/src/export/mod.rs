//! What leaves the agent: metric families, the exposition, HTTP, JSON lines.

pub mod exposition;
pub mod http;
pub mod jsonl;
pub mod metrics;
pub mod registry;
