//! errno names, for the errnos RDMA calls return.
//!
//! The numbers are those of include/uapi/asm-generic/errno-base.h and
//! errno.h, which x86-64 and arm64 use; rdma-probe's tests check them
//! against libc on the build target.

/// `"ETIMEDOUT"` for 110 or -110 (kernel return codes are negative errnos).
pub const fn errno_name(errno: i32) -> Option<&'static str> {
    Some(match errno.unsigned_abs() {
        1 => "EPERM",
        2 => "ENOENT",
        4 => "EINTR",
        5 => "EIO",
        6 => "ENXIO",
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
        100 => "ENETDOWN",
        101 => "ENETUNREACH",
        103 => "ECONNABORTED",
        104 => "ECONNRESET",
        105 => "ENOBUFS",
        107 => "ENOTCONN",
        110 => "ETIMEDOUT",
        111 => "ECONNREFUSED",
        113 => "EHOSTUNREACH",
        _ => return None,
    })
}

/// Label value for a kernel return code: `EINVAL`, `ENOMEM`, ... Bounded:
/// the errnos without a name share one label, `other`.
pub const fn errno_label(rc: i32) -> &'static str {
    match errno_name(rc) {
        Some(name) => name,
        None => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_labels() {
        assert_eq!(errno_name(22), Some("EINVAL"));
        assert_eq!(errno_name(-110), Some("ETIMEDOUT"));
        assert_eq!(errno_name(0), None);
        assert_eq!(errno_name(i32::MIN), None);
        assert_eq!(errno_label(-22), "EINVAL");
        assert_eq!(errno_label(-4000), "other");
        assert_eq!(errno_label(0), "other");
    }
}
