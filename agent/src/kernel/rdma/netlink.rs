//! The kernel's own view of RDMA resources, over RDMA netlink (nldev): the data
//! `rdma res show qp` and `rdma res show cm_id` print, and the network
//! namespace mode `rdma system show` prints. Used to reconcile QPs and CM ids
//! that existed before the agent started.
//!
//! A small hand-written client: RDMA netlink has no family header and a handful
//! of attributes, and the uapi numbers below (include/uapi/rdma/rdma_netlink.h)
//! are ABI.

use std::{io, mem::size_of};

use thiserror::Error;

const NETLINK_RDMA: libc::c_int = 20;
const RDMA_NL_NLDEV: u16 = 5;
const RDMA_NLDEV_CMD_GET: u16 = 1;
const RDMA_NLDEV_CMD_RES_QP_GET: u16 = 10;
const RDMA_NLDEV_CMD_RES_CM_ID_GET: u16 = 11;
const RDMA_NLDEV_CMD_SYS_GET: u16 = 6;

const ATTR_DEV_INDEX: u16 = 1;
const ATTR_DEV_NAME: u16 = 2;
const ATTR_PORT_INDEX: u16 = 3;
const ATTR_RES_QP: u16 = 19;
const ATTR_RES_QP_ENTRY: u16 = 20;
const ATTR_RES_LQPN: u16 = 21;
const ATTR_RES_TYPE: u16 = 26;
const ATTR_RES_STATE: u16 = 27;
const ATTR_RES_PID: u16 = 28;
const ATTR_RES_KERN_NAME: u16 = 29;
const ATTR_RES_CM_ID: u16 = 30;
const ATTR_RES_CM_ID_ENTRY: u16 = 31;
const ATTR_RES_PS: u16 = 32;
const ATTR_RES_CM_IDN: u16 = 63;
/// `RDMA_NLDEV_SYS_ATTR_NETNS_MODE` (u8): `ib_devices_shared_netns`.
const ATTR_SYS_NETNS_MODE: u16 = 66;

/// The uapi numbers above by their kernel names (`enum rdma_nldev_command`,
/// `enum rdma_nldev_attr`), for the VM suite to check against the running
/// kernel's BTF.
#[cfg(test)]
pub(crate) const UAPI: &[(&str, u16)] = &[
    ("RDMA_NLDEV_CMD_GET", RDMA_NLDEV_CMD_GET),
    ("RDMA_NLDEV_CMD_RES_QP_GET", RDMA_NLDEV_CMD_RES_QP_GET),
    ("RDMA_NLDEV_CMD_RES_CM_ID_GET", RDMA_NLDEV_CMD_RES_CM_ID_GET),
    ("RDMA_NLDEV_CMD_SYS_GET", RDMA_NLDEV_CMD_SYS_GET),
    ("RDMA_NLDEV_ATTR_DEV_INDEX", ATTR_DEV_INDEX),
    ("RDMA_NLDEV_ATTR_DEV_NAME", ATTR_DEV_NAME),
    ("RDMA_NLDEV_ATTR_PORT_INDEX", ATTR_PORT_INDEX),
    ("RDMA_NLDEV_ATTR_RES_QP", ATTR_RES_QP),
    ("RDMA_NLDEV_ATTR_RES_QP_ENTRY", ATTR_RES_QP_ENTRY),
    ("RDMA_NLDEV_ATTR_RES_LQPN", ATTR_RES_LQPN),
    ("RDMA_NLDEV_ATTR_RES_TYPE", ATTR_RES_TYPE),
    ("RDMA_NLDEV_ATTR_RES_STATE", ATTR_RES_STATE),
    ("RDMA_NLDEV_ATTR_RES_PID", ATTR_RES_PID),
    ("RDMA_NLDEV_ATTR_RES_KERN_NAME", ATTR_RES_KERN_NAME),
    ("RDMA_NLDEV_ATTR_RES_CM_ID", ATTR_RES_CM_ID),
    ("RDMA_NLDEV_ATTR_RES_CM_ID_ENTRY", ATTR_RES_CM_ID_ENTRY),
    ("RDMA_NLDEV_ATTR_RES_PS", ATTR_RES_PS),
    ("RDMA_NLDEV_ATTR_RES_CM_IDN", ATTR_RES_CM_IDN),
    ("RDMA_NLDEV_SYS_ATTR_NETNS_MODE", ATTR_SYS_NETNS_MODE),
];

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_MULTI: u16 = 2;
const NLM_F_ACK: u16 = 4;
const NLM_F_DUMP: u16 = 0x300;
const NLA_TYPE_MASK: u16 = 0x3fff;
const NLMSG_HDRLEN: usize = 16;

#[derive(Debug, Error)]
pub enum NetlinkError {
    #[error("RDMA netlink socket: {0}")]
    Socket(io::Error),
    #[error("RDMA netlink {request}: {error}")]
    Io {
        request: &'static str,
        error: io::Error,
    },
    #[error("RDMA netlink {request}: kernel returned {error}")]
    Kernel {
        request: &'static str,
        error: io::Error,
    },
    #[error("RDMA netlink {request}: malformed reply ({what})")]
    Malformed {
        request: &'static str,
        what: &'static str,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub index: u32,
    pub name: String,
}

/// One entry of `rdma res show qp`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpEntry {
    pub device: String,
    pub port: Option<u32>,
    pub lqpn: u32,
    /// `enum ib_qp_type`.
    pub qp_type: u8,
    /// `enum ib_qp_state`.
    pub state: u8,
    pub pid: Option<u32>,
    /// Owner of a kernel QP (e.g. `nvme_rdma`, `ib_core`).
    pub kern_name: Option<String>,
}

/// One entry of `rdma res show cm_id`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmIdEntry {
    pub device: String,
    pub cm_idn: u32,
    /// `enum rdma_cm_state`.
    pub state: u8,
    pub port_space: Option<u32>,
    pub lqpn: Option<u32>,
    pub qp_type: Option<u8>,
    pub pid: Option<u32>,
    pub kern_name: Option<String>,
}

#[derive(Debug, Clone, Copy)]
struct Attr<'a> {
    kind: u16,
    data: &'a [u8],
}

fn attrs(mut buf: &[u8]) -> impl Iterator<Item = Attr<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > buf.len() {
            return None;
        }
        let attr = Attr {
            kind,
            data: &buf[4..len],
        };
        let advance = (len + 3) & !3;
        buf = buf.get(advance..).unwrap_or(&[]);
        Some(attr)
    })
}

impl Attr<'_> {
    fn u32(&self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.data.get(..4)?.try_into().ok()?))
    }

    fn u8(&self) -> Option<u8> {
        self.data.first().copied()
    }

    fn string(&self) -> Option<String> {
        let end = self
            .data
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(self.data.len());
        std::str::from_utf8(&self.data[..end])
            .ok()
            .map(str::to_owned)
    }
}

/// Parses the attributes of one RDMA_NLDEV_CMD_GET reply.
fn parse_device(payload: &[u8]) -> Option<Device> {
    let mut index = None;
    let mut name = None;
    for a in attrs(payload) {
        match a.kind {
            ATTR_DEV_INDEX => index = a.u32(),
            ATTR_DEV_NAME => name = a.string(),
            _ => {}
        }
    }
    Some(Device {
        index: index?,
        name: name?,
    })
}

fn device_of(payload: &[u8]) -> String {
    attrs(payload)
        .find(|a| a.kind == ATTR_DEV_NAME)
        .and_then(|a| a.string())
        .unwrap_or_default()
}

/// Parses one RDMA_NLDEV_CMD_RES_QP_GET reply: RES_QP { RES_QP_ENTRY { ... } ... }.
fn parse_qps(payload: &[u8], out: &mut Vec<QpEntry>) {
    let device = device_of(payload);
    for table in attrs(payload).filter(|a| a.kind == ATTR_RES_QP) {
        for entry in attrs(table.data).filter(|a| a.kind == ATTR_RES_QP_ENTRY) {
            let mut qp = QpEntry {
                device: device.clone(),
                port: None,
                lqpn: 0,
                qp_type: 0,
                state: 0,
                pid: None,
                kern_name: None,
            };
            let mut has_lqpn = false;
            for a in attrs(entry.data) {
                match a.kind {
                    ATTR_PORT_INDEX => qp.port = a.u32(),
                    ATTR_RES_LQPN => {
                        has_lqpn = true;
                        qp.lqpn = a.u32().unwrap_or(0);
                    }
                    ATTR_RES_TYPE => qp.qp_type = a.u8().unwrap_or(0),
                    ATTR_RES_STATE => qp.state = a.u8().unwrap_or(0),
                    ATTR_RES_PID => qp.pid = a.u32(),
                    ATTR_RES_KERN_NAME => qp.kern_name = a.string(),
                    _ => {}
                }
            }
            if has_lqpn {
                out.push(qp);
            }
        }
    }
}

/// Parses one RDMA_NLDEV_CMD_RES_CM_ID_GET reply.
fn parse_cm_ids(payload: &[u8], out: &mut Vec<CmIdEntry>) {
    let device = device_of(payload);
    for table in attrs(payload).filter(|a| a.kind == ATTR_RES_CM_ID) {
        for entry in attrs(table.data).filter(|a| a.kind == ATTR_RES_CM_ID_ENTRY) {
            let mut id = CmIdEntry {
                device: device.clone(),
                cm_idn: 0,
                state: 0,
                port_space: None,
                lqpn: None,
                qp_type: None,
                pid: None,
                kern_name: None,
            };
            let mut has_idn = false;
            for a in attrs(entry.data) {
                match a.kind {
                    ATTR_RES_CM_IDN => {
                        has_idn = true;
                        id.cm_idn = a.u32().unwrap_or(0);
                    }
                    ATTR_RES_STATE => id.state = a.u8().unwrap_or(0),
                    ATTR_RES_PS => id.port_space = a.u32(),
                    ATTR_RES_LQPN => id.lqpn = a.u32(),
                    ATTR_RES_TYPE => id.qp_type = a.u8(),
                    ATTR_RES_PID => id.pid = a.u32(),
                    ATTR_RES_KERN_NAME => id.kern_name = a.string(),
                    _ => {}
                }
            }
            if has_idn {
                out.push(id);
            }
        }
    }
}

struct Socket(libc::c_int);

impl Drop for Socket {
    fn drop(&mut self) {
        // SAFETY: the fd was opened by Socket::open and is closed only here.
        unsafe { libc::close(self.0) };
    }
}

impl Socket {
    fn open() -> Result<Self, NetlinkError> {
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                NETLINK_RDMA,
            )
        };
        if fd < 0 {
            return Err(NetlinkError::Socket(io::Error::last_os_error()));
        }
        let socket = Socket(fd);
        let timeout = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: valid fd and a correctly sized timeval.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Ok(socket)
    }

    /// Every device, once (a dump may repeat one).
    fn devices(&self) -> Result<Vec<Device>, NetlinkError> {
        let mut devices: Vec<Device> = Vec::new();
        self.dump("device dump", RDMA_NLDEV_CMD_GET, &[], 1, |p| {
            if let Some(d) = parse_device(p) {
                if !devices.iter().any(|x| x.index == d.index) {
                    devices.push(d);
                }
            }
        })?;
        Ok(devices)
    }

    /// Sends a dump request and calls `each` with the payload of every reply.
    fn dump(
        &self,
        request: &'static str,
        command: u16,
        attrs: &[(u16, u32)],
        seq: u32,
        each: impl FnMut(&[u8]),
    ) -> Result<(), NetlinkError> {
        self.exchange(
            request,
            command,
            NLM_F_REQUEST | NLM_F_DUMP,
            attrs,
            seq,
            each,
        )
    }

    /// Sends a request with `flags` and calls `each` with the payload of
    /// every reply until the last (a dump's DONE, an ACK, or a message that
    /// is not part of a multipart reply).
    fn exchange(
        &self,
        request: &'static str,
        command: u16,
        flags: u16,
        attrs: &[(u16, u32)],
        seq: u32,
        mut each: impl FnMut(&[u8]),
    ) -> Result<(), NetlinkError> {
        let mut msg = Vec::with_capacity(64);
        let kind = (RDMA_NL_NLDEV << 10) | command;
        msg.extend_from_slice(&0u32.to_ne_bytes()); // length, patched below
        msg.extend_from_slice(&kind.to_ne_bytes());
        msg.extend_from_slice(&flags.to_ne_bytes());
        msg.extend_from_slice(&seq.to_ne_bytes());
        msg.extend_from_slice(&0u32.to_ne_bytes());
        for &(attr, value) in attrs {
            msg.extend_from_slice(&8u16.to_ne_bytes());
            msg.extend_from_slice(&attr.to_ne_bytes());
            msg.extend_from_slice(&value.to_ne_bytes());
        }
        let len = msg.len() as u32;
        msg[..4].copy_from_slice(&len.to_ne_bytes());
        // SAFETY: sending an initialised buffer of msg.len() bytes to the kernel.
        let sent = unsafe { libc::send(self.0, msg.as_ptr().cast(), msg.len(), 0) };
        if sent < 0 {
            return Err(NetlinkError::Io {
                request,
                error: io::Error::last_os_error(),
            });
        }
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            // SAFETY: receiving into a buffer we own, at most its length.
            let n = unsafe { libc::recv(self.0, buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                return Err(NetlinkError::Io {
                    request,
                    error: io::Error::last_os_error(),
                });
            }
            let mut rest = &buf[..n as usize];
            while rest.len() >= NLMSG_HDRLEN {
                let len = u32::from_ne_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
                let kind = u16::from_ne_bytes([rest[4], rest[5]]);
                let flags = u16::from_ne_bytes([rest[6], rest[7]]);
                if len < NLMSG_HDRLEN || len > rest.len() {
                    return Err(NetlinkError::Malformed {
                        request,
                        what: "message length",
                    });
                }
                let payload = &rest[NLMSG_HDRLEN..len];
                match kind {
                    NLMSG_DONE => return Ok(()),
                    NLMSG_ERROR => {
                        let code = payload
                            .get(..4)
                            .map(|b| i32::from_ne_bytes(b.try_into().expect("4 bytes")))
                            .unwrap_or(-libc::EIO);
                        if code == 0 {
                            return Ok(());
                        }
                        return Err(NetlinkError::Kernel {
                            request,
                            error: io::Error::from_raw_os_error(-code),
                        });
                    }
                    _ => each(payload),
                }
                if flags & NLM_F_MULTI == 0 {
                    return Ok(());
                }
                rest = rest.get((len + 3) & !3..).unwrap_or(&[]);
            }
        }
    }
}

/// How RDMA devices are shared among network namespaces (`rdma system set
/// netns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetnsMode {
    /// Every namespace sees every device (the default).
    Shared,
    /// A device is seen only in its own namespace: netlink and sysfs list
    /// only this namespace's devices.
    Exclusive,
}

/// Parses the RDMA_NLDEV_CMD_SYS_GET reply.
fn parse_netns_mode(payload: &[u8]) -> Option<NetnsMode> {
    attrs(payload)
        .find(|a| a.kind == ATTR_SYS_NETNS_MODE)
        .and_then(|a| a.u8())
        .map(|shared| {
            if shared == 0 {
                NetnsMode::Exclusive
            } else {
                NetnsMode::Shared
            }
        })
}

/// The RDMA subsystem's network namespace mode (`rdma system show`).
pub fn netns_mode() -> Result<NetnsMode, NetlinkError> {
    let socket = Socket::open()?;
    let mut mode = None;
    socket.exchange(
        "system get",
        RDMA_NLDEV_CMD_SYS_GET,
        NLM_F_REQUEST | NLM_F_ACK,
        &[],
        1,
        |p| mode = mode.or(parse_netns_mode(p)),
    )?;
    mode.ok_or(NetlinkError::Malformed {
        request: "system get",
        what: "no netns mode",
    })
}

/// The kernel's RDMA resources at one moment.
#[derive(Debug, Default, Clone)]
pub struct Snapshot {
    pub devices: Vec<Device>,
    pub qps: Vec<QpEntry>,
    pub cm_ids: Vec<CmIdEntry>,
}

/// The RDMA devices this network namespace sees (`rdma dev show`).
pub fn devices() -> Result<Vec<Device>, NetlinkError> {
    Socket::open()?.devices()
}

/// Dumps devices, then each device's QPs and CM ids (the kernel dumps
/// resources per device: `res_get_common_dumpit()` requires a device index).
pub fn snapshot() -> Result<Snapshot, NetlinkError> {
    let socket = Socket::open()?;
    let mut snap = Snapshot {
        devices: socket.devices()?,
        ..Snapshot::default()
    };
    for (i, device) in snap.devices.iter().enumerate() {
        let seq = 2 + 2 * i as u32;
        socket.dump(
            "QP dump",
            RDMA_NLDEV_CMD_RES_QP_GET,
            &[(ATTR_DEV_INDEX, device.index)],
            seq,
            |p| parse_qps(p, &mut snap.qps),
        )?;
        socket.dump(
            "CM id dump",
            RDMA_NLDEV_CMD_RES_CM_ID_GET,
            &[(ATTR_DEV_INDEX, device.index)],
            seq + 1,
            |p| parse_cm_ids(p, &mut snap.cm_ids),
        )?;
    }
    Ok(snap)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(kind: u16, data: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(data);
        while out.len() % 4 != 0 {
            out.push(0);
        }
        out
    }

    fn nested(kind: u16, children: &[Vec<u8>]) -> Vec<u8> {
        attr(kind | 0x8000, &children.concat())
    }

    #[test]
    fn parses_device_and_qp_replies() {
        let dev = [
            attr(ATTR_DEV_INDEX, &3u32.to_ne_bytes()),
            attr(ATTR_DEV_NAME, b"rxe0\0"),
        ]
        .concat();
        assert_eq!(
            parse_device(&dev),
            Some(Device {
                index: 3,
                name: "rxe0".into()
            })
        );
        let qp = |lqpn: u32, ty: u8, state: u8, owner: Vec<u8>| {
            nested(
                ATTR_RES_QP_ENTRY,
                &[
                    attr(ATTR_PORT_INDEX, &1u32.to_ne_bytes()),
                    attr(ATTR_RES_LQPN, &lqpn.to_ne_bytes()),
                    attr(ATTR_RES_TYPE, &[ty]),
                    attr(ATTR_RES_STATE, &[state]),
                    owner,
                ],
            )
        };
        let reply = [
            dev.clone(),
            nested(
                ATTR_RES_QP,
                &[
                    qp(1, 1, 3, attr(ATTR_RES_KERN_NAME, b"ib_core\0")),
                    qp(17, 2, 3, attr(ATTR_RES_PID, &4242u32.to_ne_bytes())),
                ],
            ),
        ]
        .concat();
        let mut qps = Vec::new();
        parse_qps(&reply, &mut qps);
        assert_eq!(qps.len(), 2);
        assert_eq!(qps[0].kern_name.as_deref(), Some("ib_core"));
        assert_eq!((qps[1].lqpn, qps[1].qp_type, qps[1].state), (17, 2, 3));
        assert_eq!((qps[1].pid, qps[1].port), (Some(4242), Some(1)));
        assert_eq!(qps[1].device, "rxe0");
    }

    #[test]
    fn parses_the_netns_mode() {
        let reply = |shared: u8| {
            [
                attr(ATTR_SYS_NETNS_MODE, &[shared]),
                attr(ATTR_SYS_NETNS_MODE + 1, b"ib\0"),
            ]
            .concat()
        };
        assert_eq!(parse_netns_mode(&reply(1)), Some(NetnsMode::Shared));
        assert_eq!(parse_netns_mode(&reply(0)), Some(NetnsMode::Exclusive));
        assert_eq!(
            parse_netns_mode(&attr(ATTR_DEV_INDEX, &1u32.to_ne_bytes())),
            None
        );
    }

    #[test]
    fn parses_cm_id_replies() {
        let reply = [
            attr(ATTR_DEV_NAME, b"rxe0\0"),
            nested(
                ATTR_RES_CM_ID,
                &[nested(
                    ATTR_RES_CM_ID_ENTRY,
                    &[
                        attr(ATTR_RES_CM_IDN, &9u32.to_ne_bytes()),
                        attr(ATTR_RES_STATE, &[8]),
                        attr(ATTR_RES_PS, &0x106u32.to_ne_bytes()),
                        attr(ATTR_RES_LQPN, &17u32.to_ne_bytes()),
                    ],
                )],
            ),
        ]
        .concat();
        let mut ids = Vec::new();
        parse_cm_ids(&reply, &mut ids);
        assert_eq!(
            ids,
            vec![CmIdEntry {
                device: "rxe0".into(),
                cm_idn: 9,
                state: 8,
                port_space: Some(0x106),
                lqpn: Some(17),
                qp_type: None,
                pid: None,
                kern_name: None
            }]
        );
    }

    #[test]
    fn truncated_attributes_stop_parsing() {
        let mut bytes = attr(ATTR_DEV_INDEX, &3u32.to_ne_bytes());
        bytes.extend_from_slice(&[200, 0, 2, 0]); // claims 200 bytes
        assert_eq!(attrs(&bytes).count(), 1);
    }

    /// Against the running kernel (VM suite): rxe0's GSI QP is always there.
    #[test]
    fn snapshot_of_the_running_kernel() {
        if !std::path::Path::new("/sys/class/infiniband").is_dir() {
            eprintln!("no RDMA devices on this host; covered by the VM suite");
            return;
        }
        let snap = snapshot().unwrap();
        assert!(!snap.devices.is_empty());
        assert!(
            snap.qps.iter().any(|q| q.qp_type == 1 && q.lqpn == 1),
            "{snap:?}"
        );
    }
}
