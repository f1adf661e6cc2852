//! The HTTP endpoint: `/metrics`, `/healthz`, `/readyz` and a tiny index
//! page, with the web configuration's TLS and basic auth, and limits.

pub mod auth;
pub mod cert_expiry;
mod server;
pub mod web_config;
pub mod web_config_watch;

pub use server::{serve, HttpLimits, WebConfigHandle};

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, TryLockError,
    },
    time::{Duration, Instant},
};

use crate::export::metrics::{render, Metrics};
use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{Html, IntoResponse, Response},
    routing::get,
    Router,
};

/// Whether the refresh before a scrape may wait for the locks it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockWait {
    /// Give up on a lock held elsewhere: return `false`.
    Try,
    Block,
}

/// The lock, or `None` if it is held elsewhere and `wait` is
/// [`LockWait::Try`].
pub fn lock_for_scrape<T>(mutex: &Mutex<T>, wait: LockWait) -> Option<MutexGuard<'_, T>> {
    match wait {
        LockWait::Block => Some(mutex.lock().expect("not poisoned")),
        LockWait::Try => match mutex.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::WouldBlock) => None,
            Err(TryLockError::Poisoned(_)) => panic!("poisoned"),
        },
    }
}

/// Pulls the counters kept elsewhere (the kernel's, the probe threads') into
/// the metrics; `false` if it gave up on a lock ([`LockWait::Try`]).
pub(crate) type ScrapeHook = Box<dyn Fn(LockWait) -> bool + Send + Sync>;

/// A render that took longer than this is done on the blocking pool until
/// one is quick again: the event loop it would hold up also drains the ring
/// buffers. The QP agent's renders in 20 to 30 µs natively
/// (`benches/pipeline.rs`), and a whole scrape at 10,000 live QPs takes
/// about 5 ms under emulation; a mesh of 1,000 targets (11 MB) takes far
/// longer.
const INLINE_RENDER_LIMIT: Duration = Duration::from_millis(10);

pub struct HttpState {
    metrics: Metrics,
    before_scrape: ScrapeHook,
    ready: AtomicBool,
    /// How long the last render took, in nanoseconds; the first one is
    /// not known to be quick.
    last_render_ns: AtomicU64,
}

impl HttpState {
    pub fn new(metrics: Metrics, before_scrape: ScrapeHook) -> Arc<Self> {
        Arc::new(Self {
            metrics,
            before_scrape,
            ready: AtomicBool::new(false),
            last_render_ns: AtomicU64::new(u64::MAX),
        })
    }

    fn render(&self) -> String {
        let start = Instant::now();
        let body = render(&self.metrics.registry);
        let took = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_render_ns.store(took, Ordering::Relaxed);
        body
    }

    fn renders_inline(&self) -> bool {
        Duration::from_nanos(self.last_render_ns.load(Ordering::Relaxed)) <= INLINE_RENDER_LIMIT
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }
}

const INDEX: &str = r#"<!doctype html><html><head><title>qpwatch</title></head><body>
<h1>qpwatch</h1><p>RDMA queue pair lifecycle observability.</p>
<ul><li><a href="/metrics">/metrics</a></li><li><a href="/healthz">/healthz</a></li><li><a href="/readyz">/readyz</a></li></ul>
</body></html>"#;

async fn index() -> Html<&'static str> {
    Html(INDEX)
}

/// Rendered on the event loop's thread while renders are quick: under
/// emulation a hand-off to the blocking pool took a fifth of a scrape
/// (bench/RESULTS.md, round 8). A refresh whose lock is held by slow work
/// (the prober starting its QPs) waits on the blocking pool, and so does a
/// render after one that took longer than [`INLINE_RENDER_LIMIT`].
async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let body = if state.renders_inline() && (state.before_scrape)(LockWait::Try) {
        Ok(state.render())
    } else {
        let state = Arc::clone(&state);
        tokio::task::spawn_blocking(move || {
            (state.before_scrape)(LockWait::Block);
            state.render()
        })
        .await
    };
    match body {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                crate::export::exposition::CONTENT_TYPE,
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(state): State<Arc<HttpState>>) -> Response {
    if state.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
    }
}

pub fn router(state: Arc<HttpState>) -> Router {
    Router::new()
        .route("/", get(index))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

#[cfg(test)]
pub(crate) mod test_certs;
#[cfg(test)]
mod tests;
