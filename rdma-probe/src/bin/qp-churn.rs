//! `qp-churn`: creates, connects (RESET → INIT → RTR → RTS, in loopback pairs)
//! and destroys RC QPs on plain verbs at a rate and concurrency, optionally
//! holding QPs open, and prints what it did as JSON (counts and per-operation
//! latencies). Exit status: 0 when no call failed, 3 when some failed, 2 on bad
//! usage, 1 on other errors.
//!
//! Signals: SIGTERM/SIGINT end the churn (pairs in flight are finished, held
//! QPs destroyed, the report printed); SIGUSR1 pauses the churn, SIGUSR2
//! resumes it. With `--status-file`, the counts are written there (atomically)
//! with a `phase`: `holding` once the held QPs are in RTS, `paused` once every
//! worker is idle after SIGUSR1, `running` after SIGUSR2, `churned` when the
//! lifecycles are done, `held` instead when they are done and held QPs stay
//! open (until `--hold-ms` or SIGTERM), `done` at the end.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use rdma_probe::{Churn, ChurnConfig, ChurnCounts};

#[derive(Parser)]
#[command(
    name = "qp-churn",
    version,
    about = "QP lifecycle churn on plain verbs: create, RESET→INIT→RTR→RTS (loopback pairs), destroy"
)]
struct Cli {
    /// RDMA device (default: the first one).
    #[arg(long)]
    device: Option<String>,
    /// Port number.
    #[arg(long, default_value_t = 1)]
    port: u8,
    /// GID index for the RoCE address vectors (default: the first RoCE v2
    /// IPv4-mapped GID, else the first non-zero one).
    #[arg(long)]
    gid_index: Option<u8>,
    /// QP lifecycles to churn, in pairs (an odd number is rounded up).
    /// 0: none (only --hold); without it: until SIGTERM.
    #[arg(long)]
    lifecycles: Option<u64>,
    /// Worker threads (concurrency).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Target QP lifecycles per second over all threads (default: flat out).
    #[arg(long)]
    rate: Option<f64>,
    /// QPs (in pairs) set up to RTS before the churn and held open.
    #[arg(long, default_value_t = 0)]
    hold: u64,
    /// With --hold: after the churn, keep the held QPs this long, then
    /// destroy them (default: until SIGTERM/SIGINT).
    #[arg(long)]
    hold_ms: Option<u64>,
    /// After the churn, print the report and exit with the held QPs still
    /// open: the kernel destroys them.
    #[arg(long)]
    exit_open: bool,
    /// Thread name prefix: the kernel sees every call from `NAME-N`.
    #[arg(long, default_value = "churn")]
    name: String,
    /// Write the live counts and phase here (JSON, replaced atomically).
    #[arg(long)]
    status_file: Option<PathBuf>,
    /// Log level on stderr: error, warn, info, debug.
    #[arg(long, default_value = "warn", value_parser = parse_level)]
    log_level: log::LevelFilter,
}

fn parse_level(s: &str) -> Result<log::LevelFilter, String> {
    s.parse().map_err(|_| format!("unknown log level {s:?}"))
}

static STOP: AtomicBool = AtomicBool::new(false);
static PAUSE: AtomicBool = AtomicBool::new(false);
static RESUME: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(signal: libc::c_int) {
    // Only atomic stores: async-signal-safe.
    match signal {
        libc::SIGUSR1 => PAUSE.store(true, Ordering::Release),
        libc::SIGUSR2 => RESUME.store(true, Ordering::Release),
        _ => STOP.store(true, Ordering::Release),
    }
}

fn install_signal_handlers() -> Result<()> {
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGUSR1, libc::SIGUSR2] {
        // SAFETY: sigaction with a zeroed struct plus our handler, which only
        // stores to atomics (async-signal-safe); SA_RESTART keeps the verbs
        // calls of the workers from failing with EINTR.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(signal, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error()).context("sigaction");
        }
    }
    Ok(())
}

fn write_status(path: Option<&Path>, phase: &str, counts: &ChurnCounts) -> Result<()> {
    let Some(path) = path else { return Ok(()) };
    let body = serde_json::json!({ "phase": phase, "pid": std::process::id(), "counts": counts });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, format!("{body}\n"))
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}

struct StderrLogger;

impl log::Log for StderrLogger {
    fn enabled(&self, _: &log::Metadata) -> bool {
        true
    }
    fn log(&self, record: &log::Record) {
        if self.enabled(record.metadata()) {
            eprintln!("qp-churn: {}: {}", record.level(), record.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: StderrLogger = StderrLogger;

fn run(cli: Cli) -> Result<ExitCode> {
    log::set_logger(&LOGGER).ok();
    log::set_max_level(cli.log_level);
    install_signal_handlers()?;
    let status = cli.status_file.as_deref();
    let config = ChurnConfig {
        device: cli.device,
        port: cli.port,
        gid_index: cli.gid_index,
        lifecycles: cli.lifecycles,
        threads: cli.threads,
        rate: cli.rate,
        hold: cli.hold,
        thread_name: cli.name,
    };
    let churn = Churn::start(config).context("starting the churn")?;
    churn.wait_held();
    write_status(status, "holding", &churn.counts())?;
    let control = churn.control().clone();
    let threads = cli.threads;
    let mut paused_reported = false;
    loop {
        if STOP.load(Ordering::Acquire) {
            control.stop.store(true, Ordering::Release);
        }
        if PAUSE.swap(false, Ordering::AcqRel) {
            control.pause.store(true, Ordering::Release);
            paused_reported = false;
        }
        if RESUME.swap(false, Ordering::AcqRel) {
            control.pause.store(false, Ordering::Release);
            write_status(status, "running", &churn.counts())?;
        }
        if control.churn_done() == threads {
            break;
        }
        if control.pause.load(Ordering::Acquire) && !paused_reported && control.parked() == threads
        {
            write_status(status, "paused", &churn.counts())?;
            paused_reported = true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut finished = churn.finish();
    let counts = finished.counts();
    let holding = counts.qps_held > 0;
    let phase = if holding && !cli.exit_open {
        "held"
    } else {
        "churned"
    };
    write_status(status, phase, &counts)?;
    let stdout = std::io::stdout();
    if cli.exit_open {
        finished.leak();
        let report = finished.report();
        let mut out = stdout.lock();
        serde_json::to_writer(&mut out, &report)?;
        writeln!(out)?;
        out.flush()?;
        // The QPs are the kernel's to clean up now; no destructor runs.
        std::process::exit(if report.counts.failures() == 0 { 0 } else { 3 });
    }
    if holding {
        let until = cli
            .hold_ms
            .map(|ms| Instant::now() + Duration::from_millis(ms));
        while !STOP.load(Ordering::Acquire) && until.is_none_or(|t| Instant::now() < t) {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    finished.release();
    let report = finished.report();
    write_status(status, "done", &report.counts)?;
    let mut out = stdout.lock();
    serde_json::to_writer(&mut out, &report)?;
    writeln!(out)?;
    Ok(if report.counts.failures() == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(3)
    })
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("qp-churn: {error:#}");
            ExitCode::from(1)
        }
    }
}
