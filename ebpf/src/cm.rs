//! RDMA CM programs: kprobe/kretprobe pairs and entry kprobes on rdma_cm /
//! rdma_ucm functions, and counters on the `ib_cma:*` tracepoints (an opt-in
//! group: a tracepoint attachment holds its module, a kprobe does not).
//!
//! Every CM record carries the id's `res.id` (the id `rdma res show cm_id`
//! prints) and, for kprobes, the `rdma_id_private` address, which identifies
//! an id before it is attached to a device.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{kprobe, kretprobe, map, raw_tracepoint},
    maps::{LruHashMap, PerCpuArray},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
    Global,
};
use qpwatch_common::{
    ib_cm_slot, CmEvent, CmOffsets, CmOp, EventKind, KernelOffsets, PendingKey, CM_FLAG_ATTACHED,
    CM_FLAG_CONN_PARAM, CM_FLAG_HAS_QP, CM_FLAG_STATE, CM_FLAG_STATE_AFTER, CM_FLAG_USER,
    IB_CM_TRACEPOINTS,
};

use crate::{
    begin, current_comm, emit, finish, now_ns, offsets, read_device_name, read_ptr, read_u32,
    read_u8, Pending,
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

/// Writes a new record of `op` by `pid_tgid`, beginning now, into `event`.
#[inline(always)]
fn init_cm_event(event: &mut CmEvent, op: CmOp, pid_tgid: u64) {
    *event = CmEvent::zeroed();
    event.kind = EventKind::Cm as u32;
    event.op = op as u32;
    event.start_ns = now_ns();
    event.end_ns = event.start_ns;
    event.pid_tgid = pid_tgid;
    current_comm(&mut event.comm);
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
    begin(ctx, &CM_PENDING, op.hook(), |event, pid_tgid| {
        init_cm_event(event, op, pid_tgid);
        describe_id(event, id_priv, &k, &c);
        if id_priv != 0 {
            event.state = read_u32(id_priv, c.id_priv_state);
            event.flags |= CM_FLAG_STATE;
        }
        fill(event, &k, &c);
    });
}

/// `only_with_qp`: drop the record when the id had no kernel QP at entry (the
/// cma_*_qp helpers return early for userspace ids).
#[inline(always)]
fn finish_cm(ctx: &RetProbeContext, op: CmOp, only_with_qp: bool) {
    let Some((k, c)) = cm_offsets() else { return };
    let rc: u64 = ctx.ret();
    finish(ctx, &CM_PENDING, op.hook(), |event| {
        event.end_ns = now_ns();
        let had_qp = event.flags & CM_FLAG_HAS_QP != 0;
        event.rc = rc as i32;
        let id_priv = event.id_ptr;
        if id_priv != 0 {
            describe_id(event, id_priv, &k, &c);
            event.state_after = read_u32(id_priv, c.id_priv_state);
            event.flags |= CM_FLAG_STATE_AFTER;
        }
        if had_qp || !only_with_qp {
            emit(&*event);
        }
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

/// The programs of one [`CmOp`]: a kprobe and kretprobe pair on `$function`
/// (`$begin(&ctx, op)` records the call at entry, the return completes it;
/// `$only_with_qp`: see [`finish_cm`]), or, with `entry`, a kprobe alone that
/// emits the record at once, about the id `$id_priv(&ctx)`. `$function` must
/// be the op's ([`CmOp::function`]): checked at compile time.
macro_rules! cm_hook {
    (
        $op:ident on $function:literal:
        $entry:ident, $ret:ident, $begin:ident, $only_with_qp:expr
    ) => {
        cm_hook!(@check $op $function);

        #[kprobe(function = $function)]
        pub fn $entry(ctx: ProbeContext) -> u32 {
            $begin(&ctx, CmOp::$op);
            0
        }

        #[kretprobe(function = $function)]
        pub fn $ret(ctx: RetProbeContext) -> u32 {
            finish_cm(&ctx, CmOp::$op, $only_with_qp);
            0
        }
    };
    ($op:ident on $function:literal: entry $entry:ident, $id_priv:ident) => {
        cm_hook!(@check $op $function);

        #[kprobe(function = $function)]
        pub fn $entry(ctx: ProbeContext) -> u32 {
            cm_entry_hit(CmOp::$op, $id_priv(&ctx));
            0
        }
    };
    (@check $op:ident $function:literal) => {
        const _: () = assert!(
            CmOp::$op.is_function($function),
            concat!("CmOp::", stringify!($op), " names another function than ", $function)
        );
    };
}

/// The first argument, a `struct rdma_id_private *`.
#[inline(always)]
fn id_priv_arg(ctx: &ProbeContext) -> u64 {
    ctx.arg(0).unwrap_or(0)
}

/// The first argument, a `struct rdma_cm_id *`: the id embedded in its
/// rdma_id_private.
#[inline(always)]
fn cm_id_arg(ctx: &ProbeContext) -> u64 {
    id_priv_of(ctx.arg(0).unwrap_or(0))
}

#[inline(always)]
fn begin_cm_id(ctx: &ProbeContext, op: CmOp) {
    begin_cm(ctx, op, cm_id_arg(ctx), |_, _, _| {});
}

#[inline(always)]
fn begin_id_priv(ctx: &ProbeContext, op: CmOp) {
    begin_cm(ctx, op, id_priv_arg(ctx), |_, _, _| {});
}

// int rdma_resolve_addr(struct rdma_cm_id *id, ...) and friends: the first
// argument is the embedded `struct rdma_cm_id`.
cm_hook!(ResolveAddr on "rdma_resolve_addr":
    cm_resolve_addr, cm_resolve_addr_ret, begin_cm_id, false);
cm_hook!(ResolveRoute on "rdma_resolve_route":
    cm_resolve_route, cm_resolve_route_ret, begin_cm_id, false);
cm_hook!(Listen on "rdma_listen": cm_listen, cm_listen_ret, begin_cm_id, false);
// int rdma_connect_locked(struct rdma_cm_id *id, struct rdma_conn_param *):
// the REQ (or SIDR REQ) goes out inside it (cma_connect_ib,
// cma_resolve_ib_udp); rdma_connect() and librdmacm's connect end here.
cm_hook!(Connect on "rdma_connect_locked": cm_connect, cm_connect_ret, begin_cm_id, false);
cm_hook!(Reject on "rdma_reject": cm_reject, cm_reject_ret, begin_cm_id, false);
// int rdma_disconnect(struct rdma_cm_id *id): sends the DREQ, or the DREP
// to the peer's DREQ.
cm_hook!(Disconnect on "rdma_disconnect": cm_disconnect, cm_disconnect_ret, begin_cm_id, false);

// The static cma_*_qp helpers of drivers/infiniband/core/cma.c take the
// rdma_id_private itself. cma_init_{conn,ud}_qp get the new QP as an argument
// (rdma_create_qp() sets id->qp only after them); the cma_modify_qp_* ones
// return early for ids without a kernel QP, i.e. every userspace id.
cm_hook!(InitConnQp on "cma_init_conn_qp":
    cm_init_conn_qp, cm_init_conn_qp_ret, begin_id_priv, false);
cm_hook!(InitUdQp on "cma_init_ud_qp": cm_init_ud_qp, cm_init_ud_qp_ret, begin_id_priv, false);
// static int cma_rep_recv(struct rdma_id_private *id_priv): the active side
// moves its kernel QP to RTR and RTS (if it has one) and sends the RTU; on
// failure it rejects. From cma_ib_handler for kernel consumers, from
// rdma_accept() without parameters for librdmacm after CONNECT_RESPONSE.
cm_hook!(RepRecv on "cma_rep_recv": cm_rep_recv, cm_rep_recv_ret, begin_id_priv, false);
cm_hook!(ModifyQpRtr on "cma_modify_qp_rtr":
    cm_modify_qp_rtr, cm_modify_qp_rtr_ret, begin_id_priv, true);
cm_hook!(ModifyQpRts on "cma_modify_qp_rts":
    cm_modify_qp_rts, cm_modify_qp_rts_ret, begin_id_priv, true);
cm_hook!(ModifyQpErr on "cma_modify_qp_err":
    cm_modify_qp_err, cm_modify_qp_err_ret, begin_id_priv, true);

/// `int rdma_create_qp(struct rdma_cm_id *id, struct ib_pd *pd,
///     struct ib_qp_init_attr *qp_init_attr)`; `id_priv->qp_num` is set on success.
#[inline(always)]
fn begin_create_qp(ctx: &ProbeContext, op: CmOp) {
    let pd: u64 = ctx.arg(1).unwrap_or(0);
    let init_attr: u64 = ctx.arg(2).unwrap_or(0);
    begin_cm(ctx, op, cm_id_arg(ctx), |event, k, _| {
        event.qp_type = read_u32(init_attr, k.ib_qp_init_attr_qp_type);
        if event.device[0] == 0 && pd != 0 {
            read_device_name(read_ptr(pd, k.ib_pd_device), k, &mut event.device);
        }
    });
}
cm_hook!(CreateQp on "rdma_create_qp": cm_create_qp, cm_create_qp_ret, begin_create_qp, false);

/// `int rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param
/// *conn_param)`: with parameters, the passive side's REP (cma_accept_ib;
/// `id_priv->qp_num` is the userspace QP's); without, the active side's
/// cma_rep_recv (librdmacm after CONNECT_RESPONSE).
#[inline(always)]
fn begin_accept(ctx: &ProbeContext, op: CmOp) {
    let conn_param: u64 = ctx.arg(1).unwrap_or(0);
    begin_cm(ctx, op, cm_id_arg(ctx), |event, _, _| {
        if conn_param != 0 {
            event.flags |= CM_FLAG_CONN_PARAM;
        }
    });
}
cm_hook!(Accept on "rdma_accept": cm_accept, cm_accept_ret, begin_accept, false);

/// `static int cma_cm_event_handler(struct rdma_id_private *id_priv,
///     struct rdma_cm_event *event)`: every RDMA CM event goes through it to
/// the consumer's handler (ucma for userspace ids); the return is the
/// consumer's result. (The rdma_cma:cm_event_handler tracepoint would pin
/// rdma_cm, and fires a second time, for the wildcard listener, from
/// cma_listen_handler when a connection request reaches a per-device listener.)
#[inline(always)]
fn begin_cm_event(ctx: &ProbeContext, op: CmOp) {
    begin_with_cm_event(ctx, op, id_priv_arg(ctx));
}

/// The entry of a handler whose second argument is a `struct rdma_cm_event *`.
#[inline(always)]
fn begin_with_cm_event(ctx: &ProbeContext, op: CmOp, id_priv: u64) {
    let event_ptr: u64 = ctx.arg(1).unwrap_or(0);
    begin_cm(ctx, op, id_priv, |event, _, c| {
        event.event = read_u32(event_ptr, c.cm_event_event);
        event.status = read_u32(event_ptr, c.cm_event_status) as i32;
    });
}
cm_hook!(EventHandler on "cma_cm_event_handler":
    cm_event_handler, cm_event_handler_ret, begin_cm_event, false);

/// `static int ucma_event_handler(struct rdma_cm_id *cm_id,
///     struct rdma_cm_event *event)` in rdma_ucm.
#[inline(always)]
fn begin_ucma_event(ctx: &ProbeContext, op: CmOp) {
    begin_with_cm_event(ctx, op, cm_id_arg(ctx));
}
cm_hook!(UcmaHandler on "ucma_event_handler":
    cm_ucma_handler, cm_ucma_handler_ret, begin_ucma_event, false);

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
cm_hook!(IbHandler on "cma_ib_handler": cm_ib_handler, cm_ib_handler_ret, begin_ib_handler, false);
cm_hook!(IbReqHandler on "cma_ib_req_handler":
    cm_ib_req_handler, cm_ib_req_handler_ret, begin_ib_handler, false);

/// A function hooked at entry only: the record is emitted there, with the
/// id as the function finds it.
#[inline(always)]
fn cm_entry_hit(op: CmOp, id_priv: u64) {
    let Some((k, c)) = cm_offsets() else { return };
    let mut event = CmEvent::zeroed();
    init_cm_event(&mut event, op, bpf_get_current_pid_tgid());
    describe_id(&mut event, id_priv, &k, &c);
    if id_priv != 0 {
        event.state = read_u32(id_priv, c.id_priv_state);
        event.flags |= CM_FLAG_STATE;
    }
    emit(&event);
}

// static void _destroy_id(struct rdma_id_private *id_priv, enum
// rdma_cm_state state): every id ends here, destroyed by its owner
// (rdma_destroy_id), by the CMA when a handler returned non-zero, or on
// device removal.
cm_hook!(DestroyId on "_destroy_id": entry cm_destroy_id, id_priv_arg);
// void rdma_destroy_qp(struct rdma_cm_id *id): a kernel consumer's QP
// leaves its id (the QP itself is destroyed through ib_destroy_qp).
cm_hook!(DestroyQp on "rdma_destroy_qp": entry cm_destroy_qp, cm_id_arg);

/// One raw tracepoint program per line of `ib_cm_tracepoints!`, counting in
/// the tracepoint's slot of `IB_CM_HITS`.
macro_rules! ib_cm_programs {
    ($($program:ident => $tracepoint:literal,)*) => {$(
        #[raw_tracepoint(tracepoint = $tracepoint)]
        pub fn $program(_ctx: RawTracePointContext) -> i32 {
            const SLOT: usize = ib_cm_slot($tracepoint);
            if let Some(hits) = IB_CM_HITS.get_ptr_mut(0) {
                // SAFETY: per-CPU slot.
                unsafe { (*hits)[SLOT] += 1 };
            }
            0
        }
    )*};
}
qpwatch_common::ib_cm_tracepoints!(ib_cm_programs);
