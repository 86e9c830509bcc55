//! Prometheus metrics (`[metrics] listen`, off by default): `GET /metrics` over HTTP/1.
//!
//! Two sources. The data plane's counters (the `STATS` record, per (service, client class),
//! per backend), health states and connection-table occupancy are read at each scrape: the
//! HTTP task asks the daemon's loop for a [`Snapshot`], so the loop stays the only owner of
//! the data plane. Events the daemon sees (health changes, reloads, table swaps, DNS answers)
//! are counted as they happen in [`Metrics`], which the HTTP and DNS tasks share.
//!
//! Names follow Prometheus conventions: `lb_` prefix, a unit suffix (`_packets`, `_bytes`),
//! counters end in `_total`, labels `service`, `zone`, `backend`, `reason`; every metric has a
//! HELP text saying what it counts (`promtool check metrics` passes, tested). The `STATS`
//! counters are exported as `daemon::exported` says: drops, passes and voided entries as one
//! family each with non-overlapping reasons, the others as metrics of their own.

use super::exported::{self, Export, FAMILIES};
use crate::compile::CompiledService;
use crate::config::Config;
use crate::controller::Controller;
use crate::dataplane::Dataplane;
use anyhow::Result;
use http_body_util::Full;
use hyper::body::Bytes;
use lb_common::maps::{stat, BackendCounters, FAMILY_V4};
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinHandle;

type Labels = Vec<(&'static str, String)>;
/// A metric made from one field of each sample: (name, help, the field).
type Field<T> = (&'static str, &'static str, fn(&T) -> u64);

/// Connection-table buckets read per family and scrape (see [`Dataplane::conntrack_occupancy`]).
pub const OCCUPANCY_SAMPLE_BUCKETS: u32 = 4096;
/// Scrapes served at once; more connections wait for a slot.
const MAX_CONNECTIONS: usize = 16;
/// A scrape whose snapshot the daemon's loop has not delivered by then gets a 503.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(5);

/// Counters of the events the daemon sees; clones share the counts.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    health_changes: Family<Labels, Counter>,
    reloads: Family<Labels, Counter>,
    table_swaps: Counter,
    dns_answers: Family<Labels, Counter>,
    name_resolutions: Family<Labels, Counter>,
}

impl Metrics {
    /// A health check turned `backend` of `service` healthy or unhealthy.
    pub fn health_change(&self, service: &str, backend: std::net::IpAddr, healthy: bool) {
        let to = if healthy { "healthy" } else { "unhealthy" };
        self.health_changes
            .get_or_create(&vec![
                ("service", service.to_owned()),
                ("backend", backend.to_string()),
                ("to", to.to_owned()),
            ])
            .inc();
    }

    /// The daemon resolved the name of endpoints given by DNS name, or failed to.
    pub fn name_resolution(&self, name: &str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.name_resolutions.get_or_create(&vec![("name", name.to_owned()), ("result", result.to_owned())]).inc();
    }

    /// A reload (SIGHUP or `lb reload`) was applied or refused.
    pub fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.reloads.get_or_create(&vec![("result", result.to_owned())]).inc();
    }

    /// `n` Maglev tables were written and flipped to.
    pub fn tables_swapped(&self, n: usize) {
        self.table_swaps.inc_by(n as u64);
    }

    /// The DNS front sent `message` (a DNS message: its header's RCODE is counted).
    pub fn dns_answer(&self, message: &[u8]) {
        let Some(&flags) = message.get(3) else { return };
        self.dns_answers.get_or_create(&vec![("rcode", rcode_name(flags & 0x0f))]).inc();
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "backend_health_changes",
            "Health verdict changes reported by the health checks (first verdicts included), by new state",
            self.health_changes.clone(),
        );
        r.register(
            "reloads",
            "Configuration reloads (SIGHUP or lb reload), by result: applied or refused",
            self.reloads.clone(),
        );
        r.register(
            "table_swaps",
            "Maglev tables written into a free slot and made active (one TABLE_INDEX flip each)",
            self.table_swaps.clone(),
        );
        r.register("dns_answers", "Answers of the DNS front, by response code", self.dns_answers.clone());
        r.register(
            "name_resolutions",
            "Resolutions of the endpoints given by DNS name, by name and result: ok or failed",
            self.name_resolutions.clone(),
        );
    }
}

/// The RFC 1035/6895 mnemonic of a header RCODE.
fn rcode_name(rcode: u8) -> String {
    match rcode {
        0 => "NOERROR".into(),
        1 => "FORMERR".into(),
        2 => "SERVFAIL".into(),
        3 => "NXDOMAIN".into(),
        4 => "NOTIMP".into(),
        5 => "REFUSED".into(),
        n => n.to_string(),
    }
}

/// What the data plane and the controller hold at one scrape.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Snapshot {
    /// The `STATS` counters, indexed like `stat::NAMES`.
    pub global: Vec<u64>,
    pub classes: Vec<ClassSample>,
    pub backends: Vec<BackendSample>,
    pub conntrack: Vec<ConntrackSample>,
    /// Each `--interface` and whether the program is attached to it.
    pub links: Vec<LinkSample>,
    /// The VIPs announced now; None without `[announce]`.
    pub announced: Option<Vec<std::net::IpAddr>>,
    /// Failures the daemon survived, by name (`daemon::faults`).
    pub faults: Vec<(String, u64)>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct LinkSample {
    pub interface: String,
    pub attached: bool,
}

impl Snapshot {
    /// Adds what the daemon's status says of its interfaces and announcement.
    pub fn with_status(mut self, st: &super::reply::Status) -> Self {
        self.links = st
            .links
            .iter()
            .map(|l| LinkSample { interface: l.interface.clone(), attached: l.state == "attached" })
            .collect();
        self.announced = st.announce.as_ref().map(|a| a.announced.clone());
        self.faults = st.faults.0.clone();
        self
    }
}

/// Counters of one (service, client class).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassSample {
    pub service: String,
    /// The client zone's name; empty for class 0 and Traffic Manager classes.
    pub zone: String,
    pub class: u32,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub spills: u64,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct BackendSample {
    pub service: String,
    pub backend: String,
    /// The backend's zone; empty without one.
    pub zone: String,
    pub healthy: bool,
    /// Health-checked and without a verdict yet.
    pub unchecked: bool,
    pub counters: BackendCounters,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ConntrackSample {
    pub family: &'static str,
    pub live: u64,
    pub slots: u64,
}

/// The zone a client class of `svc` stands for: None for class 0 and for a Traffic Manager
/// service's classes (its routing method's, not zones).
pub fn class_zone(cfg: &Config, svc: &CompiledService, class: u32) -> Option<String> {
    if class == 0 || svc.plan.traffic_manager().is_some() {
        return None;
    }
    cfg.zones.get(class as usize - 1).map(|z| z.name.clone())
}

/// Reads the counters, health states and connection-table occupancy.
pub fn snapshot(ctl: &Controller, dp: &Dataplane) -> Result<Snapshot> {
    let st = dp.stats()?;
    let cfg = ctl.config();
    let mut snap = Snapshot { global: st.global.clone(), ..Default::default() };
    super::probe_path::add_counters(&mut snap.global);
    for s in ctl.applied().map(|a| a.services.as_slice()).unwrap_or_default() {
        for t in &s.tables {
            let c = st.class(s.id, t.class);
            snap.classes.push(ClassSample {
                service: s.name.clone(),
                zone: class_zone(cfg, s, t.class).unwrap_or_default(),
                class: t.class,
                packets: c.packets,
                bytes: c.bytes,
                new_flows: c.new_flows,
                spills: c.spills,
            });
        }
        let Some(svc) = cfg.services.iter().find(|c| c.name == s.name) else { continue };
        for ((&id, &addr), b) in s.backend_ids.iter().zip(&s.backend_addrs).zip(&svc.backends) {
            snap.backends.push(BackendSample {
                service: s.name.clone(),
                backend: addr.to_string(),
                zone: b.zone().unwrap_or_default().to_owned(),
                healthy: ctl.healthy(&s.name, addr),
                unchecked: ctl.unchecked(&s.name, addr),
                counters: dp.backend_stats(id)?,
            });
        }
    }
    for (family, live, slots) in dp.conntrack_occupancy(OCCUPANCY_SAMPLE_BUCKETS) {
        snap.conntrack.push(ConntrackSample { family: if family == FAMILY_V4 { "ipv4" } else { "ipv6" }, live, slots });
    }
    Ok(snap)
}

fn counter(value: u64) -> Counter {
    let c = Counter::default();
    c.inc_by(value);
    c
}

/// A counter family with one series per `(labels, value)`.
fn counters(samples: impl IntoIterator<Item = (Labels, u64)>) -> Family<Labels, Counter> {
    let f = Family::<Labels, Counter>::default();
    for (labels, v) in samples {
        f.get_or_create(&labels).inc_by(v);
    }
    f
}

fn gauge(value: u64) -> Gauge {
    let g = Gauge::default();
    g.set(value as i64);
    g
}

fn gauges(samples: impl IntoIterator<Item = (Labels, u64)>) -> Family<Labels, Gauge> {
    let f = Family::<Labels, Gauge>::default();
    for (labels, v) in samples {
        f.get_or_create(&labels).set(v as i64);
    }
    f
}

/// The exposition (OpenMetrics text) of `snap` and `events`.
pub fn render(snap: &Snapshot, events: &Metrics) -> String {
    let mut r = Registry::with_prefix("lb");
    // The data plane's counters (summed over CPUs): reasons of a few families, else metrics of
    // their own (`exported`).
    let families: Vec<Family<Labels, Counter>> = FAMILIES.iter().map(|_| Family::default()).collect();
    for (i, name) in stat::NAMES.iter().enumerate() {
        let value = exported::exported_value(&stat::NAMES, &snap.global, i);
        match exported::export(name) {
            Some(Export::Reason { family, reason }) => {
                families[family].get_or_create(&vec![("reason", reason.to_owned())]).inc_by(value);
            }
            Some(Export::Own { name, help }) => r.register(name, help, counter(value)),
            None => r.register(*name, format!("Data-plane counter {name} (lb stats)"), counter(value)),
        }
    }
    for ((name, help, _), family) in FAMILIES.iter().zip(families) {
        r.register(*name, *help, family);
    }
    r.register(
        "build_info",
        "1, labelled with the lb release, the commit it was built from and its eBPF object's SHA-256",
        gauges([(
            vec![
                ("version", env!("CARGO_PKG_VERSION").to_owned()),
                ("commit", env!("LB_GIT_COMMIT").to_owned()),
                ("ebpf_sha256", env!("LB_EBPF_SHA256").to_owned()),
            ],
            1,
        )]),
    );
    r.register(
        "daemon_faults",
        "Failures the daemon survived, by fault (lb status lists them; the log says each): a state file moved aside, a state save that failed, control connections refused or evicted, the control socket bound again",
        counters(snap.faults.iter().map(|(name, n)| (vec![("fault", name.clone())], *n))),
    );
    r.register(
        "interface_attached",
        "1 if the balancer's XDP program is attached to the interface (a --interface of lb run), else 0",
        gauges(snap.links.iter().map(|l| (vec![("interface", l.interface.clone())], l.attached as u64))),
    );
    if let Some(vips) = &snap.announced {
        r.register("announced_vips", "VIPs this balancer announces now ([announce])", gauge(vips.len() as u64));
        r.register(
            "vip_announced",
            "1 for each VIP this balancer announces now ([announce])",
            gauges(vips.iter().map(|v| (vec![("vip", v.to_string())], 1))),
        );
    }
    let class_labels = |c: &ClassSample| {
        vec![("service", c.service.clone()), ("zone", c.zone.clone()), ("class", c.class.to_string())]
    };
    let per_class: [Field<ClassSample>; 4] = [
        ("class_packets", "Packets forwarded, by service and client class (zone: the client zone)", |c| c.packets),
        ("class_bytes", "Bytes forwarded (whole frames), by service and client class", |c| c.bytes),
        ("class_new_flows", "New flows (backend selections), by service and client class", |c| c.new_flows),
        ("class_cross_zone_spills", "New flows of a client zone sent to a backend of another zone", |c| c.spills),
    ];
    for (name, help, value) in per_class {
        r.register(name, help, counters(snap.classes.iter().map(|c| (class_labels(c), value(c)))));
    }
    let backend_labels = |b: &BackendSample| {
        vec![("service", b.service.clone()), ("backend", b.backend.clone()), ("zone", b.zone.clone())]
    };
    let per_backend: [Field<BackendCounters>; 3] = [
        ("backend_packets", "Packets forwarded to the backend (zone: the backend's)", |c| c.packets),
        ("backend_bytes", "Bytes forwarded to the backend (whole frames as received)", |c| c.bytes),
        ("backend_new_flows", "New flows that chose the backend", |c| c.new_flows),
    ];
    for (name, help, value) in per_backend {
        r.register(name, help, counters(snap.backends.iter().map(|b| (backend_labels(b), value(&b.counters)))));
    }
    r.register(
        "backend_healthy",
        "1 if the backend counts as healthy (health checks, or the operator's override), else 0",
        gauges(snap.backends.iter().map(|b| (backend_labels(b), b.healthy as u64))),
    );
    r.register(
        "backend_unchecked",
        "1 while the backend waits for its first health-check verdict (no new connections meanwhile), else 0",
        gauges(snap.backends.iter().map(|b| (backend_labels(b), b.unchecked as u64))),
    );
    let family = |c: &ConntrackSample| vec![("family", c.family.to_owned())];
    r.register(
        "conntrack_live_slots",
        format!(
            "Live connection-table slots, read at each scrape: exact for a table of at most {OCCUPANCY_SAMPLE_BUCKETS} buckets, \
             else estimated from {OCCUPANCY_SAMPLE_BUCKETS} buckets spread evenly over it"
        ),
        gauges(snap.conntrack.iter().map(|c| (family(c), c.live))),
    );
    r.register(
        "conntrack_slots",
        "Slots of the connection table",
        gauges(snap.conntrack.iter().map(|c| (family(c), c.slots))),
    );
    let ratio = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    for c in &snap.conntrack {
        ratio.get_or_create(&family(c)).set(if c.slots == 0 { 0.0 } else { c.live as f64 / c.slots as f64 });
    }
    r.register("conntrack_occupancy_ratio", "Live connection-table slots over all slots (0 to 1)", ratio);
    events.register(&mut r);
    let mut out = String::new();
    encode(&mut out, &r).expect("writing into a String cannot fail");
    out
}

/// The Prometheus text format (0.0.4) of an OpenMetrics exposition: a counter's HELP and TYPE
/// name its `_total` series, and there is no `# EOF` or `# UNIT`.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|tag| {
            let rest = line.strip_prefix(tag)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{tag}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// `promtool check metrics` on `text` (the classic format): Err with what it said.
#[cfg(any(test, feature = "test-helpers"))]
pub fn promtool_check(text: &str) -> std::result::Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting promtool (Debian package prometheus; cargo xtask setup installs it): {e}"))?;
    child.stdin.take().expect("piped").write_all(text.as_bytes()).map_err(|e| e.to_string())?;
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    let said = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(said)
    }
}

/// A scrape's request to the daemon's loop: reply with a snapshot (or why there is none).
pub type SnapshotRequest = oneshot::Sender<std::result::Result<Snapshot, String>>;

/// Binds `listen` (errors surface here) and serves `GET /metrics` until the task is aborted.
/// Returns the bound address (useful with port 0) and the task.
pub async fn serve(
    listen: SocketAddr,
    events: Metrics,
    snapshots: mpsc::Sender<SnapshotRequest>,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let listener = TcpListener::bind(listen).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let slots = std::sync::Arc::new(Semaphore::new(MAX_CONNECTIONS));
        loop {
            let Ok(permit) = slots.clone().acquire_owned().await else { return };
            let Ok((stream, _)) = listener.accept().await else {
                // Out of descriptors or the like: wait instead of spinning.
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            };
            let (events, snapshots) = (events.clone(), snapshots.clone());
            tokio::spawn(async move {
                let _held = permit;
                let service = hyper::service::service_fn(move |req| {
                    let (events, snapshots) = (events.clone(), snapshots.clone());
                    async move { Ok::<_, std::convert::Infallible>(respond(req, &events, &snapshots).await) }
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
                let _ = tokio::time::timeout(Duration::from_secs(60), conn).await;
            });
        }
    });
    Ok((bound, task))
}

async fn respond<B>(
    req: hyper::Request<B>,
    events: &Metrics,
    snapshots: &mpsc::Sender<SnapshotRequest>,
) -> hyper::Response<Full<Bytes>> {
    let reply = |status: u16, content_type: &str, body: String| {
        hyper::Response::builder()
            .status(status)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .expect("a valid response")
    };
    let openmetrics = req
        .headers()
        .get_all(hyper::header::ACCEPT)
        .iter()
        .any(|v| v.to_str().is_ok_and(|v| v.contains("application/openmetrics-text")));
    if req.uri().path() != "/metrics" {
        return reply(404, "text/plain", "not found; metrics are at /metrics\n".into());
    }
    if req.method() != hyper::Method::GET && req.method() != hyper::Method::HEAD {
        return reply(405, "text/plain", "only GET\n".into());
    }
    let (tx, rx) = oneshot::channel();
    let snap = match snapshots.send(tx).await {
        Ok(()) => tokio::time::timeout(SNAPSHOT_TIMEOUT, rx).await,
        Err(_) => return reply(503, "text/plain", "the daemon is shutting down\n".into()),
    };
    match snap {
        // Prometheus asks for OpenMetrics; other clients (curl, promtool) get the classic text.
        Ok(Ok(Ok(snap))) if openmetrics => {
            reply(200, "application/openmetrics-text; version=1.0.0; charset=utf-8", render(&snap, events))
        }
        Ok(Ok(Ok(snap))) => {
            reply(200, "text/plain; version=0.0.4; charset=utf-8", classic_text(&render(&snap, events)))
        }
        Ok(Ok(Err(e))) => reply(503, "text/plain", format!("reading the data plane: {e}\n")),
        _ => reply(503, "text/plain", "the daemon did not answer in time\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Snapshot {
        let mut global = vec![0; stat::NAMES.len()];
        global[stat::RX_PACKETS as usize] = 7;
        global[stat::NEW_FLOW as usize] = 3;
        Snapshot {
            global,
            classes: vec![ClassSample {
                service: "web".into(),
                zone: "zone-2".into(),
                class: 2,
                packets: 5,
                bytes: 500,
                new_flows: 2,
                spills: 1,
            }],
            backends: vec![BackendSample {
                service: "web".into(),
                backend: "198.18.11.1".into(),
                zone: "zone-1".into(),
                healthy: true,
                unchecked: false,
                counters: BackendCounters { packets: 4, bytes: 400, new_flows: 2 },
            }],
            conntrack: vec![ConntrackSample { family: "ipv4", live: 9, slots: 64 }],
            ..Snapshot::default()
        }
    }

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
    }

    #[test]
    fn data_plane_counters_are_exported_once_each_without_overlap() {
        let mut snap = sample();
        let at = |name: &str| stat::NAMES.iter().position(|n| *n == name).unwrap();
        snap.global[at("drop_fib")] = 10;
        snap.global[at("drop_no_neigh")] = 4;
        snap.global[at("drop_too_big")] = 3;
        snap.global[at("drop_too_big_no_df")] = 3;
        snap.global[at("pass_not_our_mac")] = 2;
        snap.global[at("ct_expired")] = 5;
        snap.global[at("tx")] = 6;
        let text = render(&snap, &Metrics::default());
        has(&text, "lb_rx_packets_total 7");
        has(&text, "lb_new_flows_total 3");
        has(&text, "lb_tx_packets_total 6");
        has(&text, r#"lb_dropped_packets_total{reason="fib"} 6"#);
        has(&text, r#"lb_dropped_packets_total{reason="no_neigh"} 4"#);
        has(&text, r#"lb_dropped_packets_total{reason="too_big"} 0"#);
        has(&text, r#"lb_dropped_packets_total{reason="too_big_no_df"} 3"#);
        has(&text, r#"lb_passed_packets_total{reason="not_our_mac"} 2"#);
        has(&text, r#"lb_conntrack_voided_entries_total{reason="idle"} 5"#);
        // The drops sum to the packets dropped, each once.
        let dropped: u64 = text
            .lines()
            .filter(|l| l.starts_with("lb_dropped_packets_total{"))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(dropped, 13, "{text}");
        // No counter is exported under its raw name any more.
        assert!(!text.contains("lb_drop_fib"), "{text}");
    }

    #[test]
    fn build_interfaces_announcement_and_occupancy_gauges() {
        let mut snap = sample();
        snap.links = vec![
            LinkSample { interface: "eth0".into(), attached: true },
            LinkSample { interface: "eth1".into(), attached: false },
        ];
        snap.announced = Some(vec!["198.18.0.100".parse().unwrap()]);
        let text = render(&snap, &Metrics::default());
        assert!(
            text.lines()
                .any(|l| l.starts_with("lb_build_info{version=\"") && l.contains("ebpf_sha256=") && l.ends_with(" 1")),
            "{text}"
        );
        has(&text, r#"lb_interface_attached{interface="eth0"} 1"#);
        has(&text, r#"lb_interface_attached{interface="eth1"} 0"#);
        has(&text, "lb_announced_vips 1");
        let mut snap = sample();
        snap.faults = vec![("state_save_failed".into(), 2)];
        has(&render(&snap, &Metrics::default()), r#"lb_daemon_faults_total{fault="state_save_failed"} 2"#);
        has(&text, r#"lb_vip_announced{vip="198.18.0.100"} 1"#);
        has(&text, r#"lb_conntrack_occupancy_ratio{family="ipv4"} 0.140625"#);
        // Without [announce], no announcement series.
        assert!(!render(&sample(), &Metrics::default()).contains("lb_announced_vips"));
    }

    /// Every kind of series once: a sample with links, an announcement and counted events, in
    /// the classic text format.
    fn full_exposition() -> String {
        let mut snap = sample();
        snap.links = vec![LinkSample { interface: "eth0".into(), attached: true }];
        snap.announced = Some(vec![]);
        let m = Metrics::default();
        m.reload(true);
        m.health_change("web", "198.18.11.1".parse().unwrap(), true);
        m.dns_answer(&[0, 0, 0x81, 0x80]);
        classic_text(&render(&snap, &m))
    }

    /// The exposition passes Prometheus's own linter (Debian's `prometheus` package, which
    /// `cargo xtask setup` installs, ships promtool).
    #[test]
    fn promtool_check_metrics_passes() {
        let text = full_exposition();
        if let Err(said) = promtool_check(&text) {
            panic!("promtool: {said}\n{text}");
        }
    }

    #[test]
    fn class_backend_and_conntrack_series_carry_their_labels() {
        let text = render(&sample(), &Metrics::default());
        has(&text, r#"lb_class_packets_total{service="web",zone="zone-2",class="2"} 5"#);
        has(&text, r#"lb_class_cross_zone_spills_total{service="web",zone="zone-2",class="2"} 1"#);
        has(&text, r#"lb_backend_bytes_total{service="web",backend="198.18.11.1",zone="zone-1"} 400"#);
        has(&text, r#"lb_backend_new_flows_total{service="web",backend="198.18.11.1",zone="zone-1"} 2"#);
        has(&text, r#"lb_backend_healthy{service="web",backend="198.18.11.1",zone="zone-1"} 1"#);
        has(&text, r#"lb_backend_unchecked{service="web",backend="198.18.11.1",zone="zone-1"} 0"#);
        has(&text, r#"lb_conntrack_live_slots{family="ipv4"} 9"#);
        has(&text, r#"lb_conntrack_slots{family="ipv4"} 64"#);
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn events_are_counted_by_their_labels() {
        let m = Metrics::default();
        m.health_change("web", "198.18.11.1".parse().unwrap(), false);
        m.health_change("web", "198.18.11.1".parse().unwrap(), false);
        m.reload(true);
        m.reload(false);
        m.tables_swapped(3);
        // Header bytes 2..4: QR, then RCODE in the low nibble of byte 3.
        m.dns_answer(&[0x12, 0x34, 0x81, 0x83]);
        m.dns_answer(&[0x12, 0x34, 0x81, 0x80]);
        m.dns_answer(&[0x12]);
        let text = render(&Snapshot::default(), &m.clone());
        has(&text, r#"lb_backend_health_changes_total{service="web",backend="198.18.11.1",to="unhealthy"} 2"#);
        has(&text, r#"lb_reloads_total{result="applied"} 1"#);
        has(&text, r#"lb_reloads_total{result="refused"} 1"#);
        has(&text, "lb_table_swaps_total 3");
        has(&text, r#"lb_dns_answers_total{rcode="NXDOMAIN"} 1"#);
        has(&text, r#"lb_dns_answers_total{rcode="NOERROR"} 1"#);
    }

    /// The shipped Grafana dashboard queries only metrics the daemon exports (a rename breaks
    /// this test, not the operator's dashboard), and every graph panel states its unit.
    #[test]
    fn the_dashboard_uses_exported_metrics_with_units() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../../packaging/grafana/lb-zonal-spill.json")).unwrap();
        let exposition = full_exposition();
        let exported: std::collections::HashSet<&str> =
            exposition.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
        for panel in dashboard["panels"].as_array().unwrap() {
            if panel["type"] == "row" {
                continue;
            }
            assert!(panel["fieldConfig"]["defaults"]["unit"].is_string(), "panel {} has no unit", panel["title"]);
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let names =
                    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("lb_"));
                for name in names {
                    assert!(exported.contains(name), "panel {}: {name} is not exported", panel["title"]);
                }
            }
        }
    }

    #[tokio::test]
    async fn serves_metrics_over_http_and_404_elsewhere() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (tx, mut rx) = mpsc::channel::<SnapshotRequest>(4);
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), Metrics::default(), tx).await.unwrap();
        tokio::spawn(async move {
            while let Some(reply) = rx.recv().await {
                let _ = reply.send(Ok(sample()));
            }
        });
        let get = |path: &'static str, accept: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{accept}Connection: close\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        // As Prometheus asks: OpenMetrics.
        let ok = get("/metrics", "Accept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("lb_rx_packets_total 7") && ok.contains("\n# TYPE lb_rx_packets counter"), "{ok}");
        assert!(ok.to_ascii_lowercase().contains("content-type: application/openmetrics-text"), "{ok}");
        // Without: the classic text format.
        let plain = get("/metrics", "").await;
        assert!(plain.contains("\n# TYPE lb_rx_packets_total counter") && !plain.contains("# EOF"), "{plain}");
        assert!(plain.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{plain}");
        assert!(get("/", "").await.starts_with("HTTP/1.1 404"));
        task.abort();
    }
}
