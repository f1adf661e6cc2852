//! The library's error type: every failed verbs, rdma_cm or OS call names the
//! call and its errno.

use std::fmt;
use std::time::Duration;

use qpwatch_common::vocab::{errno_name, CmEventKind};

use crate::step::Step;

/// An errno value printed as `ENAME (n): description`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

impl Errno {
    /// errno of the last failed libc/librdmacm/libibverbs call on this thread.
    pub fn last() -> Errno {
        Errno(std::io::Error::last_os_error().raw_os_error().unwrap_or(0))
    }

    /// Symbolic name (`"ETIMEDOUT"`), for the errnos RDMA calls return.
    pub fn name(self) -> Option<&'static str> {
        errno_name(self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = std::io::Error::from_raw_os_error(self.0).to_string();
        let text = text.split(" (os error").next().unwrap_or(&text);
        match self.name() {
            Some(name) => write!(f, "{name} ({}): {text}", self.0),
            None => write!(f, "errno {}: {text}", self.0),
        }
    }
}

/// Everything that can go wrong in a probe or in the responder.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A libibverbs call failed.
    #[error("{call} failed: {errno}")]
    Verbs { call: &'static str, errno: Errno },
    /// A librdmacm call failed.
    #[error("{call} failed: {errno}")]
    Cm { call: &'static str, errno: Errno },
    /// A libc call (poll, eventfd, fcntl) failed.
    #[error("{call} failed: {errno}")]
    Os { call: &'static str, errno: Errno },
    /// A step did not finish within its timeout.
    #[error("{step}: no answer within {} ms", timeout.as_millis())]
    Timeout { step: Step, timeout: Duration },
    /// rdma_cm reported something other than what the step waits for
    /// (`status` is the event's status: a negative errno, or the CM reject
    /// reason for REJECTED).
    #[error("{step}: expected {expected}, got {got} (status {status})")]
    CmEvent {
        step: Step,
        expected: CmEventKind,
        got: CmEventKind,
        status: i32,
    },
    /// The peer disconnected while the connection was in use.
    #[error("{step}: the peer disconnected (RDMA_CM_EVENT_DISCONNECTED)")]
    PeerDisconnected { step: Step },
    /// A work request completed with an error status.
    #[error("{step}: {opcode} completion failed: {status_text} (status {status}, vendor_err {vendor_err:#x})")]
    WorkCompletion {
        step: Step,
        opcode: &'static str,
        status: u32,
        status_text: String,
        vendor_err: u32,
    },
    /// The echo did not carry the ping it should answer.
    #[error("ping {seq}: bad echo: {detail}")]
    BadEcho { seq: u64, detail: String },
    /// The address resolved to another RDMA device than the one asked for.
    #[error("{target} resolves to device {actual}, not {requested}")]
    DeviceMismatch {
        target: std::net::SocketAddr,
        requested: String,
        actual: String,
    },
    /// A target or listen address that is not `IP[:PORT]`.
    #[error("invalid address {input:?}: {reason}")]
    InvalidAddress { input: String, reason: &'static str },
    /// A configuration value out of range.
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The probe was told to fail here (fault injection for tests).
    #[error("injected failure after {0}")]
    Injected(Step),
}

impl Error {
    pub(crate) fn verbs(call: &'static str) -> Error {
        Error::Verbs {
            call,
            errno: Errno::last(),
        }
    }

    /// For verbs calls that return the errno instead of setting it
    /// (ibv_modify_qp, ibv_post_send, ...).
    pub(crate) fn verbs_rc(call: &'static str, rc: i32) -> Error {
        Error::Verbs {
            call,
            errno: Errno(rc.abs()),
        }
    }

    pub(crate) fn cm(call: &'static str) -> Error {
        Error::Cm {
            call,
            errno: Errno::last(),
        }
    }

    pub(crate) fn os(call: &'static str) -> Error {
        Error::Os {
            call,
            errno: Errno::last(),
        }
    }

    /// The errno behind the error, if there is one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Verbs { errno, .. } | Error::Cm { errno, .. } | Error::Os { errno, .. } => {
                Some(errno.0)
            }
            Error::CmEvent { status, got, .. } if *got != CmEventKind::Rejected && *status < 0 => {
                Some(-status)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_display_names_the_constant() {
        assert_eq!(
            Errno(libc::ETIMEDOUT).to_string(),
            "ETIMEDOUT (110): Connection timed out"
        );
        assert_eq!(Errno(4095).to_string(), "errno 4095: Unknown error 4095");
    }

    /// The shared table's numbering is this target's.
    #[test]
    fn errno_names_match_libc() {
        let names = [
            (libc::EPERM, "EPERM"),
            (libc::ENOENT, "ENOENT"),
            (libc::EINTR, "EINTR"),
            (libc::EIO, "EIO"),
            (libc::ENXIO, "ENXIO"),
            (libc::EAGAIN, "EAGAIN"),
            (libc::ENOMEM, "ENOMEM"),
            (libc::EACCES, "EACCES"),
            (libc::EFAULT, "EFAULT"),
            (libc::EBUSY, "EBUSY"),
            (libc::EEXIST, "EEXIST"),
            (libc::ENODEV, "ENODEV"),
            (libc::EINVAL, "EINVAL"),
            (libc::EMFILE, "EMFILE"),
            (libc::ENOSPC, "ENOSPC"),
            (libc::ERANGE, "ERANGE"),
            (libc::ENOSYS, "ENOSYS"),
            (libc::ENODATA, "ENODATA"),
            (libc::EPROTO, "EPROTO"),
            (libc::EOPNOTSUPP, "EOPNOTSUPP"),
            (libc::EAFNOSUPPORT, "EAFNOSUPPORT"),
            (libc::EADDRINUSE, "EADDRINUSE"),
            (libc::EADDRNOTAVAIL, "EADDRNOTAVAIL"),
            (libc::ENETDOWN, "ENETDOWN"),
            (libc::ENETUNREACH, "ENETUNREACH"),
            (libc::ECONNABORTED, "ECONNABORTED"),
            (libc::ECONNRESET, "ECONNRESET"),
            (libc::ENOBUFS, "ENOBUFS"),
            (libc::ENOTCONN, "ENOTCONN"),
            (libc::ETIMEDOUT, "ETIMEDOUT"),
            (libc::ECONNREFUSED, "ECONNREFUSED"),
            (libc::EHOSTUNREACH, "EHOSTUNREACH"),
        ];
        for (errno, name) in names {
            assert_eq!(Errno(errno).name(), Some(name));
        }
        let named = (1..4096).filter(|e| Errno(*e).name().is_some()).count();
        assert_eq!(named, names.len());
    }

    #[test]
    fn call_errors_name_call_and_errno() {
        let err = Error::verbs_rc("ibv_modify_qp", libc::EINVAL);
        assert_eq!(
            err.to_string(),
            "ibv_modify_qp failed: EINVAL (22): Invalid argument"
        );
        assert_eq!(err.errno(), Some(libc::EINVAL));
        let err = Error::CmEvent {
            step: Step::AddrResolve,
            expected: CmEventKind::AddrResolved,
            got: CmEventKind::AddrError,
            status: -libc::ENETUNREACH,
        };
        assert_eq!(err.errno(), Some(libc::ENETUNREACH));
        let rejected = Error::CmEvent {
            step: Step::Connect,
            expected: CmEventKind::ConnectResponse,
            got: CmEventKind::Rejected,
            status: 8,
        };
        assert_eq!(rejected.errno(), None);
    }
}
