//! RDMA vocabulary: QP states and types as the kernel numbers them, CM event
//! and errno names. They are defined once, in `qpwatch_common::vocab`, shared
//! with rdma-probe; the VM suite checks the tables against the running
//! kernel's BTF (below).

pub use qpwatch_common::vocab::{cm_event, cm_event_name, errno_label, Gid, QpState, QpType};

pub mod netlink;

/// Label value of a CM event's status: `0`, an errno name for negative
/// values, `reject_<n>` for IB CM reject reasons (positive, below 64).
pub fn cm_status_label(status: i32) -> String {
    match status {
        0 => "0".to_owned(),
        s if s < 0 => errno_label(s).to_owned(),
        s if s < 64 => format!("reject_{s}"),
        _ => "other".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cm_events_and_statuses() {
        assert_eq!(cm_event_name(cm_event::ESTABLISHED), "ESTABLISHED");
        assert_eq!(cm_event_name(99), "other");
        assert_eq!(cm_status_label(0), "0");
        assert_eq!(cm_status_label(-110), "ETIMEDOUT");
        assert_eq!(cm_status_label(28), "reject_28");
        assert_eq!(cm_status_label(1000), "other");
    }

    /// The QP tables against the running kernel's BTF (runs in the VM suite).
    #[test]
    fn tables_match_running_kernel_btf() {
        use crate::kernel::btf::Btf;
        use std::sync::Arc;
        let (Ok(vmlinux), Ok(ib_core)) = (
            std::fs::read("/sys/kernel/btf/vmlinux"),
            std::fs::read("/sys/kernel/btf/ib_core"),
        ) else {
            eprintln!("ib_core BTF not present; covered by the VM suite");
            return;
        };
        let base = Arc::new(Btf::parse(&vmlinux).unwrap());
        let ib_core = Btf::parse_split(&ib_core, base).unwrap();
        for (name, value) in ib_core.enum_values("ib_qp_state").unwrap() {
            let state = QpState::from_kernel(value as u32).unwrap();
            assert_eq!(name, format!("IB_QPS_{}", state.label()));
        }
        for (name, value) in ib_core.enum_values("ib_qp_type").unwrap() {
            let ty = QpType::from_kernel(value as u32);
            if ty != QpType::Other {
                assert_eq!(name, format!("IB_QPT_{}", ty.label()));
            }
        }
    }
}
