//! Prometheus metrics (`[metrics] listen`, off by default): `GET /metrics` over HTTP/1.
//!
//! Two sources. The data plane's counters (the `STATS` record, per (service, client class),
//! per backend), health states and connection-table occupancy are read at each scrape: the
//! HTTP task asks the daemon's loop for a [`Snapshot`], so the loop stays the only owner of
//! the data plane. Events the daemon sees (health changes, reloads, table swaps, DNS answers)
//! are counted as they happen in [`Metrics`], which the HTTP and DNS tasks share.
//!
//! Names follow Prometheus conventions: `lb_` prefix, counters end in `_total`, labels
//! `service`, `zone`, `backend`. Every `STATS` counter is exported as `lb_<name>_total`,
//! generated from `lb_common::maps::stat::NAMES`, so new counters appear without a change here.

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
    if class == 0 || svc.tm.is_some() {
        return None;
    }
    cfg.zones.get(class as usize - 1).map(|z| z.name.clone())
}

/// Reads the counters, health states and connection-table occupancy.
pub fn snapshot(ctl: &Controller, dp: &Dataplane) -> Result<Snapshot> {
    let st = dp.stats()?;
    let cfg = ctl.config();
    let mut snap = Snapshot { global: st.global.clone(), ..Default::default() };
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
                zone: b.zone.clone().unwrap_or_default(),
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
    for (i, name) in stat::NAMES.iter().enumerate() {
        let help = format!("Data-plane counter {name} (lb stats), summed over CPUs");
        r.register(*name, help, counter(snap.global.get(i).copied().unwrap_or(0)));
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
    events.register(&mut r);
    let mut out = String::new();
    encode(&mut out, &r).expect("writing into a String cannot fail");
    out
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
        Ok(Ok(Ok(snap))) => {
            reply(200, "application/openmetrics-text; version=1.0.0; charset=utf-8", render(&snap, events))
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
        }
    }

    fn has(text: &str, line: &str) {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in:\n{text}");
    }

    #[test]
    fn every_stats_counter_is_exported_as_a_total_from_the_list() {
        let text = render(&sample(), &Metrics::default());
        for name in stat::NAMES {
            let value = if name == "rx_packets" {
                7
            } else if name == "new_flow" {
                3
            } else {
                0
            };
            has(&text, &format!("lb_{name}_total {value}"));
            has(&text, &format!("# TYPE lb_{name} counter"));
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
        let get = |path: &'static str| async move {
            let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = get("/metrics").await;
        assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
        assert!(ok.contains("lb_rx_packets_total 7"), "{ok}");
        assert!(ok.to_ascii_lowercase().contains("content-type: application/openmetrics-text"), "{ok}");
        assert!(get("/").await.starts_with("HTTP/1.1 404"));
        task.abort();
    }
}
