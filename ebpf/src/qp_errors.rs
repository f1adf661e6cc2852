//! Why a QP enters ERR: the async events consumers' handlers receive, and
//! soft-RoCE's error completions and its own moves to ERR. Entry-only
//! kprobes: each records the call as it begins.

use aya_ebpf::{macros::kprobe, programs::ProbeContext};
use qpwatch_common::{EventKind, QpEvent, RxeOffsets};

use crate::{emit, offsets, read_ptr, read_u32, read_u8, RXE_OFFSETS};

#[inline(always)]
fn event_at_entry(kind: EventKind) -> QpEvent {
    let mut event = crate::qp::new_event(kind);
    event.end_ns = event.start_ns;
    event
}

/// `void handler(struct ib_event *event, void *context)`: drivers call the
/// QP's `event_handler` directly (`qp->ibqp.event_handler(&ev, ...)`, e.g.
/// rxe's `req_next_wqe`, mlx5's `mlx5_ib_handle_qp_event`); ib_core has no
/// common function in between, so every consumer's handler is hooked.
#[inline(always)]
fn qp_async_event(ctx: &ProbeContext) {
    let Some(offsets) = offsets() else { return };
    if offsets.events_valid == 0 {
        return;
    }
    let ib_event: u64 = ctx.arg(0).unwrap_or(0);
    if ib_event == 0 {
        return;
    }
    let qp = read_ptr(ib_event, offsets.ib_event_element);
    if qp == 0 {
        return;
    }
    let mut event = event_at_entry(EventKind::QpAsyncEvent);
    event.detail = read_u32(ib_event, offsets.ib_event_event);
    crate::qp::qp_identity(&mut event, qp, &offsets);
    emit(&event);
}

/// One entry program per consumer's QP event handler.
macro_rules! qp_event_handlers {
    ($($(#[$doc:meta])* $program:ident => $function:literal,)*) => {
        $(
            $(#[$doc])*
            #[kprobe(function = $function)]
            pub fn $program(ctx: ProbeContext) -> u32 {
                qp_async_event(&ctx);
                0
            }
        )*
    };
}

qp_event_handlers! {
    /// Every QP created through uverbs (userspace), whatever the driver.
    qp_event_uverbs => "ib_uverbs_qp_event_handler",
    /// NVMe over RDMA, host side.
    qp_event_nvme_rdma => "nvme_rdma_qp_event",
    /// NVMe over RDMA, target side.
    qp_event_nvmet_rdma => "nvmet_rdma_qp_event",
    /// iSER initiator.
    qp_event_iser => "iser_qp_event_callback",
    /// iSER target.
    qp_event_isert => "isert_qp_event_callback",
    /// SRP initiator.
    qp_event_srp => "srp_qp_event",
    /// SRP target.
    qp_event_srpt => "srpt_qp_event",
    /// RDS over RDMA.
    qp_event_rds => "rds_ib_qp_event_handler",
    /// SMC-R.
    qp_event_smc => "smc_ib_qp_event_handler",
    /// IPoIB connected mode, receive QPs.
    qp_event_ipoib_cm_rx => "ipoib_cm_rx_event_handler",
}

#[inline(always)]
fn rxe_offsets() -> Option<RxeOffsets> {
    let offsets = RXE_OFFSETS.load();
    (offsets.valid != 0).then_some(offsets)
}

/// `int rxe_cq_post(struct rxe_cq *cq, struct rxe_cqe *cqe, int solicited)`:
/// soft-RoCE builds every completion in the kernel, of user QPs too. An
/// error status other than a flush is what sends the QP to ERR next
/// (`rxe_completer`: `do_complete()`, then `rxe_qp_error()`).
#[kprobe(function = "rxe_cq_post")]
pub fn rxe_completion(ctx: ProbeContext) -> u32 {
    let (Some(offsets), Some(rxe)) = (offsets(), rxe_offsets()) else {
        return 0;
    };
    let cq: u64 = ctx.arg(0).unwrap_or(0);
    let cqe: u64 = ctx.arg(1).unwrap_or(0);
    if cq == 0 || cqe == 0 {
        return 0;
    }
    let status = read_u32(cqe, rxe.rxe_cqe_status);
    if status == 0 || status == rxe.wc_flush_err {
        return 0;
    }
    let mut event = event_at_entry(EventKind::CompletionError);
    event.detail = status;
    let ibcq = cq + rxe.rxe_cq_ibcq as u64;
    if read_u8(cq, rxe.rxe_cq_is_user) != 0 {
        event.qp_num = read_u32(cqe, rxe.rxe_cqe_uibwc_qp_num);
        crate::read_device_name(
            read_ptr(ibcq, rxe.ib_cq_device),
            &offsets,
            &mut event.device,
        );
    } else {
        let qp = read_ptr(cqe, rxe.rxe_cqe_ibwc_qp);
        if qp == 0 {
            return 0;
        }
        crate::qp::qp_identity(&mut event, qp, &offsets);
    }
    emit(&event);
    0
}

/// `void rxe_qp_error(struct rxe_qp *qp)`: soft-RoCE moves the QP to ERR
/// after an error completion (`rxe_completer`) or a responder error
/// (`rxe_responder`). A modify to ERR does not come here: 6.1's
/// `rxe_qp_from_attr` has its own inlined copy.
#[kprobe(function = "rxe_qp_error")]
pub fn rxe_qp_error(ctx: ProbeContext) -> u32 {
    let (Some(offsets), Some(rxe)) = (offsets(), rxe_offsets()) else {
        return 0;
    };
    let qp: u64 = ctx.arg(0).unwrap_or(0);
    if qp == 0 {
        return 0;
    }
    let mut event = event_at_entry(EventKind::DeviceError);
    crate::qp::qp_identity(&mut event, qp + rxe.rxe_qp_ibqp as u64, &offsets);
    emit(&event);
    0
}
