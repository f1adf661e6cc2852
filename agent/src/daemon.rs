//! The agent's main loop: keep the probes attached (tracer), feed the
//! pipeline, serve metrics, shut down cleanly on a signal.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::Context;
use tokio::{
    net::TcpListener,
    signal::unix::{signal, SignalKind},
    sync::watch,
};
use tracing::{debug, info};

use crate::{
    cm::{CmCorrelator, CmNames},
    config::RunArgs,
    correlator::Correlator,
    http::{self, HttpState},
    jsonl::JsonLines,
    metrics::{Buckets, Metrics},
    offsets::kernel_release,
    pipeline::{EventSink, Pipeline},
    tracer::{Tracer, TracerConfig},
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Serve /metrics.
    Serve,
    /// Print events as JSON lines on stdout.
    Events,
}

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

pub async fn run(args: RunArgs, mode: Mode) -> anyhow::Result<()> {
    args.validate()?;
    bump_memlock_rlimit();

    let metrics = Metrics::new(&Buckets::default(), &kernel_release());
    let sink: Option<Box<dyn EventSink>> = match mode {
        Mode::Events => Some(Box::new(JsonLines::new(std::io::stdout()))),
        Mode::Serve => None,
    };
    let pipeline = Arc::new(Mutex::new(Pipeline {
        correlator: Correlator::new(args.limits()),
        cm: CmCorrelator::new(CmNames::linux_6_1()),
        metrics: metrics.clone(),
        sink,
    }));
    let mut tracer = Tracer::new(
        TracerConfig {
            btf_dir: args.btf_dir.clone(),
            groups: args.groups.clone(),
            ring_buffer_bytes: args.ring_buffer_bytes,
            strict: args.strict,
            reconcile: !args.no_reconcile,
        },
        Arc::clone(&pipeline),
    );

    let (stop_tx, stop_rx) = watch::channel(false);
    let mut server = None;
    let state = if mode == Mode::Serve {
        let counters = tracer.counters();
        let scrape_metrics = metrics.clone();
        let state = HttpState::new(
            metrics.clone(),
            Box::new(move || {
                counters
                    .lock()
                    .expect("not poisoned")
                    .refresh(&scrape_metrics)
            }),
        );
        let listener = TcpListener::bind(args.listen)
            .await
            .with_context(|| format!("cannot listen on {}", args.listen))?;
        info!(listen = %args.listen, "serving /metrics");
        let mut http_stop = stop_rx.clone();
        server = Some(tokio::spawn(http::serve(
            listener,
            Arc::clone(&state),
            async move {
                let _ = http_stop.changed().await;
            },
        )));
        Some(state)
    } else {
        None
    };

    let shutdown = termination();
    tokio::pin!(shutdown);
    let mut poll = tokio::time::interval(Duration::from_secs_f64(args.module_poll_interval));
    let result = loop {
        tokio::select! {
            result = &mut shutdown => break result,
            _ = poll.tick() => {
                let polled = tracer.poll().await;
                if let Some(state) = &state {
                    state.set_ready(tracer.ready());
                }
                if let Err(error) = polled {
                    break Err(error.into());
                }
            }
        }
    };

    if let Some(state) = &state {
        state.set_ready(false);
    }
    let _ = stop_tx.send(true);
    if let Some(server) = server {
        server.await.context("HTTP server task")??;
    }
    tracer.shutdown().await;
    info!("detached; bye");
    result
}
