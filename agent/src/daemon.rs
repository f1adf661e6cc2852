//! The agent's main loop: resolve offsets, load and attach, drain the ring
//! buffer into the correlator, serve metrics, shut down cleanly on a signal.

use std::sync::{Arc, Mutex};

use anyhow::Context;
use aya::maps::{MapData, RingBuf};
use tokio::{
    io::{unix::AsyncFd, Interest},
    net::TcpListener,
    signal::unix::{signal, SignalKind},
    sync::watch,
};
use tracing::{debug, info, warn};

use crate::{
    config::RunArgs,
    correlator::Correlator,
    events::decode,
    http::{self, HttpState},
    metrics::{Buckets, Metrics},
    offsets::KernelBtf,
    probes::{qp_hooks, Probes},
};

/// Raises RLIMIT_MEMLOCK for kernels that still charge BPF maps against it
/// (before 5.11, which moved to memcg accounting).
fn bump_memlock_rlimit() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads a valid, initialised struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        debug!(
            error = %std::io::Error::last_os_error(),
            "cannot raise RLIMIT_MEMLOCK; fine on kernels >= 5.11"
        );
    }
}

/// Resolves when SIGINT or SIGTERM arrives.
async fn termination() -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
    Ok(())
}

/// Everything downstream of the ring buffer.
pub struct Pipeline {
    pub correlator: Correlator,
    pub metrics: Metrics,
}

impl Pipeline {
    /// Drains every record currently in the ring buffer; returns how many.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>) -> usize {
        let mut n = 0;
        while let Some(record) = ring.next() {
            self.process(&record);
            n += 1;
        }
        n
    }

    pub fn process(&mut self, record: &[u8]) {
        match decode(record) {
            Ok(call) => {
                self.metrics.event_received(call.kind_label());
                self.correlator.handle(&call, &mut self.metrics);
            }
            Err(error) => {
                self.metrics.event_malformed(&error);
                warn!(%error, "dropping malformed ring-buffer record");
            }
        }
    }
}

pub async fn run(args: RunArgs) -> anyhow::Result<()> {
    args.validate()?;
    bump_memlock_rlimit();

    let mut btf = KernelBtf::new(&args.btf_dir);
    let offsets = btf.qp_offsets()?;
    info!(
        kernel = btf.kernel(),
        ?offsets,
        "resolved struct offsets from BTF"
    );

    let mut probes = Probes::load(&offsets, args.ring_buffer_bytes)?;
    match aya_log::EbpfLogger::init(probes.ebpf_mut()) {
        Ok(logger) => {
            tokio::spawn(forward_ebpf_logs(logger));
        }
        Err(error) => warn!(%error, "eBPF log forwarding unavailable"),
    }
    probes.attach(&qp_hooks())?;

    let ring = probes.take_events()?;
    let lost = Mutex::new(probes.take_lost_counters()?);
    let metrics = Metrics::new(&Buckets::default(), btf.kernel());

    let scrape_metrics = metrics.clone();
    let state = HttpState::new(
        metrics.clone(),
        Box::new(move || match lost.lock().expect("not poisoned").read() {
            Ok(totals) => scrape_metrics.update_lost(totals),
            Err(error) => warn!(%error, "reading lost-event counters"),
        }),
    );
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    info!(listen = %args.listen, "serving /metrics");

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut http_stop = stop_rx.clone();
    let server = tokio::spawn(http::serve(listener, Arc::clone(&state), async move {
        let _ = http_stop.changed().await;
    }));

    let mut pipeline = Pipeline {
        correlator: Correlator::new(args.limits()),
        metrics,
    };
    // SAFETY: the RingBuf owns its map fd and keeps it open until the AsyncFd is dropped.
    let mut ring = unsafe { AsyncFd::register_with_interest(ring, Interest::READABLE) }
        .context("registering the ring buffer with the event loop")?;
    state.set_ready(true);

    let shutdown = termination();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            result = &mut shutdown => { result?; break; }
            guard = ring.readable_mut() => {
                let mut guard = guard.context("waiting on the ring buffer")?;
                pipeline.drain(guard.get_inner_mut());
                guard.clear_ready();
            }
        }
    }

    state.set_ready(false);
    // Events already in the ring are counted before the probes go away.
    let flushed = pipeline.drain(ring.get_mut());
    debug!(flushed, "drained the ring buffer");
    let _ = stop_tx.send(true);
    server.await.context("HTTP server task")??;
    drop(probes);
    info!("detached; bye");
    Ok(())
}

async fn forward_ebpf_logs<T: log::Log>(logger: aya_log::EbpfLogger<T>) {
    // SAFETY: the logger owns its ring-buffer fd for as long as the AsyncFd lives.
    let Ok(mut fd) = (unsafe { AsyncFd::register_with_interest(logger, Interest::READABLE) })
    else {
        warn!("cannot poll the eBPF log ring buffer");
        return;
    };
    loop {
        let Ok(mut guard) = fd.readable_mut().await else {
            return;
        };
        guard.get_inner_mut().flush();
        guard.clear_ready();
    }
}
