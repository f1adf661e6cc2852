//! The web configuration file of the Prometheus exporter-toolkit
//! (`--web.config.file` of node_exporter and ebpf_exporter): TLS, basic auth
//! users with bcrypt hashes, extra response headers. Whatever qpwatch cannot
//! do as the file says is refused, naming the key: a security setting is
//! never silently dropped.

use std::{
    collections::BTreeMap,
    fs,
    io::Read,
    path::{Path, PathBuf},
    sync::Arc,
};

use axum::http::{HeaderName, HeaderValue};
use rustls::{
    crypto::{ring as provider, CryptoProvider},
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig, SupportedCipherSuite, SupportedProtocolVersion,
};
use serde::Deserialize;
use thiserror::Error;

use super::{auth::BasicAuth, cert_expiry::not_after_unix};

/// The most that is read of the web configuration file or of a PEM file.
const MAX_FILE_BYTES: u64 = 1 << 20;

/// A web configuration file that cannot be used: one line, naming the file
/// and the key.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("{path}: {key}: {message}")]
pub struct WebConfigError {
    pub path: String,
    pub key: String,
    pub message: String,
}

/// What the HTTP endpoint does, from the web configuration file (or
/// [`WebConfig::default`]: plain HTTP, no authentication).
#[derive(Default)]
pub struct WebConfig {
    /// The file it came from.
    pub source: Option<PathBuf>,
    pub tls: Option<Arc<ServerConfig>>,
    /// Whether a client certificate is required (mutual TLS).
    pub client_certificates: ClientCertificates,
    pub basic_auth: Option<Arc<BasicAuth>>,
    /// Added to every response.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// When the first of the served certificates (`cert_file`, leaf and
    /// chain) stops being valid, in Unix seconds.
    pub cert_expiry: Option<i64>,
    /// The files it was read from: the web configuration file, then the
    /// PEM files it names.
    pub files: Vec<PathBuf>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum ClientCertificates {
    #[default]
    None,
    VerifiedIfGiven,
    Required,
}

impl WebConfig {
    /// One line for the log: what the endpoint requires.
    pub fn summary(&self) -> String {
        let tls = match (&self.tls, self.client_certificates) {
            (None, _) => "plain HTTP",
            (Some(_), ClientCertificates::None) => "TLS",
            (Some(_), ClientCertificates::VerifiedIfGiven) => {
                "TLS, client certificates verified if given"
            }
            (Some(_), ClientCertificates::Required) => "TLS, client certificates required",
        };
        match &self.basic_auth {
            None => format!("{tls}, no basic auth"),
            Some(auth) => format!("{tls}, basic auth ({} users)", auth.users()),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tls_server_config: Option<TlsFile>,
    http_server_config: Option<HttpFile>,
    basic_auth_users: Option<BTreeMap<String, String>>,
    rate_limit: Option<serde_yaml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert: Option<String>,
    key: Option<String>,
    client_ca: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    client_auth_type: Option<String>,
    client_ca_file: Option<String>,
    client_allowed_sans: Option<Vec<String>>,
    min_version: Option<String>,
    max_version: Option<String>,
    cipher_suites: Option<Vec<String>>,
    prefer_server_cipher_suites: Option<bool>,
    curve_preferences: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFile {
    http2: Option<bool>,
    headers: Option<BTreeMap<String, String>>,
}

/// The headers exporter-toolkit lets a file set, and their allowed values
/// (empty: any).
const HEADERS: [(&str, &[&str]); 5] = [
    ("Strict-Transport-Security", &[]),
    ("X-Content-Type-Options", &["nosniff"]),
    ("X-Frame-Options", &["deny", "sameorigin"]),
    ("X-XSS-Protection", &[]),
    ("Content-Security-Policy", &[]),
];

struct Context<'a> {
    path: &'a Path,
    dir: PathBuf,
    /// The PEM files read so far.
    read: std::cell::RefCell<Vec<PathBuf>>,
}

impl<'a> Context<'a> {
    fn new(path: &'a Path) -> Self {
        Self {
            path,
            dir: path.parent().map(Path::to_owned).unwrap_or_default(),
            read: Default::default(),
        }
    }
}

impl Context<'_> {
    fn error(&self, key: &str, message: impl Into<String>) -> WebConfigError {
        WebConfigError {
            path: self.path.display().to_string(),
            key: key.to_owned(),
            message: one_line(&message.into()),
        }
    }

    /// A path of the file, relative to the file's directory (as exporter-toolkit).
    fn resolve(&self, file: &str) -> PathBuf {
        let path = Path::new(file);
        if path.is_absolute() {
            path.to_owned()
        } else {
            self.dir.join(path)
        }
    }

    /// PEM text given inline (`inline_key`) or in a file (`file_key`), not both.
    fn pem(
        &self,
        inline: &Option<String>,
        inline_key: &str,
        file: &Option<String>,
        file_key: &str,
    ) -> Result<Option<(Vec<u8>, String)>, WebConfigError> {
        match (inline, file) {
            (Some(_), Some(_)) => Err(self.error(
                inline_key,
                format!("give {inline_key} or {file_key}, not both"),
            )),
            (Some(text), None) => Ok(Some((text.clone().into_bytes(), inline_key.to_owned()))),
            (None, Some(file)) => {
                let path = self.resolve(file);
                let bytes = read_bounded(&path).map_err(|e| self.error(file_key, e))?;
                self.read.borrow_mut().push(path);
                Ok(Some((bytes, file_key.to_owned())))
            }
            (None, None) => Ok(None),
        }
    }
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, String> {
    let file = fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "{} is larger than {} KiB",
            path.display(),
            MAX_FILE_BYTES / 1024
        ));
    }
    Ok(bytes)
}

/// Reads and checks the web configuration file; `None`: plain HTTP, no
/// authentication.
pub fn load(path: Option<&Path>) -> Result<WebConfig, WebConfigError> {
    let Some(path) = path else {
        return Ok(WebConfig::default());
    };
    let cx = Context::new(path);
    let bytes = read_bounded(path).map_err(|e| cx.error("(file)", e))?;
    let text = String::from_utf8(bytes).map_err(|_| cx.error("(file)", "not UTF-8 text"))?;
    parse(&cx, &text)
}

/// Parses the file's text (`path`: for relative paths and errors).
pub fn parse_text(path: &Path, text: &str) -> Result<WebConfig, WebConfigError> {
    parse(&Context::new(path), text)
}

fn parse(cx: &Context, text: &str) -> Result<WebConfig, WebConfigError> {
    let value: serde_yaml::Value =
        serde_yaml::from_str(text).map_err(|e| cx.error("(syntax)", e.to_string()))?;
    let file: File = if value.is_null() {
        File::default()
    } else {
        serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(|e| {
            let key = e.path().to_string();
            let key = if key == "." { "(file)".to_owned() } else { key };
            // serde_yaml names the enclosing mapping itself
            let mut message = e.inner().to_string();
            for (i, _) in key.match_indices('.').chain([(key.len(), "")]) {
                if let Some(rest) = message.strip_prefix(&format!("{}: ", &key[..i])) {
                    message = rest.to_owned();
                    break;
                }
            }
            cx.error(&key, message)
        })?
    };
    if file.rate_limit.is_some() {
        return Err(cx.error(
            "rate_limit",
            "not supported by qpwatch: its [http] limits bound the connections per source instead",
        ));
    }
    let mut config = WebConfig {
        source: Some(cx.path.to_owned()),
        ..WebConfig::default()
    };
    if let Some(http) = &file.http_server_config {
        if http.http2 == Some(true) {
            return Err(cx.error(
                "http_server_config.http2",
                "qpwatch serves HTTP/1.1 only: set false or leave the key out",
            ));
        }
        for (name, value) in http.headers.iter().flatten() {
            config.headers.push(header(cx, name, value)?);
        }
    }
    if let Some(tls) = &file.tls_server_config {
        let (server, client_certificates, cert_expiry) = tls_config(cx, tls)?;
        config.tls = Some(Arc::new(server));
        config.client_certificates = client_certificates;
        config.cert_expiry = Some(cert_expiry);
    }
    if let Some(users) = &file.basic_auth_users {
        if !users.is_empty() {
            for (user, hash) in users {
                let key = format!("basic_auth_users.{user}");
                if user.is_empty() || user.contains(':') {
                    return Err(cx.error(&key, "a user name is not empty and has no ':'"));
                }
                hash.parse::<bcrypt::HashParts>().map_err(|e| {
                    cx.error(
                        &key,
                        format!("not a bcrypt hash ({e}): see qpwatch hash-password"),
                    )
                })?;
            }
            config.basic_auth = Some(Arc::new(BasicAuth::new(users.clone())));
        }
    }
    config.files = std::iter::once(cx.path.to_owned())
        .chain(cx.read.take())
        .collect();
    Ok(config)
}

fn header(
    cx: &Context,
    name: &str,
    value: &str,
) -> Result<(HeaderName, HeaderValue), WebConfigError> {
    let key = format!("http_server_config.headers.{name}");
    let Some((_, allowed)) = HEADERS.iter().find(|(h, _)| *h == name) else {
        return Err(cx.error(
            &key,
            format!(
                "this header cannot be set (these can: {})",
                HEADERS.map(|(h, _)| h).join(", ")
            ),
        ));
    };
    if !allowed.is_empty() && !allowed.contains(&value) {
        return Err(cx.error(
            &key,
            format!("{value:?} is not one of {}", allowed.join(", ")),
        ));
    }
    let value = HeaderValue::from_str(value)
        .map_err(|_| cx.error(&key, format!("{value:?} is not a header value")))?;
    let name = HeaderName::from_bytes(name.as_bytes()).expect("one of HEADERS");
    Ok((name, value))
}

fn version(
    cx: &Context,
    key: &str,
    name: &str,
) -> Result<&'static SupportedProtocolVersion, WebConfigError> {
    match name {
        "TLS12" => Ok(&rustls::version::TLS12),
        "TLS13" => Ok(&rustls::version::TLS13),
        "TLS10" | "TLS11" => Err(cx.error(
            key,
            format!("{name} is not supported: qpwatch (rustls) speaks TLS 1.2 and 1.3 only (1.0 and 1.1 are deprecated by RFC 8996); use TLS12 or TLS13"),
        )),
        _ => Err(cx.error(key, format!("{name:?} is not a TLS version (TLS12, TLS13)"))),
    }
}

/// The cipher suites for TLS 1.2 (exporter-toolkit's, Go's names, which
/// are IANA's), in the file's order; the TLS 1.3 suites are always on, as in Go.
fn cipher_suites(
    cx: &Context,
    names: &[String],
) -> Result<Vec<SupportedCipherSuite>, WebConfigError> {
    let tls12: Vec<(String, SupportedCipherSuite)> = provider::ALL_CIPHER_SUITES
        .iter()
        .filter(|s| s.tls13().is_none())
        .map(|s| (format!("{:?}", s.suite()), *s))
        .collect();
    let mut suites: Vec<SupportedCipherSuite> = provider::ALL_CIPHER_SUITES
        .iter()
        .filter(|s| s.tls13().is_some())
        .copied()
        .collect();
    for name in names {
        // Go's short aliases of the ChaCha20 suites
        let full = if name.ends_with("CHACHA20_POLY1305") {
            format!("{name}_SHA256")
        } else {
            name.clone()
        };
        let Some((_, suite)) = tls12.iter().find(|(n, _)| *n == full) else {
            return Err(cx.error(
                "tls_server_config.cipher_suites",
                format!(
                    "{name:?} is not a TLS 1.2 cipher suite qpwatch supports ({})",
                    tls12
                        .iter()
                        .map(|(n, _)| n.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        };
        suites.push(*suite);
    }
    Ok(suites)
}

fn curves(
    cx: &Context,
    names: &[String],
) -> Result<Vec<&'static dyn rustls::crypto::SupportedKxGroup>, WebConfigError> {
    names
        .iter()
        .map(|name| match name.as_str() {
            "X25519" => Ok(provider::kx_group::X25519),
            "CurveP256" => Ok(provider::kx_group::SECP256R1),
            "CurveP384" => Ok(provider::kx_group::SECP384R1),
            _ => Err(cx.error(
                "tls_server_config.curve_preferences",
                format!("{name:?} is not a curve qpwatch supports (X25519, CurveP256, CurveP384)"),
            )),
        })
        .collect()
}

/// The server's TLS, who must show a certificate, and when the first served
/// certificate expires.
fn tls_config(
    cx: &Context,
    tls: &TlsFile,
) -> Result<(ServerConfig, ClientCertificates, i64), WebConfigError> {
    const K: &str = "tls_server_config";
    let key = |k: &str| format!("{K}.{k}");
    let min = version(
        cx,
        &key("min_version"),
        tls.min_version.as_deref().unwrap_or("TLS12"),
    )?;
    let max = version(
        cx,
        &key("max_version"),
        tls.max_version.as_deref().unwrap_or("TLS13"),
    )?;
    let rank = |v: &SupportedProtocolVersion| u16::from(v.version);
    if rank(min) > rank(max) {
        return Err(cx.error(&key("max_version"), "below min_version"));
    }
    let versions: Vec<&'static SupportedProtocolVersion> =
        [&rustls::version::TLS12, &rustls::version::TLS13]
            .into_iter()
            .filter(|v| rank(v) >= rank(min) && rank(v) <= rank(max))
            .collect();

    let mut crypto = provider::default_provider();
    if let Some(names) = &tls.cipher_suites {
        crypto.cipher_suites = cipher_suites(cx, names)?;
    }
    if let Some(names) = &tls.curve_preferences {
        crypto.kx_groups = curves(cx, names)?;
    }
    let crypto: Arc<CryptoProvider> = Arc::new(crypto);

    if tls
        .client_allowed_sans
        .as_ref()
        .is_some_and(|s| !s.is_empty())
    {
        return Err(cx.error(
            &key("client_allowed_sans"),
            "not supported by qpwatch: give the clients certificates of their own CA (client_ca_file)",
        ));
    }
    let auth_type = tls.client_auth_type.as_deref().unwrap_or("NoClientCert");
    let ca = cx.pem(
        &tls.client_ca,
        &key("client_ca"),
        &tls.client_ca_file,
        &key("client_ca_file"),
    )?;
    let client_certificates = match auth_type {
        "NoClientCert" => ClientCertificates::None,
        "VerifyClientCertIfGiven" => ClientCertificates::VerifiedIfGiven,
        "RequireAndVerifyClientCert" => ClientCertificates::Required,
        "RequestClientCert" | "RequireAnyClientCert" => {
            return Err(cx.error(
                &key("client_auth_type"),
                format!("{auth_type} is not supported: a client certificate that is not verified proves nothing; use RequireAndVerifyClientCert (or VerifyClientCertIfGiven) with client_ca_file"),
            ))
        }
        _ => {
            return Err(cx.error(
                &key("client_auth_type"),
                format!("{auth_type:?} is not one of NoClientCert, VerifyClientCertIfGiven, RequireAndVerifyClientCert"),
            ))
        }
    };
    let (cert_pem, cert_key) = cx
        .pem(&tls.cert, &key("cert"), &tls.cert_file, &key("cert_file"))?
        .ok_or_else(|| cx.error(&key("cert_file"), "missing: TLS needs a certificate"))?;
    let (key_pem, key_key) = cx
        .pem(&tls.key, &key("key"), &tls.key_file, &key("key_file"))?
        .ok_or_else(|| cx.error(&key("key_file"), "missing: TLS needs a private key"))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| cx.error(&cert_key, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(cx.error(&cert_key, "no PEM certificate in it"));
    }
    let mut cert_expiry = i64::MAX;
    for cert in &certs {
        let not_after = not_after_unix(cert).map_err(|e| cx.error(&cert_key, e.to_string()))?;
        cert_expiry = cert_expiry.min(not_after);
    }
    let private_key = PrivateKeyDer::from_pem_slice(&key_pem)
        .map_err(|e| cx.error(&key_key, format!("no PEM private key in it: {e}")))?;

    let builder = ServerConfig::builder_with_provider(Arc::clone(&crypto))
        .with_protocol_versions(&versions)
        .map_err(|e| cx.error(&key("min_version"), e.to_string()))?;
    let builder = match (client_certificates, ca) {
        (ClientCertificates::None, None) => builder.with_no_client_auth(),
        (ClientCertificates::None, Some((_, ca_key))) => {
            return Err(cx.error(
                &ca_key,
                "a client CA without client_auth_type: set RequireAndVerifyClientCert (or VerifyClientCertIfGiven)",
            ))
        }
        (_, None) => {
            return Err(cx.error(
                &key("client_ca_file"),
                format!("missing: {auth_type} verifies client certificates against it"),
            ))
        }
        (required, Some((ca_pem, ca_key))) => {
            let mut roots = RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(&ca_pem) {
                let cert =
                    cert.map_err(|e| cx.error(&ca_key, format!("not PEM certificates: {e}")))?;
                roots
                    .add(cert)
                    .map_err(|e| cx.error(&ca_key, format!("not a CA certificate: {e}")))?;
            }
            if roots.is_empty() {
                return Err(cx.error(&ca_key, "no PEM certificate in it"));
            }
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&crypto));
            let verifier = if required == ClientCertificates::VerifiedIfGiven {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            let verifier = verifier
                .build()
                .map_err(|e| cx.error(&ca_key, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(certs, private_key)
        .map_err(|e| cx.error(&key_key, format!("does not go with the certificate: {e}")))?;
    config.ignore_client_order = tls.prefer_server_cipher_suites.unwrap_or(true);
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((config, client_certificates, cert_expiry))
}
