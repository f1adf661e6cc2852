//! What a probe reports: the closed set of results, the per-call QP timings
//! and the outcome record.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use qpwatch_common::vocab::{CmEventKind, QpState};
use serde::Serialize;

use crate::error::Error;
use crate::ser;
use crate::step::Step;

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

impl QpCallKind {
    pub fn as_str(self) -> &'static str {
        match self {
            QpCallKind::Create => "create",
            QpCallKind::Modify => "modify",
            QpCallKind::Destroy => "destroy",
        }
    }
}

/// One userspace QP verb call, timed on CLOCK_MONOTONIC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QpCall {
    pub kind: QpCallKind,
    /// The state a modify moves the QP to.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "ser::opt_qp_state"
    )]
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
    fn names_serialize_as_labels() {
        for result in ProbeResult::ALL {
            assert_eq!(serde_json::to_value(result).unwrap(), result.as_str());
        }
        let call = |kind, target_state| QpCall {
            kind,
            target_state,
            start_ns: 1,
            duration: Duration::from_nanos(2),
            rc: 0,
        };
        let modify = serde_json::to_value(call(QpCallKind::Modify, Some(QpState::Rtr))).unwrap();
        assert_eq!(modify["kind"], "modify");
        assert_eq!(modify["target_state"], "RTR");
        let create = serde_json::to_value(call(QpCallKind::Create, None)).unwrap();
        assert_eq!(create["kind"], QpCallKind::Create.as_str());
        assert!(create.get("target_state").is_none());
    }
}
