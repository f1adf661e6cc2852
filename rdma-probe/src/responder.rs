//! The responder: accepts RC connections on an rdma_cm address and echoes
//! every message it receives back to its sender.
//!
//! One thread serves every connection: a poll loop over the stop eventfd, the
//! rdma_cm event channel and one completion channel per connection. A
//! connection that does not get established within `accept_timeout`, stays
//! silent for `idle_timeout`, disconnects, or has a failed completion is
//! closed and all its resources freed; the others are not affected.
//!
//! Strangers cannot exhaust it: a connect request from outside the
//! allow-list, beyond `max_connections`, or beyond `max_per_source` of its
//! source address is rejected; a message that is not a probe (shorter than
//! the header, another magic) is counted and not echoed, its receive posted
//! again and the connection kept (it is not the peer's last chance to send a
//! probe, and a peer sending only those is still closed on `idle_timeout`,
//! which only echoes restart); a message longer than the receive buffer
//! fails the receive and closes the connection (its QP is in error); any
//! failed receive but a flush is counted as such.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use qpwatch_common::vocab::CmEventKind;
use rdma_sys::ibv_wc_opcode;
use serde::Serialize;

use crate::error::Error;
use crate::guard::{check_probe, AllowList, MalformedProbe, SourceCounts};
use crate::requester::{PollMode, MAX_MESSAGE_SIZE, MESSAGE_HEADER};
use crate::time::{monotonic_ns, Deadline};
use crate::verbs::{
    poll_fds, pollin, rc_conn_param, CmEvent, CmId, CmQueuePair, Completion, CompletionChannel,
    CompletionQueue, EventChannel, EventFd, MemoryRegion, PostQueue, ProtectionDomain, QpCaps,
};

const SEND_FLAG: u64 = 1 << 32;

#[derive(Debug, Clone)]
pub struct ResponderConfig {
    pub listen: SocketAddr,
    /// Largest message echoed (the size of each receive buffer).
    pub max_message_size: usize,
    /// Receives posted per connection.
    pub recv_depth: u32,
    /// From CONNECT_REQUEST to ESTABLISHED.
    pub accept_timeout: Duration,
    /// An established connection with no message for this long is closed.
    pub idle_timeout: Duration,
    /// Connect requests beyond this many open connections are rejected.
    pub max_connections: usize,
    /// ... and beyond this many of one source address.
    pub max_per_source: usize,
    /// Connect requests from other sources are rejected.
    pub allow: AllowList,
    pub poll_mode: PollMode,
}

impl ResponderConfig {
    pub fn new(listen: SocketAddr) -> ResponderConfig {
        ResponderConfig {
            listen,
            max_message_size: MAX_MESSAGE_SIZE,
            recv_depth: 16,
            accept_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            max_connections: 256,
            max_per_source: 8,
            allow: AllowList::everyone(),
            poll_mode: PollMode::Events,
        }
    }

    fn validate(&self) -> Result<(), Error> {
        if !(MESSAGE_HEADER..=1 << 20).contains(&self.max_message_size) {
            return Err(Error::InvalidConfig(format!(
                "max message size {} is outside {MESSAGE_HEADER}..=1MiB",
                self.max_message_size
            )));
        }
        if !(1..=1024).contains(&self.recv_depth) {
            return Err(Error::InvalidConfig("recv depth must be 1..=1024".into()));
        }
        if self.max_connections == 0 {
            return Err(Error::InvalidConfig(
                "max connections must be at least 1".into(),
            ));
        }
        if self.max_per_source == 0 {
            return Err(Error::InvalidConfig(
                "max connections per source must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Counters of a running responder.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ResponderStats {
    /// CONNECT_REQUEST events received.
    pub connect_requests: u64,
    /// Requests refused (any reason below, or setting up failed).
    pub rejected: u64,
    /// ... of which: `max_connections` open already.
    pub refused_max_connections: u64,
    /// ... of which: `max_per_source` open from its source already.
    pub refused_per_source: u64,
    /// ... of which: its source is not in the allow-list.
    pub refused_not_allowed: u64,
    /// Connections that reached ESTABLISHED.
    pub established: u64,
    /// Connections closed, for any reason.
    pub closed: u64,
    /// ... of which: the peer disconnected (DREQ).
    pub closed_by_peer: u64,
    /// ... of which: not established in time, or idle too long.
    pub closed_timeout: u64,
    /// ... of which: a failed completion or a CM error event.
    pub closed_error: u64,
    /// Connections open now.
    pub active: u64,
    /// Messages echoed.
    pub echoes: u64,
    /// Messages dropped, not probes: shorter than the header.
    pub malformed_short: u64,
    /// ... another magic.
    pub malformed_magic: u64,
    /// ... longer than the receive buffer, or another failed receive (the
    /// connection is closed).
    pub malformed_too_long: u64,
}

impl ResponderStats {
    /// Messages dropped for `reason`.
    pub fn malformed(&self, reason: MalformedProbe) -> u64 {
        match reason {
            MalformedProbe::Short => self.malformed_short,
            MalformedProbe::Magic => self.malformed_magic,
            MalformedProbe::TooLong => self.malformed_too_long,
        }
    }
}

#[derive(Default)]
struct Counters {
    connect_requests: AtomicU64,
    rejected: AtomicU64,
    refused_max_connections: AtomicU64,
    refused_per_source: AtomicU64,
    refused_not_allowed: AtomicU64,
    established: AtomicU64,
    closed: AtomicU64,
    closed_by_peer: AtomicU64,
    closed_timeout: AtomicU64,
    closed_error: AtomicU64,
    active: AtomicU64,
    echoes: AtomicU64,
    malformed_short: AtomicU64,
    malformed_magic: AtomicU64,
    malformed_too_long: AtomicU64,
}

impl Counters {
    fn snapshot(&self) -> ResponderStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ResponderStats {
            connect_requests: get(&self.connect_requests),
            rejected: get(&self.rejected),
            refused_max_connections: get(&self.refused_max_connections),
            refused_per_source: get(&self.refused_per_source),
            refused_not_allowed: get(&self.refused_not_allowed),
            established: get(&self.established),
            closed: get(&self.closed),
            closed_by_peer: get(&self.closed_by_peer),
            closed_timeout: get(&self.closed_timeout),
            closed_error: get(&self.closed_error),
            active: get(&self.active),
            echoes: get(&self.echoes),
            malformed_short: get(&self.malformed_short),
            malformed_magic: get(&self.malformed_magic),
            malformed_too_long: get(&self.malformed_too_long),
        }
    }

    fn malformed(&self, reason: MalformedProbe) {
        bump(match reason {
            MalformedProbe::Short => &self.malformed_short,
            MalformedProbe::Magic => &self.malformed_magic,
            MalformedProbe::TooLong => &self.malformed_too_long,
        });
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// Stops a running responder from any thread.
#[derive(Clone)]
pub struct ResponderStopper {
    stop: Arc<EventFd>,
}

impl ResponderStopper {
    pub fn stop(&self) {
        self.stop.signal();
    }
}

/// A responder bound and listening; [`Responder::run`] serves until stopped.
pub struct Responder {
    config: ResponderConfig,
    connections: HashMap<usize, Conn>,
    sources: SourceCounts,
    listener: Arc<CmId>,
    channel: Arc<EventChannel>,
    stop: Arc<EventFd>,
    counters: Arc<Counters>,
    local_addr: SocketAddr,
}

impl Responder {
    /// Binds `config.listen` and starts listening.
    pub fn bind(config: ResponderConfig) -> Result<Responder, Error> {
        config.validate()?;
        let channel = EventChannel::new()?;
        let listener = CmId::create(&channel)?;
        listener.bind_addr(config.listen)?;
        listener.listen(128)?;
        let local_addr = listener.local_addr().unwrap_or(config.listen);
        Ok(Responder {
            config,
            connections: HashMap::new(),
            sources: SourceCounts::default(),
            listener,
            channel,
            stop: Arc::new(EventFd::new()?),
            counters: Arc::default(),
            local_addr,
        })
    }

    /// Binds and serves on a thread of its own.
    pub fn spawn(config: ResponderConfig) -> Result<ResponderHandle, Error> {
        let responder = Responder::bind(config)?;
        let stopper = responder.stopper();
        let counters = responder.counters.clone();
        let local_addr = responder.local_addr;
        let thread = std::thread::Builder::new()
            .name("rdma-responder".into())
            .spawn(move || responder.run())
            .map_err(|e| Error::Os {
                call: "pthread_create",
                errno: crate::error::Errno(e.raw_os_error().unwrap_or(0)),
            })?;
        Ok(ResponderHandle {
            stopper,
            counters,
            local_addr,
            thread,
        })
    }

    /// The bound address (with the port rdma_cm chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stopper(&self) -> ResponderStopper {
        ResponderStopper {
            stop: self.stop.clone(),
        }
    }

    pub fn stats(&self) -> ResponderStats {
        self.counters.snapshot()
    }

    /// Serves until stopped; then closes every connection and the listener.
    /// Errors of single connections close those connections; only a failing
    /// event channel or poll ends the loop with an error.
    pub fn run(mut self) -> Result<ResponderStats, Error> {
        let result = self.serve();
        self.sources = SourceCounts::default();
        for (_, conn) in self.connections.drain() {
            let _ = conn.id.disconnect();
            bump(&self.counters.closed);
            self.counters.active.fetch_sub(1, Ordering::Relaxed);
        }
        let stats = self.counters.snapshot();
        result.map(|()| stats)
    }

    fn serve(&mut self) -> Result<(), Error> {
        let mut fds = Vec::new();
        let mut keys = Vec::new();
        let mut spins: u32 = 0;
        loop {
            let busy = self.config.poll_mode == PollMode::Busy;
            if busy {
                self.service_all_cqs();
                spins = spins.wrapping_add(1);
                if !spins.is_multiple_of(1024) && !self.connections.is_empty() {
                    continue;
                }
            }
            let now = monotonic_ns();
            let next_deadline = self
                .connections
                .values()
                .map(|c| c.deadline)
                .fold(Deadline::new(now, Duration::from_secs(1)), Deadline::min);
            fds.clear();
            keys.clear();
            fds.push(pollin(self.stop.fd()));
            fds.push(pollin(self.channel.fd()));
            if !busy {
                for (key, conn) in &self.connections {
                    fds.push(pollin(conn.cq.channel().fd()));
                    keys.push(*key);
                }
            }
            let timeout_ms = if busy && !self.connections.is_empty() {
                0
            } else {
                next_deadline.poll_timeout_ms(now)
            };
            poll_fds(&mut fds, timeout_ms)?;
            if fds[0].revents != 0 {
                return Ok(());
            }
            if fds[1].revents != 0 {
                while let Some(event) = self.channel.next_event(0)? {
                    self.handle_cm_event(event);
                }
            }
            for (fd, key) in fds[2..].iter().zip(&keys) {
                if fd.revents != 0 {
                    self.service_cq(*key, true);
                }
            }
            self.expire(monotonic_ns());
        }
    }

    fn handle_cm_event(&mut self, event: CmEvent) {
        let key = event.id as usize;
        match event.kind {
            CmEventKind::ConnectRequest => self.accept(event),
            CmEventKind::Established => {
                if let Some(conn) = self.connections.get_mut(&key) {
                    conn.established = true;
                    conn.touch(&self.config);
                    bump(&self.counters.established);
                }
            }
            CmEventKind::Disconnected => {
                if let Some(conn) = self.remove(key) {
                    // Answers the DREQ with a DREP before the id goes.
                    let _ = conn.id.disconnect();
                    self.closed(&self.counters.closed_by_peer);
                }
            }
            CmEventKind::Rejected
            | CmEventKind::ConnectError
            | CmEventKind::Unreachable
            | CmEventKind::DeviceRemoval
            | CmEventKind::AddrChange => {
                if self.remove(key).is_some() {
                    log::debug!("responder: connection closed on {}", event.kind);
                    self.closed(&self.counters.closed_error);
                } else if key == self.listener.raw() as usize {
                    log::warn!("responder: listener got {}", event.kind);
                }
            }
            _ => {}
        }
    }

    fn remove(&mut self, key: usize) -> Option<Conn> {
        let conn = self.connections.remove(&key)?;
        if let Some(ip) = conn.source {
            self.sources.remove(ip);
        }
        Some(conn)
    }

    fn closed(&self, reason: &AtomicU64) {
        bump(reason);
        bump(&self.counters.closed);
        self.counters.active.fetch_sub(1, Ordering::Relaxed);
    }

    fn accept(&mut self, event: CmEvent) {
        bump(&self.counters.connect_requests);
        // SAFETY: `event.id` is the child id of this CONNECT_REQUEST, received
        // on our channel and owned by us from now on.
        let Some(id) = (unsafe { CmId::adopt(event.id, &self.channel) }) else {
            return;
        };
        let source = id.peer_addr().map(|a| a.ip());
        let refused = if !source.is_some_and(|ip| self.config.allow.allows(ip)) {
            Some(&self.counters.refused_not_allowed)
        } else if self.connections.len() >= self.config.max_connections {
            Some(&self.counters.refused_max_connections)
        } else if !source.is_some_and(|ip| self.sources.try_add(ip, self.config.max_per_source)) {
            Some(&self.counters.refused_per_source)
        } else {
            None
        };
        if let Some(reason) = refused {
            log::debug!("responder: refusing a connection from {source:?}");
            let _ = id.reject();
            bump(reason);
            bump(&self.counters.rejected);
            return;
        }
        match Conn::accept(&id, &self.config, source) {
            Ok(conn) => {
                self.connections.insert(id.raw() as usize, conn);
                bump(&self.counters.active);
            }
            Err(err) => {
                log::warn!("responder: refusing a connection: {err}");
                if let Some(ip) = source {
                    self.sources.remove(ip);
                }
                let _ = id.reject();
                bump(&self.counters.rejected);
            }
        }
    }

    fn service_all_cqs(&mut self) {
        let keys: Vec<usize> = self.connections.keys().copied().collect();
        for key in keys {
            self.service_cq(key, false);
        }
    }

    fn service_cq(&mut self, key: usize, woken: bool) {
        let Some(conn) = self.connections.get_mut(&key) else {
            return;
        };
        match conn.service(&self.config, woken, &self.counters) {
            Ok(echoed) => {
                self.counters.echoes.fetch_add(echoed, Ordering::Relaxed);
            }
            Err(err) => {
                log::debug!("responder: closing a connection: {err}");
                if let Some(conn) = self.remove(key) {
                    let _ = conn.id.disconnect();
                }
                self.closed(&self.counters.closed_error);
            }
        }
    }

    fn expire(&mut self, now: u64) {
        let expired: Vec<usize> = self
            .connections
            .iter()
            .filter(|(_, c)| c.deadline.expired(now))
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            if let Some(conn) = self.remove(key) {
                log::debug!(
                    "responder: closing a connection {}",
                    if conn.established {
                        "idle too long"
                    } else {
                        "not established in time"
                    }
                );
                let _ = conn.id.disconnect();
            }
            self.closed(&self.counters.closed_timeout);
        }
    }
}

/// A responder running on its own thread.
pub struct ResponderHandle {
    stopper: ResponderStopper,
    counters: Arc<Counters>,
    local_addr: SocketAddr,
    thread: JoinHandle<Result<ResponderStats, Error>>,
}

impl ResponderHandle {
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    pub fn stats(&self) -> ResponderStats {
        self.counters.snapshot()
    }

    pub fn stopper(&self) -> ResponderStopper {
        self.stopper.clone()
    }

    /// Whether the serving thread ended (stopped, or failed).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops the responder and waits for it to have freed everything.
    pub fn stop(self) -> Result<ResponderStats, Error> {
        self.stopper.stop();
        self.join()
    }

    /// Waits for the responder to end (after a stop from a [`ResponderStopper`]).
    pub fn join(self) -> Result<ResponderStats, Error> {
        match self.thread.join() {
            Ok(result) => result,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }
}

/// One accepted connection; the QP is created with rdma_create_qp, so
/// librdmacm moves it to RTR/RTS in rdma_accept.
struct Conn {
    qp: CmQueuePair,
    mr: MemoryRegion,
    cq: Arc<CompletionQueue>,
    id: Arc<CmId>,
    slot_size: usize,
    max_inline: usize,
    established: bool,
    deadline: Deadline,
    /// The requester's address (its per-source count).
    source: Option<IpAddr>,
}

impl Conn {
    fn accept(
        id: &Arc<CmId>,
        config: &ResponderConfig,
        source: Option<IpAddr>,
    ) -> Result<Conn, Error> {
        let pd = ProtectionDomain::alloc(id)?;
        let comp_channel = CompletionChannel::create(id)?;
        let depth = config.recv_depth;
        let cq = CompletionQueue::create(&comp_channel, 2 * depth as i32)?;
        let inline = 64u32;
        let caps = QpCaps {
            send_wr: depth,
            recv_wr: depth,
            inline_data: inline,
        };
        let qp = CmQueuePair::create(id, &pd, &cq, caps).or_else(|_| {
            CmQueuePair::create(
                id,
                &pd,
                &cq,
                QpCaps {
                    inline_data: 0,
                    ..caps
                },
            )
        })?;
        let slot_size = config.max_message_size;
        let mr = MemoryRegion::register(&pd, slot_size * depth as usize)?;
        for slot in 0..depth as usize {
            qp.post_recv(slot as u64, &mr, slot * slot_size, slot_size)?;
        }
        if config.poll_mode == PollMode::Events {
            cq.arm()?;
        }
        let mut param = rc_conn_param(0);
        id.accept(&mut param)?;
        Ok(Conn {
            qp,
            mr,
            cq,
            id: id.clone(),
            slot_size,
            max_inline: if caps.inline_data > 0 {
                inline as usize
            } else {
                0
            },
            established: false,
            deadline: Deadline::after(config.accept_timeout),
            source,
        })
    }

    fn touch(&mut self, config: &ResponderConfig) {
        self.deadline = Deadline::after(config.idle_timeout);
    }

    /// Echoes what arrived; returns how many messages were echoed.
    fn service(
        &mut self,
        config: &ResponderConfig,
        woken: bool,
        counters: &Counters,
    ) -> Result<u64, Error> {
        if woken {
            self.cq.channel().take_event(&self.cq)?;
        }
        let mut echoed = self.drain(counters)?;
        if config.poll_mode == PollMode::Events {
            // Re-arm, then drain once more: a completion that came in before
            // the arm raises no event.
            self.cq.arm()?;
            echoed += self.drain(counters)?;
        }
        if echoed > 0 {
            self.touch(config);
        }
        Ok(echoed)
    }

    fn drain(&mut self, counters: &Counters) -> Result<u64, Error> {
        let mut wcs = [Completion::default(); 16];
        let mut echoed = 0;
        loop {
            let n = self.cq.poll(&mut wcs)?;
            for wc in &wcs[..n] {
                if !wc.is_success() {
                    // LOC_LEN_ERR on hardware; soft-RoCE fails the receive of
                    // a message above its buffer with another status.
                    if wc.wr_id & SEND_FLAG == 0
                        && wc.status != rdma_sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR
                    {
                        counters.malformed(MalformedProbe::TooLong);
                        log::debug!(
                            "responder: a receive failed ({}): closing the connection",
                            wc.status_text()
                        );
                    }
                    return Err(Error::WorkCompletion {
                        step: crate::step::Step::Ping,
                        opcode: if wc.wr_id & SEND_FLAG != 0 {
                            "SEND"
                        } else {
                            "RECV"
                        },
                        status: wc.status,
                        status_text: wc.status_text(),
                        vendor_err: wc.vendor_err,
                    });
                }
                let slot = (wc.wr_id & !SEND_FLAG) as usize;
                let offset = slot * self.slot_size;
                if wc.wr_id & SEND_FLAG != 0 {
                    self.qp
                        .post_recv(slot as u64, &self.mr, offset, self.slot_size)?;
                } else if wc.opcode == ibv_wc_opcode::IBV_WC_RECV {
                    let len = wc.byte_len as usize;
                    let mut header = [0u8; MESSAGE_HEADER];
                    let head = len.min(MESSAGE_HEADER);
                    self.mr.read(offset, &mut header[..head]);
                    if let Err(reason) = check_probe(&header[..head]) {
                        counters.malformed(reason);
                        self.qp
                            .post_recv(slot as u64, &self.mr, offset, self.slot_size)?;
                        continue;
                    }
                    let inline = len <= self.max_inline;
                    self.qp
                        .post_send(SEND_FLAG | slot as u64, &self.mr, offset, len, inline)?;
                    echoed += 1;
                }
            }
            if n < wcs.len() {
                return Ok(echoed);
            }
        }
    }
}
