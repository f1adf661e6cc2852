//! `rdma-probe probe|responder`: the library's requester and responder on the
//! command line. Exit status of `probe`: 0 when every probe is ok, 3 when some
//! failed (the summary says which and why), 2 on bad usage, 1 on other errors.

use std::io::Write;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use rdma_probe::{
    parse_endpoint, parse_target, probe_summary, PollMode, ProbeConfig, ProbeMode, Responder,
    ResponderConfig, Step, DEFAULT_PORT,
};

#[derive(Parser)]
#[command(
    name = "rdma-probe",
    version,
    about = "Synthetic RDMA (rdma_cm RC) probes and their echo responder"
)]
struct Cli {
    /// Log level on stderr: error, warn, info, debug.
    #[arg(long, global = true, default_value = "info", value_parser = parse_level)]
    log_level: log::LevelFilter,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Probe a responder and print latency statistics.
    Probe(ProbeArgs),
    /// Accept probe connections and echo every message.
    Responder(ResponderArgs),
}

#[derive(Args)]
struct ProbeArgs {
    /// Responder address, IP[:PORT].
    #[arg(long, value_parser = parse_target_arg)]
    target: std::net::SocketAddr,
    /// Local address to resolve from.
    #[arg(long)]
    source: Option<IpAddr>,
    /// Require the target to resolve to this RDMA device.
    #[arg(long)]
    device: Option<String>,
    /// Ping-pongs per probe.
    #[arg(long, default_value_t = 10)]
    count: u32,
    /// Number of probes (persistent mode: rounds on one connection).
    #[arg(long, default_value_t = 1)]
    probes: u32,
    /// Keep one connection up and only ping-pong (steady-state RTT).
    #[arg(long)]
    persistent: bool,
    /// Timeout of every step and of every ping, in ms.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// Pause between pings, in ms.
    #[arg(long, default_value_t = 0)]
    interval_ms: u64,
    /// Pause between probes, in ms.
    #[arg(long, default_value_t = 0)]
    probe_interval_ms: u64,
    /// Message size in bytes.
    #[arg(long, default_value_t = 64)]
    size: usize,
    /// Spin on the CQ instead of sleeping on the completion channel.
    #[arg(long)]
    busy_poll: bool,
    /// Fault injection: fail every probe right after this step
    /// (addr_resolve, route_resolve, qp_create, connect, established, ping, disconnect).
    #[arg(long, env = "RDMA_PROBE_FAIL_AFTER")]
    fail_after: Option<Step>,
    /// Print the summary as JSON instead of the table.
    #[arg(long)]
    json: bool,
    /// Stay alive this long after the summary, or until SIGINT/SIGTERM (all
    /// probe resources already freed), so a test can inspect the process.
    #[arg(long, default_value_t = 0)]
    linger_ms: u64,
}

#[derive(Args)]
struct ResponderArgs {
    /// Address to listen on, IP[:PORT].
    #[arg(long, default_value = "0.0.0.0", value_parser = parse_listen_arg)]
    listen: std::net::SocketAddr,
    /// Largest message echoed, in bytes.
    #[arg(long, default_value_t = rdma_probe::MAX_MESSAGE_SIZE)]
    max_size: usize,
    /// Close connections not established within this many ms.
    #[arg(long, default_value_t = 10_000)]
    accept_timeout_ms: u64,
    /// Close connections idle for this many ms.
    #[arg(long, default_value_t = 120_000)]
    idle_timeout_ms: u64,
    /// Reject connect requests beyond this many connections.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Reject connect requests beyond this many connections of one source address.
    #[arg(long, default_value_t = 8)]
    max_per_source: usize,
    /// Spin on the CQs instead of sleeping on completion channels.
    #[arg(long)]
    busy_poll: bool,
    /// On exit, print the counters as JSON on stdout.
    #[arg(long)]
    json: bool,
}

fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    s.parse().map_err(|_| format!("unknown log level {s:?}"))
}

fn parse_target_arg(s: &str) -> Result<std::net::SocketAddr, String> {
    parse_target(s).map_err(|e| e.to_string())
}

fn parse_listen_arg(s: &str) -> Result<std::net::SocketAddr, String> {
    parse_endpoint(s, DEFAULT_PORT).map_err(|e| e.to_string())
}

fn poll_mode(busy: bool) -> PollMode {
    if busy {
        PollMode::Busy
    } else {
        PollMode::Events
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    StderrLogger::install(cli.log_level);
    let result = match cli.command {
        Command::Probe(args) => run_probe(args),
        Command::Responder(args) => run_responder(args),
    };
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("rdma-probe: {err:#}");
            ExitCode::from(1)
        }
    }
}

fn run_probe(args: ProbeArgs) -> Result<ExitCode> {
    let mut config = ProbeConfig::new(args.target);
    config.source = args.source;
    config.device = args.device;
    config.pings = args.count;
    config.message_size = args.size;
    config.step_timeout = Duration::from_millis(args.timeout_ms);
    config.ping_interval = Duration::from_millis(args.interval_ms);
    config.poll_mode = poll_mode(args.busy_poll);
    config.fail_after = args.fail_after;
    config.validate().context("invalid probe options")?;

    let mode = if args.persistent {
        ProbeMode::Persistent
    } else {
        ProbeMode::OneShot
    };
    let interval = Duration::from_millis(args.probe_interval_ms);
    let summary = probe_summary(&config, mode, args.probes, interval);
    let mut stdout = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer(&mut stdout, &summary)?;
        writeln!(stdout)?;
    } else {
        write!(stdout, "{}", summary.render_table())?;
    }
    stdout.flush()?;
    drop(stdout);
    if args.linger_ms > 0 {
        let signals = TermSignals::block().context("blocking SIGINT/SIGTERM")?;
        signals.wait(Duration::from_millis(args.linger_ms));
    }
    Ok(if summary.all_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn run_responder(args: ResponderArgs) -> Result<ExitCode> {
    let mut config = ResponderConfig::new(args.listen);
    config.max_message_size = args.max_size;
    config.accept_timeout = Duration::from_millis(args.accept_timeout_ms);
    config.idle_timeout = Duration::from_millis(args.idle_timeout_ms);
    config.max_connections = args.max_connections;
    config.max_per_source = args.max_per_source;
    config.poll_mode = poll_mode(args.busy_poll);

    // Block SIGINT/SIGTERM before the serving thread starts (it inherits the
    // mask), then take them synchronously here.
    let signals = TermSignals::block().context("blocking SIGINT/SIGTERM")?;
    let handle =
        Responder::spawn(config).with_context(|| format!("responder on {}", args.listen))?;
    log::info!("rdma-probe responder listening on {}", handle.local_addr());
    while !handle.is_finished() {
        if let Some(sig) = signals.wait(Duration::from_millis(200)) {
            log::info!("signal {sig}: stopping");
            break;
        }
    }
    let stats = handle.stop().context("responder failed")?;
    if args.json {
        println!("{}", serde_json::to_string(&stats)?);
    } else {
        log::info!(
            "responder stopped: {} connections established, {} echoes, {} rejected",
            stats.established,
            stats.echoes,
            stats.rejected
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// SIGINT and SIGTERM, blocked and waited for with sigtimedwait.
struct TermSignals {
    set: libc::sigset_t,
}

impl TermSignals {
    fn block() -> Result<TermSignals> {
        // SAFETY: sigset_t is plain data initialised by sigemptyset; the mask
        // change affects this thread and the threads it starts afterwards.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGTERM);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            anyhow::ensure!(
                rc == 0,
                "pthread_sigmask: {}",
                std::io::Error::from_raw_os_error(rc)
            );
            Ok(TermSignals { set })
        }
    }

    fn wait(&self, timeout: Duration) -> Option<i32> {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: valid signal set and timespec; no siginfo wanted.
        let sig = unsafe { libc::sigtimedwait(&self.set, std::ptr::null_mut(), &ts) };
        (sig > 0).then_some(sig)
    }
}

struct StderrLogger {
    level: log::LevelFilter,
}

impl StderrLogger {
    fn install(level: log::LevelFilter) {
        let logger = Box::leak(Box::new(StderrLogger { level }));
        if log::set_logger(logger).is_ok() {
            log::set_max_level(level);
        }
    }
}

impl log::Log for StderrLogger {
    fn enabled(&self, metadata: &log::Metadata) -> bool {
        metadata.level() <= self.level
    }

    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("rdma-probe [{}] {}", record.level(), record.args());
        }
    }

    fn flush(&self) {}
}
