//! The UD probe mesh: one UD QP per local RDMA device, driven by one thread,
//! probes every target and answers every peer (R-Pingmesh's design).
//!
//! - Targets are resolved through rdma_cm in `RDMA_PS_UDP` (SIDR): the
//!   peer's listener answers with its UD QP number and Q_Key; the address
//!   handle comes from the route rdma_cm resolved (RoCEv2 GID of the IP).
//! - A probe carries a sequence number and the sender's timestamp; the
//!   answer adds the responder's receive and send times; the prober times
//!   the probe's send completion: the RTT breakdown of [`Answer`].
//! - QPs and threads do not grow with the number of targets.
//!
//! API contract (shared with the agent; keep stable):

use std::{
    net::{IpAddr, SocketAddr},
    sync::Arc,
    time::Duration,
};

use crate::{error::Error, guard::AllowList, outcome::QpCall};

/// rdma_cm port (RDMA_PS_UDP space) of the UD responder when none is given.
/// Same number as the RC responder's; the port spaces are apart.
pub const DEFAULT_UD_PORT: u16 = crate::target::DEFAULT_PORT;

/// Probes a UD responder answers per second and source by default: twice
/// what one prober sends a target at its fastest (`interval_seconds` 0.01).
pub const DEFAULT_ANSWER_RATE_PER_SOURCE: f64 = 200.0;

/// Sources the answer rate limiter keeps a bucket for at most.
pub const RATE_LIMITED_SOURCES: usize = 4096;

/// The mesh's settings that hold for every target.
#[derive(Debug, Clone, PartialEq)]
pub struct MeshConfig {
    /// Where the UD responder listens (RDMA_PS_UDP); `None`: probe only, answer no one.
    pub listen: Option<SocketAddr>,
    /// A probe not answered within this is lost.
    pub timeout: Duration,
    /// Target resolution (addr, route, SIDR) gives up after this; retried
    /// after `resolve_retry`.
    pub resolve_timeout: Duration,
    pub resolve_retry: Duration,
    /// Bytes of a probe message (header included).
    pub message_size: usize,
    /// Measure each probe's prober delay (its send completion looked up in
    /// the in-flight table); off: [`Answer::prober_delay_ns`] is `None`.
    pub rtt_breakdown: bool,
    /// The responder answers SIDR requests and probes from these sources only.
    pub allow: AllowList,
    /// Probes answered per second and source address at most (a token
    /// bucket as deep as one second's worth); `None`: no limit.
    pub answer_rate_per_source: Option<f64>,
    /// Testing aid: every probe sent is these bytes instead (see
    /// [`crate::malformed_payload`]); the responder drops them.
    pub malformed: Option<Vec<u8>>,
}

impl Default for MeshConfig {
    fn default() -> Self {
        Self {
            listen: None,
            timeout: Duration::from_secs(1),
            resolve_timeout: Duration::from_secs(2),
            resolve_retry: Duration::from_secs(5),
            message_size: 64,
            rtt_breakdown: true,
            allow: AllowList::everyone(),
            answer_rate_per_source: Some(DEFAULT_ANSWER_RATE_PER_SOURCE),
            malformed: None,
        }
    }
}

/// One peer to probe.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MeshTarget {
    /// The caller's key for this target (reported back in every callback).
    pub key: Arc<str>,
    /// The peer's UD responder (rdma_cm RDMA_PS_UDP address and port).
    pub address: SocketAddr,
    /// Local address to probe from (picks the device); `None`: routing decides.
    pub source: Option<IpAddr>,
    /// Time between two probes to this target.
    pub interval: Duration,
}

/// The clock the prober's side of an [`Answer`] was measured with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Clock {
    /// CLOCK_MONOTONIC, read by the mesh thread just before it posts a probe
    /// and when it polls a completion: the prober delay includes the thread's
    /// own wake-up and polling. The only clock used so far: device completion
    /// timestamps (`IBV_WC_EX_WITH_COMPLETION_TIMESTAMP`) are detected and
    /// logged per device, not read.
    Software,
    /// The device's completion timestamps.
    Device,
}

impl Clock {
    pub const ALL: [Clock; 2] = [Clock::Software, Clock::Device];

    pub fn as_str(self) -> &'static str {
        match self {
            Clock::Software => "software",
            Clock::Device => "device",
        }
    }
}

/// An answered probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub seq: u64,
    /// Sender's clock (CLOCK_MONOTONIC) when the probe was posted and when
    /// the answer was polled: `rtt = received - sent`.
    pub sent_ns: u64,
    pub received_ns: u64,
    /// Responder's clock (its own CLOCK_MONOTONIC): when it polled the probe
    /// and when it posted the answer. Only `responder_tx_ns -
    /// responder_rx_ns` means anything on this side.
    pub responder_rx_ns: u64,
    pub responder_tx_ns: u64,
    /// From posting the probe to polling its send completion, in `clock`'s
    /// nanoseconds; `None`: not measured ([`MeshConfig::rtt_breakdown`]
    /// off). An answer polled before its probe's send completion gets the
    /// RTT: the send completion is polled no earlier, so this is a lower
    /// bound, and exact when both came in one poll batch (one timestamp).
    pub prober_delay_ns: Option<u64>,
    pub clock: Clock,
}

impl Answer {
    pub fn rtt(&self) -> Duration {
        Duration::from_nanos(self.received_ns.saturating_sub(self.sent_ns))
    }

    /// Time the probe spent in the responder (host delay on the far side),
    /// at most the whole RTT: the responder's software estimate can
    /// overstate (see [`Answer::responder_delay_clamped`]).
    pub fn responder_delay(&self) -> Duration {
        Duration::from_nanos(self.responder_tx_ns.saturating_sub(self.responder_rx_ns))
            .min(self.rtt())
    }

    /// The responder claimed more than the whole RTT (its estimate of a
    /// starved thread's wait counted time before the probe came): its delay
    /// is taken as the RTT, the network RTT as 0.
    pub fn responder_delay_clamped(&self) -> bool {
        self.responder_tx_ns.saturating_sub(self.responder_rx_ns) > self.rtt().as_nanos() as u64
    }

    /// The RTT less the responder's delay. With [`Clock::Software`] it still
    /// holds the prober's own delay on both ends (posting, and polling the
    /// answer): the prober delay is not subtracted, as its send completion is
    /// polled by the same thread, often after the packet left and sometimes
    /// after the answer came.
    pub fn network_rtt(&self) -> Duration {
        self.rtt().saturating_sub(self.responder_delay())
    }

    pub fn prober_delay(&self) -> Option<Duration> {
        self.prober_delay_ns.map(Duration::from_nanos)
    }

    /// Whether the responder's times are possible: answer posted no earlier
    /// than the probe was received. If not (a clock bug, a broken or lying
    /// peer), the answer's RTT still holds, its network RTT and responder
    /// delay do not.
    pub fn responder_times_fit(&self) -> bool {
        self.responder_tx_ns >= self.responder_rx_ns
    }
}

/// Why a UD responder did not answer a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// Too short, wrong magic or version.
    Malformed,
    /// An answer to a probe no longer in flight (late, after its timeout, or duplicated).
    UnknownAnswer,
    /// No address handle could be made back to the sender.
    NoReturnPath,
    /// The send queue was full.
    SendQueueFull,
    /// A probe from a source outside the allow-list.
    NotAllowed,
    /// A probe beyond its source's answer rate.
    RateLimited,
    /// A probe from a new source while the rate limiter's table is full.
    RateTableFull,
    /// A SIDR request from a source outside the allow-list (rejected).
    SidrNotAllowed,
}

impl Dropped {
    pub const ALL: [Dropped; 8] = [
        Dropped::Malformed,
        Dropped::UnknownAnswer,
        Dropped::NoReturnPath,
        Dropped::SendQueueFull,
        Dropped::NotAllowed,
        Dropped::RateLimited,
        Dropped::RateTableFull,
        Dropped::SidrNotAllowed,
    ];
    pub fn as_str(self) -> &'static str {
        match self {
            Dropped::Malformed => "malformed",
            Dropped::UnknownAnswer => "unknown_answer",
            Dropped::NoReturnPath => "no_return_path",
            Dropped::SendQueueFull => "send_queue_full",
            Dropped::NotAllowed => "not_allowed",
            Dropped::RateLimited => "rate_limited",
            Dropped::RateTableFull => "rate_table_full",
            Dropped::SidrNotAllowed => "sidr_not_allowed",
        }
    }
}

/// Where the mesh thread reports; called on the mesh thread, must not block.
pub trait MeshSink: Send + Sync {
    /// The UD QP of a device was created (for the eBPF cross-check).
    fn qp_created(&self, device: &str, qp_num: u32, calls: &[QpCall]);
    /// A target resolved (SIDR answered): remote QP number, local device.
    fn resolved(&self, target: &Arc<str>, device: &str, remote_qp_num: u32);
    /// A target could not be resolved (it is retried); `error` says why.
    fn resolve_failed(&self, target: &Arc<str>, error: &Error);
    /// A probe was posted to the target.
    fn sent(&self, target: &Arc<str>);
    /// A probe could not be posted (the error says why); it counts as lost.
    fn send_failed(&self, target: &Arc<str>, error: &Error);
    fn answered(&self, target: &Arc<str>, answer: &Answer);
    /// A probe had no answer within the timeout.
    fn lost(&self, target: &Arc<str>, seq: u64);
    /// The responder answered a peer's probe on `device`.
    fn responded(&self, device: &str);
    /// A received message was not answered / not matched.
    fn dropped(&self, reason: Dropped);
}

/// Counters over the mesh's life (for tests and the CLI).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MeshStats {
    /// UD QPs the mesh holds now (one per device in use).
    pub qps: usize,
    /// Threads the mesh runs (1).
    pub threads: usize,
    pub targets: usize,
    pub resolved: usize,
    pub sent: u64,
    pub answered: u64,
    pub lost: u64,
    pub responded: u64,
}

/// Writes a probe's header into `out` (at least [`wire::HEADER_LEN`] bytes):
/// what a testing aid makes malformed ([`crate::malformed_payload`]).
pub fn encode_probe(out: &mut [u8]) {
    wire::Message::probe(1, 0).encode(out);
}

mod counted;
mod device;
mod engine;
mod schedule;
mod wire;

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::thread::JoinHandle;

pub use counted::{probe_counted, CountedProbe, CountedSummary};

use crate::verbs::EventFd;
use engine::{Control, Counters, Engine};

/// Starts the mesh.
pub struct Mesh;

impl Mesh {
    /// Binds the UD listener (if `config.listen`) and starts the mesh thread
    /// with no targets; `Err` if the listener cannot bind.
    pub fn spawn(config: MeshConfig, sink: Arc<dyn MeshSink>) -> Result<MeshHandle, Error> {
        Self::start(config, sink, None)
    }

    /// As [`Mesh::spawn`], but every target gets at most `probes` probes
    /// (the CLI's `--count`); after that the target stays resolved, silent.
    pub fn spawn_limited(
        config: MeshConfig,
        sink: Arc<dyn MeshSink>,
        probes: u64,
    ) -> Result<MeshHandle, Error> {
        Self::start(config, sink, Some(probes))
    }

    fn start(
        config: MeshConfig,
        sink: Arc<dyn MeshSink>,
        limit: Option<u64>,
    ) -> Result<MeshHandle, Error> {
        let control = Arc::new(Control {
            wake: EventFd::new()?,
            stop: Default::default(),
            targets: Mutex::new(None),
        });
        let counters = Arc::new(Counters::default());
        let engine = Engine::new(config, sink, counters.clone(), control.clone(), limit)?;
        counters.threads.store(1, Ordering::Relaxed);
        let thread = std::thread::Builder::new()
            .name("qpwatch-mesh".into())
            .spawn(move || engine.run())
            .map_err(|e| Error::Os {
                call: "pthread_create",
                errno: crate::error::Errno(e.raw_os_error().unwrap_or(0)),
            })?;
        Ok(MeshHandle {
            control,
            counters,
            thread,
        })
    }
}

/// The running mesh.
pub struct MeshHandle {
    control: Arc<Control>,
    counters: Arc<Counters>,
    thread: JoinHandle<Result<(), Error>>,
}

impl MeshHandle {
    /// Replaces the target list. Targets whose (key, address, source) did
    /// not change keep their resolution and sequence numbers; removed
    /// targets' probes in flight are forgotten (not lost).
    pub fn set_targets(&self, targets: Vec<MeshTarget>) {
        if let Ok(mut pending) = self.control.targets.lock() {
            *pending = Some(targets);
        }
        self.control.wake.signal();
    }

    pub fn stats(&self) -> MeshStats {
        self.counters.snapshot()
    }

    /// Whether the mesh thread ended (it only does on stop or a fatal error).
    pub fn is_finished(&self) -> bool {
        self.thread.is_finished()
    }

    /// Stops the thread, frees every RDMA object, returns the final counters.
    pub fn stop(self) -> Result<MeshStats, Error> {
        self.control.stop.store(true, Ordering::Release);
        self.control.wake.signal();
        let result = self
            .thread
            .join()
            .unwrap_or_else(|_| Err(Error::InvalidConfig("the mesh thread panicked".into())));
        result.map(|()| self.counters.snapshot())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(sent: u64, received: u64, rx: u64, tx: u64) -> Answer {
        Answer {
            seq: 1,
            sent_ns: sent,
            received_ns: received,
            responder_rx_ns: rx,
            responder_tx_ns: tx,
            prober_delay_ns: None,
            clock: Clock::Software,
        }
    }

    #[test]
    fn breakdown_arithmetic() {
        // 100 µs RTT, 30 µs in the responder (its clock far from ours)
        let a = answer(1_000_000, 1_100_000, 7_000_000_000, 7_000_030_000);
        assert_eq!(a.rtt(), Duration::from_micros(100));
        assert_eq!(a.responder_delay(), Duration::from_micros(30));
        assert_eq!(a.network_rtt(), Duration::from_micros(70));
        assert!(a.responder_times_fit());
        assert_eq!(a.prober_delay(), None);
        let a = Answer {
            prober_delay_ns: Some(12_000),
            ..a
        };
        assert_eq!(a.prober_delay(), Some(Duration::from_micros(12)));
        assert_eq!(a.network_rtt(), Duration::from_micros(70), "not subtracted");

        // the whole RTT in the responder: possible, network RTT 0
        let a = answer(0, 50, 10, 60);
        assert!(a.responder_times_fit());
        assert_eq!(a.network_rtt(), Duration::ZERO);
    }

    #[test]
    fn a_responder_delay_beyond_the_rtt_is_clamped() {
        // the responder claims more than the RTT: all of it is the host's
        let a = answer(0, 100, 0, 101);
        assert!(a.responder_times_fit());
        assert!(a.responder_delay_clamped());
        assert_eq!(a.responder_delay(), Duration::from_nanos(100));
        assert_eq!(a.network_rtt(), Duration::ZERO, "never negative");
        let a = answer(0, 100, 0, u64::MAX);
        assert!(a.responder_delay_clamped());
        assert_eq!(a.network_rtt(), Duration::ZERO);
        assert!(!answer(0, 100, 0, 100).responder_delay_clamped());
    }

    #[test]
    fn impossible_responder_times_do_not_fit() {
        // answer posted before the probe was received
        let a = answer(0, 100, 50, 10);
        assert!(!a.responder_times_fit());
        assert_eq!(a.responder_delay(), Duration::ZERO);
    }

    #[test]
    fn clock_names() {
        let names: Vec<&str> = Clock::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, ["software", "device"]);
    }

    #[test]
    fn handle_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<MeshHandle>();
    }
}
