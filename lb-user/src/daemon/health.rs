//! Health checking: what the zonal health checks and the Traffic Manager monitors probe and
//! how each judges the results (consecutive-result thresholds; tolerated failures and expected
//! status ranges), run on the one probe engine (`probe`).
//!
//! One task per (service, backend) probes on the service's interval; first probes are spread
//! over the interval so a large service does not probe all its backends at once. A task reports
//! only *changes* of its verdict to the reconcile loop, which recomputes the tables.

use super::probe::{
    self, HealthEvent, HttpProber, Judge, Judged, LocalError, Observation, Path, Prober, StreamProber, Target,
    TcpProber,
};
use super::probe_grpc::GrpcProber;
use super::probe_path::{Delivery, Lane};
use crate::config::{Config, Dataplane, HealthCheck, Service};
use crate::model::{Forwarding, HealthPath, HealthProtocol, MonitorProtocol, MonitorStatus};
use crate::policy::tm::{EndpointMonitor, MonitorSettings, ProbeOutcome};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// What a probe checks, resolved from `[service.health_check]` with defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct ProbeSpec {
    pub protocol: HealthProtocol,
    pub port: u16,
    pub request_path: String,
    pub expected_status: u16,
    /// TCP and SSL: sent once connected.
    pub request: Option<String>,
    /// What the answer (TCP, SSL) or the body (HTTP, HTTPS) must start with.
    pub response: Option<String>,
    /// HTTP and HTTPS: the Host header and TLS name.
    pub host: Option<String>,
    /// A PROXY protocol v1 line first (`proxy_header = "PROXY_V1"`).
    pub proxy_header: bool,
    /// GRPC: the service name asked for (empty: the server).
    pub grpc_service_name: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub healthy_threshold: u32,
    pub unhealthy_threshold: u32,
    /// Where the probes go.
    pub route: Route,
}

/// Where a health check's probes go (`path`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// To the backend's own address.
    Direct,
    /// To `vip`, delivered to the backend checked as its client packets are.
    Vip { vip: IpAddr, delivery: Delivery },
}

impl Route {
    /// The route of service `svc`'s checks: `path`, by default VIP for a VIP service
    /// (delivered by the service's forwarding: encapsulated from `dataplane`'s outer source of
    /// the VIP's family, or L2) and DIRECT for a next-hop service (validation refuses VIP there).
    pub fn of(svc: &Service, hc: &HealthCheck, dataplane: &Dataplane) -> Self {
        let (Some(vip), false) = (svc.vip(), hc.path == Some(HealthPath::Direct)) else { return Route::Direct };
        let delivery = match svc.forwarding {
            Forwarding::L2Dsr => Delivery::L2,
            Forwarding::Ipip => {
                let source = if vip.is_ipv4() { dataplane.encap_source_v4 } else { dataplane.encap_source_v6 };
                // The daemon fills an unset source from the interface before anything runs;
                // without one (an offline computation), the unspecified address.
                let unspecified = if vip.is_ipv4() { IpAddr::from([0u8; 4]) } else { IpAddr::from([0u8; 16]) };
                Delivery::Encap { outer_source: source.map_or(unspecified, |net| net.network()) }
            }
        };
        Route::Vip { vip, delivery }
    }
}

impl Route {
    /// Where the probes go, for `lb status`: "through the VIP 198.18.0.100 (IPIP)", "at the
    /// backends' own addresses".
    pub fn describe(&self) -> String {
        match self {
            Route::Direct => "at the backends' own addresses (path DIRECT)".into(),
            Route::Vip { vip, delivery: Delivery::L2 } => format!("through the VIP {vip} (L2_DSR)"),
            Route::Vip { vip, delivery: Delivery::Encap { .. } } => format!("through the VIP {vip} (IPIP)"),
        }
    }
}

/// Service `svc`'s health check for `lb status` ("TCP port 80, through the VIP ... (IPIP)"); None
/// without one.
pub fn describe_check(svc: &Service, dataplane: &Dataplane) -> Option<String> {
    let (hc, port) = (svc.health_check()?, svc.health_check_port()?);
    Some(format!("{} port {port}, {}", hc.protocol, Route::of(svc, hc, dataplane).describe()))
}

impl ProbeSpec {
    /// `default_port` is the service's first port (config validation guarantees one exists
    /// when the health check names none).
    pub fn from_config(hc: &HealthCheck, default_port: u16, route: Route) -> Self {
        Self {
            route,
            protocol: hc.protocol,
            port: hc.port.unwrap_or(default_port),
            request_path: hc.request_path.clone().unwrap_or_else(|| "/".into()),
            expected_status: hc.expected_status.unwrap_or(200),
            request: hc.request.clone(),
            response: hc.response.clone(),
            host: hc.host.clone(),
            proxy_header: hc.proxy_header == crate::model::ProxyHeader::ProxyV1,
            grpc_service_name: hc.grpc_service_name.clone().unwrap_or_default(),
            interval: Duration::from_secs(hc.check_interval_sec.max(1) as u64),
            timeout: Duration::from_secs(hc.timeout_sec.max(1) as u64),
            healthy_threshold: hc.healthy_threshold.max(1),
            unhealthy_threshold: hc.unhealthy_threshold.max(1),
        }
    }
}

/// One health-check probe's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Checked {
    Passed,
    /// The backend failed the probe: why.
    Failed(String),
    /// The probe could not run for a reason of this host (out of descriptors or memory): it
    /// says nothing about the backend, whose verdict is kept.
    Local(String),
}

/// The prober of a health check's protocol (Google Cloud's: TCP and SSL with an optional
/// request and expected response; HTTP, HTTPS and HTTP2 with a path, Host and expected body
/// prefix; GRPC and GRPC_WITH_TLS, the standard health service).
/// TLS probes do not verify the backend's certificate, as Google Cloud's do not.
pub fn prober(spec: &ProbeSpec) -> Arc<dyn Prober> {
    let proxy = spec.proxy_header;
    let stream = |tls: bool| -> Arc<dyn Prober> {
        if spec.request.is_none() && spec.response.is_none() && !tls && !proxy {
            return Arc::new(TcpProber);
        }
        Arc::new(StreamProber { tls, proxy, request: spec.request.clone(), response: spec.response.clone() })
    };
    let http = |tls: bool, http2: bool| -> Arc<dyn Prober> {
        let headers = spec.host.iter().map(|h| ("Host".to_owned(), h.clone())).collect();
        let path = spec.request_path.clone();
        Arc::new(HttpProber { path, headers, tls, http2, proxy, body_prefix: spec.response.clone() })
    };
    match spec.protocol {
        HealthProtocol::Tcp => stream(false),
        HealthProtocol::Ssl => stream(true),
        HealthProtocol::Http => http(false, false),
        HealthProtocol::Https => http(true, false),
        HealthProtocol::Http2 => http(true, true),
        HealthProtocol::Grpc | HealthProtocol::GrpcWithTls => Arc::new(GrpcProber {
            tls: spec.protocol == HealthProtocol::GrpcWithTls,
            service: spec.grpc_service_name.clone(),
        }),
    }
}

/// Whether an observation passes the health check `spec`.
fn checked(seen: Observation, spec: &ProbeSpec) -> Checked {
    match seen {
        Observation::Connected => Checked::Passed,
        Observation::HttpStatus(s) if s == spec.expected_status => Checked::Passed,
        Observation::HttpStatus(s) => Checked::Failed(format!("HTTP status {s}, expected {}", spec.expected_status)),
        Observation::Failed(e) => Checked::Failed(e),
    }
}

/// One probe of `addr` itself (whatever the spec's route).
pub async fn check(addr: SocketAddr, spec: &ProbeSpec) -> Checked {
    match probe::observe(prober(spec).as_ref(), &Target::direct(addr), spec.timeout).await {
        Ok(seen) => checked(seen, spec),
        Err(LocalError(e)) => Checked::Local(e),
    }
}

/// One probe: Ok(()) if the backend passed, Err(reason) otherwise (a local error included).
pub async fn probe_once(addr: SocketAddr, spec: &ProbeSpec) -> Result<(), String> {
    match check(addr, spec).await {
        Checked::Passed => Ok(()),
        Checked::Failed(e) | Checked::Local(e) => Err(e),
    }
}

/// Consecutive-result thresholds: the verdict flips after `healthy_threshold` successes in a
/// row (when unhealthy) or `unhealthy_threshold` failures in a row (when healthy). A backend
/// not yet checked (`None`) takes its first probe's result as its verdict: one pass admits it,
/// one failure confirms what it already is for selection (not healthy).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub healthy: Option<bool>,
    streak: u32,
}

impl Verdict {
    pub fn new(healthy: Option<bool>) -> Self {
        Self { healthy, streak: 0 }
    }

    /// Record one probe result; returns the new verdict if it changed (the first always).
    pub fn record(&mut self, ok: bool, spec: &ProbeSpec) -> Option<bool> {
        let Some(healthy) = self.healthy else {
            self.healthy = Some(ok);
            return Some(ok);
        };
        if ok == healthy {
            self.streak = 0;
            return None;
        }
        self.streak += 1;
        let needed = if ok { spec.healthy_threshold } else { spec.unhealthy_threshold };
        if self.streak >= needed {
            self.healthy = Some(ok);
            self.streak = 0;
            Some(ok)
        } else {
            None
        }
    }
}

/// Where a probe's first check falls within its interval: slot `slot` of `of`, so that the
/// probes of a service do not all fire at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Spread {
    pub slot: u32,
    pub of: u32,
}

/// The health check's rules as a [`Judge`]: the thresholds of [`Verdict`].
struct CheckJudge {
    verdict: Verdict,
    spec: ProbeSpec,
}

impl Judge for CheckJudge {
    fn judge(&mut self, seen: &Observation) -> Judged {
        let (ok, reason) = match checked(seen.clone(), &self.spec) {
            Checked::Passed => (true, "probe passed".to_string()),
            Checked::Failed(e) | Checked::Local(e) => (false, e),
        };
        let change = self.verdict.record(ok, &self.spec).map(|healthy| (healthy, reason.clone()));
        Judged { passed: ok, error: (!ok).then_some(reason), change }
    }
}

/// Probe one backend forever on the probe engine, sending verdict changes (and the first
/// verdict of a backend `initially` unchecked). `spread` places the first probe.
pub fn spawn_checker(
    service: String,
    addr: SocketAddr,
    spec: ProbeSpec,
    initially: Option<bool>,
    spread: Spread,
    events: mpsc::Sender<HealthEvent>,
    probe: u64,
) -> JoinHandle<()> {
    let schedule = probe::Schedule {
        interval: spec.interval,
        timeout: spec.timeout,
        offset: spec.interval.mul_f64(spread.slot as f64 / spread.of.max(1) as f64),
    };
    let judge = Box::new(CheckJudge { verdict: Verdict::new(initially), spec: spec.clone() });
    let path = match spec.route {
        Route::Direct => Path::Direct,
        Route::Vip { vip, delivery } => match Lane::new(vip, addr.ip(), delivery) {
            Ok(lane) => Path::Vip(Arc::new(lane)),
            Err(e) => {
                // Logged once per set-up attempt (`probe_path`); each probe reports it.
                Path::Unavailable(format!("{e:#}"))
            }
        },
    };
    probe::run(service, Target { addr, path }, prober(&spec), judge, schedule, events, probe)
}

// ---------------------------------------------------------------- Traffic Manager monitors

/// The prober of a Traffic Manager monitor (spec §2.3): TCP = handshake within the timeout;
/// HTTP and HTTPS = `GET path` with the custom headers, the response's status code. HTTPS does
/// not validate the endpoint's certificate, as Traffic Manager does not; SNI is the `Host`
/// header's name if one is given.
pub fn monitor_prober(m: &MonitorSettings) -> Arc<dyn Prober> {
    let http = |tls| {
        Arc::new(HttpProber {
            path: m.path.clone().unwrap_or_else(|| "/".into()),
            headers: m.custom_headers.clone(),
            tls,
            http2: false,
            // Traffic Manager monitors send no PROXY line.
            proxy: false,
            body_prefix: None,
        }) as Arc<dyn Prober>
    };
    match m.protocol {
        MonitorProtocol::Tcp => Arc::new(TcpProber),
        MonitorProtocol::Http => http(false),
        MonitorProtocol::Https => http(true),
    }
}

fn monitor_timeout(m: &MonitorSettings) -> Duration {
    Duration::from_secs(u64::from(m.timeout_sec.max(1)))
}

/// What Traffic Manager makes of an observation.
fn outcome(seen: &Observation) -> ProbeOutcome {
    match seen {
        Observation::Connected => ProbeOutcome::Connected,
        Observation::HttpStatus(s) => ProbeOutcome::HttpStatus(*s),
        Observation::Failed(_) => ProbeOutcome::Failed,
    }
}

/// One monitor probe of `addr`.
pub async fn monitor_probe_once(addr: SocketAddr, m: &MonitorSettings) -> ProbeOutcome {
    monitor_check(addr, m).await.unwrap_or(ProbeOutcome::Failed)
}

/// [`monitor_probe_once`], with a local error (this host out of descriptors or memory) told
/// apart as `Err`: it says nothing about the endpoint.
pub async fn monitor_check(addr: SocketAddr, m: &MonitorSettings) -> Result<ProbeOutcome, String> {
    match probe::observe(monitor_prober(m).as_ref(), &Target::direct(addr), monitor_timeout(m)).await {
        Ok(seen) => Ok(outcome(&seen)),
        Err(LocalError(e)) => Err(e),
    }
}

/// Traffic Manager's rules as a [`Judge`]: an [`EndpointMonitor`] with its tolerated
/// failures, judged by the expected status ranges; Online is healthy, Degraded is not.
struct MonitorJudge {
    monitor: EndpointMonitor,
    settings: MonitorSettings,
    reported: MonitorStatus,
}

impl Judge for MonitorJudge {
    fn judge(&mut self, seen: &Observation) -> Judged {
        let outcome = outcome(seen);
        let passed = self.settings.probe_succeeded(outcome);
        let error = (!passed).then(|| match seen {
            Observation::Failed(e) => e.clone(),
            Observation::HttpStatus(s) => format!("HTTP status {s}, outside the expected status ranges"),
            Observation::Connected => "failed".into(),
        });
        let status = self.monitor.record(passed);
        let change = (status != self.reported).then(|| {
            self.reported = status;
            let why = error.as_ref().map(|e| format!(" ({e})")).unwrap_or_default();
            (status == MonitorStatus::Online, format!("monitor: {status} after probe result {outcome:?}{why}"))
        });
        Judged { passed, error, change }
    }
}

/// Probe one Traffic Manager endpoint every `interval`, driving an [`EndpointMonitor`] and
/// reporting each change between Online (`healthy: true`) and Degraded (`healthy: false`).
/// `initially`: the last verdict the controller holds (None = CheckingEndpoint), so a
/// restarted checker reports only real changes.
pub fn spawn_monitor(
    service: String,
    addr: SocketAddr,
    settings: MonitorSettings,
    initially: Option<bool>,
    interval: Duration,
    events: mpsc::Sender<HealthEvent>,
    probe: u64,
) -> JoinHandle<()> {
    let mut monitor = EndpointMonitor::new(settings.tolerated_failures);
    match initially {
        Some(true) => {
            monitor.record(true);
        }
        Some(false) => {
            for _ in 0..=settings.tolerated_failures {
                monitor.record(false);
            }
        }
        None => {}
    }
    let reported = monitor.status();
    let schedule = probe::Schedule { interval, timeout: monitor_timeout(&settings), offset: Duration::ZERO };
    let prober = monitor_prober(&settings);
    let judge = Box::new(MonitorJudge { monitor, settings, reported });
    probe::run(service, Target::direct(addr), prober, judge, schedule, events, probe)
}

/// Monitor tasks for every probed endpoint of the Traffic Manager services with a
/// `[service.monitor]`: not nested (derived from the child), not Disabled (never probed),
/// not alwaysServe (Unmonitored), not in a Disabled profile (Inactive).
/// One probe task the configuration asks for: a health check of a backend, or a Traffic
/// Manager monitor of an endpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Probe {
    /// `slot` of `of`: where in the interval the first probe goes (spreads a service's probes).
    Check {
        service: String,
        backend: IpAddr,
        spec: ProbeSpec,
        slot: u32,
        of: u32,
    },
    Monitor {
        service: String,
        backend: IpAddr,
        settings: MonitorSettings,
    },
}

impl Probe {
    /// The same probe (target and settings; not its place in the interval): a reload keeps it
    /// running, with its streak of results, instead of starting over.
    pub fn same_as(&self, other: &Probe) -> bool {
        match (self, other) {
            (
                Probe::Check { service: s, backend: b, spec, .. },
                Probe::Check { service: s2, backend: b2, spec: spec2, .. },
            ) => (s, b, spec) == (s2, b2, spec2),
            (Probe::Monitor { .. }, Probe::Monitor { .. }) => self == other,
            _ => false,
        }
    }

    /// Starts it as task number `id`, from the last verdict known for its target (`verdict`).
    pub fn spawn(&self, verdict: Option<bool>, events: &mpsc::Sender<HealthEvent>, id: u64) -> JoinHandle<()> {
        match self {
            Probe::Check { service, backend, spec, slot, of } => spawn_checker(
                service.clone(),
                SocketAddr::new(*backend, spec.port),
                spec.clone(),
                verdict,
                Spread { slot: *slot, of: *of },
                events.clone(),
                id,
            ),
            Probe::Monitor { service, backend, settings } => spawn_monitor(
                service.clone(),
                SocketAddr::new(*backend, settings.port),
                settings.clone(),
                verdict,
                Duration::from_secs(u64::from(settings.interval_sec)),
                events.clone(),
                id,
            ),
        }
    }

    pub fn target(&self) -> (&str, IpAddr) {
        match self {
            Probe::Check { service, backend, .. } | Probe::Monitor { service, backend, .. } => (service, *backend),
        }
    }
}

/// Every probe `cfg` asks for: `[service.health_check]` of each backend, and
/// `[service.monitor]` of each Traffic Manager endpoint that is not nested (derived from the
/// child), not Disabled (never probed) and not always-serve.
pub fn probes_for(cfg: &Config) -> Vec<Probe> {
    let mut probes = Vec::new();
    for svc in &cfg.services {
        let (Some(hc), Some(port)) = (svc.health_check(), svc.health_check_port()) else { continue };
        let spec = ProbeSpec::from_config(hc, port, Route::of(svc, hc, &cfg.dataplane));
        let of = svc.backends.len() as u32;
        for (i, address) in svc.backends.iter().filter_map(|b| b.address()).enumerate() {
            probes.push(Probe::Check {
                service: svc.name.clone(),
                backend: address,
                spec: spec.clone(),
                slot: i as u32,
                of,
            });
        }
    }
    for svc in &cfg.services {
        for (backend, settings) in crate::policy::monitored_endpoints(svc) {
            probes.push(Probe::Monitor { service: svc.name.clone(), backend, settings });
        }
    }
    probes
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn spec(protocol: HealthProtocol, port: u16) -> ProbeSpec {
        ProbeSpec {
            protocol,
            port,
            request_path: "/healthz".into(),
            expected_status: 200,
            request: None,
            response: None,
            host: None,
            proxy_header: false,
            grpc_service_name: String::new(),
            interval: Duration::from_millis(50),
            timeout: Duration::from_secs(5),
            healthy_threshold: 2,
            unhealthy_threshold: 3,
            route: Route::Direct,
        }
    }

    #[test]
    fn a_reload_keeps_probes_whose_target_and_settings_stay() {
        let svc = |backends: &str, interval: u32| {
            format!(
                "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\
                 [service.health_check]\ncheck_interval_sec = {interval}\n{backends}"
            )
        };
        let one = "[[service.backend]]\naddress = \"198.18.11.1\"\n";
        let two = format!("{one}[[service.backend]]\naddress = \"198.18.11.2\"\n");
        let before = probes_for(&Config::parse(&svc(one, 5)).unwrap());
        assert_eq!(before.len(), 1);
        // A backend added: the first one's probe is the same (only its place in the interval
        // moved), so it keeps running; the new one starts.
        let after = probes_for(&Config::parse(&svc(&two, 5)).unwrap());
        assert_eq!(after.len(), 2);
        assert!(after[0].same_as(&before[0]) && after[0] != before[0]);
        assert!(!after[1].same_as(&before[0]));
        // Other settings: another probe.
        let slower = probes_for(&Config::parse(&svc(one, 10)).unwrap());
        assert!(!slower[0].same_as(&before[0]));
    }

    #[test]
    fn thresholds_count_consecutive_results() {
        let s = spec(HealthProtocol::Tcp, 1);
        let mut v = Verdict::new(Some(true));
        assert_eq!(v.record(false, &s), None);
        assert_eq!(v.record(false, &s), None);
        assert_eq!(v.record(true, &s), None, "a success resets the failure streak");
        assert_eq!(v.record(false, &s), None);
        assert_eq!(v.record(false, &s), None);
        assert_eq!(v.record(false, &s), Some(false), "third failure in a row flips to unhealthy");
        assert_eq!(v.record(true, &s), None);
        assert_eq!(v.record(true, &s), Some(true), "second success in a row flips back");
    }

    /// A backend not yet checked gets its verdict from its first probe, whatever the
    /// thresholds; from then on they count.
    #[test]
    fn the_first_probe_gives_an_unchecked_backend_its_verdict() {
        let s = spec(HealthProtocol::Tcp, 1);
        let mut v = Verdict::new(None);
        assert_eq!(v.record(true, &s), Some(true), "one pass admits it");
        assert_eq!(v.record(false, &s), None);
        let mut v = Verdict::new(None);
        assert_eq!(v.record(false, &s), Some(false), "one failure: unhealthy, reported");
        assert_eq!(v.record(true, &s), None, "then healthy_threshold passes");
        assert_eq!(v.record(true, &s), Some(true));
    }

    /// A server that answers something else than HTTP fails an HTTP probe (hyper's parser
    /// replaced the hand-written status line parser).
    #[tokio::test]
    async fn a_non_http_answer_fails_an_http_probe() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                let _ = s.write_all(b"SSH-2.0-OpenSSH\r\n").await;
            }
        });
        let err = probe_once(addr, &spec(HealthProtocol::Http, addr.port())).await.unwrap_err();
        assert!(err.starts_with("receive:"), "{err}");
    }

    async fn http_server(status: u16) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let code = if req.starts_with("GET /healthz ") { status } else { 404 };
                    let _ = s.write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
                });
            }
        });
        addr
    }

    #[tokio::test]
    async fn tcp_probe_passes_on_listener_and_fails_on_closed_port() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(probe_once(addr, &spec(HealthProtocol::Tcp, addr.port())).await, Ok(()));
        drop(listener);
        let err = probe_once(addr, &spec(HealthProtocol::Tcp, addr.port())).await.unwrap_err();
        assert!(err.starts_with("connect:"), "{err}");
    }

    #[tokio::test]
    async fn http_probe_checks_path_and_status() {
        let ok = http_server(200).await;
        assert_eq!(probe_once(ok, &spec(HealthProtocol::Http, ok.port())).await, Ok(()));
        let bad = http_server(503).await;
        let err = probe_once(bad, &spec(HealthProtocol::Http, bad.port())).await.unwrap_err();
        assert_eq!(err, "HTTP status 503, expected 200");
        let mut wrong_path = spec(HealthProtocol::Http, ok.port());
        wrong_path.request_path = "/other".into();
        assert!(probe_once(ok, &wrong_path).await.is_err(), "404 on another path");
    }

    #[tokio::test]
    async fn checker_reports_only_changes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let task = spawn_checker(
            "web".into(),
            addr,
            spec(HealthProtocol::Tcp, addr.port()),
            Some(false),
            Spread { slot: 0, of: 1 },
            tx,
            7,
        );
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().unwrap();
        assert_eq!((ev.service.as_str(), ev.backend, ev.healthy), ("web", addr.ip(), true));
        drop(listener);
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().unwrap();
        assert!(!ev.healthy, "closed port turns the backend unhealthy: {ev:?}");
        assert!(ev.reason.starts_with("connect:"), "{}", ev.reason);
        task.abort();
    }

    /// Out of descriptors (EMFILE), a probe says nothing about the backend: reported as a
    /// local error, and the checker's verdict does not move however long it lasts.
    #[test]
    fn a_probe_failing_with_emfile_is_a_local_error_not_a_backend_failure() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        // The probes run in a child process, with a low descriptor limit all taken, so that no
        // other test of this binary runs out of descriptors.
        // SAFETY: the child only builds its own runtime and exits with _exit.
        match unsafe { libc::fork() } {
            0 => {
                let result = std::panic::catch_unwind(|| {
                    let low = libc::rlimit { rlim_cur: 64, rlim_max: 64 };
                    // SAFETY: lowers this (child) process's own limit.
                    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) }, 0);
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    rt.block_on(async {
                        let mut hold = Vec::new();
                        while let Ok(f) = std::fs::File::open("/dev/null") {
                            hold.push(f);
                        }
                        let checked = check(addr, &spec(HealthProtocol::Tcp, addr.port())).await;
                        let Checked::Local(e) = &checked else { panic!("{checked:?}") };
                        assert!(e.contains("local error") && e.contains("Too many open files"), "{e}");
                        let s = spec(HealthProtocol::Tcp, addr.port());
                        let (tx, mut rx) = mpsc::channel(8);
                        let task = spawn_checker("web".into(), addr, s, Some(true), Spread { slot: 0, of: 1 }, tx, 1);
                        tokio::time::sleep(Duration::from_millis(500)).await;
                        assert!(rx.try_recv().is_err(), "no verdict change from local errors");
                        task.abort();
                        let m = monitor(MonitorProtocol::Tcp, addr.port(), vec![(200, 200)]);
                        assert!(monitor_check(addr, &m).await.unwrap_err().contains("Too many open files"));
                    })
                });
                // SAFETY: ends the child without running the parent's destructors.
                unsafe { libc::_exit(if result.is_ok() { 0 } else { 1 }) }
            }
            pid => {
                let mut status = 0;
                // SAFETY: waits for the child forked above.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "the child's checks failed (status {status})"
                );
            }
        }
        drop(listener);
    }

    fn monitor(protocol: MonitorProtocol, port: u16, ranges: Vec<(u16, u16)>) -> MonitorSettings {
        MonitorSettings {
            protocol,
            port,
            path: Some("/healthz".into()),
            interval_sec: 10,
            timeout_sec: 5,
            tolerated_failures: 1,
            expected_status: ranges,
            custom_headers: vec![("X-Probe".into(), "tm".into())],
        }
    }

    /// Accepts connections on a loopback port and runs `serve` on each, in its own task.
    async fn spawn_server<F, Fut>(serve: F) -> SocketAddr
    where
        F: Fn(tokio::net::TcpStream) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (s, _) = listener.accept().await.unwrap();
                tokio::spawn(serve(s));
            }
        });
        addr
    }

    /// Serves `answer_probe` on plain TCP.
    async fn header_server(status: u16) -> SocketAddr {
        spawn_server(move |s| answer_probe(s, status)).await
    }

    #[tokio::test]
    async fn o5_monitor_http_status_ranges_and_headers() {
        let moved = header_server(301).await;
        let default_ranges = monitor(MonitorProtocol::Http, moved.port(), vec![(200, 200)]);
        let outcome = monitor_probe_once(moved, &default_ranges).await;
        assert_eq!(outcome, ProbeOutcome::HttpStatus(301), "the custom header was sent");
        assert!(!default_ranges.probe_succeeded(outcome), "301 fails with the default range");
        let wide = monitor(MonitorProtocol::Http, moved.port(), vec![(200, 399)]);
        assert!(wide.probe_succeeded(outcome), "301 passes with 200-399");
        let tcp = monitor(MonitorProtocol::Tcp, moved.port(), vec![(200, 200)]);
        assert_eq!(monitor_probe_once(moved, &tcp).await, ProbeOutcome::Connected);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = listener.local_addr().unwrap();
        drop(listener);
        assert_eq!(monitor_probe_once(closed, &tcp).await, ProbeOutcome::Failed);
    }

    /// Answers `status` to GET /healthz carrying the custom header, 404 otherwise.
    async fn answer_probe<S: AsyncRead + AsyncWrite + Unpin>(mut s: S, status: u16) {
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).await.unwrap_or(0);
        let req = String::from_utf8_lossy(&buf[..n]).to_string();
        let ok = req.starts_with("GET /healthz ") && req.contains("\r\nX-Probe: tm\r\n");
        let code = if ok { status } else { 404 };
        let _ = s.write_all(format!("HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n").as_bytes()).await;
        let _ = s.shutdown().await;
    }

    /// A TLS server side with a self-signed certificate (which probes accept, as Google Cloud's
    /// and Traffic Manager's do).
    fn tls_acceptor() -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(tls_acceptor_config())
    }

    fn tls_acceptor_config() -> std::sync::Arc<tokio_rustls::rustls::ServerConfig> {
        use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer};
        let cert = rcgen::generate_simple_self_signed(vec!["backend.test".into()]).unwrap();
        let key = PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        std::sync::Arc::new(config)
    }

    /// `header_server` behind TLS, with a self-signed certificate (which the probe accepts,
    /// as Traffic Manager does).
    async fn tls_header_server(status: u16) -> SocketAddr {
        let acceptor = tls_acceptor();
        spawn_server(move |s| {
            let acceptor = acceptor.clone();
            async move {
                if let Ok(s) = acceptor.accept(s).await {
                    answer_probe(s, status).await;
                }
            }
        })
        .await
    }

    #[tokio::test]
    async fn https_monitor_reads_the_status_over_tls() {
        let failing = tls_header_server(503).await;
        let https = monitor(MonitorProtocol::Https, failing.port(), vec![(200, 299)]);
        let outcome = monitor_probe_once(failing, &https).await;
        assert_eq!(outcome, ProbeOutcome::HttpStatus(503), "TLS handshake with a self-signed certificate, then GET");
        assert!(!https.probe_succeeded(outcome), "503 is outside 200-299: a failed probe");
        let fine = tls_header_server(200).await;
        let https = monitor(MonitorProtocol::Https, fine.port(), vec![(200, 299)]);
        assert!(https.probe_succeeded(monitor_probe_once(fine, &https).await));
        // A plain-HTTP server on the HTTPS port: the handshake fails, and so does the probe.
        let plain = header_server(200).await;
        let https = monitor(MonitorProtocol::Https, plain.port(), vec![(200, 299)]);
        assert_eq!(monitor_probe_once(plain, &https).await, ProbeOutcome::Failed);
    }

    /// A name endpoint's monitor (issue 34): its name as TLS SNI and HTTP Host, at each
    /// address (`policy::monitored_endpoints` puts the Host first; the prober takes SNI from it).
    #[tokio::test]
    async fn https_monitor_sends_the_host_as_sni() {
        let acceptor = tls_acceptor();
        let (tx, mut rx) = mpsc::channel::<(Option<String>, String)>(4);
        let addr = spawn_server(move |s| {
            let (acceptor, tx) = (acceptor.clone(), tx.clone());
            async move {
                let Ok(mut s) = acceptor.accept(s).await else { return };
                let sni = s.get_ref().1.server_name().map(str::to_owned);
                let mut buf = [0u8; 1024];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let _ = tx.send((sni, String::from_utf8_lossy(&buf[..n]).to_string())).await;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
                let _ = s.shutdown().await;
            }
        })
        .await;
        let mut https = monitor(MonitorProtocol::Https, addr.port(), vec![(200, 299)]);
        https.custom_headers.insert(0, ("Host".into(), "app.example.net".into()));
        assert!(https.probe_succeeded(monitor_probe_once(addr, &https).await));
        let (sni, request) = rx.recv().await.unwrap();
        assert_eq!(sni.as_deref(), Some("app.example.net"), "the name as SNI");
        assert!(request.to_ascii_lowercase().contains("\r\nhost: app.example.net\r\n"), "{request}");
    }

    #[tokio::test]
    async fn monitor_reports_online_then_degraded_after_tolerated_failures() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, mut rx) = mpsc::channel(8);
        let settings = monitor(MonitorProtocol::Tcp, addr.port(), vec![(200, 200)]);
        let task = spawn_monitor("tm".into(), addr, settings, None, Duration::from_millis(50), tx, 7);
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().unwrap();
        assert_eq!(
            (ev.service.as_str(), ev.backend, ev.healthy),
            ("tm", addr.ip(), true),
            "CheckingEndpoint -> Online"
        );
        drop(listener);
        let ev = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await.unwrap().unwrap();
        assert!(!ev.healthy, "Degraded on failure tolerated+1: {ev:?}");
        assert!(ev.reason.contains("Degraded"), "{}", ev.reason);
        task.abort();
    }

    /// A TCP server that answers every connection with `answer` once it has read a request.
    async fn talker(answer: &'static str) -> SocketAddr {
        spawn_server(move |mut s| async move {
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).await;
            let _ = s.write_all(answer.as_bytes()).await;
        })
        .await
    }

    /// The same behind TLS, with a self-signed certificate.
    async fn tls_talker(answer: &'static str) -> SocketAddr {
        let acceptor = tls_acceptor();
        spawn_server(move |s| {
            let acceptor = acceptor.clone();
            async move {
                if let Ok(mut s) = acceptor.accept(s).await {
                    let mut buf = [0u8; 512];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    let req = String::from_utf8_lossy(&buf[..n]).to_string();
                    let reply = if req.starts_with("GET ") {
                        format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}", answer.len())
                    } else {
                        answer.to_string()
                    };
                    let _ = s.write_all(reply.as_bytes()).await;
                    let _ = s.shutdown().await;
                }
            }
        })
        .await
    }

    fn with(protocol: HealthProtocol, port: u16, request: Option<&str>, response: Option<&str>) -> ProbeSpec {
        ProbeSpec {
            request: request.map(str::to_owned),
            response: response.map(str::to_owned),
            request_path: "/".into(),
            ..spec(protocol, port)
        }
    }

    #[tokio::test]
    async fn tcp_request_and_response_prefix() {
        let pong = talker("PONG ready").await;
        let nope = talker("NOPE").await;
        let ping = |a: SocketAddr| with(HealthProtocol::Tcp, a.port(), Some("PING\n"), Some("PONG"));
        assert_eq!(probe_once(pong, &ping(pong)).await, Ok(()));
        let err = probe_once(nope, &ping(nope)).await.unwrap_err();
        assert!(err.contains("does not start with \"PONG\""), "{err}");
    }

    /// A server behind a PROXY-protocol proxy: it answers only after a valid v1 line naming the
    /// connection's own addresses.
    async fn proxied(answer: &'static str) -> SocketAddr {
        spawn_server(move |mut s| async move {
            let (local, peer) = (s.local_addr().unwrap(), s.peer_addr().unwrap());
            let want = format!("PROXY TCP4 {} {} {} {}\r\n", peer.ip(), local.ip(), peer.port(), local.port());
            let mut buf = [0u8; 128];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let reply = if buf[..n].starts_with(want.as_bytes()) { answer } else { "NO PROXY LINE" };
            let _ = s.write_all(reply.as_bytes()).await;
        })
        .await
    }

    #[tokio::test]
    async fn proxy_v1_sends_the_proxy_line_first() {
        let server = proxied("OK").await;
        let spec = |proxy_header| ProbeSpec {
            proxy_header,
            ..with(HealthProtocol::Tcp, server.port(), Some("PING\n"), Some("OK"))
        };
        assert_eq!(probe_once(server, &spec(true)).await, Ok(()));
        let err = probe_once(server, &spec(false)).await.unwrap_err();
        assert!(err.contains("NO PROXY LINE"), "{err}");
    }

    /// An HTTP/2 server over TLS (ALPN h2 only), hyper's: `status` and `body` for every request
    /// to `/healthz` with the authority `backend.test`, 404 otherwise.
    async fn h2_server(status: u16, body: &'static str) -> SocketAddr {
        use http_body_util::Full;
        use hyper::body::Bytes;
        let mut config = (*tls_acceptor_config()).clone();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        spawn_server(move |s| {
            let acceptor = acceptor.clone();
            async move {
                let Ok(tls) = acceptor.accept(s).await else { return };
                let service =
                    hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| async move {
                        let right = req.uri().path() == "/healthz"
                            && req.uri().authority().map(|a| a.as_str()) == Some("backend.test");
                        let code = if right { status } else { 404 };
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder().status(code).body(Full::new(Bytes::from(body))).unwrap(),
                        )
                    });
                let _ = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
            }
        })
        .await
    }

    #[tokio::test]
    async fn http2_probe_speaks_http2_over_tls() {
        let spec = |port: u16| ProbeSpec {
            request_path: "/healthz".into(),
            host: Some("backend.test".into()),
            ..with(HealthProtocol::Http2, port, None, Some("SERVING"))
        };
        let up = h2_server(200, "SERVING").await;
        assert_eq!(probe_once(up, &spec(up.port())).await, Ok(()));
        let down = h2_server(200, "NOT_SERVING").await;
        let err = probe_once(down, &spec(down.port())).await.unwrap_err();
        assert!(err.contains("does not start with \"SERVING\""), "{err}");
        let failing = h2_server(503, "SERVING").await;
        let err = probe_once(failing, &spec(failing.port())).await.unwrap_err();
        assert!(err.contains("503"), "{err}");
        // An HTTPS server without HTTP/2: the handshake does not give h2.
        let h1 = tls_talker("SERVING").await;
        let err = probe_once(h1, &spec(h1.port())).await.unwrap_err();
        assert!(err.contains("did not choose HTTP/2"), "{err}");
    }

    /// Slow and malicious backends cost only their own verdicts: one that accepts and never
    /// answers, one that answers an endless stream of headers (10 MB offered), one whose TLS
    /// handshake stalls. Probed at once with a healthy one, each bad one fails within its
    /// timeout (the endless headers fail at hyper's header limit, reading far less than 10 MB)
    /// while the healthy one passes.
    #[tokio::test]
    async fn slow_and_malicious_backends_fail_alone() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let silent = spawn_server(|s| async move {
            tokio::time::sleep(Duration::from_secs(30)).await;
            drop(s);
        })
        .await;
        static SENT: AtomicUsize = AtomicUsize::new(0);
        let flood = spawn_server(|mut s| async move {
            let _ = s.write_all(b"HTTP/1.1 200 OK\r\n").await;
            let line = format!("X-Filler: {}\r\n", "a".repeat(1000));
            for _ in 0..10_000 {
                if s.write_all(line.as_bytes()).await.is_err() {
                    return;
                }
                SENT.fetch_add(line.len(), Ordering::Relaxed);
            }
        })
        .await;
        let stalled_tls = spawn_server(|mut s| async move {
            // Reads the ClientHello and never answers it.
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        })
        .await;
        let good = http_server(200).await;
        let timeout = Duration::from_secs(2);
        let spec = |protocol, addr: SocketAddr| ProbeSpec { timeout, ..spec(protocol, addr.port()) };
        let specs = [
            spec(HealthProtocol::Http, silent),
            spec(HealthProtocol::Http, flood),
            spec(HealthProtocol::Https, stalled_tls),
            spec(HealthProtocol::Http, good),
        ];
        let (silent_r, flood_r, tls_r, good_r) = tokio::join!(
            probe_once(silent, &specs[0]),
            probe_once(flood, &specs[1]),
            probe_once(stalled_tls, &specs[2]),
            probe_once(good, &specs[3]),
        );
        assert_eq!(good_r, Ok(()), "the healthy backend keeps its verdict");
        assert!(silent_r.unwrap_err().contains("timeout"));
        assert!(tls_r.unwrap_err().contains("timeout"));
        let flood_err = flood_r.unwrap_err();
        assert!(flood_err.contains("receive") || flood_err.contains("timeout"), "{flood_err}");
        // The probe stopped reading: the flood could not send all it offered (the socket
        // buffers hold a few MB at most).
        assert!(SENT.load(Ordering::Relaxed) < 10_000_000, "the probe read the whole 10 MB");
    }

    #[tokio::test]
    async fn ssl_probe_needs_a_tls_handshake_and_the_response() {
        let tls = tls_talker("+OK").await;
        assert_eq!(
            probe_once(tls, &with(HealthProtocol::Ssl, tls.port(), Some("HELLO\r\n"), Some("+OK"))).await,
            Ok(())
        );
        assert_eq!(probe_once(tls, &with(HealthProtocol::Ssl, tls.port(), None, None)).await, Ok(()), "handshake only");
        let wrong = probe_once(tls, &with(HealthProtocol::Ssl, tls.port(), Some("HELLO\r\n"), Some("-ERR"))).await;
        assert!(wrong.unwrap_err().contains("does not start with"));
        // A plain server on the SSL port: the handshake fails.
        let plain = talker("+OK").await;
        let err = probe_once(plain, &with(HealthProtocol::Ssl, plain.port(), None, None)).await.unwrap_err();
        assert!(err.starts_with("TLS handshake"), "{err}");
    }

    #[tokio::test]
    async fn https_probe_reads_status_and_body_prefix() {
        let up = tls_talker("SERVING").await;
        assert_eq!(probe_once(up, &with(HealthProtocol::Https, up.port(), None, Some("SERVING"))).await, Ok(()));
        let down = tls_talker("NOT_SERVING").await;
        let err = probe_once(down, &with(HealthProtocol::Https, down.port(), None, Some("SERVING"))).await.unwrap_err();
        assert!(err.contains("does not start with \"SERVING\""), "{err}");
        // Plain HTTP on the port: the TLS handshake fails.
        let plain = http_server(200).await;
        let err = probe_once(plain, &with(HealthProtocol::Https, plain.port(), None, None)).await.unwrap_err();
        assert!(err.starts_with("TLS handshake"), "{err}");
    }
}
