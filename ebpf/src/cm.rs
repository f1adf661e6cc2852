//! RDMA CM programs: kprobe/kretprobe pairs and entry kprobes on rdma_cm /
//! rdma_ucm functions, and counters on the `ib_cma:*` tracepoints (an opt-in
//! group: a tracepoint attachment holds its module, a kprobe does not).
//!
//! Every CM record carries the id's `res.id` (the id `rdma res show cm_id`
//! prints) and, for kprobes, the `rdma_id_private` address, which identifies
//! an id before it is attached to a device.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid},
    macros::{kprobe, kretprobe, map, raw_tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
    Global,
};
use qpwatch_common::{
    hook, CmEvent, CmOffsets, CmOp, EventKind, KernelOffsets, PendingKey, CM_FLAG_ATTACHED,
    CM_FLAG_CONN_PARAM, CM_FLAG_HAS_QP, CM_FLAG_STATE, CM_FLAG_STATE_AFTER, CM_FLAG_USER, COMM_LEN,
    IB_CM_TRACEPOINTS,
};

use crate::{
    begin, emit, finish, now_ns, offsets, read_device_name, read_ptr, read_u32, read_u8, Pending,
};

#[no_mangle]
static CM_OFFSETS: Global<CmOffsets> = Global::new(CmOffsets {
    id_priv_id: 0,
    id_priv_state: 0,
    id_priv_qp_num: 0,
    id_priv_res_id: 0,
    id_priv_res_user: 0,
    id_priv_res_valid: 0,
    id_priv_device: 0,
    id_priv_qp: 0,
    id_priv_qp_type: 0,
    cm_event_event: 0,
    cm_event_status: 0,
    ib_cm_id_context: 0,
    ib_cm_event_event: 0,
    valid: 0,
});

#[map]
static CM_PENDING: LruHashMap<PendingKey, Pending<CmEvent>> = LruHashMap::with_max_entries(8192, 0);

/// Hits per `ib_cma:*` tracepoint, indexed as `IB_CM_TRACEPOINTS`, in one
/// per-CPU entry (one syscall reads them all).
#[map]
static IB_CM_HITS: PerCpuArray<[u64; IB_CM_TRACEPOINTS.len()]> =
    PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn cm_offsets() -> Option<(KernelOffsets, CmOffsets)> {
    let cm = CM_OFFSETS.load();
    if cm.valid == 0 {
        return None;
    }
    Some((offsets()?, cm))
}

#[inline(always)]
fn new_cm_event(op: CmOp) -> CmEvent {
    let mut event = CmEvent::zeroed();
    event.kind = EventKind::Cm as u32;
    event.op = op as u32;
    event.start_ns = now_ns();
    event.end_ns = event.start_ns;
    event.pid_tgid = bpf_get_current_pid_tgid();
    event.comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    event
}

/// Reads what the id says about itself; run at entry and again at return,
/// since calls attach ids to devices, assign QPs and change states.
#[inline(always)]
fn describe_id(event: &mut CmEvent, id_priv: u64, k: &KernelOffsets, c: &CmOffsets) {
    if id_priv == 0 {
        return;
    }
    event.id_ptr = id_priv;
    // rdma_restrack_add() sets res.id, then res.valid, possibly on another
    // CPU right now (address resolution attaches the id from a workqueue):
    // the id is read only once valid is seen set.
    if read_u8(id_priv, c.id_priv_res_valid) != 0 {
        event.flags |= CM_FLAG_ATTACHED;
        event.cm_id = read_u32(id_priv, c.id_priv_res_id);
    }
    event.qp_num = read_u32(id_priv, c.id_priv_qp_num);
    event.qp_type = read_u32(id_priv, c.id_priv_qp_type);
    if read_u8(id_priv, c.id_priv_res_user) != 0 {
        event.flags |= CM_FLAG_USER;
    }
    if read_ptr(id_priv, c.id_priv_qp) != 0 {
        event.flags |= CM_FLAG_HAS_QP;
    }
    if event.device[0] == 0 {
        read_device_name(read_ptr(id_priv, c.id_priv_device), k, &mut event.device);
    }
}

#[inline(always)]
fn begin_cm(
    ctx: &ProbeContext,
    op: CmOp,
    id_priv: u64,
    fill: impl FnOnce(&mut CmEvent, &KernelOffsets, &CmOffsets),
) {
    let Some((k, c)) = cm_offsets() else { return };
    let mut event = new_cm_event(op);
    describe_id(&mut event, id_priv, &k, &c);
    if id_priv != 0 {
        event.state = read_u32(id_priv, c.id_priv_state);
        event.flags |= CM_FLAG_STATE;
    }
    fill(&mut event, &k, &c);
    begin(ctx, &CM_PENDING, hook::CM_BASE + op as u32, &event);
}

/// `only_with_qp`: drop the record when the id had no kernel QP at entry (the
/// cma_*_qp helpers return early for userspace ids).
#[inline(always)]
fn finish_cm(ctx: &RetProbeContext, op: CmOp, only_with_qp: bool) {
    let Some((k, c)) = cm_offsets() else { return };
    let rc: u64 = ctx.ret();
    finish(ctx, &CM_PENDING, hook::CM_BASE + op as u32, |event| {
        let had_qp = event.flags & CM_FLAG_HAS_QP != 0;
        event.rc = rc as i32;
        let id_priv = event.id_ptr;
        if id_priv != 0 {
            describe_id(event, id_priv, &k, &c);
            event.state_after = read_u32(id_priv, c.id_priv_state);
            event.flags |= CM_FLAG_STATE_AFTER;
        }
        had_qp || !only_with_qp
    });
}

/// `container_of(id, struct rdma_id_private, id)`.
#[inline(always)]
fn id_priv_of(cm_id: u64) -> u64 {
    match cm_offsets() {
        Some((_, c)) if cm_id != 0 => cm_id - c.id_priv_id as u64,
        _ => 0,
    }
}

macro_rules! cm_call {
    ($entry:ident, $ret:ident, $op:expr, $arg0:ident) => {
        #[kprobe]
        pub fn $entry(ctx: ProbeContext) -> u32 {
            let arg0: u64 = ctx.arg(0).unwrap_or(0);
            begin_cm(&ctx, $op, $arg0(arg0), |_, _, _| {});
            0
        }

        #[kretprobe]
        pub fn $ret(ctx: RetProbeContext) -> u32 {
            finish_cm(&ctx, $op, false);
            0
        }
    };
}

macro_rules! cma_qp_helper {
    ($entry:ident, $ret:ident, $op:expr, $only_with_qp:expr) => {
        #[kprobe]
        pub fn $entry(ctx: ProbeContext) -> u32 {
            let id_priv: u64 = ctx.arg(0).unwrap_or(0);
            begin_cm(&ctx, $op, id_priv, |_, _, _| {});
            0
        }

        #[kretprobe]
        pub fn $ret(ctx: RetProbeContext) -> u32 {
            finish_cm(&ctx, $op, $only_with_qp);
            0
        }
    };
}

// int rdma_resolve_addr(struct rdma_cm_id *id, ...) and friends: the first
// argument is the embedded `struct rdma_cm_id`.
cm_call!(
    cm_resolve_addr,
    cm_resolve_addr_ret,
    CmOp::ResolveAddr,
    id_priv_of
);
cm_call!(
    cm_resolve_route,
    cm_resolve_route_ret,
    CmOp::ResolveRoute,
    id_priv_of
);
cm_call!(cm_listen, cm_listen_ret, CmOp::Listen, id_priv_of);
// int rdma_connect_locked(struct rdma_cm_id *id, struct rdma_conn_param *):
// the REQ (or SIDR REQ) goes out inside it (cma_connect_ib,
// cma_resolve_ib_udp); rdma_connect() and librdmacm's connect end here.
cm_call!(cm_connect, cm_connect_ret, CmOp::Connect, id_priv_of);
cm_call!(cm_reject, cm_reject_ret, CmOp::Reject, id_priv_of);
// int rdma_disconnect(struct rdma_cm_id *id): sends the DREQ, or the DREP
// to the peer's DREQ.
cm_call!(
    cm_disconnect,
    cm_disconnect_ret,
    CmOp::Disconnect,
    id_priv_of
);

// The static cma_*_qp helpers of drivers/infiniband/core/cma.c take the
// rdma_id_private itself. cma_init_{conn,ud}_qp get the new QP as an argument
// (rdma_create_qp() sets id->qp only after them); the cma_modify_qp_* ones
// return early for ids without a kernel QP, i.e. every userspace id.
cma_qp_helper!(
    cm_init_conn_qp,
    cm_init_conn_qp_ret,
    CmOp::InitConnQp,
    false
);
cma_qp_helper!(cm_init_ud_qp, cm_init_ud_qp_ret, CmOp::InitUdQp, false);
// static int cma_rep_recv(struct rdma_id_private *id_priv): the active side
// moves its kernel QP to RTR and RTS (if it has one) and sends the RTU; on
// failure it rejects. From cma_ib_handler for kernel consumers, from
// rdma_accept() without parameters for librdmacm after CONNECT_RESPONSE.
cma_qp_helper!(cm_rep_recv, cm_rep_recv_ret, CmOp::RepRecv, false);
cma_qp_helper!(
    cm_modify_qp_rtr,
    cm_modify_qp_rtr_ret,
    CmOp::ModifyQpRtr,
    true
);
cma_qp_helper!(
    cm_modify_qp_rts,
    cm_modify_qp_rts_ret,
    CmOp::ModifyQpRts,
    true
);
cma_qp_helper!(
    cm_modify_qp_err,
    cm_modify_qp_err_ret,
    CmOp::ModifyQpErr,
    true
);

/// `int rdma_create_qp(struct rdma_cm_id *id, struct ib_pd *pd,
///     struct ib_qp_init_attr *qp_init_attr)`; `id_priv->qp_num` is set on success.
#[kprobe]
pub fn cm_create_qp(ctx: ProbeContext) -> u32 {
    let id: u64 = ctx.arg(0).unwrap_or(0);
    let pd: u64 = ctx.arg(1).unwrap_or(0);
    let init_attr: u64 = ctx.arg(2).unwrap_or(0);
    begin_cm(&ctx, CmOp::CreateQp, id_priv_of(id), |event, k, _| {
        event.qp_type = read_u32(init_attr, k.ib_qp_init_attr_qp_type);
        if event.device[0] == 0 && pd != 0 {
            read_device_name(read_ptr(pd, k.ib_pd_device), k, &mut event.device);
        }
    });
    0
}

#[kretprobe]
pub fn cm_create_qp_ret(ctx: RetProbeContext) -> u32 {
    finish_cm(&ctx, CmOp::CreateQp, false);
    0
}

/// `int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param
/// *conn_param)`: with parameters, the passive side's REP (cma_accept_ib;
/// `id_priv->qp_num` is the userspace QP's); without, the active side's
/// cma_rep_recv (librdmacm after CONNECT_RESPONSE).
#[kprobe]
pub fn cm_accept(ctx: ProbeContext) -> u32 {
    let id: u64 = ctx.arg(0).unwrap_or(0);
    let conn_param: u64 = ctx.arg(1).unwrap_or(0);
    begin_cm(&ctx, CmOp::Accept, id_priv_of(id), |event, _, _| {
        if conn_param != 0 {
            event.flags |= CM_FLAG_CONN_PARAM;
        }
    });
    0
}

#[kretprobe]
pub fn cm_accept_ret(ctx: RetProbeContext) -> u32 {
    finish_cm(&ctx, CmOp::Accept, false);
    0
}

/// `static int cma_cm_event_handler(struct rdma_id_private *id_priv,
///     struct rdma_cm_event *event)`: every RDMA CM event goes through it to
/// the consumer's handler (ucma for userspace ids); the return is the
/// consumer's result. (The rdma_cma:cm_event_handler tracepoint would pin
/// rdma_cm, and fires a second time, for the wildcard listener, from
/// cma_listen_handler when a connection request reaches a per-device listener.)
#[kprobe]
pub fn cm_event_handler(ctx: ProbeContext) -> u32 {
    let id_priv: u64 = ctx.arg(0).unwrap_or(0);
    let event_ptr: u64 = ctx.arg(1).unwrap_or(0);
    begin_cm(&ctx, CmOp::EventHandler, id_priv, |event, _, c| {
        event.event = read_u32(event_ptr, c.cm_event_event);
        event.status = read_u32(event_ptr, c.cm_event_status) as i32;
    });
    0
}

#[kretprobe]
pub fn cm_event_handler_ret(ctx: RetProbeContext) -> u32 {
    finish_cm(&ctx, CmOp::EventHandler, false);
    0
}

/// `static int ucma_event_handler(struct rdma_cm_id *cm_id,
///     struct rdma_cm_event *event)` in rdma_ucm.
#[kprobe]
pub fn cm_ucma_handler(ctx: ProbeContext) -> u32 {
    let id: u64 = ctx.arg(0).unwrap_or(0);
    let event_ptr: u64 = ctx.arg(1).unwrap_or(0);
    begin_cm(&ctx, CmOp::UcmaHandler, id_priv_of(id), |event, _, c| {
        event.event = read_u32(event_ptr, c.cm_event_event);
        event.status = read_u32(event_ptr, c.cm_event_status) as i32;
    });
    0
}

#[kretprobe]
pub fn cm_ucma_handler_ret(ctx: RetProbeContext) -> u32 {
    finish_cm(&ctx, CmOp::UcmaHandler, false);
    0
}

/// `static int cma_ib_handler(struct ib_cm_id *cm_id, const struct ib_cm_event *ib_event)`
/// and `cma_ib_req_handler` (same signature): `cm_id->context` is the
/// rdma_id_private (the listener's, for requests).
#[inline(always)]
fn begin_ib_handler(ctx: &ProbeContext, op: CmOp) {
    let Some((_, c)) = cm_offsets() else { return };
    let ib_cm_id: u64 = ctx.arg(0).unwrap_or(0);
    let ib_event: u64 = ctx.arg(1).unwrap_or(0);
    let id_priv = if ib_cm_id == 0 {
        0
    } else {
        read_ptr(ib_cm_id, c.ib_cm_id_context)
    };
    begin_cm(ctx, op, id_priv, |event, _, c| {
        event.event = read_u32(ib_event, c.ib_cm_event_event);
    });
}

#[kprobe]
pub fn cm_ib_handler(ctx: ProbeContext) -> u32 {
    begin_ib_handler(&ctx, CmOp::IbHandler);
    0
}

#[kretprobe]
pub fn cm_ib_handler_ret(ctx: RetProbeContext) -> u32 {
    finish_cm(&ctx, CmOp::IbHandler, false);
    0
}

#[kprobe]
pub fn cm_ib_req_handler(ctx: ProbeContext) -> u32 {
    begin_ib_handler(&ctx, CmOp::IbReqHandler);
    0
}

#[kretprobe]
pub fn cm_ib_req_handler_ret(ctx: RetProbeContext) -> u32 {
    finish_cm(&ctx, CmOp::IbReqHandler, false);
    0
}

/// A function hooked at entry only: the record is emitted there, with the
/// id as the function finds it.
#[inline(always)]
fn cm_entry_hit(op: CmOp, id_priv: u64) {
    let Some((k, c)) = cm_offsets() else { return };
    let mut event = new_cm_event(op);
    describe_id(&mut event, id_priv, &k, &c);
    if id_priv != 0 {
        event.state = read_u32(id_priv, c.id_priv_state);
        event.flags |= CM_FLAG_STATE;
    }
    emit(&event);
}

/// `static void _destroy_id(struct rdma_id_private *id_priv, enum
/// rdma_cm_state state)`: every id ends here, destroyed by its owner
/// (rdma_destroy_id), by the CMA when a handler returned non-zero, or on
/// device removal.
#[kprobe]
pub fn cm_destroy_id(ctx: ProbeContext) -> u32 {
    cm_entry_hit(CmOp::DestroyId, ctx.arg(0).unwrap_or(0));
    0
}

/// `void rdma_destroy_qp(struct rdma_cm_id *id)`: a kernel consumer's QP
/// leaves its id (the QP itself is destroyed through ib_destroy_qp).
#[kprobe]
pub fn cm_destroy_qp(ctx: ProbeContext) -> u32 {
    cm_entry_hit(CmOp::DestroyQp, id_priv_of(ctx.arg(0).unwrap_or(0)));
    0
}

macro_rules! ib_cm_tracepoint {
    ($name:ident, $tracepoint:literal, $index:expr) => {
        #[raw_tracepoint(tracepoint = $tracepoint)]
        pub fn $name(_ctx: RawTracePointContext) -> i32 {
            if let Some(hits) = IB_CM_HITS.get_ptr_mut(0) {
                // SAFETY: per-CPU slot.
                unsafe { (*hits)[$index] += 1 };
            }
            0
        }
    };
}

ib_cm_tracepoint!(tp_icm_dreq_skipped, "icm_dreq_skipped", 0);
ib_cm_tracepoint!(tp_icm_dreq_unknown_err, "icm_dreq_unknown_err", 1);
ib_cm_tracepoint!(tp_icm_establish_err, "icm_establish_err", 2);
ib_cm_tracepoint!(tp_icm_handler_err, "icm_handler_err", 3);
ib_cm_tracepoint!(tp_icm_insert_failed_err, "icm_insert_failed_err", 4);
ib_cm_tracepoint!(tp_icm_issue_drep, "icm_issue_drep", 5);
ib_cm_tracepoint!(tp_icm_issue_rej, "icm_issue_rej", 6);
ib_cm_tracepoint!(tp_icm_mad_send_err, "icm_mad_send_err", 7);
ib_cm_tracepoint!(tp_icm_mra_unknown_err, "icm_mra_unknown_err", 8);
ib_cm_tracepoint!(tp_icm_no_listener_err, "icm_no_listener_err", 9);
ib_cm_tracepoint!(tp_icm_no_priv_err, "icm_no_priv_err", 10);
ib_cm_tracepoint!(tp_icm_qp_init_err, "icm_qp_init_err", 11);
ib_cm_tracepoint!(tp_icm_qp_rtr_err, "icm_qp_rtr_err", 12);
ib_cm_tracepoint!(tp_icm_qp_rts_err, "icm_qp_rts_err", 13);
ib_cm_tracepoint!(tp_icm_rej_unknown_err, "icm_rej_unknown_err", 14);
ib_cm_tracepoint!(tp_icm_remote_no_priv_err, "icm_remote_no_priv_err", 15);
ib_cm_tracepoint!(tp_icm_rep_unknown_err, "icm_rep_unknown_err", 16);
ib_cm_tracepoint!(tp_icm_send_cm_rtu_err, "icm_send_cm_rtu_err", 17);
ib_cm_tracepoint!(tp_icm_send_drep, "icm_send_drep", 18);
ib_cm_tracepoint!(tp_icm_send_drep_err, "icm_send_drep_err", 19);
ib_cm_tracepoint!(tp_icm_send_dreq, "icm_send_dreq", 20);
ib_cm_tracepoint!(tp_icm_send_dup_rep, "icm_send_dup_rep", 21);
ib_cm_tracepoint!(tp_icm_send_dup_req, "icm_send_dup_req", 22);
ib_cm_tracepoint!(tp_icm_send_mra, "icm_send_mra", 23);
ib_cm_tracepoint!(tp_icm_send_mra_unknown_err, "icm_send_mra_unknown_err", 24);
ib_cm_tracepoint!(tp_icm_send_rej, "icm_send_rej", 25);
ib_cm_tracepoint!(tp_icm_send_rep, "icm_send_rep", 26);
ib_cm_tracepoint!(tp_icm_send_rep_err, "icm_send_rep_err", 27);
ib_cm_tracepoint!(tp_icm_send_req, "icm_send_req", 28);
ib_cm_tracepoint!(tp_icm_send_rtu, "icm_send_rtu", 29);
ib_cm_tracepoint!(tp_icm_send_sidr_rep, "icm_send_sidr_rep", 30);
ib_cm_tracepoint!(tp_icm_send_sidr_req, "icm_send_sidr_req", 31);
ib_cm_tracepoint!(tp_icm_send_unknown_rej_err, "icm_send_unknown_rej_err", 32);
ib_cm_tracepoint!(tp_icm_staleconn_err, "icm_staleconn_err", 33);
