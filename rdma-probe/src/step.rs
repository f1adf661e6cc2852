//! The steps of a probe. Below the error type: errors name the step they
//! happened in.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// The steps of a probe, in order. `ping` and `disconnect` follow the
/// connection setup (`addr_resolve` … `established`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// rdma_resolve_addr → RDMA_CM_EVENT_ADDR_RESOLVED
    AddrResolve,
    /// rdma_resolve_route → RDMA_CM_EVENT_ROUTE_RESOLVED
    RouteResolve,
    /// PD, CQ, ibv_create_qp, RESET→INIT, MR registration, receives posted
    QpCreate,
    /// rdma_connect → RDMA_CM_EVENT_CONNECT_RESPONSE (the responder's REP)
    Connect,
    /// INIT→RTR→RTS and rdma_establish (RTU sent)
    Established,
    /// one SEND and its echo
    Ping,
    /// QP→ERR, rdma_disconnect → RDMA_CM_EVENT_DISCONNECTED
    Disconnect,
}

impl Step {
    pub const ALL: [Step; 7] = [
        Step::AddrResolve,
        Step::RouteResolve,
        Step::QpCreate,
        Step::Connect,
        Step::Established,
        Step::Ping,
        Step::Disconnect,
    ];

    /// The connection-setup steps whose latencies make up `setup`.
    pub const SETUP: [Step; 5] = [
        Step::AddrResolve,
        Step::RouteResolve,
        Step::QpCreate,
        Step::Connect,
        Step::Established,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Step::AddrResolve => "addr_resolve",
            Step::RouteResolve => "route_resolve",
            Step::QpCreate => "qp_create",
            Step::Connect => "connect",
            Step::Established => "established",
            Step::Ping => "ping",
            Step::Disconnect => "disconnect",
        }
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Step {
    type Err = UnknownStep;

    fn from_str(s: &str) -> Result<Step, UnknownStep> {
        Step::ALL
            .into_iter()
            .find(|step| step.as_str() == s)
            .ok_or_else(|| UnknownStep(s.to_owned()))
    }
}

/// A name that is none of [`Step::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown step {0:?}; one of {list}", list = Step::ALL.map(Step::as_str).join(", "))]
pub struct UnknownStep(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_round_trip() {
        for step in Step::ALL {
            assert_eq!(step.as_str().parse::<Step>().unwrap(), step);
            assert_eq!(serde_json::to_value(step).unwrap(), step.as_str());
        }
        assert!("bogus"
            .parse::<Step>()
            .unwrap_err()
            .to_string()
            .contains("addr_resolve"));
    }
}
