//! The probe engine: one runner loop for every probe the daemon runs, the zonal health checks
//! and the Traffic Manager monitors alike. A [`Prober`] per protocol observes a target (TCP
//! connect; HTTP and HTTPS `GET` through hyper's client); a [`Judge`] per product turns the
//! observations into a verdict (health-check thresholds, or Traffic Manager's tolerated
//! failures and expected status ranges: `health`); [`run`] probes on the interval, sets a local
//! failure (this host out of descriptors) apart, and reports only verdict changes.

use http_body_util::Empty;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A verdict change reported to the reconcile loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    pub service: String,
    pub backend: std::net::IpAddr,
    pub healthy: bool,
    pub reason: String,
    /// The probe task that reports it (its number when started): the daemon ignores a report
    /// of a task it has stopped since, which may still sit in the channel.
    pub probe: u64,
}

/// What one probe saw of its target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observation {
    /// The TCP handshake completed (a TCP probe's success).
    Connected,
    /// An HTTP response with this status code.
    HttpStatus(u16),
    /// The target failed the probe: why.
    Failed(String),
}

/// A probe that could not run for a reason of this host, not the target's (EMFILE, ENOMEM...):
/// it says nothing about the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalError(pub String);

/// What a probe connects to.
#[derive(Clone, Debug)]
pub struct Target {
    /// The backend's own address and the check's port.
    pub addr: SocketAddr,
    /// How the probe's packets reach that backend.
    pub path: Path,
}

/// How a probe's packets reach its backend.
#[derive(Clone, Debug)]
pub enum Path {
    /// To the backend's own address (`path = "DIRECT"`, Traffic Manager monitors).
    Direct,
    /// To the VIP, delivered to the backend as its client packets are (`path = "VIP"`).
    Vip(Arc<super::probe_path::Lane>),
    /// `path = "VIP"`, but the probe path could not be set up: every probe fails with this.
    Unavailable(String),
}

impl Target {
    /// A probe of `addr` itself.
    pub fn direct(addr: SocketAddr) -> Self {
        Self { addr, path: Path::Direct }
    }
}

/// How one protocol probes a target.
pub trait Prober: Send + Sync + std::fmt::Debug {
    fn observe<'a>(
        &'a self,
        to: &'a Target,
    ) -> Pin<Box<dyn Future<Output = Result<Observation, LocalError>> + Send + 'a>>;
}

/// A local shortage rather than anything the target did.
pub fn is_local_error(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM))
}

/// Connects for a probe: Ok(Err(observation)) when the target refused or was unreachable.
async fn connect(to: &Target) -> Result<Result<TcpStream, Observation>, LocalError> {
    let connected = match &to.path {
        Path::Direct => TcpStream::connect(to.addr).await,
        Path::Vip(lane) => lane.connect(to.addr.port()).await,
        Path::Unavailable(why) => return Ok(Err(Observation::Failed(why.clone()))),
    };
    match connected {
        Ok(s) => Ok(Ok(s)),
        Err(e) if is_local_error(&e) => Err(LocalError(format!("local error, not the backend's: connect: {e}"))),
        Err(e) => Ok(Err(Observation::Failed(format!("connect: {e}")))),
    }
}

/// A probe's byte stream: plain TCP, or TLS over it.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// Connects, sends a PROXY protocol v1 line with `proxy`, then with `tls` (the name to send)
/// does the TLS handshake, without verifying the certificate: Ok(Err(observation)) when the
/// target failed any of them.
async fn open(
    to: &Target,
    proxy: bool,
    tls: Option<tokio_rustls::rustls::pki_types::ServerName<'static>>,
) -> Result<Result<Box<dyn Io>, Observation>, LocalError> {
    open_with(to, proxy, tls, false).await
}

/// [`open`], offering HTTP/2 by ALPN with `h2` (and failing when the server does not take it).
pub(super) async fn open_with(
    to: &Target,
    proxy: bool,
    tls: Option<tokio_rustls::rustls::pki_types::ServerName<'static>>,
    h2: bool,
) -> Result<Result<Box<dyn Io>, Observation>, LocalError> {
    let mut stream = match connect(to).await? {
        Ok(s) => s,
        Err(failed) => return Ok(Err(failed)),
    };
    if proxy {
        use tokio::io::AsyncWriteExt;
        let local = stream.local_addr().map_err(|e| LocalError(format!("local address: {e}")))?;
        // The address the probe connected to: the VIP through the data path.
        let addr = stream.peer_addr().map_err(|e| LocalError(format!("peer address: {e}")))?;
        let family = if addr.is_ipv4() { "TCP4" } else { "TCP6" };
        let line = format!("PROXY {family} {} {} {} {}\r\n", local.ip(), addr.ip(), local.port(), addr.port());
        if let Err(e) = stream.write_all(line.as_bytes()).await {
            return Ok(Err(Observation::Failed(format!("send the PROXY line: {e}"))));
        }
    }
    Ok(match tls {
        None => Ok(Box::new(stream)),
        Some(name) => match tls::connector(h2).connect(name, stream).await {
            Ok(s) if h2 && s.get_ref().1.alpn_protocol() != Some(b"h2") => {
                Err(Observation::Failed("TLS handshake: the server did not choose HTTP/2 (ALPN h2)".into()))
            }
            Ok(s) => Ok(Box::new(s)),
            Err(e) => Err(Observation::Failed(format!("TLS handshake: {e}"))),
        },
    })
}

/// TCP: the handshake completes.
#[derive(Debug)]
pub struct TcpProber;

impl Prober for TcpProber {
    fn observe<'a>(
        &'a self,
        to: &'a Target,
    ) -> Pin<Box<dyn Future<Output = Result<Observation, LocalError>> + Send + 'a>> {
        Box::pin(async move { Ok(connect(to).await?.map(|_| Observation::Connected).unwrap_or_else(|f| f)) })
    }
}

/// HTTP, HTTPS or HTTP/2 over TLS: `GET path` with `headers` (a `Host`, or for HTTP/2 the
/// authority, of the target's address unless given), through hyper's HTTP/1 or HTTP/2 client;
/// the response's status. HTTPS does not verify the target's
/// certificate (as Google Cloud's and Traffic Manager's probes do not); its SNI is the `Host`
/// header's name when one is given.
#[derive(Debug)]
pub struct HttpProber {
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub tls: bool,
    /// HTTP/2 (over TLS, ALPN h2), through hyper's HTTP/2 client.
    pub http2: bool,
    /// A PROXY protocol v1 line first.
    pub proxy: bool,
    /// What the body must start with (read up to its length, no further).
    pub body_prefix: Option<String>,
}

/// TCP or SSL with a conversation: connect (and the TLS handshake, without verifying the
/// certificate), send `request`, and read until the answer shows `response` as its prefix (or
/// the peer closes); without `response`, connecting (and sending) is the pass.
#[derive(Debug)]
pub struct StreamProber {
    pub tls: bool,
    /// A PROXY protocol v1 line first.
    pub proxy: bool,
    pub request: Option<String>,
    pub response: Option<String>,
}

impl Prober for StreamProber {
    fn observe<'a>(
        &'a self,
        to: &'a Target,
    ) -> Pin<Box<dyn Future<Output = Result<Observation, LocalError>> + Send + 'a>> {
        Box::pin(async move {
            let name = self.tls.then(|| tokio_rustls::rustls::pki_types::ServerName::IpAddress(to.addr.ip().into()));
            Ok(match open(to, self.proxy, name).await? {
                Ok(stream) => self.converse(stream).await,
                Err(failed) => failed,
            })
        })
    }
}

impl StreamProber {
    async fn converse<S: AsyncRead + AsyncWrite + Unpin>(&self, mut s: S) -> Observation {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        if let Some(request) = &self.request {
            if let Err(e) = s.write_all(request.as_bytes()).await {
                return Observation::Failed(format!("send: {e}"));
            }
        }
        let Some(want) = &self.response else { return Observation::Connected };
        let mut got = Vec::with_capacity(want.len());
        let mut buf = [0u8; 512];
        while got.len() < want.len() {
            match s.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
                Err(e) => return Observation::Failed(format!("receive: {e}")),
            }
        }
        if got.starts_with(want.as_bytes()) {
            Observation::Connected
        } else {
            Observation::Failed(format!(
                "the response {:?} does not start with {want:?}",
                String::from_utf8_lossy(&got[..got.len().min(64)])
            ))
        }
    }
}

impl Prober for HttpProber {
    fn observe<'a>(
        &'a self,
        to: &'a Target,
    ) -> Pin<Box<dyn Future<Output = Result<Observation, LocalError>> + Send + 'a>> {
        Box::pin(async move {
            let name = self.tls.then(|| self.server_name(to.addr));
            let stream = match open_with(to, self.proxy, name, self.http2).await? {
                Ok(stream) => stream,
                Err(failed) => return Ok(failed),
            };
            Ok(self.get(stream, to.addr).await.map_or_else(Observation::Failed, Observation::HttpStatus))
        })
    }
}

impl HttpProber {
    /// The `Host` header's name (without a port), else the target's address.
    fn server_name(&self, addr: SocketAddr) -> tokio_rustls::rustls::pki_types::ServerName<'static> {
        use tokio_rustls::rustls::pki_types::ServerName;
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("host"))
            .map(|(_, v)| v.rsplit_once(':').map_or(v.as_str(), |(h, _)| h))
            .and_then(|h| ServerName::try_from(h.to_owned()).ok())
            .unwrap_or_else(|| ServerName::IpAddress(addr.ip().into()))
    }

    /// The request: `GET path` with the custom headers and a `Host` (HTTP/2: the URI's
    /// authority) of the target's address unless one is given.
    fn request(&self, addr: SocketAddr) -> Result<hyper::Request<Empty<Bytes>>, String> {
        let given = self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case("host")).map(|(_, v)| v.clone());
        let host = given.clone().unwrap_or_else(|| match addr {
            SocketAddr::V4(a) => a.ip().to_string(),
            SocketAddr::V6(a) => format!("[{}]", a.ip()),
        });
        let mut req = if self.http2 {
            // HTTP/2 carries the host as the `:authority` of an absolute URI.
            hyper::Request::get(format!("https://{host}{}", self.path))
        } else {
            let mut req = hyper::Request::get(self.path.as_str());
            if given.is_none() {
                req = req.header("Host", host);
            }
            req.header("Connection", "close")
        };
        for (name, value) in &self.headers {
            if !(self.http2 && name.eq_ignore_ascii_case("host")) {
                req = req.header(name.as_str(), value.as_str());
            }
        }
        req.header("User-Agent", "lb-health/1").body(Empty::new()).map_err(|e| format!("request: {e}"))
    }

    async fn get(&self, stream: Box<dyn Io>, addr: SocketAddr) -> Result<u16, String> {
        let req = self.request(addr)?;
        let io = TokioIo::new(stream);
        // The connection is driven while the request runs and dropped with the probe.
        let (sent, driver) = if self.http2 {
            let (mut sender, conn) = hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .handshake::<_, Empty<Bytes>>(io)
                .await
                .map_err(|e| format!("send: {e}"))?;
            let driver = tokio::spawn(conn);
            (sender.send_request(req).await, driver)
        } else {
            // Title-case header names, as the custom headers are written: some servers and
            // middleboxes on health-check paths match them case-sensitively.
            let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
                .title_case_headers(true)
                .handshake::<_, Empty<Bytes>>(io)
                .await
                .map_err(|e| format!("send: {e}"))?;
            let driver = tokio::spawn(conn);
            (sender.send_request(req).await, driver)
        };
        let result = async {
            let resp = sent.map_err(|e| format!("receive: {e}"))?;
            let status = resp.status().as_u16();
            if let Some(want) = &self.body_prefix {
                let body = read_prefix(resp.into_body(), want.len()).await?;
                if !body.starts_with(want.as_bytes()) {
                    return Err(format!(
                        "HTTP status {status}, body {:?} does not start with {want:?}",
                        String::from_utf8_lossy(&body[..body.len().min(64)])
                    ));
                }
            }
            Ok(status)
        }
        .await;
        driver.abort();
        result
    }
}

/// What a judge made of one observation.
pub struct Judged {
    /// The probe passed by the product's rules.
    pub passed: bool,
    /// Why it failed (None when it passed).
    pub error: Option<String>,
    /// The new verdict and why, when it changed.
    pub change: Option<(bool, String)>,
}

/// Up to `n` bytes of the start of `body` (a body that sends more is not read further).
async fn read_prefix(mut body: hyper::body::Incoming, n: usize) -> Result<Vec<u8>, String> {
    use http_body_util::BodyExt;
    let mut got = Vec::with_capacity(n);
    while got.len() < n {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    got.extend_from_slice(&data[..data.len().min(n - got.len())]);
                }
            }
            Some(Err(e)) => return Err(format!("receive: {e}")),
            None => break,
        }
    }
    Ok(got)
}

/// Turns observations into a verdict: the product's rules.
pub trait Judge: Send {
    fn judge(&mut self, seen: &Observation) -> Judged;
}

/// The last probe of one target, for `lb status`.
#[derive(Clone, Debug)]
pub struct LastProbe {
    pub at: std::time::Instant,
    pub passed: bool,
    pub error: Option<String>,
    pub latency: Duration,
}

type Targets = std::collections::HashMap<(String, std::net::IpAddr), LastProbe>;

/// Every running probe's last result, by (service, target address).
fn last_probes() -> &'static std::sync::Mutex<Targets> {
    static LAST: std::sync::OnceLock<std::sync::Mutex<Targets>> = std::sync::OnceLock::new();
    LAST.get_or_init(Default::default)
}

/// The last probe of `service`'s target `addr`, if it was probed.
pub fn last_probe(service: &str, addr: std::net::IpAddr) -> Option<LastProbe> {
    last_probes().lock().ok()?.get(&(service.to_owned(), addr)).cloned()
}

/// Forgets the targets no probe runs for any more (a reload removed them).
pub fn keep_last_probes(wanted: &dyn Fn(&str, std::net::IpAddr) -> bool) {
    if let Ok(mut last) = last_probes().lock() {
        last.retain(|(s, a), _| wanted(s, *a));
    }
}

/// What one probe task probes, how often, and where its first probe falls.
pub struct Schedule {
    pub interval: Duration,
    pub timeout: Duration,
    /// The first probe waits this long (spreads a service's probes over the interval).
    pub offset: Duration,
}

/// One probe of `to` within `timeout`: a timeout is the target's failure.
pub async fn observe(prober: &dyn Prober, to: &Target, timeout: Duration) -> Result<Observation, LocalError> {
    tokio::time::timeout(timeout, prober.observe(to))
        .await
        .unwrap_or_else(|_| Ok(Observation::Failed(format!("timeout after {timeout:?}"))))
}

/// The runner: probes `addr` for `service` on the schedule forever, reporting each verdict
/// change of `judge` as task number `id`.
pub fn run(
    service: String,
    to: Target,
    prober: Arc<dyn Prober>,
    mut judge: Box<dyn Judge>,
    schedule: Schedule,
    events: mpsc::Sender<HealthEvent>,
    id: u64,
) -> JoinHandle<()> {
    let addr = to.addr;
    tokio::spawn(async move {
        tokio::time::sleep(schedule.offset).await;
        let mut local = LocalErrors::default();
        let mut ticker = tokio::time::interval(schedule.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            let started = std::time::Instant::now();
            let seen = match observe(prober.as_ref(), &to, schedule.timeout).await {
                Ok(seen) => seen,
                Err(LocalError(e)) => {
                    local.seen(&service, addr, &e);
                    continue;
                }
            };
            local.cleared(&service, addr);
            let judged = judge.judge(&seen);
            let last =
                LastProbe { at: started, passed: judged.passed, error: judged.error, latency: started.elapsed() };
            if let Ok(mut all) = last_probes().lock() {
                all.insert((service.clone(), addr.ip()), last);
            }
            if let Some((healthy, reason)) = judged.change {
                let event = HealthEvent { service: service.clone(), backend: addr.ip(), healthy, reason, probe: id };
                if events.send(event).await.is_err() {
                    return; // the daemon is shutting down
                }
            }
        }
    })
}

/// Logs a probe's local errors once per run of them, not at every probe.
#[derive(Default)]
struct LocalErrors(bool);

impl LocalErrors {
    fn seen(&mut self, service: &str, addr: SocketAddr, error: &str) {
        if !std::mem::replace(&mut self.0, true) {
            tracing::warn!("service {service} backend {addr}: probe skipped, {error}; its health verdict is kept");
        }
    }

    fn cleared(&mut self, service: &str, addr: SocketAddr) {
        if std::mem::take(&mut self.0) {
            tracing::info!("service {service} backend {addr}: probes run again");
        }
    }
}

/// The TLS client of HTTPS probes.
mod tls {
    use std::sync::{Arc, OnceLock};
    use tokio_rustls::rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use tokio_rustls::rustls::crypto::{ring, verify_tls12_signature, verify_tls13_signature, CryptoProvider};
    use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
    use tokio_rustls::rustls::{ClientConfig, DigitallySignedStruct, Error, SignatureScheme};
    use tokio_rustls::TlsConnector;

    /// Built once: ring's algorithms, any certificate.
    /// The probes' TLS client; with `h2`, offering HTTP/2 by ALPN (HTTP2 checks).
    pub fn connector(h2: bool) -> TlsConnector {
        static PLAIN: OnceLock<TlsConnector> = OnceLock::new();
        static H2: OnceLock<TlsConnector> = OnceLock::new();
        let make = || {
            let provider = Arc::new(ring::default_provider());
            let mut config = ClientConfig::builder_with_provider(provider.clone())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default TLS versions")
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
                .with_no_client_auth();
            if h2 {
                config.alpn_protocols = vec![b"h2".to_vec()];
            }
            TlsConnector::from(Arc::new(config))
        };
        if h2 { H2.get_or_init(make) } else { PLAIN.get_or_init(make) }.clone()
    }

    /// Accepts any server certificate (Traffic Manager's probes do not validate them either);
    /// the handshake's signatures are still checked, so the peer holds the certificate's key.
    #[derive(Debug)]
    struct AnyCertificate(Arc<CryptoProvider>);

    impl ServerCertVerifier for AnyCertificate {
        fn verify_server_cert(
            &self,
            _end_entity: &CertificateDer<'_>,
            _intermediates: &[CertificateDer<'_>],
            _server_name: &ServerName<'_>,
            _ocsp_response: &[u8],
            _now: UnixTime,
        ) -> Result<ServerCertVerified, Error> {
            Ok(ServerCertVerified::assertion())
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, Error> {
            verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
}
