//! RDMA CM events: `enum rdma_cm_event_type` (include/rdma/rdma_cm.h). ucma
//! hands these values to userspace unchanged (`uevent->resp.event`), so
//! librdmacm's ABI fixes them; rdma-probe's tests check them against rdma-sys.

use core::fmt;

/// One list makes the value constants, [`CmEventKind`] and its names.
macro_rules! cm_events {
    ($($value:literal $variant:ident $name:ident,)*) => {
        $(pub const $name: u32 = $value;)*

        /// An `enum rdma_cm_event_type` value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum CmEventKind {
            $($variant,)*
            /// A value this list does not name.
            Other(u32),
        }

        impl CmEventKind {
            /// Every named event, in the kernel's numbering.
            pub const KNOWN: [CmEventKind; [$($value),*].len()] = [$(CmEventKind::$variant),*];

            pub const fn from_raw(raw: u32) -> CmEventKind {
                match raw {
                    $($value => CmEventKind::$variant,)*
                    other => CmEventKind::Other(other),
                }
            }

            pub const fn raw(self) -> u32 {
                match self {
                    $(CmEventKind::$variant => $value,)*
                    CmEventKind::Other(raw) => raw,
                }
            }

            /// Label value (`ESTABLISHED`); `other` for unnamed values.
            pub const fn label(self) -> &'static str {
                match self {
                    $(CmEventKind::$variant => stringify!($name),)*
                    CmEventKind::Other(_) => "other",
                }
            }

            /// The name `rdma_event_str` gives (`RDMA_CM_EVENT_ESTABLISHED`).
            pub const fn name(self) -> &'static str {
                match self {
                    $(CmEventKind::$variant => concat!("RDMA_CM_EVENT_", stringify!($name)),)*
                    CmEventKind::Other(_) => "RDMA_CM_EVENT_UNKNOWN",
                }
            }
        }
    };
}

cm_events! {
    0 AddrResolved ADDR_RESOLVED,
    1 AddrError ADDR_ERROR,
    2 RouteResolved ROUTE_RESOLVED,
    3 RouteError ROUTE_ERROR,
    4 ConnectRequest CONNECT_REQUEST,
    5 ConnectResponse CONNECT_RESPONSE,
    6 ConnectError CONNECT_ERROR,
    7 Unreachable UNREACHABLE,
    8 Rejected REJECTED,
    9 Established ESTABLISHED,
    10 Disconnected DISCONNECTED,
    11 DeviceRemoval DEVICE_REMOVAL,
    12 MulticastJoin MULTICAST_JOIN,
    13 MulticastError MULTICAST_ERROR,
    14 AddrChange ADDR_CHANGE,
    15 TimewaitExit TIMEWAIT_EXIT,
}

/// Label value of an event number: `ESTABLISHED`, or `other`.
pub const fn cm_event_name(event: u32) -> &'static str {
    CmEventKind::from_raw(event).label()
}

impl fmt::Display for CmEventKind {
    /// `RDMA_CM_EVENT_REJECTED`; `RDMA_CM_EVENT 99` for unnamed values.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmEventKind::Other(raw) => write!(f, "RDMA_CM_EVENT {raw}"),
            kind => f.write_str(kind.name()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbering_and_names() {
        for (i, kind) in CmEventKind::KNOWN.into_iter().enumerate() {
            assert_eq!(kind.raw(), i as u32);
            assert_eq!(CmEventKind::from_raw(i as u32), kind);
        }
        assert_eq!(CmEventKind::KNOWN.len(), 16);
        assert_eq!(cm_event_name(ESTABLISHED), "ESTABLISHED");
        assert_eq!(cm_event_name(TIMEWAIT_EXIT), "TIMEWAIT_EXIT");
        assert_eq!(cm_event_name(99), "other");
        assert_eq!(CmEventKind::from_raw(99), CmEventKind::Other(99));
        assert_eq!(CmEventKind::Other(99).raw(), 99);
        assert_eq!(CmEventKind::Rejected.name(), "RDMA_CM_EVENT_REJECTED");
    }
}
