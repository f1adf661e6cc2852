//! `qpwatch events`: every decoded lifecycle event as one JSON object per line.

use std::{
    io::{BufWriter, Write},
    time::{Duration, SystemTime},
};

use serde::Serialize;

use crate::{
    kernel::rdma::{cm_event_name, QpState},
    model::cm::CmCorrelator,
    model::events::{clock_ns, Call, CmCall, QpCall},
    model::pipeline::EventSink,
    model::qp::QpDetail,
};
use qpwatch_common::{CmOp, QpOrigin};

/// Converts `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) to wall-clock time.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    realtime_minus_monotonic_ns: i128,
}

impl Clock {
    pub fn now() -> Self {
        Self {
            realtime_minus_monotonic_ns: clock_ns(libc::CLOCK_REALTIME)
                - clock_ns(libc::CLOCK_MONOTONIC),
        }
    }

    pub fn wall(&self, monotonic_ns: u64) -> SystemTime {
        let ns = i128::from(monotonic_ns) + self.realtime_minus_monotonic_ns;
        SystemTime::UNIX_EPOCH + Duration::from_nanos(ns.max(0) as u64)
    }
}

#[derive(Debug, Serialize, PartialEq)]
pub struct JsonEvent<'a> {
    pub ts: String,
    pub mono_ns: u64,
    pub kind: &'a str,
    /// The kernel function or tracepoint.
    pub op: &'a str,
    pub device: &'a str,
    pub qp_num: Option<u32>,
    pub qp_type: Option<&'a str>,
    pub cm_id: Option<u32>,
    pub from_state: Option<&'a str>,
    pub to_state: Option<&'a str>,
    pub cm_event: Option<&'a str>,
    pub cm_status: Option<i32>,
    pub rc: i32,
    pub duration_ns: u64,
    pub pid: u32,
    pub comm: &'a str,
    pub origin: Option<&'a str>,
    /// The remote side a modify gave the QP: its GID (an IP for RoCE) and
    /// QP number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_gid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote_qpn: Option<u32>,
    /// The creating task's cgroup v2 path (creates only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<&'a str>,
    /// The async event a QP's consumer received (`QP_FATAL`, `SQ_DRAINED`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub async_event: Option<&'a str>,
    /// The status of a completion in error (`RETRY_EXC_ERR`, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wc_status: Option<&'a str>,
    /// Why the QP entered ERR with this event (`requested`,
    /// `async_event:<event>`, `completion:<status>`, `unknown`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub err_cause: Option<&'a str>,
}

pub struct JsonLines<W: Write + Send> {
    out: BufWriter<W>,
    clock: Clock,
}

impl<W: Write + Send> JsonLines<W> {
    pub fn new(out: W) -> Self {
        Self {
            out: BufWriter::new(out),
            clock: Clock::now(),
        }
    }

    fn write(&mut self, event: &JsonEvent) {
        // A closed stdout (e.g. `| head`) ends the stream; nothing to recover.
        let _ = serde_json::to_writer(&mut self.out, event);
        let _ = self.out.write_all(b"\n");
        let _ = self.out.flush();
    }

    fn ts(&self, mono_ns: u64) -> String {
        humantime::format_rfc3339_nanos(self.clock.wall(mono_ns)).to_string()
    }
}

fn qp_op(call: &QpCall) -> &'static str {
    match call.call {
        Call::Create {
            origin: QpOrigin::User,
        } => "ib_create_qp_user",
        Call::Create {
            origin: QpOrigin::Kernel,
        } => "ib_create_qp_kernel",
        Call::Modify { .. } => "_ib_modify_qp",
        Call::Destroy => "ib_destroy_qp_user",
        Call::AsyncEvent { .. } => "qp_event_handler",
        Call::CompletionError { .. } => "rxe_cq_post",
        Call::DeviceError => "rxe_qp_error",
    }
}

impl<W: Write + Send> EventSink for JsonLines<W> {
    fn qp(
        &mut self,
        call: &QpCall,
        from: Option<QpState>,
        cm_id: Option<u32>,
        cgroup: Option<&str>,
        detail: &QpDetail,
    ) {
        let to = match call.call {
            Call::Modify { to, .. } => to,
            _ if detail.err_cause.is_some() => Some(QpState::Err),
            _ => None,
        };
        let origin = match call.call {
            Call::Create {
                origin: QpOrigin::User,
            } => Some("user"),
            Call::Create {
                origin: QpOrigin::Kernel,
            } => Some("kernel"),
            _ => None,
        };
        let ts = self.ts(call.start_ns);
        let event = JsonEvent {
            ts,
            mono_ns: call.start_ns,
            kind: call.kind_label(),
            op: qp_op(call),
            device: call.device(),
            qp_num: Some(call.qp_num),
            qp_type: Some(call.qp_type.label()),
            cm_id,
            from_state: from.map(QpState::label),
            to_state: to.map(QpState::label),
            cm_event: None,
            cm_status: None,
            rc: call.rc,
            duration_ns: call.duration().as_nanos() as u64,
            pid: call.pid,
            comm: call.comm(),
            origin,
            remote_gid: call.remote_gid.map(|gid| gid.to_string()),
            remote_qpn: call.remote_qpn,
            cgroup,
            async_event: detail.async_event.as_deref(),
            wc_status: detail.completion_status.as_deref(),
            err_cause: detail.err_cause.as_deref(),
        };
        self.write(&event);
    }

    fn cm(&mut self, call: &CmCall, cm: &CmCorrelator) {
        let names = cm.names();
        let from = call.state.map(|s| names.state(s));
        let to = call.state_after.map(|s| names.state(s));
        let has_event = matches!(call.op, CmOp::EventHandler | CmOp::UcmaHandler);
        let ib_event = matches!(call.op, CmOp::IbHandler | CmOp::IbReqHandler)
            .then(|| names.ib_event(call.event));
        let cm_event = if has_event {
            Some(cm_event_name(call.event))
        } else {
            ib_event.as_deref()
        };
        let ts = self.ts(call.start_ns);
        let event = JsonEvent {
            ts,
            mono_ns: call.start_ns,
            kind: "cm",
            op: call.op.label(),
            device: call.device(),
            qp_num: (call.qp_num != 0).then_some(call.qp_num),
            qp_type: None,
            cm_id: call.attached.then_some(call.cm_id),
            from_state: from.as_deref(),
            to_state: to.as_deref(),
            cm_event,
            cm_status: has_event.then_some(call.status),
            rc: call.rc,
            duration_ns: call.duration().as_nanos() as u64,
            pid: call.pid,
            comm: call.comm(),
            origin: Some(if call.user { "user" } else { "kernel" }),
            remote_gid: None,
            remote_qpn: None,
            cgroup: None,
            async_event: None,
            wc_status: None,
            err_cause: None,
        };
        self.write(&event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cm::CmNames;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn one_json_object_per_event() {
        let buf = Shared::default();
        let mut sink = JsonLines::new(buf.clone());
        let call = QpCall::synthetic(
            Call::Modify {
                to: Some(QpState::Rtr),
                attr_mask: 1,
                invalid_state: false,
            },
            "rxe0",
            17,
            1_000,
            3_500,
        );
        let mut call = call;
        let mut gid = [0u8; 16];
        gid[10..].copy_from_slice(&[0xff, 0xff, 198, 18, 0, 2]);
        call.remote_gid = Some(crate::kernel::rdma::Gid(gid));
        call.remote_qpn = Some(0x11);
        sink.qp(
            &call,
            Some(QpState::Init),
            Some(4),
            Some("/system.slice/a.service"),
            &QpDetail::default(),
        );
        let died = QpCall::synthetic(Call::DeviceError, "rxe0", 17, 4_000, 4_000);
        sink.qp(
            &died,
            Some(QpState::Rts),
            Some(4),
            None,
            &QpDetail {
                err_cause: Some("completion:RETRY_EXC_ERR".into()),
                ..QpDetail::default()
            },
        );
        let cm = CmCorrelator::new(CmNames::linux_6_1());
        let mut connect = CmCall::synthetic(CmOp::Connect, 4, 2_000);
        connect.qp_num = 17;
        sink.cm(&connect, &cm);
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let mut lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        let died = lines.remove(1);
        assert_eq!(died["kind"], "qp_device_error");
        assert_eq!(died["from_state"], "RTS");
        assert_eq!(died["to_state"], "ERR");
        assert_eq!(died["err_cause"], "completion:RETRY_EXC_ERR");
        assert!(died.get("async_event").is_none());
        assert!(lines[0].get("err_cause").is_none());
        assert_eq!(lines[0]["kind"], "qp_modify");
        assert_eq!(lines[0]["from_state"], "INIT");
        assert_eq!(lines[0]["to_state"], "RTR");
        assert_eq!(lines[0]["duration_ns"], 2_500);
        assert_eq!(lines[0]["cm_id"], 4);
        assert_eq!(lines[0]["remote_gid"], "198.18.0.2");
        assert_eq!(lines[0]["remote_qpn"], 0x11);
        assert_eq!(lines[0]["cgroup"], "/system.slice/a.service");
        assert!(lines[1].get("remote_gid").is_none());
        assert!(lines[1].get("cgroup").is_none());
        assert_eq!(lines[1]["op"], "rdma_connect_locked");
        assert_eq!(lines[1]["qp_num"], 17);
        assert_eq!(lines[1]["cm_id"], 4);
        assert!(lines[1]["ts"].as_str().unwrap().ends_with('Z'));
    }
}
