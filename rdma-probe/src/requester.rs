//! The requester: probes a responder over an RC connection it sets up itself.
//!
//! The QP is created with `ibv_create_qp`, not `rdma_create_qp`, so that every
//! state change is one `ibv_modify_qp` call made (and timed) here, as rping
//! `-q` does: with no QP attached to the cm_id, librdmacm reports the REP as
//! RDMA_CM_EVENT_CONNECT_RESPONSE instead of moving a QP to RTS itself, and the
//! active side finishes with `rdma_establish` (librdmacm/cma.c,
//! `rdma_get_cm_event` / `ucma_process_conn_resp`).

use std::cell::Cell;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use qpwatch_common::vocab::{CmEventKind, QpState};
use rdma_sys::{ibv_qp_attr, ibv_qp_attr_mask, ibv_wc_opcode};

use crate::error::Error;
use crate::outcome::{ProbeMode, ProbeOutcome, QpCall, QpCallKind};
use crate::step::Step;
use crate::time::{elapsed, monotonic_ns, Deadline};
use crate::verbs::{
    poll_fds, pollin, rc_conn_param, CmEvent, CmId, Completion, CompletionChannel, CompletionQueue,
    EventChannel, MemoryRegion, PostQueue, ProtectionDomain, QpCaps, QueuePair,
};

/// Bytes every probe message starts with: magic, then the sequence number.
pub const MESSAGE_HEADER: usize = 16;
pub(crate) const MAGIC: u64 = u64::from_le_bytes(*b"QPWPROBE");
/// Largest probe message (the responder's default receive size).
pub const MAX_MESSAGE_SIZE: usize = 4096;
const WR_SEND: u64 = 1;
const WR_RECV: u64 = 2;
/// librdmacm's address/route timers get this much longer than the probe's
/// own deadline, so they report their own error (ADDR_ERROR, ROUTE_ERROR)
/// when they fire, and the probe deadline is the backstop.
const CM_TIMER_SLACK: Duration = Duration::from_millis(250);

/// How completions are waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PollMode {
    /// Sleep on the completion channel (no CPU while waiting).
    #[default]
    Events,
    /// Spin on ibv_poll_cq, as perftest does: lowest latency, one core busy.
    Busy,
}

/// What to probe and how.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    pub target: SocketAddr,
    /// Local address to resolve from (rdma_resolve_addr's `src_addr`).
    pub source: Option<IpAddr>,
    /// Fail with `addr_error` unless the target resolves to this RDMA device.
    pub device: Option<String>,
    /// Ping-pongs per probe (per round in persistent mode).
    pub pings: u32,
    /// Bytes per message, `MESSAGE_HEADER..=MAX_MESSAGE_SIZE`.
    pub message_size: usize,
    /// Timeout of every step, and of every single ping.
    pub step_timeout: Duration,
    /// Pause between two pings.
    pub ping_interval: Duration,
    pub poll_mode: PollMode,
    /// Fault injection for tests: fail right after this step completes.
    pub fail_after: Option<Step>,
    /// Testing aid: every ping sends these bytes instead of a probe (see
    /// [`crate::malformed_payload`]); the responder drops them, so the ping
    /// times out.
    pub malformed: Option<Vec<u8>>,
}

impl ProbeConfig {
    pub fn new(target: SocketAddr) -> ProbeConfig {
        ProbeConfig {
            target,
            source: None,
            device: None,
            pings: 10,
            message_size: 64,
            step_timeout: Duration::from_secs(2),
            ping_interval: Duration::ZERO,
            poll_mode: PollMode::Events,
            fail_after: None,
            malformed: None,
        }
    }

    pub fn validate(&self) -> Result<(), Error> {
        if !(MESSAGE_HEADER..=MAX_MESSAGE_SIZE).contains(&self.message_size) {
            return Err(Error::InvalidConfig(format!(
                "message size {} is outside {MESSAGE_HEADER}..={MAX_MESSAGE_SIZE}",
                self.message_size
            )));
        }
        if self.step_timeout.is_zero() || self.step_timeout > Duration::from_secs(3600) {
            return Err(Error::InvalidConfig(
                "step timeout must be 1 ms..1 h".into(),
            ));
        }
        if let (Some(src), dst) = (self.source, self.target) {
            if src.is_ipv4() != dst.is_ipv4() {
                return Err(Error::InvalidConfig(format!(
                    "source {src} and target {dst} are of different families"
                )));
            }
        }
        Ok(())
    }
}

/// One full probe: resolve, connect, `config.pings` ping-pongs, disconnect,
/// destroy. Never panics on RDMA errors; every failure is in the outcome, and
/// every resource is freed before it returns.
pub fn probe_once(config: &ProbeConfig) -> ProbeOutcome {
    let mut out = ProbeOutcome::new(config.target, ProbeMode::OneShot, monotonic_ns());
    if let Err(err) = config.validate() {
        out.fail(Step::AddrResolve, &err);
        return out;
    }
    let Some(mut conn) = Connection::open(config, &mut out) else {
        return out;
    };
    let result = conn
        .ping_round(config, &mut out)
        .and_then(|()| conn.disconnect(config, &mut out));
    if let Err((step, err)) = result {
        out.fail(step, &err);
    }
    conn.teardown(&mut out);
    out
}

/// Persistent mode: one connection kept up across rounds of pings, so the
/// RTTs are steady-state, without setup cost. A round that fails drops the
/// connection; the next round sets up a new one.
pub struct PersistentProbe {
    config: ProbeConfig,
    conn: Option<Connection>,
}

impl PersistentProbe {
    pub fn new(config: ProbeConfig) -> PersistentProbe {
        PersistentProbe { config, conn: None }
    }

    pub fn config(&self) -> &ProbeConfig {
        &self.config
    }

    pub fn is_connected(&self) -> bool {
        self.conn.is_some()
    }

    /// `config.pings` ping-pongs, connecting first if needed (then the
    /// outcome carries the setup steps; otherwise `reused_connection`).
    pub fn round(&mut self) -> ProbeOutcome {
        let config = &self.config;
        let mut out = ProbeOutcome::new(config.target, ProbeMode::Persistent, monotonic_ns());
        if let Err(err) = config.validate() {
            out.fail(Step::AddrResolve, &err);
            return out;
        }
        let conn = match self.conn.take() {
            Some(conn) => {
                out.reused_connection = true;
                conn.describe(&mut out);
                conn
            }
            None => match Connection::open(config, &mut out) {
                Some(conn) => conn,
                None => return out,
            },
        };
        let mut conn = conn;
        match conn.ping_round(config, &mut out) {
            Ok(()) => self.conn = Some(conn),
            Err((step, err)) => {
                out.fail(step, &err);
                conn.teardown(&mut out);
            }
        }
        out
    }

    /// Disconnects and destroys the connection, if there is one, and returns
    /// an outcome of its own with the `disconnect` step and the QP's last calls.
    pub fn shut(&mut self) -> Option<ProbeOutcome> {
        self.conn.as_ref()?;
        let mut out = ProbeOutcome::new(self.config.target, ProbeMode::Persistent, monotonic_ns());
        out.reused_connection = true;
        self.close(&mut out);
        Some(out)
    }

    /// Disconnects and destroys the connection, recording the `disconnect`
    /// step and the QP's last calls into `out` (e.g. the last round's).
    pub fn close(&mut self, out: &mut ProbeOutcome) {
        if let Some(mut conn) = self.conn.take() {
            if let Err((step, err)) = conn.disconnect(&self.config, out) {
                out.fail(step, &err);
            }
            conn.teardown(out);
        }
    }
}

type StepResult<T> = Result<T, (Step, Error)>;

fn at<T>(step: Step, r: Result<T, Error>) -> StepResult<T> {
    r.map_err(|e| (step, e))
}

fn inject(config: &ProbeConfig, step: Step) -> StepResult<()> {
    match config.fail_after {
        Some(s) if s == step => Err((step, Error::Injected(step))),
        _ => Ok(()),
    }
}

fn modify_call_name(state: QpState) -> &'static str {
    match state {
        QpState::Reset => "ibv_modify_qp(RESET)",
        QpState::Init => "ibv_modify_qp(INIT)",
        QpState::Rtr => "ibv_modify_qp(RTR)",
        QpState::Rts => "ibv_modify_qp(RTS)",
        QpState::Sqd => "ibv_modify_qp(SQD)",
        QpState::Sqe => "ibv_modify_qp(SQE)",
        QpState::Err => "ibv_modify_qp(ERR)",
    }
}

/// The requester's connection: every field an RAII guard (the `Arc` parents
/// make the drop order safe); `teardown` destroys the QP first, timed.
struct Connection {
    qp: Option<QueuePair>,
    mr: Option<MemoryRegion>,
    cq: Option<Arc<CompletionQueue>>,
    id: Arc<CmId>,
    channel: Arc<EventChannel>,
    inline: bool,
    /// The CQ is armed and its event not yet taken (ibv_req_notify_cq).
    cq_armed: Cell<bool>,
    next_seq: u64,
    device: Option<String>,
    port_num: u8,
    source: Option<SocketAddr>,
    remote_qp_num: Option<u32>,
}

impl Connection {
    /// Runs the setup steps; on failure records it in `out`, frees
    /// everything and returns `None`.
    fn open(config: &ProbeConfig, out: &mut ProbeOutcome) -> Option<Connection> {
        let start = monotonic_ns();
        let created =
            EventChannel::new().and_then(|channel| Ok((CmId::create(&channel)?, channel)));
        let (id, channel) = match created {
            Ok(v) => v,
            Err(err) => {
                out.fail(Step::AddrResolve, &err);
                return None;
            }
        };
        let mut conn = Connection {
            qp: None,
            mr: None,
            cq: None,
            id,
            channel,
            inline: false,
            cq_armed: Cell::new(false),
            next_seq: 0,
            device: None,
            port_num: 0,
            source: None,
            remote_qp_num: None,
        };
        match conn.set_up(config, out) {
            Ok(()) => {
                out.setup = Some(elapsed(start, monotonic_ns()));
                Some(conn)
            }
            Err((step, err)) => {
                out.fail(step, &err);
                conn.teardown(out);
                None
            }
        }
    }

    fn describe(&self, out: &mut ProbeOutcome) {
        out.device = self.device.clone();
        out.port_num = Some(self.port_num);
        out.source = self.source;
        out.qp_num = self.qp.as_ref().map(|qp| qp.qp_num());
        out.remote_qp_num = self.remote_qp_num;
    }

    fn set_up(&mut self, config: &ProbeConfig, out: &mut ProbeOutcome) -> StepResult<()> {
        let cm_timer_ms =
            i32::try_from((config.step_timeout + CM_TIMER_SLACK).as_millis()).unwrap_or(i32::MAX);

        let step = Step::AddrResolve;
        let t = monotonic_ns();
        let source = config.source.map(|ip| SocketAddr::new(ip, 0));
        at(
            step,
            self.id.resolve_addr(source, config.target, cm_timer_ms),
        )?;
        at(
            step,
            self.await_event(
                step,
                CmEventKind::AddrResolved,
                config.step_timeout + CM_TIMER_SLACK * 2,
            ),
        )?;
        out.steps.insert(step, elapsed(t, monotonic_ns()));
        self.device = self.id.device_name();
        self.port_num = self.id.port_num();
        self.source = self.id.local_addr();
        self.describe(out);
        if let (Some(requested), Some(actual)) = (&config.device, &self.device) {
            if requested != actual {
                return Err((
                    step,
                    Error::DeviceMismatch {
                        target: config.target,
                        requested: requested.clone(),
                        actual: actual.clone(),
                    },
                ));
            }
        }
        inject(config, step)?;

        let step = Step::RouteResolve;
        let t = monotonic_ns();
        at(step, self.id.resolve_route(cm_timer_ms))?;
        at(
            step,
            self.await_event(
                step,
                CmEventKind::RouteResolved,
                config.step_timeout + CM_TIMER_SLACK * 2,
            ),
        )?;
        out.steps.insert(step, elapsed(t, monotonic_ns()));
        inject(config, step)?;

        let step = Step::QpCreate;
        let t = monotonic_ns();
        at(step, self.create_qp(config, out))?;
        out.steps.insert(step, elapsed(t, monotonic_ns()));
        self.describe(out);
        inject(config, step)?;

        let step = Step::Connect;
        let t = monotonic_ns();
        let qp_num = self.qp.as_ref().map_or(0, |qp| qp.qp_num());
        let mut param = rc_conn_param(qp_num);
        at(step, self.id.connect(&mut param))?;
        let event = at(
            step,
            self.await_event(step, CmEventKind::ConnectResponse, config.step_timeout),
        )?;
        self.remote_qp_num = Some(event.peer_qp_num);
        out.remote_qp_num = self.remote_qp_num;
        out.steps.insert(step, elapsed(t, monotonic_ns()));
        inject(config, step)?;

        let step = Step::Established;
        let t = monotonic_ns();
        at(step, self.modify_qp(QpState::Rtr, out))?;
        at(step, self.modify_qp(QpState::Rts, out))?;
        at(step, self.id.establish())?;
        out.steps.insert(step, elapsed(t, monotonic_ns()));
        inject(config, step)
    }

    /// PD, completion channel, CQ, QP (RESET→INIT), MR, one receive posted.
    fn create_qp(&mut self, config: &ProbeConfig, out: &mut ProbeOutcome) -> Result<(), Error> {
        let pd = ProtectionDomain::alloc(&self.id)?;
        let comp_channel = CompletionChannel::create(&self.id)?;
        let cq = CompletionQueue::create(&comp_channel, 8)?;
        let want_inline = if config.message_size <= 256 {
            config.message_size as u32
        } else {
            0
        };
        let caps = QpCaps {
            send_wr: 4,
            recv_wr: 4,
            inline_data: want_inline,
        };
        let start = monotonic_ns();
        let created = QueuePair::create(&pd, &cq, caps);
        let duration = elapsed(start, monotonic_ns());
        let qp = created?;
        out.qp_num = Some(qp.qp_num());
        out.qp_calls.entry(qp.qp_num()).or_default().push(QpCall {
            kind: QpCallKind::Create,
            target_state: None,
            start_ns: start,
            duration,
            rc: 0,
        });
        self.inline = want_inline > 0 && qp.max_inline_data() >= want_inline;
        self.qp = Some(qp);
        self.cq = Some(cq);
        self.modify_qp(QpState::Init, out)?;
        let malformed = config.malformed.as_ref().map_or(0, Vec::len);
        let mr = MemoryRegion::register(&pd, 2 * config.message_size + malformed)?;
        if let Some(qp) = &self.qp {
            qp.post_recv(WR_RECV, &mr, config.message_size, config.message_size)?;
        }
        self.mr = Some(mr);
        Ok(())
    }

    /// One timed ibv_modify_qp to `state`; attributes from rdma_init_qp_attr
    /// (ERR needs none).
    fn modify_qp(&self, state: QpState, out: &mut ProbeOutcome) -> Result<(), Error> {
        let Some(qp) = &self.qp else {
            return Ok(());
        };
        let (mut attr, mask) = if state == QpState::Err {
            // SAFETY: ibv_qp_attr is plain old data; all-zero is valid.
            let mut attr: ibv_qp_attr = unsafe { std::mem::MaybeUninit::zeroed().assume_init() };
            attr.qp_state = state.to_kernel();
            (attr, ibv_qp_attr_mask::IBV_QP_STATE.0 as i32)
        } else {
            self.id.init_qp_attr(state)?
        };
        let start = monotonic_ns();
        let rc = qp.modify(&mut attr, mask);
        let duration = elapsed(start, monotonic_ns());
        out.qp_calls.entry(qp.qp_num()).or_default().push(QpCall {
            kind: QpCallKind::Modify,
            target_state: Some(state),
            start_ns: start,
            duration,
            rc,
        });
        if rc != 0 {
            return Err(Error::verbs_rc(modify_call_name(state), rc));
        }
        Ok(())
    }

    /// Waits for the next CM event on this connection and requires `expected`.
    fn await_event(
        &self,
        step: Step,
        expected: CmEventKind,
        timeout: Duration,
    ) -> Result<CmEvent, Error> {
        let deadline = Deadline::after(timeout);
        loop {
            let now = monotonic_ns();
            if deadline.expired(now) {
                return Err(Error::Timeout { step, timeout });
            }
            match self.channel.next_event(deadline.poll_timeout_ms(now))? {
                None => continue,
                Some(event) if event.id != self.id.raw() => continue,
                Some(event) if event.kind == expected => return Ok(event),
                Some(event) => {
                    return Err(Error::CmEvent {
                        step,
                        expected,
                        got: event.kind,
                        status: event.status,
                    })
                }
            }
        }
    }

    fn ping_round(&mut self, config: &ProbeConfig, out: &mut ProbeOutcome) -> StepResult<()> {
        for i in 0..config.pings {
            if i > 0 && !config.ping_interval.is_zero() {
                std::thread::sleep(config.ping_interval);
            }
            let rtt = at(Step::Ping, self.ping(config))?;
            out.rtts.push(rtt);
            if i == 0 {
                inject(config, Step::Ping)?;
            }
        }
        Ok(())
    }

    /// One SEND and its echo; the RTT runs from just before ibv_post_send to
    /// the poll that returned the echo's receive completion.
    fn ping(&mut self, config: &ProbeConfig) -> Result<Duration, Error> {
        let seq = self.next_seq;
        self.next_seq += 1;
        let (Some(qp), Some(mr), Some(cq)) = (&self.qp, &self.mr, &self.cq) else {
            return Err(Error::InvalidConfig("connection not set up".into()));
        };
        let size = config.message_size;
        let mut header = [0u8; MESSAGE_HEADER];
        header[..8].copy_from_slice(&MAGIC.to_le_bytes());
        header[8..].copy_from_slice(&seq.to_le_bytes());
        mr.write(0, &header);

        let start = monotonic_ns();
        let deadline = Deadline::new(start, config.step_timeout);
        match &config.malformed {
            Some(bytes) => {
                mr.write(2 * size, bytes);
                qp.post_send(WR_SEND, mr, 2 * size, bytes.len(), false)?;
            }
            None => qp.post_send(WR_SEND, mr, 0, size, self.inline)?,
        }
        let mut sent = false;
        let mut rtt = None;
        let armed = &self.cq_armed;
        let mut spins: u32 = 0;
        let mut wcs = [Completion::default(); 4];
        while !(sent && rtt.is_some()) {
            let n = cq.poll(&mut wcs)?;
            let now = monotonic_ns();
            for wc in &wcs[..n] {
                if !wc.is_success() {
                    return Err(Error::WorkCompletion {
                        step: Step::Ping,
                        opcode: if wc.wr_id == WR_SEND { "SEND" } else { "RECV" },
                        status: wc.status,
                        status_text: wc.status_text(),
                        vendor_err: wc.vendor_err,
                    });
                }
                match (wc.wr_id, wc.opcode) {
                    (WR_SEND, _) => sent = true,
                    (WR_RECV, ibv_wc_opcode::IBV_WC_RECV) => {
                        check_echo(mr, size, seq, wc.byte_len)?;
                        rtt = Some(elapsed(start, now));
                    }
                    _ => {}
                }
            }
            if n > 0 {
                continue;
            }
            if deadline.expired(now) {
                return Err(Error::Timeout {
                    step: Step::Ping,
                    timeout: config.step_timeout,
                });
            }
            match config.poll_mode {
                PollMode::Busy => {
                    spins = spins.wrapping_add(1);
                    if spins.is_multiple_of(4096) {
                        self.check_peer(0)?;
                    }
                }
                PollMode::Events if !armed.get() => {
                    // Poll once more after arming: a completion that came in
                    // before the arm raises no event.
                    cq.arm()?;
                    armed.set(true);
                }
                PollMode::Events => {
                    let comp_fd = cq.channel().fd();
                    let mut fds = [pollin(comp_fd), pollin(self.channel.fd())];
                    poll_fds(&mut fds, deadline.poll_timeout_ms(now))?;
                    if fds[0].revents != 0 && cq.channel().take_event(cq)? {
                        armed.set(false);
                    }
                    if fds[1].revents != 0 {
                        self.check_peer(0)?;
                    }
                }
            }
        }
        qp.post_recv(WR_RECV, mr, size, size)?;
        Ok(rtt.unwrap_or_default())
    }

    /// Fails if rdma_cm reports the peer gone.
    fn check_peer(&self, timeout_ms: i32) -> Result<(), Error> {
        while let Some(event) = self.channel.next_event(timeout_ms)? {
            match event.kind {
                CmEventKind::Disconnected | CmEventKind::DeviceRemoval => {
                    return Err(Error::PeerDisconnected { step: Step::Ping });
                }
                _ => continue,
            }
        }
        Ok(())
    }

    /// QP → ERR, rdma_disconnect (DREQ), wait for DISCONNECTED (DREP).
    fn disconnect(&mut self, config: &ProbeConfig, out: &mut ProbeOutcome) -> StepResult<()> {
        let step = Step::Disconnect;
        let t = monotonic_ns();
        // librdmacm's rdma_disconnect only moves a QP it owns to ERR
        // (ucma_modify_qp_err); this one is ours.
        at(step, self.modify_qp(QpState::Err, out))?;
        at(step, self.id.disconnect())?;
        at(
            step,
            self.await_event(step, CmEventKind::Disconnected, config.step_timeout),
        )?;
        out.steps.insert(step, elapsed(t, monotonic_ns()));
        inject(config, step)
    }

    /// Frees everything, the QP first with a timed ibv_destroy_qp.
    fn teardown(mut self, out: &mut ProbeOutcome) {
        if let Some(qp) = self.qp.take() {
            let qp_num = qp.qp_num();
            let start = monotonic_ns();
            let rc = qp.destroy();
            out.qp_calls.entry(qp_num).or_default().push(QpCall {
                kind: QpCallKind::Destroy,
                target_state: None,
                start_ns: start,
                duration: elapsed(start, monotonic_ns()),
                rc,
            });
        }
        // MR, CQ, completion channel, PD, cm_id, event channel: the rest of
        // `self` drops here; the Arc parents keep that order.
    }
}

fn check_echo(mr: &MemoryRegion, size: usize, seq: u64, byte_len: u32) -> Result<(), Error> {
    if byte_len as usize != size {
        return Err(Error::BadEcho {
            seq,
            detail: format!("{byte_len} bytes, sent {size}"),
        });
    }
    let mut header = [0u8; MESSAGE_HEADER];
    mr.read(size, &mut header);
    let magic = u64::from_le_bytes(header[..8].try_into().unwrap_or_default());
    let echoed = u64::from_le_bytes(header[8..].try_into().unwrap_or_default());
    if magic != MAGIC || echoed != seq {
        return Err(Error::BadEcho {
            seq,
            detail: format!("got sequence {echoed} (magic {magic:#x})"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation() {
        let mut c = ProbeConfig::new("198.18.0.1:9723".parse().unwrap());
        assert!(c.validate().is_ok());
        c.message_size = MESSAGE_HEADER - 1;
        assert!(c.validate().is_err());
        c.message_size = MAX_MESSAGE_SIZE;
        assert!(c.validate().is_ok());
        c.step_timeout = Duration::ZERO;
        assert!(c.validate().is_err());
        c.step_timeout = Duration::from_millis(1);
        c.source = Some("::1".parse().unwrap());
        assert!(c
            .validate()
            .unwrap_err()
            .to_string()
            .contains("different families"));
    }

    #[test]
    fn invalid_config_fails_the_probe_without_touching_rdma() {
        let mut c = ProbeConfig::new("198.18.0.1:9723".parse().unwrap());
        c.message_size = 1;
        let out = probe_once(&c);
        assert_eq!(out.result, crate::ProbeResult::Error);
        assert_eq!(out.failed_step, Some(Step::AddrResolve));
        assert!(out.qp_calls.is_empty());
    }
}
