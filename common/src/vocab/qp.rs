//! QP states and types.
//!
//! `enum ib_qp_state` and `enum ib_qp_type` (include/rdma/ib_verbs.h) mirror the
//! uverbs ABI (`enum ib_uverbs_qp_state`, `IB_UVERBS_QPT_*` in
//! include/uapi/rdma/ib_user_verbs.h), and libibverbs' `enum ibv_qp_state`
//! has the same values, so the numbering is fixed across kernels and
//! libraries. The agent's VM suite checks it against the running kernel's
//! BTF, rdma-probe's tests against rdma-sys.

use core::fmt;

/// `enum ib_qp_state` / `enum ibv_qp_state`, declared in the kernel's order:
/// the discriminant is the kernel's value.
#[repr(u32)]
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
    /// In the kernel's numbering: `ALL[n]` is state n.
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

    /// The kernel's (and libibverbs') value.
    pub const fn to_kernel(self) -> u32 {
        self as u32
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

/// `enum ib_qp_type`.
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
    /// Every named type (not [`QpType::Other`]).
    pub const KNOWN: [QpType; 11] = [
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
    ];

    pub const fn from_kernel(value: u32) -> Self {
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
        Self::KNOWN
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_round_trip() {
        for (i, s) in QpState::ALL.iter().enumerate() {
            assert_eq!(QpState::from_kernel(i as u32), Some(*s));
            assert_eq!(s.to_kernel(), i as u32);
            assert_eq!(QpState::from_label(s.label()), Some(*s));
        }
        assert_eq!(QpState::from_kernel(7), None);
        assert_eq!(QpState::from_label("rts"), None);
    }

    #[test]
    fn types_round_trip() {
        assert_eq!(QpType::from_kernel(2), QpType::Rc);
        assert_eq!(QpType::from_kernel(7), QpType::Other);
        assert_eq!(QpType::from_kernel(0x1000), QpType::Other);
        assert_eq!(QpType::from_label("UD"), QpType::Ud);
        assert_eq!(QpType::from_label("bogus"), QpType::Other);
        for ty in QpType::KNOWN {
            assert_eq!(QpType::from_label(ty.label()), ty);
        }
    }
}
