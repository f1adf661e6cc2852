//! qpwatch's synthetic RDMA probes: a real data path over rdma_cm whose QPs are
//! ground truth for the eBPF tracing.
//!
//! - [`probe_once`]: resolve → route → QP → connect → N ping-pongs →
//!   disconnect → destroy, each step timed and bounded by a timeout.
//! - [`PersistentProbe`]: one connection kept up, rounds of ping-pongs.
//! - [`run_probes`] / [`probe_summary`]: the probe loop, one-shot or
//!   persistent, paced and ended by a [`ProbeDriver`].
//! - [`Responder`]: accepts connections and echoes every message.
//! - [`ProbeSummary`] / [`LatencySummary`]: statistics over outcomes.
//! - [`mesh`]: the UD probe mesh (one UD QP per device probes all targets, answers all peers).
//! - [`Churn`]: QP lifecycle churn on plain verbs (the `qp-churn` load generator).

mod churn;
mod error;
mod guard;
pub mod mesh;
mod outcome;
mod requester;
mod responder;
mod run;
mod ser;
mod stats;
mod step;
mod summary;
mod target;
mod time;
mod verbs;

pub use churn::{
    Churn, ChurnConfig, ChurnControl, ChurnCounts, ChurnLatencies, ChurnReport, Finished,
};
pub use error::{Errno, Error};
pub use guard::{
    canonical_ip, check_probe, gid_source, malformed_payload, AllowList, MalformedProbe, Rate,
    RateLimiter, SourceCounts, Subnet, MALFORMED_KINDS,
};
pub use outcome::{ProbeMode, ProbeOutcome, ProbeResult, QpCall, QpCallKind};
pub use qpwatch_common::vocab::{CmEventKind, QpState};
pub use requester::{
    probe_once, PersistentProbe, PollMode, ProbeConfig, MAX_MESSAGE_SIZE, MESSAGE_HEADER,
};
pub use responder::{
    Responder, ResponderConfig, ResponderHandle, ResponderStats, ResponderStopper,
};
pub use run::{probe_summary, run_probes, ProbeDriver};
pub use stats::{nearest_rank, LatencySummary};
pub use step::{Step, UnknownStep};
pub use summary::ProbeSummary;
pub use target::{parse_endpoint, parse_target, DEFAULT_PORT};
pub use time::{monotonic_ns, Deadline};

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    /// The agent keeps these across threads / async tasks.
    #[test]
    fn handles_are_send() {
        assert_send::<PersistentProbe>();
        assert_send::<Responder>();
        assert_send::<ResponderHandle>();
        assert_send::<ResponderStopper>();
        assert_send::<ProbeOutcome>();
        assert_send::<Error>();
    }
}
