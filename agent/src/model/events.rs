//! Decoding of ring-buffer records into typed lifecycle events.

use std::{mem::size_of, time::Duration};

use qpwatch_common::{
    CmEvent, CmOp, EventKind, QpEvent, QpOrigin, CM_FLAG_ATTACHED, CM_FLAG_CONN_PARAM,
    CM_FLAG_HAS_QP, CM_FLAG_STATE, CM_FLAG_STATE_AFTER, CM_FLAG_USER, IB_QP_STATE_MASK, REMOTE_GID,
    REMOTE_QPN,
};
use thiserror::Error;

use crate::kernel::rdma::{Gid, QpState, QpType};

/// Nanoseconds of `clock`; with CLOCK_MONOTONIC, the clock of the records'
/// `bpf_ktime_get_ns()` timestamps.
pub fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we pass.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("record of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown event kind {0}")]
    UnknownKind(u32),
    #[error("unknown CM op {0}")]
    UnknownOp(u32),
    #[error("{kind:?} record of {len} bytes, expected {expected}")]
    BadLength {
        kind: EventKind,
        len: usize,
        expected: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call {
    Create {
        origin: QpOrigin,
    },
    /// `to` is `None` for a modify without `IB_QP_STATE` in its mask, or with a
    /// state the kernel does not define (then `invalid_state` is set).
    Modify {
        to: Option<QpState>,
        attr_mask: u32,
        invalid_state: bool,
    },
    Destroy,
    /// A QP async event reached its consumer's handler: `event` is the
    /// kernel's `enum ib_event_type`.
    AsyncEvent {
        event: u32,
    },
    /// The device completed a work request of the QP in error (not a
    /// flush): `status` is the kernel's `enum ib_wc_status`.
    CompletionError {
        status: u32,
    },
    /// The device moved the QP to ERR itself.
    DeviceError,
}

/// The `kind` of every record (`qpwatch_events_total`, `qpwatch events`),
/// indexed by [`Record::kind_index`].
pub const RECORD_KINDS: [&str; 7] = [
    "qp_create",
    "qp_modify",
    "qp_destroy",
    "qp_async_event",
    "qp_completion_error",
    "qp_device_error",
    "cm",
];

/// One completed kernel call on a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCall {
    pub call: Call,
    pub start_ns: u64,
    pub end_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub qp_num: u32,
    pub qp_type: QpType,
    pub rc: i32,
    /// The remote side a modify gave the QP (`IB_QP_AV` with a GRH,
    /// `IB_QP_DEST_QPN`); `None` otherwise or when peers are off.
    pub remote_gid: Option<Gid>,
    pub remote_qpn: Option<u32>,
    /// The creating task's cgroup v2 id (creates only; 0 otherwise).
    pub cgroup_id: u64,
    comm: [u8; qpwatch_common::COMM_LEN],
    device: [u8; qpwatch_common::DEVICE_NAME_LEN],
}

fn c_str(bytes: &[u8]) -> &str {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    // Device names are ASCII by ib_device_rename()'s rules; comm may be anything.
    std::str::from_utf8(&bytes[..end]).unwrap_or("?")
}

impl QpCall {
    pub fn device(&self) -> &str {
        c_str(&self.device)
    }

    pub fn device_bytes(&self) -> &[u8; qpwatch_common::DEVICE_NAME_LEN] {
        &self.device
    }

    pub fn comm(&self) -> &str {
        c_str(&self.comm)
    }

    pub fn comm_bytes(&self) -> &[u8; qpwatch_common::COMM_LEN] {
        &self.comm
    }

    /// Sets the task name (tests and benchmarks).
    pub fn set_comm(&mut self, comm: &str) {
        self.comm = [0; qpwatch_common::COMM_LEN];
        let n = comm.len().min(qpwatch_common::COMM_LEN - 1);
        self.comm[..n].copy_from_slice(&comm.as_bytes()[..n]);
    }

    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.end_ns.saturating_sub(self.start_ns))
    }

    pub fn ok(&self) -> bool {
        self.rc == 0
    }

    /// Its kind's index in [`RECORD_KINDS`].
    pub fn kind_index(&self) -> usize {
        match self.call {
            Call::Create { .. } => 0,
            Call::Modify { .. } => 1,
            Call::Destroy => 2,
            Call::AsyncEvent { .. } => 3,
            Call::CompletionError { .. } => 4,
            Call::DeviceError => 5,
        }
    }

    pub fn kind_label(&self) -> &'static str {
        RECORD_KINDS[self.kind_index()]
    }

    /// A synthetic call, for tests and benchmarks of the correlator.
    pub fn synthetic(call: Call, device: &str, qp_num: u32, start_ns: u64, end_ns: u64) -> Self {
        let mut dev = [0u8; qpwatch_common::DEVICE_NAME_LEN];
        let n = device.len().min(dev.len() - 1);
        dev[..n].copy_from_slice(&device.as_bytes()[..n]);
        QpCall {
            call,
            start_ns,
            end_ns,
            pid: 1,
            tid: 1,
            qp_num,
            qp_type: QpType::Rc,
            rc: 0,
            remote_gid: None,
            remote_qpn: None,
            cgroup_id: 0,
            comm: *b"synthetic\0\0\0\0\0\0\0",
            device: dev,
        }
    }
}

/// One completed RDMA CM call or handler, or the entry of an entry-only hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CmCall {
    pub op: CmOp,
    pub start_ns: u64,
    pub end_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// Kernel address of the id (kprobes only): identifies ids with no `cm_id` yet.
    pub id_ptr: u64,
    /// `res.id`, meaningful when `attached`.
    pub cm_id: u32,
    /// Attached to a device (`res.valid`): listed by `rdma res show cm_id`.
    pub attached: bool,
    pub qp_num: u32,
    pub event: u32,
    pub status: i32,
    pub rc: i32,
    /// `enum rdma_cm_state` at entry and at return, where read.
    pub state: Option<u32>,
    pub state_after: Option<u32>,
    pub qp_type: QpType,
    pub user: bool,
    pub has_qp: bool,
    /// `rdma_accept()` with connection parameters: the passive side's REP.
    pub conn_param: bool,
    comm: [u8; qpwatch_common::COMM_LEN],
    device: [u8; qpwatch_common::DEVICE_NAME_LEN],
}

impl CmCall {
    pub fn device(&self) -> &str {
        c_str(&self.device)
    }

    pub fn comm(&self) -> &str {
        c_str(&self.comm)
    }

    pub fn duration(&self) -> Duration {
        Duration::from_nanos(self.end_ns.saturating_sub(self.start_ns))
    }

    /// A synthetic record, for tests of the CM correlator.
    pub fn synthetic(op: CmOp, cm_id: u32, at_ns: u64) -> Self {
        let mut device = [0u8; qpwatch_common::DEVICE_NAME_LEN];
        device[..4].copy_from_slice(b"rxe0");
        CmCall {
            op,
            start_ns: at_ns,
            end_ns: at_ns,
            pid: 1,
            tid: 1,
            id_ptr: 0,
            cm_id,
            attached: true,
            qp_num: 0,
            event: 0,
            status: 0,
            rc: 0,
            state: None,
            state_after: None,
            qp_type: QpType::Rc,
            user: true,
            has_qp: false,
            conn_param: false,
            comm: *b"synthetic\0\0\0\0\0\0\0",
            device,
        }
    }
}

/// A decoded ring-buffer record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Qp(QpCall),
    Cm(CmCall),
}

impl Record {
    /// When the kernel call (or tracepoint) completed and the record was written.
    pub fn end_ns(&self) -> u64 {
        match self {
            Record::Qp(call) => call.end_ns,
            Record::Cm(call) => call.end_ns,
        }
    }

    /// Its kind's index in [`RECORD_KINDS`].
    pub fn kind_index(&self) -> usize {
        match self {
            Record::Qp(call) => call.kind_index(),
            Record::Cm(_) => 6,
        }
    }

    pub fn kind_label(&self) -> &'static str {
        RECORD_KINDS[self.kind_index()]
    }
}

fn check_len<T>(kind: EventKind, bytes: &[u8]) -> Result<T, DecodeError> {
    let expected = size_of::<T>();
    if bytes.len() != expected {
        return Err(DecodeError::BadLength {
            kind,
            len: bytes.len(),
            expected,
        });
    }
    // SAFETY: the length was checked; T is a #[repr(C)] plain-data event type
    // from qpwatch-common, valid for any bit pattern.
    Ok(unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

fn decode_cm(bytes: &[u8]) -> Result<CmCall, DecodeError> {
    let raw: CmEvent = check_len(EventKind::Cm, bytes)?;
    let op = CmOp::from_u32(raw.op).ok_or(DecodeError::UnknownOp(raw.op))?;
    Ok(CmCall {
        op,
        start_ns: raw.start_ns,
        end_ns: raw.end_ns,
        pid: (raw.pid_tgid >> 32) as u32,
        tid: raw.pid_tgid as u32,
        id_ptr: raw.id_ptr,
        cm_id: raw.cm_id,
        attached: raw.flags & CM_FLAG_ATTACHED != 0,
        qp_num: raw.qp_num,
        event: raw.event,
        status: raw.status,
        rc: raw.rc,
        state: (raw.flags & CM_FLAG_STATE != 0).then_some(raw.state),
        state_after: (raw.flags & CM_FLAG_STATE_AFTER != 0).then_some(raw.state_after),
        qp_type: QpType::from_kernel(raw.qp_type),
        user: raw.flags & CM_FLAG_USER != 0,
        has_qp: raw.flags & CM_FLAG_HAS_QP != 0,
        conn_param: raw.flags & CM_FLAG_CONN_PARAM != 0,
        comm: zero_after_nul(raw.comm),
        device: raw.device,
    })
}

/// `comm` as the programs copy it from the task: kernels before 5.19 or so
/// rename a task with `strlcpy()`, which leaves an older name's bytes after
/// the NUL. Zeroed here, so that one name is one set of bytes.
fn zero_after_nul(mut comm: [u8; qpwatch_common::COMM_LEN]) -> [u8; qpwatch_common::COMM_LEN] {
    if let Some(end) = comm.iter().position(|&b| b == 0) {
        comm[end..].fill(0);
    }
    comm
}

/// Decodes one ring-buffer record.
pub fn decode(bytes: &[u8]) -> Result<Record, DecodeError> {
    let raw_kind = bytes
        .get(..4)
        .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")))
        .ok_or(DecodeError::Short(bytes.len()))?;
    let kind = EventKind::from_u32(raw_kind).ok_or(DecodeError::UnknownKind(raw_kind))?;
    if kind == EventKind::Cm {
        return decode_cm(bytes).map(Record::Cm);
    }
    let raw: QpEvent = check_len(kind, bytes)?;
    let call = match kind {
        EventKind::QpCreate => Call::Create {
            origin: if raw.origin == QpOrigin::Kernel as u32 {
                QpOrigin::Kernel
            } else {
                QpOrigin::User
            },
        },
        EventKind::QpModify => {
            let changes_state = raw.attr_mask & IB_QP_STATE_MASK != 0;
            let to = changes_state
                .then(|| QpState::from_kernel(raw.new_state))
                .flatten();
            Call::Modify {
                to,
                attr_mask: raw.attr_mask,
                invalid_state: changes_state && to.is_none(),
            }
        }
        EventKind::QpDestroy => Call::Destroy,
        EventKind::QpAsyncEvent => Call::AsyncEvent { event: raw.detail },
        EventKind::CompletionError => Call::CompletionError { status: raw.detail },
        EventKind::DeviceError => Call::DeviceError,
        EventKind::Cm => unreachable!("decoded above"),
    };
    Ok(Record::Qp(QpCall {
        call,
        start_ns: raw.start_ns,
        end_ns: raw.end_ns,
        pid: (raw.pid_tgid >> 32) as u32,
        tid: raw.pid_tgid as u32,
        qp_num: raw.qp_num,
        qp_type: QpType::from_kernel(raw.qp_type),
        rc: raw.rc,
        remote_gid: (raw.remote & REMOTE_GID != 0).then_some(Gid(raw.remote_gid)),
        remote_qpn: (raw.remote & REMOTE_QPN != 0).then_some(raw.remote_qpn),
        cgroup_id: raw.cgroup_id,
        comm: zero_after_nul(raw.comm),
        device: raw.device,
    }))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn raw_bytes<T>(event: &T) -> Vec<u8> {
        // SAFETY: the event types are #[repr(C)] without padding.
        unsafe { std::slice::from_raw_parts((event as *const T).cast::<u8>(), size_of::<T>()) }
            .to_vec()
    }

    fn qp(bytes: &[u8]) -> Result<QpCall, DecodeError> {
        match decode(bytes)? {
            Record::Qp(call) => Ok(call),
            other => panic!("not a QP record: {other:?}"),
        }
    }

    fn modify(mask: u32, state: u32) -> QpEvent {
        let mut e = QpEvent::zeroed();
        e.kind = EventKind::QpModify as u32;
        e.attr_mask = mask;
        e.new_state = state;
        e.start_ns = 100;
        e.end_ns = 350;
        e.pid_tgid = (42u64 << 32) | 43;
        e.qp_num = 17;
        e.qp_type = 2;
        e.rc = -22;
        e.device[..4].copy_from_slice(b"rxe0");
        e.comm[..5].copy_from_slice(b"rping");
        e
    }

    #[test]
    fn decodes_a_modify() {
        let call = qp(&raw_bytes(&modify(1 | 0x10, 2))).unwrap();
        assert_eq!(
            call.call,
            Call::Modify {
                to: Some(QpState::Rtr),
                attr_mask: 0x11,
                invalid_state: false
            }
        );
        assert_eq!(
            (call.pid, call.tid, call.qp_num, call.rc),
            (42, 43, 17, -22)
        );
        assert_eq!(call.device(), "rxe0");
        assert_eq!(call.comm(), "rping");
        assert_eq!(call.qp_type, QpType::Rc);
        assert_eq!(call.duration(), Duration::from_nanos(250));
    }

    /// A task renamed with `strlcpy()` (older kernels) keeps its old name's
    /// tail after the NUL: the agent sees one name either way.
    #[test]
    fn comm_is_zeroed_after_its_nul() {
        let mut e = modify(1, 2);
        e.comm = *b"rping\0longname12";
        let call = qp(&raw_bytes(&e)).unwrap();
        assert_eq!(call.comm(), "rping");
        assert_eq!(call.comm_bytes(), &modify(1, 2).comm);
        e.comm = *b"fifteen_letters\0";
        assert_eq!(qp(&raw_bytes(&e)).unwrap().comm_bytes(), &e.comm);
    }

    #[test]
    fn remote_side_only_where_the_program_marked_it() {
        let call = qp(&raw_bytes(&modify(1, 2))).unwrap();
        assert_eq!((call.remote_gid, call.remote_qpn), (None, None));
        let mut e = modify(1 | (1 << 7) | (1 << 20), 2);
        e.remote_qpn = 0x11;
        e.remote_gid[10..].copy_from_slice(&[0xff, 0xff, 198, 18, 0, 2]);
        e.remote = REMOTE_QPN;
        let call = qp(&raw_bytes(&e)).unwrap();
        assert_eq!((call.remote_gid, call.remote_qpn), (None, Some(0x11)));
        e.remote |= REMOTE_GID;
        let call = qp(&raw_bytes(&e)).unwrap();
        assert_eq!(call.remote_gid.unwrap().to_string(), "198.18.0.2");
    }

    #[test]
    fn state_is_only_read_with_the_state_mask() {
        let call = qp(&raw_bytes(&modify(0x10, 3))).unwrap();
        assert!(matches!(
            call.call,
            Call::Modify {
                to: None,
                invalid_state: false,
                ..
            }
        ));
        let call = qp(&raw_bytes(&modify(1, 99))).unwrap();
        assert!(matches!(
            call.call,
            Call::Modify {
                to: None,
                invalid_state: true,
                ..
            }
        ));
    }

    #[test]
    fn rejects_bad_records() {
        assert_eq!(decode(&[1, 0]), Err(DecodeError::Short(2)));
        let mut bytes = raw_bytes(&modify(1, 1));
        bytes[0] = 77;
        assert_eq!(decode(&bytes), Err(DecodeError::UnknownKind(77)));
        let bytes = raw_bytes(&modify(1, 1));
        assert!(matches!(
            decode(&bytes[..bytes.len() - 1]),
            Err(DecodeError::BadLength { .. })
        ));
    }

    #[test]
    fn decodes_a_cm_handler_record() {
        let mut e = CmEvent::zeroed();
        e.kind = EventKind::Cm as u32;
        e.op = CmOp::EventHandler as u32;
        e.cm_id = 7;
        e.event = 9;
        e.state = 5;
        e.flags = CM_FLAG_STATE | CM_FLAG_USER;
        e.id_ptr = 0xffff_8880_0000_1000;
        let Record::Cm(call) = decode(&raw_bytes(&e)).unwrap() else {
            panic!("not a CM record");
        };
        assert_eq!(call.op, CmOp::EventHandler);
        assert_eq!((call.cm_id, call.event, call.state), (7, 9, Some(5)));
        assert_eq!(call.state_after, None);
        assert!(call.user && !call.has_qp);
        e.op = 999;
        assert_eq!(decode(&raw_bytes(&e)), Err(DecodeError::UnknownOp(999)));
        let bytes = raw_bytes(&e);
        assert!(matches!(
            decode(&bytes[..100]),
            Err(DecodeError::BadLength {
                kind: EventKind::Cm,
                ..
            })
        ));
    }

    #[test]
    fn end_before_start_is_zero_duration() {
        let mut e = modify(1, 1);
        e.end_ns = 5;
        assert_eq!(qp(&raw_bytes(&e)).unwrap().duration(), Duration::ZERO);
    }
}

/// Property tests of the decoder (proptest, a bounded number of cases in the
/// normal `cargo test`): it must never panic on any bytes, must classify
/// every malformed record, and must round-trip every well-formed one.
#[cfg(test)]
mod prop {
    use proptest::prelude::*;
    use qpwatch_common::{CmEvent, CmOp, EventKind, QpEvent, COMM_LEN, DEVICE_NAME_LEN};

    use super::tests::raw_bytes;
    use super::*;

    const QP_LEN: usize = size_of::<QpEvent>();
    const CM_LEN: usize = size_of::<CmEvent>();

    fn config() -> ProptestConfig {
        ProptestConfig {
            cases: 2000,
            failure_persistence: None,
            ..ProptestConfig::default()
        }
    }

    prop_compose! {
        fn qp_event()(
            kind in 1u32..=3,
            origin in any::<u32>(),
            start_ns in any::<u64>(),
            end_ns in any::<u64>(),
            pid_tgid in any::<u64>(),
            qp_num in any::<u32>(),
            qp_type in any::<u32>(),
            rc in any::<i32>(),
            attr_mask in any::<u32>(),
            new_state in 0u32..10,
            cgroup_id in any::<u64>(),
            comm in proptest::collection::vec(any::<u8>(), COMM_LEN),
            device in proptest::collection::vec(any::<u8>(), DEVICE_NAME_LEN),
        ) -> QpEvent {
            let mut e = QpEvent::zeroed();
            e.kind = kind;
            e.origin = origin;
            e.start_ns = start_ns;
            e.end_ns = end_ns;
            e.pid_tgid = pid_tgid;
            e.qp_num = qp_num;
            e.qp_type = qp_type;
            e.rc = rc;
            e.attr_mask = attr_mask;
            e.new_state = new_state;
            e.cgroup_id = cgroup_id;
            e.comm.copy_from_slice(&comm);
            e.device.copy_from_slice(&device);
            e
        }
    }

    proptest! {
        #![proptest_config(config())]

        /// Any byte string: a record or a typed error, never a panic, and
        /// the error is the one the bytes call for.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let result = decode(&bytes);
            if bytes.len() < 4 {
                prop_assert_eq!(result, Err(DecodeError::Short(bytes.len())));
                return Ok(());
            }
            let kind = u32::from_ne_bytes(bytes[..4].try_into().unwrap());
            match EventKind::from_u32(kind) {
                None => prop_assert_eq!(result, Err(DecodeError::UnknownKind(kind))),
                Some(EventKind::Cm) if bytes.len() != CM_LEN => {
                    let is_bad_length = matches!(result, Err(DecodeError::BadLength { .. }));
                    prop_assert!(is_bad_length);
                }
                Some(EventKind::Cm) => {
                    let is_cm = matches!(result, Ok(Record::Cm(_)) | Err(DecodeError::UnknownOp(_)));
                    prop_assert!(is_cm);
                }
                Some(k) if bytes.len() != QP_LEN => prop_assert_eq!(
                    result,
                    Err(DecodeError::BadLength { kind: k, len: bytes.len(), expected: QP_LEN })
                ),
                Some(_) => {
                    let is_qp = matches!(result, Ok(Record::Qp(_)));
                    prop_assert!(is_qp);
                }
            }
        }

        /// A well-formed QP record decodes to exactly its fields.
        #[test]
        fn qp_records_round_trip(e in qp_event()) {
            let Ok(Record::Qp(call)) = decode(&raw_bytes(&e)) else {
                return Err(TestCaseError::fail("not decoded as a QP record"));
            };
            prop_assert_eq!(call.start_ns, e.start_ns);
            prop_assert_eq!(call.end_ns, e.end_ns);
            prop_assert_eq!(call.pid, (e.pid_tgid >> 32) as u32);
            prop_assert_eq!(call.tid, e.pid_tgid as u32);
            prop_assert_eq!(call.qp_num, e.qp_num);
            prop_assert_eq!(call.qp_type, QpType::from_kernel(e.qp_type));
            prop_assert_eq!(call.rc, e.rc);
            prop_assert_eq!(call.cgroup_id, e.cgroup_id);
            prop_assert_eq!(call.duration(), Duration::from_nanos(e.end_ns.saturating_sub(e.start_ns)));
            prop_assert_eq!(call.device_bytes(), &e.device);
            // comm: its bytes up to the first NUL, zeros after
            let comm_end = e.comm.iter().position(|&b| b == 0).unwrap_or(COMM_LEN);
            prop_assert_eq!(&call.comm_bytes()[..comm_end], &e.comm[..comm_end]);
            prop_assert!(call.comm_bytes()[comm_end..].iter().all(|&b| b == 0));
            // the printable names stop at the first NUL (or are "?")
            let dev_end = e.device.iter().position(|&b| b == 0).unwrap_or(DEVICE_NAME_LEN);
            prop_assert!(call.device() == "?" || call.device().as_bytes() == &e.device[..dev_end]);
            match (EventKind::from_u32(e.kind).unwrap(), call.call) {
                (EventKind::QpCreate, Call::Create { origin }) => prop_assert_eq!(
                    origin,
                    if e.origin == QpOrigin::Kernel as u32 { QpOrigin::Kernel } else { QpOrigin::User }
                ),
                (EventKind::QpModify, Call::Modify { to, attr_mask, invalid_state }) => {
                    prop_assert_eq!(attr_mask, e.attr_mask);
                    if e.attr_mask & IB_QP_STATE_MASK == 0 {
                        prop_assert_eq!((to, invalid_state), (None, false));
                    } else {
                        let expected = QpState::from_kernel(e.new_state);
                        prop_assert_eq!(to, expected);
                        prop_assert_eq!(invalid_state, expected.is_none());
                        prop_assert_eq!(expected.is_some(), e.new_state <= 6);
                    }
                }
                (EventKind::QpDestroy, Call::Destroy) => {}
                (kind, call) => return Err(TestCaseError::fail(format!("{kind:?} decoded as {call:?}"))),
            }
        }

        /// Cutting or padding a valid record is always caught.
        #[test]
        fn truncated_or_padded_records_are_bad_length(e in qp_event(), cut in 4usize..QP_LEN, pad in 1usize..64) {
            let bytes = raw_bytes(&e);
            let short = decode(&bytes[..cut]);
            let is_bad_length = matches!(short, Err(DecodeError::BadLength { len, .. }) if len == cut);
            prop_assert!(is_bad_length);
            let mut long = bytes.clone();
            long.extend(std::iter::repeat_n(0u8, pad));
            let is_bad_length = matches!(decode(&long), Err(DecodeError::BadLength { .. }));
            prop_assert!(is_bad_length);
        }

        /// CM records: any op value is decoded or rejected as an unknown op;
        /// the flags map to exactly the optional fields.
        #[test]
        fn cm_records_decode_or_reject_the_op(op in 0u32..80, flags in any::<u32>(), state in any::<u32>(), after in any::<u32>(), cm_id in any::<u32>()) {
            let mut e = CmEvent::zeroed();
            e.kind = EventKind::Cm as u32;
            e.op = op;
            e.flags = flags;
            e.state = state;
            e.state_after = after;
            e.cm_id = cm_id;
            match decode(&raw_bytes(&e)) {
                Ok(Record::Cm(call)) => {
                    prop_assert_eq!(Some(call.op), CmOp::from_u32(op));
                    prop_assert_eq!(call.cm_id, cm_id);
                    prop_assert_eq!(call.state, (flags & CM_FLAG_STATE != 0).then_some(state));
                    prop_assert_eq!(call.state_after, (flags & CM_FLAG_STATE_AFTER != 0).then_some(after));
                    prop_assert_eq!(call.user, flags & CM_FLAG_USER != 0);
                    prop_assert_eq!(call.attached, flags & CM_FLAG_ATTACHED != 0);
                }
                Err(DecodeError::UnknownOp(o)) => {
                    prop_assert_eq!(o, op);
                    prop_assert!(CmOp::from_u32(op).is_none());
                }
                other => return Err(TestCaseError::fail(format!("unexpected {other:?}"))),
            }
        }
    }
}
