//! The HTTP endpoint's own counts: its connections, those it refused or
//! closed at a limit, requests refused for want of credentials, and the web
//! configuration's reloads.

use crate::export::registry::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec};

use super::Registrar;

/// Why a connection was refused or closed before a request was served.
pub const REFUSED_REASONS: [&str; 8] = [
    "max_connections",
    "max_connections_per_source",
    "accept_error",
    "tls_handshake_timeout",
    "tls_handshake_error",
    "header_timeout",
    "header_too_large",
    "bad_request",
];

#[derive(Clone)]
pub struct HttpMetrics {
    connections: IntCounter,
    active: IntGauge,
    refused: IntCounterVec,
    idle_closed: IntCounter,
    auth_failures: IntCounterVec,
    web_config_reloads: IntCounterVec,
    /// No labels; no series without TLS.
    tls_cert_expiry: IntGaugeVec,
}

impl HttpMetrics {
    pub fn new(r: &mut Registrar) -> Self {
        let m = Self {
            connections: r.counter(
                "qpwatch_http_connections_total",
                "TCP connections accepted by the HTTP endpoint (refused ones too).",
            ),
            active: r.gauge(
                "qpwatch_http_active_connections",
                "HTTP connections open now.",
            ),
            refused: r.counter_vec(
                "qpwatch_http_connections_refused_total",
                "HTTP connections closed by the agent before a request was served, by reason.",
                &["reason"],
            ),
            idle_closed: r.counter(
                "qpwatch_http_idle_connections_closed_total",
                "HTTP connections closed after the idle timeout with no request under way.",
            ),
            auth_failures: r.counter_vec(
                "qpwatch_http_auth_failures_total",
                "HTTP requests refused with 401: no basic auth credentials (missing) or wrong ones (invalid).",
                &["reason"],
            ),
            web_config_reloads: r.counter_vec(
                "qpwatch_http_web_config_reloads_total",
                "Reads of the web configuration file on SIGHUP or when its files changed, ok or error (the previous one is kept).",
                &["result"],
            ),
            tls_cert_expiry: r.gauge_vec(
                "qpwatch_http_tls_cert_expiry_timestamp_seconds",
                "When the first of the endpoint's served TLS certificates (cert_file: leaf and chain) expires (its notAfter), as a Unix time; no series without TLS. Follows the web configuration's reloads.",
                &[],
            ),
        };
        for reason in REFUSED_REASONS {
            m.refused.with_label_values(&[reason]);
        }
        for reason in ["missing", "invalid"] {
            m.auth_failures.with_label_values(&[reason]);
        }
        for result in ["ok", "error"] {
            m.web_config_reloads.with_label_values(&[result]);
        }
        m
    }

    pub fn accepted(&self) {
        self.connections.inc();
    }

    /// The returned guard counts the connection as open until dropped.
    pub fn open(&self) -> ActiveConnection {
        self.active.inc();
        ActiveConnection(self.active.clone())
    }

    pub fn refused(&self, reason: &str) {
        debug_assert!(REFUSED_REASONS.contains(&reason), "{reason}");
        self.refused.with_label_values(&[reason]).inc();
    }

    pub fn idle_closed(&self) {
        self.idle_closed.inc();
    }

    pub fn auth_failure(&self, reason: &str) {
        self.auth_failures.with_label_values(&[reason]).inc();
    }

    /// The served certificates' first expiry (Unix seconds), `None` without TLS.
    pub fn tls_cert_expiry(&self, expiry: Option<i64>) {
        match expiry {
            Some(at) => self.tls_cert_expiry.with_label_values::<&str>(&[]).set(at),
            None => {
                let _ = self.tls_cert_expiry.remove_label_values::<&str>(&[]);
            }
        }
    }

    pub fn web_config_reload(&self, ok: bool) {
        self.web_config_reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }
}

pub struct ActiveConnection(IntGauge);

impl Drop for ActiveConnection {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use crate::export::registry::Registry;

    use super::*;

    #[test]
    fn the_certificate_expiry_has_a_series_only_with_tls() {
        let registry = Registry::new();
        let http = HttpMetrics::new(&mut Registrar::new(&registry));
        let text = || crate::export::metrics::render(&registry);
        let series = "qpwatch_http_tls_cert_expiry_timestamp_seconds ";
        assert!(!text().contains(series));
        http.tls_cert_expiry(Some(1_796_000_000));
        assert!(text().contains(&format!("{series}1796000000\n")));
        http.tls_cert_expiry(Some(1_796_086_400));
        assert!(text().contains(&format!("{series}1796086400\n")));
        http.tls_cert_expiry(None);
        assert!(!text().contains(series), "{}", text());
    }
}
