//! The HTTP endpoint: `/metrics`, `/healthz`, `/readyz` and a tiny index
//! page, with the web configuration's TLS and basic auth, and limits.

pub mod auth;
pub mod cert_expiry;
mod server;
pub mod web_config;

pub use server::{serve, HttpLimits, WebConfigHandle};

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use crate::export::metrics::{render, Metrics};
use axum::{
    extract::State,
    http::{header, StatusCode},
    response::{Html, IntoResponse, Response},
    routing::get,
    Router,
};

type ScrapeHook = Box<dyn Fn() + Send + Sync>;

pub struct HttpState {
    metrics: Metrics,
    /// Runs before each scrape, to pull counters kept in the kernel.
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

async fn metrics(State(state): State<Arc<HttpState>>) -> Response {
    let state = Arc::clone(&state);
    let body = tokio::task::spawn_blocking(move || {
        (state.before_scrape)();
        render(&state.metrics.registry)
    })
    .await;
    match body {
        Ok(body) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], body).into_response(),
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
