//! What a probe reports: the closed set of results, the steps, the per-call
//! QP timings and the outcome record.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

use rdma_sys::rdma_cm_event_type as ev;
use serde::Serialize;

use crate::error::Error;
use crate::ser;

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
    type Err = Error;

    fn from_str(s: &str) -> Result<Step, Error> {
        Step::ALL
            .into_iter()
            .find(|step| step.as_str() == s)
            .ok_or_else(|| {
                Error::InvalidConfig(format!(
                    "unknown step {s:?}; one of {}",
                    Step::ALL.map(Step::as_str).join(", ")
                ))
            })
    }
}

/// A probe's result, from a closed set (usable as a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeResult {
    Ok,
    /// A step got no answer in time; the outcome's `failed_step` names it.
    Timeout,
    /// RDMA_CM_EVENT_REJECTED: the peer (or its CM, e.g. no listener) refused.
    Rejected,
    /// RDMA_CM_EVENT_UNREACHABLE: the CM got no reply to its REQ.
    Unreachable,
    /// RDMA_CM_EVENT_ADDR_ERROR or a failed rdma_resolve_addr.
    AddrError,
    /// RDMA_CM_EVENT_ROUTE_ERROR or a failed rdma_resolve_route.
    RouteError,
    /// RDMA_CM_EVENT_CONNECT_ERROR or a failed rdma_connect.
    ConnectError,
    /// Anything else: a failed verbs call, a failed completion, the peer
    /// disconnecting mid-probe, an injected failure.
    Error,
}

impl ProbeResult {
    pub const ALL: [ProbeResult; 8] = [
        ProbeResult::Ok,
        ProbeResult::Timeout,
        ProbeResult::Rejected,
        ProbeResult::Unreachable,
        ProbeResult::AddrError,
        ProbeResult::RouteError,
        ProbeResult::ConnectError,
        ProbeResult::Error,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ProbeResult::Ok => "ok",
            ProbeResult::Timeout => "timeout",
            ProbeResult::Rejected => "rejected",
            ProbeResult::Unreachable => "unreachable",
            ProbeResult::AddrError => "addr_error",
            ProbeResult::RouteError => "route_error",
            ProbeResult::ConnectError => "connect_error",
            ProbeResult::Error => "error",
        }
    }

    /// The result a failed probe reports for `err`.
    pub fn of_error(err: &Error) -> ProbeResult {
        match err {
            Error::Timeout { .. } => ProbeResult::Timeout,
            Error::CmEvent { got, .. } => match got {
                CmEventKind::Rejected => ProbeResult::Rejected,
                CmEventKind::Unreachable => ProbeResult::Unreachable,
                CmEventKind::AddrError => ProbeResult::AddrError,
                CmEventKind::RouteError => ProbeResult::RouteError,
                CmEventKind::ConnectError => ProbeResult::ConnectError,
                _ => ProbeResult::Error,
            },
            Error::Cm { call, .. } => match *call {
                "rdma_resolve_addr" => ProbeResult::AddrError,
                "rdma_resolve_route" => ProbeResult::RouteError,
                "rdma_connect" => ProbeResult::ConnectError,
                _ => ProbeResult::Error,
            },
            Error::DeviceMismatch { .. } => ProbeResult::AddrError,
            _ => ProbeResult::Error,
        }
    }
}

impl fmt::Display for ProbeResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `enum rdma_cm_event_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmEventKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ConnectRequest,
    ConnectResponse,
    ConnectError,
    Unreachable,
    Rejected,
    Established,
    Disconnected,
    DeviceRemoval,
    MulticastJoin,
    MulticastError,
    AddrChange,
    TimewaitExit,
    Other(u32),
}

impl CmEventKind {
    pub fn from_raw(raw: u32) -> CmEventKind {
        match raw {
            ev::RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            ev::RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            ev::RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            ev::RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            ev::RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            ev::RDMA_CM_EVENT_CONNECT_RESPONSE => CmEventKind::ConnectResponse,
            ev::RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            ev::RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            ev::RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            ev::RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            ev::RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            ev::RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            ev::RDMA_CM_EVENT_MULTICAST_JOIN => CmEventKind::MulticastJoin,
            ev::RDMA_CM_EVENT_MULTICAST_ERROR => CmEventKind::MulticastError,
            ev::RDMA_CM_EVENT_ADDR_CHANGE => CmEventKind::AddrChange,
            ev::RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }

    /// The name `rdma_event_str` gives.
    pub fn name(self) -> &'static str {
        match self {
            CmEventKind::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventKind::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventKind::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventKind::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventKind::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventKind::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventKind::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventKind::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventKind::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventKind::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventKind::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventKind::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventKind::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventKind::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventKind::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventKind::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            CmEventKind::Other(_) => "RDMA_CM_EVENT_UNKNOWN",
        }
    }
}

impl fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmEventKind::Other(raw) => write!(f, "RDMA_CM_EVENT {raw}"),
            kind => f.write_str(kind.name()),
        }
    }
}

/// `enum ibv_qp_state`, named as the agent's metrics name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum QpState {
    Reset,
    Init,
    Rtr,
    Rts,
    Sqd,
    Sqe,
    Err,
}

impl QpState {
    pub fn raw(self) -> u32 {
        use rdma_sys::ibv_qp_state as s;
        match self {
            QpState::Reset => s::IBV_QPS_RESET,
            QpState::Init => s::IBV_QPS_INIT,
            QpState::Rtr => s::IBV_QPS_RTR,
            QpState::Rts => s::IBV_QPS_RTS,
            QpState::Sqd => s::IBV_QPS_SQD,
            QpState::Sqe => s::IBV_QPS_SQE,
            QpState::Err => s::IBV_QPS_ERR,
        }
    }
}

/// Which QP verb a [`QpCall`] timed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QpCallKind {
    /// ibv_create_qp (kernel: ib_create_qp_user)
    Create,
    /// ibv_modify_qp with IBV_QP_STATE (kernel: _ib_modify_qp)
    Modify,
    /// ibv_destroy_qp (kernel: ib_destroy_qp_user)
    Destroy,
}

/// One userspace QP verb call, timed on CLOCK_MONOTONIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QpCall {
    pub kind: QpCallKind,
    /// The state a modify moves the QP to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target_state: Option<QpState>,
    /// CLOCK_MONOTONIC at the call, comparable with `bpf_ktime_get_ns`.
    pub start_ns: u64,
    #[serde(rename = "duration_ns", serialize_with = "ser::duration_ns")]
    pub duration: Duration,
    /// 0, or the errno the call failed with.
    pub rc: i32,
}

/// Whether the probe set up its own connection or used a standing one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProbeMode {
    OneShot,
    Persistent,
}

/// Everything one probe measured.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeOutcome {
    pub target: SocketAddr,
    pub mode: ProbeMode,
    pub result: ProbeResult,
    /// The step that failed (for every result but `ok`).
    pub failed_step: Option<Step>,
    /// The error, as text.
    pub error: Option<String>,
    /// errno behind the failure, when there is one.
    pub errno: Option<i32>,
    /// Status of the rdma_cm event that failed the probe (REJECTED: the CM
    /// reject reason; ADDR_ERROR etc.: a negative errno).
    pub cm_event_status: Option<i32>,
    /// Local RDMA device and port the address resolved to.
    pub device: Option<String>,
    pub port_num: Option<u8>,
    pub source: Option<SocketAddr>,
    pub qp_num: Option<u32>,
    pub remote_qp_num: Option<u32>,
    /// Persistent mode: the connection was already up, no setup was done.
    pub reused_connection: bool,
    /// CLOCK_MONOTONIC at the start of the probe.
    pub start_ns: u64,
    /// Latency of each step that completed.
    #[serde(serialize_with = "ser::duration_map_ns")]
    pub steps: BTreeMap<Step, Duration>,
    /// From the start to the QP in RTS with the connection established.
    #[serde(rename = "setup_ns", serialize_with = "ser::opt_duration_ns")]
    pub setup: Option<Duration>,
    /// Round-trip time of each completed ping.
    #[serde(rename = "rtts_ns", serialize_with = "ser::durations_ns")]
    pub rtts: Vec<Duration>,
    /// The probe's own QP verb calls, by QP number.
    pub qp_calls: BTreeMap<u32, Vec<QpCall>>,
}

impl ProbeOutcome {
    pub(crate) fn new(target: SocketAddr, mode: ProbeMode, start_ns: u64) -> ProbeOutcome {
        ProbeOutcome {
            target,
            mode,
            result: ProbeResult::Ok,
            failed_step: None,
            error: None,
            errno: None,
            cm_event_status: None,
            device: None,
            port_num: None,
            source: None,
            qp_num: None,
            remote_qp_num: None,
            reused_connection: false,
            start_ns,
            steps: BTreeMap::new(),
            setup: None,
            rtts: Vec::new(),
            qp_calls: BTreeMap::new(),
        }
    }

    pub fn is_ok(&self) -> bool {
        self.result == ProbeResult::Ok
    }

    /// Records the failure `err` during `step`.
    pub(crate) fn fail(&mut self, step: Step, err: &Error) {
        self.result = ProbeResult::of_error(err);
        self.failed_step = Some(step);
        self.error = Some(err.to_string());
        self.errno = err.errno();
        if let Error::CmEvent { status, .. } = err {
            self.cm_event_status = Some(*status);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm_event(got: CmEventKind, status: i32) -> Error {
        Error::CmEvent {
            step: Step::Connect,
            expected: CmEventKind::ConnectResponse,
            got,
            status,
        }
    }

    #[test]
    fn cm_events_map_to_results() {
        let cases = [
            (CmEventKind::Rejected, ProbeResult::Rejected),
            (CmEventKind::Unreachable, ProbeResult::Unreachable),
            (CmEventKind::AddrError, ProbeResult::AddrError),
            (CmEventKind::RouteError, ProbeResult::RouteError),
            (CmEventKind::ConnectError, ProbeResult::ConnectError),
            (CmEventKind::Disconnected, ProbeResult::Error),
            (CmEventKind::DeviceRemoval, ProbeResult::Error),
            (CmEventKind::Established, ProbeResult::Error),
            (CmEventKind::Other(99), ProbeResult::Error),
        ];
        for (kind, expected) in cases {
            assert_eq!(
                ProbeResult::of_error(&cm_event(kind, -110)),
                expected,
                "{kind}"
            );
        }
    }

    #[test]
    fn other_errors_map_to_results() {
        let timeout = Error::Timeout {
            step: Step::RouteResolve,
            timeout: Duration::from_secs(1),
        };
        assert_eq!(ProbeResult::of_error(&timeout), ProbeResult::Timeout);
        let sync = |call| Error::Cm {
            call,
            errno: crate::error::Errno(libc::ENETUNREACH),
        };
        assert_eq!(
            ProbeResult::of_error(&sync("rdma_resolve_addr")),
            ProbeResult::AddrError
        );
        assert_eq!(
            ProbeResult::of_error(&sync("rdma_resolve_route")),
            ProbeResult::RouteError
        );
        assert_eq!(
            ProbeResult::of_error(&sync("rdma_connect")),
            ProbeResult::ConnectError
        );
        assert_eq!(
            ProbeResult::of_error(&sync("rdma_create_id")),
            ProbeResult::Error
        );
        assert_eq!(
            ProbeResult::of_error(&Error::verbs_rc("ibv_create_qp", libc::ENOMEM)),
            ProbeResult::Error
        );
        assert_eq!(
            ProbeResult::of_error(&Error::Injected(Step::Connect)),
            ProbeResult::Error
        );
        assert_eq!(
            ProbeResult::of_error(&Error::PeerDisconnected { step: Step::Ping }),
            ProbeResult::Error
        );
    }

    #[test]
    fn failure_is_recorded_on_the_outcome() {
        let mut o = ProbeOutcome::new("198.18.0.1:9723".parse().unwrap(), ProbeMode::OneShot, 0);
        assert!(o.is_ok());
        o.fail(Step::Connect, &cm_event(CmEventKind::Rejected, 8));
        assert_eq!(o.result, ProbeResult::Rejected);
        assert_eq!(o.failed_step, Some(Step::Connect));
        assert_eq!(o.cm_event_status, Some(8));
        assert_eq!(o.errno, None);
        let json = serde_json::to_value(&o).unwrap();
        assert_eq!(json["result"], "rejected");
        assert_eq!(json["failed_step"], "connect");
    }

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
        for result in ProbeResult::ALL {
            assert_eq!(serde_json::to_value(result).unwrap(), result.as_str());
        }
        assert_eq!(serde_json::to_value(QpState::Rtr).unwrap(), "RTR");
        assert_eq!(
            CmEventKind::from_raw(ev::RDMA_CM_EVENT_REJECTED).to_string(),
            "RDMA_CM_EVENT_REJECTED"
        );
    }
}
