//! The HTTP endpoint: `/metrics`, `/healthz`, `/readyz` and a tiny index
//! page, with the web configuration's TLS and basic auth, and limits.

pub mod auth;
pub mod cert_expiry;
mod server;
pub mod web_config;

pub use server::{serve, HttpLimits, WebConfigHandle};

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc, Mutex, MutexGuard, TryLockError,
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

pub struct HttpState {
    metrics: Metrics,
    before_scrape: ScrapeHook,
    ready: AtomicBool,
}

impl HttpState {
    pub fn new(metrics: Metrics, before_scrape: ScrapeHook) -> Arc<Self> {
        Arc::new(Self {
            metrics,
            before_scrape,
            ready: AtomicBool::new(false),
        })
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

/// Rendered on the event loop's thread: under emulation a hand-off to the
/// blocking pool took a fifth of a scrape (bench/RESULTS.md, round 8). Only a
/// refresh whose lock is held by slow work (the prober starting its QPs) is
/// handed to the blocking pool, to wait there.
async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    if !(state.before_scrape)(LockWait::Try) {
        let waiting = Arc::clone(&state);
        let refreshed =
            tokio::task::spawn_blocking(move || (waiting.before_scrape)(LockWait::Block)).await;
        if let Err(e) = refreshed {
            return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response();
        }
    }
    let body = render(&state.metrics.registry);
    ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response()
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
