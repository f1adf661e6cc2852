//! The accept loop: a bound on connections, in all and per source address,
//! then (with TLS) the handshake within its timeout, then HTTP/1.1 with
//! a bound on the request header and two clocks of its own: an idle
//! connection (no byte of a request since the last response, or since it
//! opened) is closed after `idle_timeout`, a request whose header has not
//! arrived whole `header_timeout` after its first byte too. So a client
//! that holds connections open, idle or trickling, holds at most
//! `max_connections_per_source` of them, for a bounded time.

use std::{
    collections::HashMap,
    convert::Infallible,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{Arc, Mutex, RwLock},
    task::{Context, Poll},
    time::Duration,
};

use axum::{
    body::Body,
    http::{header, HeaderValue, Request, Response, StatusCode},
    Router,
};
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper::{body::Incoming, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{watch, Notify, Semaphore},
    time::Instant,
};
use tokio_rustls::TlsAcceptor;
use tower_service::Service;
use tracing::{debug, warn};

use super::web_config::WebConfig;
use crate::export::metrics::http::HttpMetrics;

/// The endpoint's limits (`[http]` in the configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HttpLimits {
    pub max_connections: usize,
    pub max_connections_per_source: usize,
    pub header_timeout: Duration,
    pub idle_timeout: Duration,
    pub tls_handshake_timeout: Duration,
    pub max_header_bytes: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        Self {
            max_connections: 64,
            max_connections_per_source: 8,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(120),
            tls_handshake_timeout: Duration::from_secs(10),
            max_header_bytes: 16 * 1024,
        }
    }
}

/// How long connections still open at shutdown may take to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The web configuration in force: read at each new connection, replaced on
/// SIGHUP.
#[derive(Clone, Default)]
pub struct WebConfigHandle(Arc<RwLock<Arc<WebConfig>>>);

impl WebConfigHandle {
    pub fn new(config: WebConfig) -> Self {
        Self(Arc::new(RwLock::new(Arc::new(config))))
    }

    pub fn current(&self) -> Arc<WebConfig> {
        Arc::clone(&self.0.read().expect("not poisoned"))
    }

    pub fn replace(&self, config: WebConfig) {
        *self.0.write().expect("not poisoned") = Arc::new(config);
    }
}

/// The source a connection counts against: the IPv4 address, or the /64 of
/// an IPv6 one (a host usually has a whole /64).
fn source(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

type Sources = Arc<Mutex<HashMap<IpAddr, usize>>>;

/// One connection counted against its source, until dropped.
struct SourceSlot {
    sources: Sources,
    source: IpAddr,
}

impl SourceSlot {
    fn take(sources: &Sources, source: IpAddr, max: usize) -> Option<Self> {
        let mut map = sources.lock().expect("not poisoned");
        let n = map.entry(source).or_insert(0);
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            sources: Arc::clone(sources),
            source,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut map = self.sources.lock().expect("not poisoned");
        if let Some(n) = map.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.source);
            }
        }
    }
}

/// Serves `router` on `listener` until `shutdown`, then gives the open
/// connections [`SHUTDOWN_GRACE`] to finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    web: WebConfigHandle,
    limits: HttpLimits,
    metrics: HttpMetrics,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let sources: Sources = Arc::default();
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // EMFILE and the like: wait rather than spin
                    metrics.refused("accept_error");
                    warn!(%error, "HTTP: cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        metrics.accepted();
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            metrics.refused("max_connections");
            debug!(%peer, "HTTP: connection refused, max_connections reached");
            continue;
        };
        let Some(source_slot) = SourceSlot::take(
            &sources,
            source(peer.ip()),
            limits.max_connections_per_source,
        ) else {
            metrics.refused("max_connections_per_source");
            debug!(%peer, "HTTP: connection refused, max_connections_per_source reached");
            continue;
        };
        let connection = Connection {
            peer,
            web: web.current(),
            router: router.clone(),
            limits,
            metrics: metrics.clone(),
            stop: stop_rx.clone(),
        };
        tokio::spawn(async move {
            let _slots = (slot, source_slot);
            connection.run(stream).await;
        });
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    if tokio::time::timeout(SHUTDOWN_GRACE, slots.acquire_many(all))
        .await
        .is_err()
    {
        debug!("HTTP: connections still open at shutdown are dropped");
    }
    Ok(())
}

struct Connection {
    peer: SocketAddr,
    web: Arc<WebConfig>,
    router: Router,
    limits: HttpLimits,
    metrics: HttpMetrics,
    stop: watch::Receiver<bool>,
}

impl Connection {
    async fn run(mut self, stream: TcpStream) {
        let _open = self.metrics.open();
        let _ = stream.set_nodelay(true);
        let Some(tls) = self.web.tls.clone() else {
            return self.http(stream).await;
        };
        let handshake = tokio::time::timeout(
            self.limits.tls_handshake_timeout,
            TlsAcceptor::from(tls).accept(stream),
        );
        let stream = tokio::select! {
            done = handshake => done,
            _ = self.stop.changed() => return,
        };
        match stream {
            Ok(Ok(stream)) => self.http(stream).await,
            Ok(Err(error)) => {
                self.metrics.refused("tls_handshake_error");
                debug!(peer = %self.peer, %error, "HTTP: TLS handshake failed");
            }
            Err(_) => {
                self.metrics.refused("tls_handshake_timeout");
                debug!(peer = %self.peer, "HTTP: TLS handshake timed out");
            }
        }
    }

    async fn http<S>(mut self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let clock = Arc::new(Clock::new(self.limits));
        let io = TokioIo::new(Clocked {
            inner: stream,
            clock: Arc::clone(&clock),
        });
        let web = Arc::clone(&self.web);
        let router = self.router.clone();
        let metrics = self.metrics.clone();
        let service_clock = Arc::clone(&clock);
        let service = service_fn(move |request: Request<Incoming>| {
            let request_number = service_clock.busy();
            let web = Arc::clone(&web);
            let mut router = router.clone();
            let metrics = metrics.clone();
            let clock = Arc::clone(&service_clock);
            async move {
                let mut response = match authorize(&web, &request, &metrics).await {
                    Ok(()) => router
                        .call(request.map(Body::new))
                        .await
                        .unwrap_or_else(|never| match never {}),
                    Err(refused) => refused,
                };
                response
                    .headers_mut()
                    .extend(web.headers.iter().map(|(k, v)| (k.clone(), v.clone())));
                Ok::<_, Infallible>(response.map(|body| {
                    Body::new(Timed {
                        body,
                        clock,
                        request_number,
                    })
                }))
            }
        });
        let connection = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(None)
            .max_buf_size(self.limits.max_header_bytes)
            .keep_alive(true)
            .serve_connection(io, service);
        tokio::pin!(connection);
        let mut stopping = false;
        loop {
            let deadline = clock.deadline();
            tokio::select! {
                done = connection.as_mut() => {
                    if let Err(error) = done {
                        self.closed_by(&error);
                    }
                    return;
                }
                _ = clock.changed.notified() => {}
                _ = sleep_until(deadline) => {
                    match clock.expired() {
                        Some(Expired::Idle) => {
                            self.metrics.idle_closed();
                            return;
                        }
                        Some(Expired::Header) => {
                            self.metrics.refused("header_timeout");
                            debug!(peer = %self.peer, "HTTP: request header timed out");
                            return;
                        }
                        None => {}
                    }
                }
                _ = self.stop.changed(), if !stopping => {
                    if clock.idle() {
                        return;
                    }
                    stopping = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }

    fn closed_by(&self, error: &hyper::Error) {
        let reason = if error.is_parse_too_large() {
            "header_too_large"
        } else if error.is_parse() {
            "bad_request"
        } else {
            // the client went away, or an I/O error
            debug!(peer = %self.peer, %error, "HTTP: connection ended");
            return;
        };
        self.metrics.refused(reason);
        debug!(peer = %self.peer, %error, "HTTP: {reason}");
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Every path but `/healthz` and `/readyz` needs the basic auth
/// credentials when the web configuration has users.
async fn authorize(
    web: &WebConfig,
    request: &Request<Incoming>,
    metrics: &HttpMetrics,
) -> Result<(), Response<Body>> {
    let Some(auth) = &web.basic_auth else {
        return Ok(());
    };
    if matches!(request.uri().path(), "/healthz" | "/readyz") {
        return Ok(());
    }
    match auth
        .check(request.headers().get(header::AUTHORIZATION))
        .await
    {
        Ok(()) => Ok(()),
        Err(failure) => {
            metrics.auth_failure(failure.label());
            let mut response = Response::new(Body::from("Unauthorized\n"));
            *response.status_mut() = StatusCode::UNAUTHORIZED;
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"qpwatch\""),
            );
            Err(response)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// No byte of a request since this instant.
    Idle(Instant),
    /// A request's header began to arrive at this instant.
    Header(Instant),
    /// Request number N is being served.
    Busy(u64),
}

#[derive(Debug, PartialEq, Eq)]
enum Expired {
    Idle,
    Header,
}

/// The connection's phase, for its idle and header timeouts.
struct Clock {
    phase: Mutex<Phase>,
    requests: std::sync::atomic::AtomicU64,
    limits: HttpLimits,
    changed: Notify,
}

impl Clock {
    fn new(limits: HttpLimits) -> Self {
        Self {
            phase: Mutex::new(Phase::Idle(Instant::now())),
            requests: std::sync::atomic::AtomicU64::new(0),
            limits,
            changed: Notify::new(),
        }
    }

    fn set(&self, phase: Phase) {
        *self.phase.lock().expect("not poisoned") = phase;
        self.changed.notify_one();
    }

    fn read_bytes(&self) {
        let mut phase = self.phase.lock().expect("not poisoned");
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Header(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// A request is served: its number.
    fn busy(&self) -> u64 {
        let n = self
            .requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.set(Phase::Busy(n));
        n
    }

    /// Request `n`'s response is all handed over (the next request may
    /// already be served).
    fn response_sent(&self, n: u64) {
        let mut phase = self.phase.lock().expect("not poisoned");
        if *phase == Phase::Busy(n) {
            *phase = Phase::Idle(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// No request under way.
    fn idle(&self) -> bool {
        matches!(*self.phase.lock().expect("not poisoned"), Phase::Idle(_))
    }

    fn deadline(&self) -> Option<Instant> {
        match *self.phase.lock().expect("not poisoned") {
            Phase::Idle(since) => Some(since + self.limits.idle_timeout),
            Phase::Header(since) => Some(since + self.limits.header_timeout),
            Phase::Busy(_) => None,
        }
    }

    fn expired(&self) -> Option<Expired> {
        let now = Instant::now();
        match *self.phase.lock().expect("not poisoned") {
            Phase::Idle(since) if now >= since + self.limits.idle_timeout => Some(Expired::Idle),
            Phase::Header(since) if now >= since + self.limits.header_timeout => {
                Some(Expired::Header)
            }
            _ => None,
        }
    }
}

/// The connection's stream, telling the clock when request bytes arrive.
struct Clocked<S> {
    inner: S,
    clock: Arc<Clock>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Clocked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            self.clock.read_bytes();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Clocked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// A response body that restarts the idle clock once it is all handed over
/// (or dropped).
struct Timed {
    body: Body,
    clock: Arc<Clock>,
    request_number: u64,
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.clock.response_sent(self.request_number);
    }
}

impl HttpBody for Timed {
    type Data = <Body as HttpBody>::Data;
    type Error = <Body as HttpBody>::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if let Poll::Ready(None) = polled {
            self.clock.response_sent(self.request_number);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
