//! The web configuration file and the endpoint, over real TCP and TLS: a
//! server thread of its own, curl and raw sockets as clients.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use tokio::sync::oneshot;

use super::{
    lock_for_scrape, router, serve,
    test_certs::{certs, Certs},
    web_config::{self, WebConfig},
    HttpLimits, HttpState, ScrapeHook, WebConfigHandle,
};
use crate::export::metrics::{render, Buckets, Metrics};

const USER: &str = "prometheus";
const PASSWORD: &str = "s3cret pass";

/// A cost-4 hash of [`PASSWORD`] (cheap for tests; files usually have 10).
fn hash() -> String {
    bcrypt::hash(PASSWORD, 4).unwrap()
}

/// A web configuration file in a directory of its own, beside copies of
/// the certificates (so that relative paths are tested too).
fn web_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let c = certs();
    for name in ["ca.crt", "server.crt", "server.key"] {
        std::fs::copy(c.path(name), dir.path().join(name)).unwrap();
    }
    let path = dir.path().join("web.yml");
    std::fs::write(&path, text).unwrap();
    (dir, path)
}

fn load(text: &str) -> Result<WebConfig, String> {
    let (_dir, path) = web_file(text);
    web_config::load(Some(&path)).map_err(|e| e.to_string())
}

fn tls_and_auth() -> String {
    format!(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\nbasic_auth_users:\n  {USER}: {}\n",
        hash()
    )
}

#[test]
fn good_files() {
    let web = load("").unwrap();
    assert!(web.tls.is_none() && web.basic_auth.is_none());
    let web = load("# nothing but a comment\n").unwrap();
    assert!(web.tls.is_none());
    let web = load(&tls_and_auth()).unwrap();
    assert!(web.tls.is_some());
    assert_eq!(web.summary(), "TLS, basic auth (1 users)");
    let c = certs();
    let web = load(&format!(
        "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n  min_version: TLS13\n  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305]\n  curve_preferences: [X25519, CurveP256]\n  prefer_server_cipher_suites: false\nhttp_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    Strict-Transport-Security: max-age=31536000\n",
        c.path("server.crt").display(),
        c.path("server.key").display()
    ))
    .unwrap();
    assert_eq!(
        web.summary(),
        "TLS, client certificates required, no basic auth"
    );
    assert_eq!(web.headers.len(), 2);
    let inline = std::fs::read_to_string(c.path("server.crt")).unwrap();
    let key = std::fs::read_to_string(c.path("server.key")).unwrap();
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    let web = load(&format!(
        "tls_server_config:\n  cert: |\n{}  key: |\n{}basic_auth_users: {{}}\n",
        indent(&inline),
        indent(&key)
    ))
    .unwrap();
    assert_eq!(web.summary(), "TLS, no basic auth");
}

/// What the watch for renewed certificates looks at: the file, then the
/// PEM files it names, as they were read (relative ones from its
/// directory); none for PEM given inline.
#[test]
fn a_web_config_names_the_files_it_was_read_from() {
    let (dir, path) = web_file(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
    );
    let web = web_config::load(Some(&path)).unwrap();
    let in_dir = |name: &str| dir.path().join(name);
    assert_eq!(
        web.files,
        [
            path.clone(),
            in_dir("ca.crt"),
            in_dir("server.crt"),
            in_dir("server.key")
        ]
    );
    let inline = std::fs::read_to_string(in_dir("server.crt")).unwrap();
    let indent = |s: &str| s.lines().map(|l| format!("    {l}\n")).collect::<String>();
    std::fs::write(
        &path,
        format!(
            "tls_server_config:\n  cert: |\n{}  key_file: server.key\n",
            indent(&inline)
        ),
    )
    .unwrap();
    let web = web_config::load(Some(&path)).unwrap();
    assert_eq!(web.files, [path.clone(), in_dir("server.key")]);
    assert!(web_config::load(None).unwrap().files.is_empty());
}

/// Each bad file: one line naming the file and the key.
#[test]
fn bad_files_name_the_key() {
    let tls = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n";
    let cases: &[(String, &str)] = &[
        ("tls_server_config: [".into(), "web.yml: (syntax):"),
        ("tls_config:\n  cert_file: a\n".into(), "web.yml: tls_config: unknown field `tls_config`"),
        (format!("{tls}  min_verison: TLS12\n"), "web.yml: tls_server_config.min_verison: unknown field"),
        (format!("{tls}  min_version: TLS10\n"), "tls_server_config.min_version: TLS10 is not supported: qpwatch (rustls) speaks TLS 1.2 and 1.3 only"),
        (format!("{tls}  min_version: TLS11\n"), "tls_server_config.min_version: TLS11 is not supported"),
        (format!("{tls}  max_version: SSL3\n"), "tls_server_config.max_version: \"SSL3\" is not a TLS version"),
        (format!("{tls}  min_version: TLS13\n  max_version: TLS12\n"), "tls_server_config.max_version: below min_version"),
        ("tls_server_config:\n  cert_file: server.crt\n".into(), "tls_server_config.key_file: missing"),
        ("tls_server_config:\n  key_file: server.key\n".into(), "tls_server_config.cert_file: missing"),
        ("tls_server_config:\n  cert_file: nonexistent.crt\n  key_file: server.key\n".into(), "tls_server_config.cert_file: cannot read"),
        ("tls_server_config:\n  cert_file: server.key\n  key_file: server.key\n".into(), "tls_server_config.cert_file: no PEM certificate in it"),
        ("tls_server_config:\n  cert_file: server.crt\n  key_file: ca.crt\n".into(), "tls_server_config.key_file: no PEM private key in it"),
        (format!("{tls}  cert: abc\n"), "tls_server_config.cert: give tls_server_config.cert or tls_server_config.cert_file, not both"),
        (format!("{tls}  client_auth_type: RequestClientCert\n"), "tls_server_config.client_auth_type: RequestClientCert is not supported"),
        (format!("{tls}  client_auth_type: RequireAnyClientCert\n"), "tls_server_config.client_auth_type: RequireAnyClientCert is not supported"),
        (format!("{tls}  client_auth_type: Always\n"), "tls_server_config.client_auth_type: \"Always\" is not one of"),
        (format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"), "tls_server_config.client_ca_file: missing"),
        (format!("{tls}  client_ca_file: ca.crt\n"), "tls_server_config.client_ca_file: a client CA without client_auth_type"),
        (format!("{tls}  client_allowed_sans: [prometheus]\n"), "tls_server_config.client_allowed_sans: not supported"),
        (format!("{tls}  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n"), "tls_server_config.cipher_suites: \"TLS_RSA_WITH_RC4_128_SHA\" is not a TLS 1.2 cipher suite qpwatch supports"),
        (format!("{tls}  curve_preferences: [CurveP521]\n"), "tls_server_config.curve_preferences: \"CurveP521\" is not a curve"),
        ("http_server_config:\n  http2: true\n".into(), "http_server_config.http2: qpwatch serves HTTP/1.1 only"),
        ("http_server_config:\n  headers:\n    Server: qpwatch\n".into(), "http_server_config.headers.Server: this header cannot be set"),
        ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n".into(), "http_server_config.headers.X-Frame-Options: \"allow\" is not one of deny, sameorigin"),
        ("rate_limit:\n  interval: 1s\n  burst: 5\n".into(), "rate_limit: not supported by qpwatch"),
        ("basic_auth_users:\n  prometheus: secret\n".into(), "basic_auth_users.prometheus: not a bcrypt hash"),
        ("basic_auth_users:\n  \"a:b\": $2y$10$X0h1gDsPszWURQaxFh.zoubFi6DXncSjhoQNJgRrnGs7EsimhC7zG\n".into(), "basic_auth_users.a:b: a user name is not empty and has no ':'"),
        ("basic_auth_users: [a]\n".into(), "basic_auth_users: invalid type: sequence"),
    ];
    for (text, expected) in cases {
        let message = load(text)
            .err()
            .unwrap_or_else(|| panic!("accepted: {text}"));
        assert!(
            message.contains(expected),
            "for {text:?}\n  got:      {message}\n  expected: …{expected}…"
        );
        assert!(!message.contains('\n'), "one line: {message:?}");
    }
    let e = web_config::load(Some(Path::new("/nonexistent/web.yml")))
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.starts_with("/nonexistent/web.yml: (file): cannot read"),
        "{e}"
    );
}

/// The endpoint on 127.0.0.1, on a thread and runtime of its own.
struct Server {
    addr: SocketAddr,
    metrics: Metrics,
    web: WebConfigHandle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Server {
    fn start(web: WebConfig, limits: HttpLimits) -> Self {
        Self::start_with(
            web,
            limits,
            Metrics::new(&Buckets::default(), "test"),
            Box::new(|_| true),
        )
    }

    fn start_with(
        web: WebConfig,
        limits: HttpLimits,
        metrics: Metrics,
        before_scrape: ScrapeHook,
    ) -> Self {
        let handle = WebConfigHandle::new(web);
        let (stop, stopped) = oneshot::channel::<()>();
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (m, h) = (metrics.clone(), handle.clone());
        let thread = thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                addr_tx.send(listener.local_addr().unwrap()).unwrap();
                let state = HttpState::new(m.clone(), before_scrape);
                state.set_ready(true);
                serve(
                    listener,
                    router(state),
                    h,
                    limits,
                    m.http.clone(),
                    async move {
                        let _ = stopped.await;
                    },
                )
                .await
                .unwrap();
            });
        });
        Server {
            addr: addr_rx.recv().unwrap(),
            metrics,
            web: handle,
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    /// Stops the server; how long it took.
    fn stop(&mut self) -> Duration {
        let t0 = Instant::now();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            thread.join().unwrap();
        }
        t0.elapsed()
    }

    /// A series of the server's own metrics.
    fn value(&self, series: &str) -> f64 {
        let text = render(&self.metrics.registry);
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    /// Waits (a second at most) until the series has the value.
    fn wait_value(&self, series: &str, expected: f64) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while self.value(series) != expected && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(self.value(series), expected, "{series}");
    }

    fn url(&self, scheme: &str, path: &str) -> String {
        format!("{scheme}://127.0.0.1:{}{path}", self.addr.port())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// curl's HTTP status (0: no response) and its exit code.
fn curl(args: &[&str]) -> (u16, i32) {
    let out = Command::new("curl")
        .args([
            "-s",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "10",
        ])
        .args(args)
        .output()
        .expect("curl");
    let code = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, out.status.code().unwrap_or(-1))
}

fn ca(c: &Certs) -> String {
    c.path("ca.crt").display().to_string()
}

#[test]
fn tls_and_basic_auth() {
    let (_dir, path) = web_file(&tls_and_auth());
    let server = Server::start(
        web_config::load(Some(&path)).unwrap(),
        HttpLimits::default(),
    );
    let c = certs();
    let ca = ca(c);
    let metrics = server.url("https", "/metrics");
    let good = format!("{USER}:{PASSWORD}");
    assert_eq!(curl(&["--cacert", &ca, "-u", &good, &metrics]).0, 200);
    assert_eq!(
        curl(&["--cacert", &ca, "-u", &good, &metrics]).0,
        200,
        "remembered"
    );
    assert_eq!(
        curl(&["--cacert", &ca, "-u", "prometheus:wrong", &metrics]).0,
        401
    );
    assert_eq!(
        curl(&["--cacert", &ca, "-u", &format!("root:{PASSWORD}"), &metrics]).0,
        401
    );
    assert_eq!(curl(&["--cacert", &ca, &metrics]).0, 401);
    assert_eq!(curl(&["--cacert", &ca, &server.url("https", "/")]).0, 401);
    assert_eq!(
        curl(&["--cacert", &ca, &server.url("https", "/healthz")]).0,
        200,
        "open"
    );
    assert_eq!(
        curl(&["--cacert", &ca, &server.url("https", "/readyz")]).0,
        200,
        "open"
    );
    // the challenge
    let out = Command::new("curl")
        .args([
            "-s",
            "-D",
            "-",
            "-o",
            "/dev/null",
            "--cacert",
            &ca,
            &metrics,
        ])
        .output()
        .unwrap();
    let head = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(
        head.contains("www-authenticate: basic realm=\"qpwatch\""),
        "{head}"
    );
    // no TLS: no answer
    let (code, rc) = curl(&[&server.url("http", "/metrics")]);
    assert_eq!(code, 0, "plain HTTP to the TLS port (curl exit {rc})");
    assert_ne!(rc, 0);
    // a certificate the client does not trust
    assert_ne!(curl(&["-u", &good, &metrics]).1, 0);
    assert_eq!(
        server.value("qpwatch_http_auth_failures_total{reason=\"missing\"}"),
        3.0
    );
    assert_eq!(
        server.value("qpwatch_http_auth_failures_total{reason=\"invalid\"}"),
        2.0
    );
    server.wait_value(
        "qpwatch_http_connections_refused_total{reason=\"tls_handshake_error\"}",
        2.0,
    );
}

#[test]
fn tls_versions_and_client_certificates() {
    let (_dir, path) = web_file(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS13\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.crt\n",
    );
    let server = Server::start(
        web_config::load(Some(&path)).unwrap(),
        HttpLimits::default(),
    );
    let c = certs();
    let ca = ca(c);
    let (cert, key) = (
        c.path("client.crt").display().to_string(),
        c.path("client.key").display().to_string(),
    );
    let url = server.url("https", "/metrics");
    assert_eq!(
        curl(&["--cacert", &ca, "--cert", &cert, "--key", &key, &url]).0,
        200
    );
    assert_eq!(curl(&["--cacert", &ca, &url]).0, 0, "no client certificate");
    let tls12 = [
        "--cacert",
        &ca,
        "--cert",
        &cert,
        "--key",
        &key,
        "--tls-max",
        "1.2",
        &url,
    ];
    assert_eq!(curl(&tls12).0, 0, "TLS 1.2 below min_version");
}

/// Connections held open, idle, from one address: the scrape from another
/// still answers, at once.
#[test]
fn idle_connections_do_not_starve_a_scrape() {
    let limits = HttpLimits {
        max_connections: 64,
        max_connections_per_source: 8,
        ..HttpLimits::default()
    };
    let server = Server::start(WebConfig::default(), limits);
    let idle: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    let t0 = Instant::now();
    let (code, rc) = curl(&["--interface", "127.0.0.2", &server.url("http", "/metrics")]);
    let took = t0.elapsed();
    assert_eq!((code, rc), (200, 0));
    // far below any timeout (the guest's emulated CPUs run this too)
    assert!(took < Duration::from_secs(5), "{took:?}");
    let refused = server
        .value("qpwatch_http_connections_refused_total{reason=\"max_connections_per_source\"}");
    assert_eq!(refused, 292.0);
    assert_eq!(server.value("qpwatch_http_connections_total"), 301.0);
    server.wait_value("qpwatch_http_active_connections", 8.0);
    // other sources fill what is left of max_connections
    let more: Vec<TcpStream> = (3..12)
        .flat_map(|i| {
            let source = format!("127.0.0.{i}:0");
            (0..8).map(move |_| connect_from(&source, server.addr))
        })
        .collect();
    let (code, _) = curl(&["--interface", "127.0.0.20", &server.url("http", "/healthz")]);
    assert_eq!(code, 0, "max_connections reached");
    assert!(
        server.value("qpwatch_http_connections_refused_total{reason=\"max_connections\"}") >= 1.0
    );
    drop(more);
    drop(idle);
}

fn connect_from(source: &str, to: SocketAddr) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    let stream = rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(source.parse().unwrap()).unwrap();
        socket.connect(to).await.unwrap()
    });
    let stream = stream.into_std().unwrap();
    stream.set_nonblocking(false).unwrap();
    stream
}

/// Reads until the server closes the connection; how long that took.
fn closed_within(mut stream: TcpStream, limit: Duration) -> (Duration, Vec<u8>) {
    stream.set_read_timeout(Some(limit)).unwrap();
    let t0 = Instant::now();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return (t0.elapsed(), all),
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                return (t0.elapsed(), all)
            }
            Err(e) => panic!("not closed within {limit:?}: {e}"),
        }
    }
}

#[test]
fn slow_idle_and_oversized_clients_are_cut_off() {
    let limits = HttpLimits {
        header_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(1500),
        max_header_bytes: 8192,
        ..HttpLimits::default()
    };
    let server = Server::start(WebConfig::default(), limits);
    // a header that never ends
    let mut slow = TcpStream::connect(server.addr).unwrap();
    slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        .unwrap();
    let (took, _) = closed_within(slow, Duration::from_secs(5));
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(4),
        "{took:?}"
    );
    assert_eq!(
        server.value("qpwatch_http_connections_refused_total{reason=\"header_timeout\"}"),
        1.0
    );
    // a connection that never says anything
    let (took, _) = closed_within(
        TcpStream::connect(server.addr).unwrap(),
        Duration::from_secs(8),
    );
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // a kept-alive connection: served, then idle
    let mut kept = TcpStream::connect(server.addr).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let (took, answer) = closed_within(kept, Duration::from_secs(5));
    assert!(
        answer.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert_eq!(
        server.value("qpwatch_http_idle_connections_closed_total"),
        2.0
    );
    // a header larger than max_header_bytes
    let mut big = TcpStream::connect(server.addr).unwrap();
    let filler = "a".repeat(20_000);
    let _ =
        big.write_all(format!("GET /metrics HTTP/1.1\r\nX-Filler: {filler}\r\n\r\n").as_bytes());
    let (_, answer) = closed_within(big, Duration::from_secs(5));
    assert!(
        answer.starts_with(b"HTTP/1.1 431"),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    // hyper sends the 431 and closes before its connection future returns
    // the error that is counted, so the client can see the close first
    server.wait_value(
        "qpwatch_http_connections_refused_total{reason=\"header_too_large\"}",
        1.0,
    );
}

/// A TLS client that never says hello is cut off at the handshake timeout.
#[test]
fn tls_handshake_timeout() {
    let (_dir, path) = web_file(&tls_and_auth());
    let limits = HttpLimits {
        tls_handshake_timeout: Duration::from_millis(500),
        ..HttpLimits::default()
    };
    let server = Server::start(web_config::load(Some(&path)).unwrap(), limits);
    let (took, _) = closed_within(
        TcpStream::connect(server.addr).unwrap(),
        Duration::from_secs(5),
    );
    assert!(
        took >= Duration::from_millis(400) && took < Duration::from_secs(4),
        "{took:?}"
    );
    server.wait_value(
        "qpwatch_http_connections_refused_total{reason=\"tls_handshake_timeout\"}",
        1.0,
    );
}

/// A new web configuration applies to new connections.
#[test]
fn replaced_web_config_applies_to_new_connections() {
    let server = Server::start(WebConfig::default(), HttpLimits::default());
    assert_eq!(curl(&[&server.url("http", "/metrics")]).0, 200);
    let users = format!("basic_auth_users:\n  {USER}: {}\n", hash());
    server
        .web
        .replace(web_config::parse_text(Path::new("/tmp/web.yml"), &users).unwrap());
    assert_eq!(curl(&[&server.url("http", "/metrics")]).0, 401);
    let good = format!("{USER}:{PASSWORD}");
    assert_eq!(curl(&["-u", &good, &server.url("http", "/metrics")]).0, 200);
}

/// Idle connections do not hold up the shutdown.
#[test]
fn shutdown_with_idle_connections_is_prompt() {
    let mut server = Server::start(WebConfig::default(), HttpLimits::default());
    let idle: Vec<TcpStream> = (0..6)
        .map(|_| TcpStream::connect(server.addr).unwrap())
        .collect();
    let mut kept = TcpStream::connect(server.addr).unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut buf = [0u8; 256];
    let _ = kept.read(&mut buf).unwrap();
    thread::sleep(Duration::from_millis(100));
    let took = server.stop();
    // not the 2 s the connections under way get
    assert!(took < Duration::from_millis(1500), "{took:?}");
    drop((idle, kept));
}

/// A scrape whose refresh waits for a lock held by slow work waits off the
/// event loop: the endpoint answers meanwhile, and the scrape completes once
/// the lock is free.
#[test]
fn a_refresh_waiting_for_its_lock_does_not_stall_the_endpoint() {
    let refreshes = std::sync::Arc::new(std::sync::Mutex::new(0u32));
    let counted = std::sync::Arc::clone(&refreshes);
    let server = Server::start_with(
        WebConfig::default(),
        HttpLimits::default(),
        Metrics::new(&Buckets::default(), "test"),
        Box::new(move |wait| match lock_for_scrape(&counted, wait) {
            Some(mut n) => {
                *n += 1;
                true
            }
            None => false,
        }),
    );
    let held = refreshes.lock().unwrap();
    let url = server.url("http", "/metrics");
    let scrape = thread::spawn(move || curl(&[&url]));
    thread::sleep(Duration::from_millis(300));
    let t0 = Instant::now();
    assert_eq!(curl(&[&server.url("http", "/healthz")]), (200, 0));
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(
        !scrape.is_finished(),
        "scraped while the refresh's lock was held"
    );
    drop(held);
    assert_eq!(scrape.join().unwrap(), (200, 0));
    assert_eq!(*refreshes.lock().unwrap(), 1);
}

/// A collector as slow as a large mesh's families.
#[derive(Clone)]
struct SlowCollector {
    desc: crate::export::registry::Desc,
}

impl crate::export::registry::Collector for SlowCollector {
    fn descs(&self) -> Vec<&crate::export::registry::Desc> {
        vec![&self.desc]
    }

    fn collect(&self, _: &mut [String]) {
        thread::sleep(SLOW_RENDER);
    }
}

/// How long [`SlowCollector`] takes: long beside a `/healthz` round trip
/// even in an emulated guest, where curl's alone took 540 ms once while the
/// other tests ran.
const SLOW_RENDER: Duration = Duration::from_secs(3);

/// After a slow render, the next one is done off the event loop: the
/// endpoint answers while it runs.
#[test]
fn after_a_slow_render_the_next_is_off_the_event_loop() {
    let metrics = Metrics::new(&Buckets::default(), "test");
    let desc = crate::export::registry::Desc::new(
        "slow",
        "slow",
        crate::export::exposition::Kind::Gauge,
        &[],
    )
    .unwrap();
    metrics
        .registry
        .register(Box::new(SlowCollector { desc }))
        .unwrap();
    let server = Server::start_with(
        WebConfig::default(),
        HttpLimits::default(),
        metrics,
        Box::new(|_| true),
    );
    assert_eq!(curl(&[&server.url("http", "/metrics")]), (200, 0));
    let url = server.url("http", "/metrics");
    let scrape = thread::spawn(move || curl(&[&url]));
    thread::sleep(Duration::from_millis(100));
    let t0 = Instant::now();
    assert_eq!(curl(&[&server.url("http", "/healthz")]), (200, 0));
    let took = t0.elapsed();
    assert!(!scrape.is_finished(), "the slow render ended first");
    assert!(took < SLOW_RENDER / 2, "{took:?}");
    assert_eq!(scrape.join().unwrap(), (200, 0));
}
