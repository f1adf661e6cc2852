//! RDMA vocabulary: QP states and types as the kernel numbers them, and errno names.
//!
//! `enum ib_qp_state` and `enum ib_qp_type` (include/rdma/ib_verbs.h) mirror the
//! uverbs ABI (`enum ib_uverbs_qp_state`, `IB_UVERBS_QPT_*` in
//! include/uapi/rdma/ib_user_verbs.h), so their values are fixed across kernels.
//! The VM suite checks these tables against the running kernel's BTF anyway.

use std::fmt;

pub mod netlink;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
    pub const ALL: [QpState; 7] = [
        QpState::Reset,
        QpState::Init,
        QpState::Rtr,
        QpState::Rts,
        QpState::Sqd,
        QpState::Sqe,
        QpState::Err,
    ];

    pub fn from_kernel(value: u32) -> Option<Self> {
        Self::ALL.get(value as usize).copied()
    }

    /// Label value, as `rdma res show qp` prints it.
    pub const fn label(self) -> &'static str {
        match self {
            QpState::Reset => "RESET",
            QpState::Init => "INIT",
            QpState::Rtr => "RTR",
            QpState::Rts => "RTS",
            QpState::Sqd => "SQD",
            QpState::Sqe => "SQE",
            QpState::Err => "ERR",
        }
    }

    pub fn from_label(label: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.label() == label)
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    Smi,
    Gsi,
    Rc,
    Uc,
    Ud,
    RawIpv6,
    RawEthertype,
    RawPacket,
    XrcIni,
    XrcTgt,
    Driver,
    /// Driver-internal or future types; one label for all of them.
    Other,
}

impl QpType {
    pub fn from_kernel(value: u32) -> Self {
        match value {
            0 => QpType::Smi,
            1 => QpType::Gsi,
            2 => QpType::Rc,
            3 => QpType::Uc,
            4 => QpType::Ud,
            5 => QpType::RawIpv6,
            6 => QpType::RawEthertype,
            8 => QpType::RawPacket,
            9 => QpType::XrcIni,
            10 => QpType::XrcTgt,
            0xff => QpType::Driver,
            _ => QpType::Other,
        }
    }

    /// Label value, as `rdma res show qp` prints it.
    pub const fn label(self) -> &'static str {
        match self {
            QpType::Smi => "SMI",
            QpType::Gsi => "GSI",
            QpType::Rc => "RC",
            QpType::Uc => "UC",
            QpType::Ud => "UD",
            QpType::RawIpv6 => "RAW_IPV6",
            QpType::RawEthertype => "RAW_ETHERTYPE",
            QpType::RawPacket => "RAW_PACKET",
            QpType::XrcIni => "XRC_INI",
            QpType::XrcTgt => "XRC_TGT",
            QpType::Driver => "DRIVER",
            QpType::Other => "other",
        }
    }

    pub fn from_label(label: &str) -> Self {
        [
            QpType::Smi,
            QpType::Gsi,
            QpType::Rc,
            QpType::Uc,
            QpType::Ud,
            QpType::RawIpv6,
            QpType::RawEthertype,
            QpType::RawPacket,
            QpType::XrcIni,
            QpType::XrcTgt,
            QpType::Driver,
        ]
        .into_iter()
        .find(|t| t.label() == label)
        .unwrap_or(QpType::Other)
    }
}

impl fmt::Display for QpType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// `enum rdma_cm_event_type` (include/rdma/rdma_cm.h). ucma hands these values
/// to userspace unchanged (`uevent->resp.event`), so librdmacm's ABI fixes them.
pub const CM_EVENT_NAMES: [&str; 16] = [
    "ADDR_RESOLVED",
    "ADDR_ERROR",
    "ROUTE_RESOLVED",
    "ROUTE_ERROR",
    "CONNECT_REQUEST",
    "CONNECT_RESPONSE",
    "CONNECT_ERROR",
    "UNREACHABLE",
    "REJECTED",
    "ESTABLISHED",
    "DISCONNECTED",
    "DEVICE_REMOVAL",
    "MULTICAST_JOIN",
    "MULTICAST_ERROR",
    "ADDR_CHANGE",
    "TIMEWAIT_EXIT",
];

pub fn cm_event_name(event: u32) -> &'static str {
    CM_EVENT_NAMES
        .get(event as usize)
        .copied()
        .unwrap_or("other")
}

pub mod cm_event {
    pub const ADDR_RESOLVED: u32 = 0;
    pub const ADDR_ERROR: u32 = 1;
    pub const ROUTE_RESOLVED: u32 = 2;
    pub const ROUTE_ERROR: u32 = 3;
    pub const CONNECT_REQUEST: u32 = 4;
    pub const CONNECT_RESPONSE: u32 = 5;
    pub const CONNECT_ERROR: u32 = 6;
    pub const UNREACHABLE: u32 = 7;
    pub const REJECTED: u32 = 8;
    pub const ESTABLISHED: u32 = 9;
    pub const DISCONNECTED: u32 = 10;
}

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

/// Label value for a negative kernel return code: `EINVAL`, `ENOMEM`, ...
/// Bounded: errnos are below 4096 and unknown ones share one label.
pub fn errno_label(rc: i32) -> &'static str {
    match rc.unsigned_abs() {
        1 => "EPERM",
        2 => "ENOENT",
        4 => "EINTR",
        5 => "EIO",
        11 => "EAGAIN",
        12 => "ENOMEM",
        13 => "EACCES",
        14 => "EFAULT",
        16 => "EBUSY",
        17 => "EEXIST",
        19 => "ENODEV",
        22 => "EINVAL",
        24 => "EMFILE",
        28 => "ENOSPC",
        34 => "ERANGE",
        38 => "ENOSYS",
        61 => "ENODATA",
        71 => "EPROTO",
        95 => "EOPNOTSUPP",
        97 => "EAFNOSUPPORT",
        98 => "EADDRINUSE",
        99 => "EADDRNOTAVAIL",
        101 => "ENETUNREACH",
        103 => "ECONNABORTED",
        104 => "ECONNRESET",
        107 => "ENOTCONN",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        113 => "EHOSTUNREACH",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for (i, s) in QpState::ALL.iter().enumerate() {
            assert_eq!(QpState::from_kernel(i as u32), Some(*s));
            assert_eq!(QpState::from_label(s.label()), Some(*s));
        }
        assert_eq!(QpState::from_kernel(7), None);
    }

    #[test]
    fn cm_events_and_statuses() {
        assert_eq!(cm_event_name(cm_event::ESTABLISHED), "ESTABLISHED");
        assert_eq!(cm_event_name(99), "other");
        assert_eq!(cm_status_label(0), "0");
        assert_eq!(cm_status_label(-110), "ETIMEDOUT");
        assert_eq!(cm_status_label(28), "reject_28");
        assert_eq!(cm_status_label(1000), "other");
    }

    #[test]
    fn types_and_errnos() {
        assert_eq!(QpType::from_kernel(2), QpType::Rc);
        assert_eq!(QpType::from_kernel(7), QpType::Other);
        assert_eq!(QpType::from_kernel(0x1000), QpType::Other);
        assert_eq!(QpType::from_label("UD"), QpType::Ud);
        assert_eq!(errno_label(-22), "EINVAL");
        assert_eq!(errno_label(-4000), "other");
    }

    /// The tables above against the running kernel's BTF (runs in the VM suite).
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
