//! The UD QP of one local RDMA device, with its receive pool, send slots and
//! the address handles back to the peers it answers.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use log::debug;
use qpwatch_common::vocab::QpState;
use rdma_sys::{ibv_qp_attr, ibv_qp_attr_mask, ibv_wc, ibv_wc_flags, RDMA_UDP_QKEY};

use crate::error::{Errno, Error};
use crate::outcome::{QpCall, QpCallKind};
use crate::time::{elapsed, monotonic_ns};
use crate::verbs::{
    AddressHandle, CmId, CompletionChannel, CompletionQueue, MemoryRegion, PostQueue,
    ProtectionDomain, QpCaps, QueuePair,
};

use super::wire::Message;

/// Receives kept posted.
pub const RECV_DEPTH: usize = 512;
/// Sends (probes and answers) outstanding at most.
pub const SEND_DEPTH: usize = 256;
/// UD receives start with the 40-byte GRH (for RoCEv2 over IPv4, the IPv4
/// header sits in its last 20 bytes).
pub const GRH_LEN: usize = 40;
/// Address handles kept for answering peers; the cache is emptied when full.
pub const AH_CACHE: usize = 4096;

/// Work request ids: sends have this bit set, the rest is the slot.
pub const SEND_FLAG: u64 = 1 << 63;

/// The probe a send slot carries (answers carry none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub target: u64,
    pub seq: u64,
}

/// A peer's UD QP as seen in a received message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PeerKey {
    source: [u8; 16],
    destination: [u8; 16],
    qp_num: u32,
}

/// The sender of a received GRH: the IPv4 source of RoCEv2 over IPv4, else
/// the source GID (an IPv4-mapped one as IPv4).
pub fn grh_source(grh: &[u8; GRH_LEN]) -> IpAddr {
    if grh[20] == 0x45 {
        IpAddr::V4(Ipv4Addr::new(grh[32], grh[33], grh[34], grh[35]))
    } else {
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&grh[8..24]);
        crate::guard::gid_source(gid)
    }
}

/// Source and destination addresses of a received GRH (IPv4 header for
/// RoCEv2 over IPv4, otherwise the GIDs).
fn grh_addresses(grh: &[u8; GRH_LEN]) -> ([u8; 16], [u8; 16]) {
    let mut source = [0u8; 16];
    let mut destination = [0u8; 16];
    if grh[20] == 0x45 {
        source[12..].copy_from_slice(&grh[32..36]);
        destination[12..].copy_from_slice(&grh[36..40]);
    } else {
        source.copy_from_slice(&grh[8..24]);
        destination.copy_from_slice(&grh[24..40]);
    }
    (source, destination)
}

pub struct Device {
    pub name: String,
    /// Testing aid: sent instead of every message ([`super::MeshConfig::malformed`]).
    pub malformed: Option<Vec<u8>>,
    pub port_num: u8,
    answer_routes: HashMap<PeerKey, AddressHandle>,
    qp: QueuePair,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    pub cq: Arc<CompletionQueue>,
    pub pd: Arc<ProtectionDomain>,
    pub channel: Arc<CompletionChannel>,
    pub anchor: Arc<CmId>,
    free_slots: Vec<usize>,
    /// The probe a send slot carries (for its send completion).
    slot_owner: Vec<Option<Probe>>,
    message_size: usize,
    inline: bool,
    /// A failed completion: the QP is torn down and made anew.
    pub broken: bool,
    /// The device's core clock (kHz) if it stamps completions; not read
    /// yet: the mesh times with CLOCK_MONOTONIC.
    pub completion_clock_khz: Option<u64>,
}

pub enum SendError {
    QueueFull,
    Post(Error),
}

impl Device {
    /// A UD QP on `anchor`'s device, in RTS with receives posted; also the
    /// timed create/modify calls.
    pub fn create(anchor: Arc<CmId>, message_size: usize) -> Result<(Device, Vec<QpCall>), Error> {
        let name = anchor.device_name().unwrap_or_else(|| "?".into());
        let port_num = anchor.port_num();
        let completion_clock_khz = anchor.completion_clock_khz().unwrap_or_else(|e| {
            debug!("mesh: {name}: {e}");
            None
        });
        let pd = ProtectionDomain::alloc(&anchor)?;
        let channel = CompletionChannel::create(&anchor)?;
        let cq = CompletionQueue::create(&channel, (RECV_DEPTH + SEND_DEPTH + 16) as i32)?;
        cq.arm()?;
        let mut calls = Vec::new();
        let caps = |inline_data| QpCaps {
            send_wr: SEND_DEPTH as u32,
            recv_wr: RECV_DEPTH as u32,
            inline_data,
        };
        let start = monotonic_ns();
        let qp = match QueuePair::create_ud(&pd, &cq, caps(message_size as u32)) {
            Ok(qp) => qp,
            // A provider without inline sends of this size.
            Err(_) => QueuePair::create_ud(&pd, &cq, caps(0))?,
        };
        calls.push(QpCall {
            kind: QpCallKind::Create,
            target_state: None,
            start_ns: start,
            duration: elapsed(start, monotonic_ns()),
            rc: 0,
        });
        let inline = qp.max_inline_data() as usize >= message_size;
        for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
            // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
            let mut attr: ibv_qp_attr = unsafe { MaybeUninit::zeroed().assume_init() };
            attr.qp_state = state.to_kernel();
            let mut mask = ibv_qp_attr_mask::IBV_QP_STATE.0;
            match state {
                QpState::Init => {
                    attr.pkey_index = 0;
                    attr.port_num = port_num;
                    attr.qkey = RDMA_UDP_QKEY;
                    mask |= ibv_qp_attr_mask::IBV_QP_PKEY_INDEX.0
                        | ibv_qp_attr_mask::IBV_QP_PORT.0
                        | ibv_qp_attr_mask::IBV_QP_QKEY.0;
                }
                QpState::Rts => {
                    attr.sq_psn = 0;
                    mask |= ibv_qp_attr_mask::IBV_QP_SQ_PSN.0;
                }
                _ => {}
            }
            let start = monotonic_ns();
            let rc = qp.modify(&mut attr, mask as i32);
            calls.push(QpCall {
                kind: QpCallKind::Modify,
                target_state: Some(state),
                start_ns: start,
                duration: elapsed(start, monotonic_ns()),
                rc,
            });
            if rc != 0 {
                return Err(Error::verbs_rc("ibv_modify_qp", rc));
            }
        }
        let recv_mr = MemoryRegion::register(&pd, RECV_DEPTH * (message_size + GRH_LEN))?;
        let send_mr = MemoryRegion::register(&pd, SEND_DEPTH * message_size)?;
        let device = Device {
            malformed: None,
            name,
            port_num,
            answer_routes: HashMap::new(),
            qp,
            recv_mr,
            send_mr,
            cq,
            pd,
            channel,
            anchor,
            free_slots: (0..SEND_DEPTH).rev().collect(),
            slot_owner: vec![None; SEND_DEPTH],
            message_size,
            inline,
            broken: false,
            completion_clock_khz,
        };
        for slot in 0..RECV_DEPTH {
            device.repost(slot)?;
        }
        Ok((device, calls))
    }

    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    fn recv_len(&self) -> usize {
        self.message_size + GRH_LEN
    }

    pub fn repost(&self, slot: usize) -> Result<(), Error> {
        let len = self.recv_len();
        self.qp
            .post_recv(slot as u64, &self.recv_mr, slot * len, len)
    }

    /// The GRH and the message of a completed receive into `slot`.
    pub fn received(&self, slot: usize, byte_len: usize, message: &mut Vec<u8>) -> [u8; GRH_LEN] {
        let mut grh = [0u8; GRH_LEN];
        let base = slot * self.recv_len();
        self.recv_mr.read(base, &mut grh);
        let len = byte_len.clamp(GRH_LEN, self.recv_len()) - GRH_LEN;
        message.resize(len, 0);
        self.recv_mr.read(base + GRH_LEN, message);
        grh
    }

    /// A send completed: its slot is free again; returns the probe it
    /// carried.
    pub fn send_done(&mut self, slot: usize) -> Option<Probe> {
        if slot >= SEND_DEPTH || self.free_slots.contains(&slot) {
            return None;
        }
        self.free_slots.push(slot);
        self.slot_owner[slot].take()
    }

    /// Sends `build(now)`, `now` being the time just before ibv_post_send;
    /// returns that time.
    pub fn send(
        &mut self,
        build: impl FnOnce(u64) -> Message,
        ah: &AddressHandle,
        remote_qpn: u32,
        remote_qkey: u32,
        owner: Option<Probe>,
    ) -> Result<u64, SendError> {
        let Some(slot) = self.free_slots.pop() else {
            return Err(SendError::QueueFull);
        };
        let mut buf = vec![0u8; self.message_size];
        let now = monotonic_ns();
        build(now).encode(&mut buf);
        if let Some(bytes) = &self.malformed {
            buf.clear();
            buf.extend(bytes.iter().take(self.message_size));
        }
        let offset = slot * self.message_size;
        self.send_mr.write(offset, &buf);
        match self.qp.post_send_ud(
            SEND_FLAG | slot as u64,
            &self.send_mr,
            offset,
            buf.len(),
            self.inline && buf.len() == self.message_size,
            ah,
            remote_qpn,
            remote_qkey,
        ) {
            Ok(()) => {
                self.slot_owner[slot] = owner;
                Ok(now)
            }
            Err(e) => {
                self.free_slots.push(slot);
                Err(SendError::Post(e))
            }
        }
    }

    /// Answers the probe `wc` carried (its GRH `grh`) with `build(now)`.
    pub fn answer(
        &mut self,
        wc: &mut ibv_wc,
        grh: &mut [u8; GRH_LEN],
        build: impl FnOnce(u64) -> Message,
    ) -> Result<(), AnswerError> {
        if wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 == 0 {
            return Err(AnswerError::NoReturnPath(Error::Verbs {
                call: "ibv_create_ah_from_wc",
                errno: Errno(libc::EINVAL),
            }));
        }
        let (source, destination) = grh_addresses(grh);
        let key = PeerKey {
            source,
            destination,
            qp_num: wc.src_qp,
        };
        let ah = match self.answer_routes.remove(&key) {
            Some(ah) => ah,
            None => {
                if self.answer_routes.len() >= AH_CACHE {
                    self.answer_routes.clear();
                }
                AddressHandle::from_wc(&self.pd, wc, grh, self.port_num)
                    .map_err(AnswerError::NoReturnPath)?
            }
        };
        let sent = self.send(build, &ah, wc.src_qp, RDMA_UDP_QKEY, None);
        self.answer_routes.insert(key, ah);
        match sent {
            Ok(_) => Ok(()),
            Err(SendError::QueueFull) => Err(AnswerError::QueueFull),
            Err(SendError::Post(e)) => Err(AnswerError::Post(e)),
        }
    }
}

pub enum AnswerError {
    NoReturnPath(Error),
    QueueFull,
    Post(Error),
}

impl Drop for Device {
    fn drop(&mut self) {
        // Answer routes before the QP, the QP before its CQ and PD (the
        // fields' Arcs order the rest).
        self.answer_routes.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grh_addresses_of_ipv4_and_gids() {
        let mut grh = [0u8; GRH_LEN];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[198, 18, 0, 2]);
        grh[36..40].copy_from_slice(&[198, 18, 0, 1]);
        let (s, d) = grh_addresses(&grh);
        assert_eq!(&s[12..], &[198, 18, 0, 2]);
        assert_eq!(&d[12..], &[198, 18, 0, 1]);
        let mut grh = [0u8; GRH_LEN];
        grh[0] = 0x60;
        grh[8..24].copy_from_slice(&[1; 16]);
        grh[24..40].copy_from_slice(&[2; 16]);
        assert_eq!(grh_addresses(&grh), ([1; 16], [2; 16]));
        let v4 = IpAddr::V4(Ipv4Addr::new(198, 18, 0, 5));
        grh[8..24].copy_from_slice(
            &"::ffff:198.18.0.5"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        assert_eq!(grh_source(&grh), v4, "an IPv4-mapped GID");
        let mut grh = [0u8; GRH_LEN];
        grh[20] = 0x45;
        grh[32..36].copy_from_slice(&[198, 18, 0, 5]);
        assert_eq!(grh_source(&grh), v4, "RoCEv2's IPv4 header");
    }
}
