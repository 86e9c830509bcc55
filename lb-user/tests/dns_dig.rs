//! The DNS front against a real DNS client: `dig` (Debian's dnsutils, installed by
//! `cargo xtask setup`) queries the server task bound to 127.0.0.1 on an ephemeral port, with
//! and without EDNS Client Subnet, for every routing method; monitor changes are published
//! through the same watch channel the daemon uses.

use lb_user::config::Config;
use lb_user::daemon::dns::{self, RoutingView, ViewSender};
use lb_user::daemon::metrics::{self, Metrics};
use lb_user::model::MonitorStatus;
use lb_user::policy::tm::ProbeStatuses;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

const CFG: &str = r#"
[[latency]]
client_prefixes = ["198.18.1.0/24"]
regions = ["westeurope", "eastus"]
[[latency]]
client_prefixes = ["198.18.2.0/24"]
regions = ["eastus", "westeurope"]
[[geo]]
client_prefixes = ["198.18.1.0/24"]
region = "IE"
[[geo]]
client_prefixes = ["198.18.2.0/24"]
region = "US-CA"
[[geo]]
client_prefixes = ["198.18.3.0/24"]
region = "JP"

[[service]]
name = "prio"
vip = "198.18.0.1"
protocol = "TCP"
routing_method = "PRIORITY"
dns_name = "prio.tm.test"
ttl = 42
[[service.backend]]
address = "198.18.10.1"
[[service.backend]]
address = "198.18.10.2"

[[service]]
name = "weighted"
vip = "198.18.0.2"
protocol = "TCP"
routing_method = "WEIGHTED"
dns_name = "weighted.tm.test"
[[service.backend]]
address = "198.18.11.1"
weight = 1
[[service.backend]]
address = "198.18.11.2"
weight = 3

[[service]]
name = "perf"
vip = "198.18.0.3"
protocol = "TCP"
routing_method = "PERFORMANCE"
dns_name = "perf.tm.test"
[[service.backend]]
address = "198.18.12.1"
location = "westeurope"
[[service.backend]]
address = "198.18.12.3"
location = "eastus"

[[service]]
name = "geo"
vip = "198.18.0.4"
protocol = "TCP"
routing_method = "GEOGRAPHIC"
dns_name = "geo.tm.test"
[[service.backend]]
address = "198.18.13.1"
geo_mapping = ["IE"]
[[service.backend]]
address = "198.18.13.2"
geo_mapping = ["US"]

[[service]]
name = "subnet"
vip = "198.18.0.5"
protocol = "TCP"
routing_method = "SUBNET"
dns_name = "subnet.tm.test"
[[service.backend]]
address = "198.18.14.1"
subnets = ["10.0.0.0/8"]
[[service.backend]]
address = "198.18.14.2"
subnets = ["127.0.0.0/8"]

[[service]]
name = "subnet-fb"
vip = "198.18.0.8"
protocol = "TCP"
routing_method = "SUBNET"
dns_name = "subnet-fb.tm.test"
[[service.backend]]
address = "198.18.18.1"
subnets = ["10.0.0.0/8"]
[[service.backend]]
address = "198.18.18.9"

[[service]]
name = "multi"
vip = "198.18.0.6"
protocol = "TCP"
routing_method = "MULTIVALUE"
max_return = 2
dns_name = "multi.tm.test"
[[service.backend]]
address = "198.18.15.1"
[[service.backend]]
address = "198.18.15.2"
[[service.backend]]
address = "198.18.15.3"
[[service.backend]]
address = "198.18.15.4"
[[service.backend]]
address = "2001:db8:15::1"

[[service]]
name = "off"
vip = "198.18.0.7"
protocol = "TCP"
routing_method = "PRIORITY"
profile_status = "Disabled"
dns_name = "off.tm.test"
[[service.backend]]
address = "198.18.17.1"
"#;

/// What dig saw for one query.
#[derive(Debug, Default)]
struct Answer {
    status: String,
    /// (ttl, type, address)
    records: Vec<(u32, String, String)>,
}

impl Answer {
    fn addrs(&self) -> Vec<&str> {
        self.records.iter().map(|r| r.2.as_str()).collect()
    }
}

fn dig_path() -> &'static str {
    let ok = std::process::Command::new("dig").arg("-v").output().is_ok_and(|o| o.status.success());
    assert!(ok, "dig not found: `cargo xtask setup` installs Debian's dnsutils, which the DNS tests need");
    "dig"
}

/// Runs dig once with several queries (each `[name, type]`) and extra options; returns one
/// answer per query, in order.
async fn dig(server: SocketAddr, queries: &[(&str, &str)], opts: &[&str]) -> Vec<Answer> {
    let mut cmd = tokio::process::Command::new(dig_path());
    cmd.arg(format!("@{}", server.ip())).args(["-p", &server.port().to_string()]);
    for (name, qtype) in queries {
        cmd.args([*name, *qtype, "+noall", "+comments", "+answer", "+tries=1", "+time=5"]).args(opts);
    }
    let out = cmd.output().await.expect("running dig");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "dig failed: {text}{}", String::from_utf8_lossy(&out.stderr));
    let mut answers: Vec<Answer> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            answers.push(Answer { status: rest.split(',').next().unwrap_or("").to_string(), records: Vec::new() });
        } else if !line.starts_with(';') && !line.trim().is_empty() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() == 5 {
                let a = answers.last_mut().expect("a record before any header");
                a.records.push((f[1].parse().unwrap(), f[3].to_string(), f[4].to_string()));
            }
        }
    }
    assert_eq!(answers.len(), queries.len(), "one answer per query:\n{text}");
    answers
}

async fn one(server: SocketAddr, name: &str, qtype: &str, opts: &[&str]) -> Answer {
    dig(server, &[(name, qtype)], opts).await.remove(0)
}

struct Front {
    addr: SocketAddr,
    cfg: Config,
    probes: ProbeStatuses,
    tx: ViewSender,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    /// Counts the answers sent (the daemon's metrics).
    metrics: Metrics,
}

impl Front {
    async fn start() -> Front {
        let cfg = Config::parse(CFG).unwrap();
        let probes = ProbeStatuses::new(&cfg, MonitorStatus::Online);
        let (tx, rx) = tokio::sync::watch::channel(Arc::new(RoutingView::new(cfg.clone(), probes.clone())));
        let metrics = Metrics::default();
        let (addr, tasks) = dns::serve(
            "127.0.0.1:0".parse().unwrap(),
            rx,
            dns::TcpLimits { total: 64, per_source: 16 },
            metrics.clone(),
        )
        .await
        .unwrap();
        Front { addr, cfg, probes, tx, tasks, metrics }
    }

    /// Publishes a monitor status, as the daemon does after a reconcile.
    fn set(&mut self, service: &str, endpoint: &str, status: MonitorStatus) {
        self.probes.set(&self.cfg, service, endpoint, status).unwrap();
        self.tx.send_replace(Arc::new(RoutingView::new(self.cfg.clone(), self.probes.clone())));
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn counts(answers: &[Answer]) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for a in answers {
        for addr in a.addrs() {
            *m.entry(addr.to_string()).or_insert(0) += 1;
        }
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn priority_answers_first_available_with_ttl_over_udp_and_tcp() {
    let mut f = Front::start().await;
    let a = one(f.addr, "prio.tm.test", "A", &[]).await;
    assert_eq!((a.status.as_str(), a.addrs()), ("NOERROR", vec!["198.18.10.1"]));
    assert_eq!((a.records[0].0, a.records[0].1.as_str()), (42, "A"), "the service's ttl");
    let a = one(f.addr, "PRIO.tm.test.", "A", &["+tcp", "+subnet=198.18.2.0/24"]).await;
    assert_eq!(a.addrs(), ["198.18.10.1"], "TCP, ECS and case do not matter to PRIORITY");
    f.set("prio", "198.18.10.1", MonitorStatus::Degraded);
    assert_eq!(one(f.addr, "prio.tm.test", "A", &[]).await.addrs(), ["198.18.10.2"], "A2: first Degraded -> next");
    f.set("prio", "198.18.10.2", MonitorStatus::Degraded);
    assert_eq!(one(f.addr, "prio.tm.test", "A", &[]).await.addrs(), ["198.18.10.1"], "A4: all Degraded");
    let a = one(f.addr, "prio.tm.test", "AAAA", &[]).await;
    assert_eq!((a.status.as_str(), a.records.len()), ("NOERROR", 0), "AAAA for an A endpoint: NODATA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weighted_random_by_weight_and_never_degraded() {
    let mut f = Front::start().await;
    let queries = vec![("weighted.tm.test", "A"); 200];
    let c = counts(&dig(f.addr, &queries, &[]).await);
    let (w1, w2) = (c.get("198.18.11.1").copied().unwrap_or(0), c.get("198.18.11.2").copied().unwrap_or(0));
    assert_eq!(w1 + w2, 200, "one record per answer: {c:?}");
    assert!((20..=85).contains(&w1), "about 25 % for weight 1 of 4 (W1): {c:?}");
    f.set("weighted", "198.18.11.2", MonitorStatus::Degraded);
    let c = counts(&dig(f.addr, &vec![("weighted.tm.test", "A"); 40], &["+subnet=198.18.1.0/24"]).await);
    assert_eq!(c, BTreeMap::from([("198.18.11.1".to_string(), 40)]), "W2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn performance_uses_the_client_subnet_latency() {
    let mut f = Front::start().await;
    let a = one(f.addr, "perf.tm.test", "A", &["+subnet=198.18.1.0/24"]).await;
    assert_eq!(a.addrs(), ["198.18.12.1"], "F1: westeurope for 198.18.1.0/24");
    let a = one(f.addr, "perf.tm.test", "A", &["+subnet=198.18.2.7/32"]).await;
    assert_eq!(a.addrs(), ["198.18.12.3"], "eastus for 198.18.2.0/24");
    // Without ECS the source 127.0.0.1 has no latency data: any available endpoint.
    let c = counts(&dig(f.addr, &[("perf.tm.test", "A"); 5], &[]).await);
    assert_eq!(c.values().sum::<usize>(), 5, "{c:?}");
    f.set("perf", "198.18.12.1", MonitorStatus::Degraded);
    let a = one(f.addr, "perf.tm.test", "A", &["+subnet=198.18.1.0/24"]).await;
    assert_eq!(a.addrs(), ["198.18.12.3"], "F2: region Degraded -> next region");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn geographic_by_client_subnet_and_nodata() {
    let mut f = Front::start().await;
    assert_eq!(one(f.addr, "geo.tm.test", "A", &["+subnet=198.18.1.0/24"]).await.addrs(), ["198.18.13.1"], "IE");
    assert_eq!(
        one(f.addr, "geo.tm.test", "A", &["+subnet=198.18.2.0/24"]).await.addrs(),
        ["198.18.13.2"],
        "US-CA -> US"
    );
    for opts in [&["+subnet=198.18.3.0/24"][..], &[][..]] {
        let a = one(f.addr, "geo.tm.test", "A", opts).await;
        assert_eq!((a.status.as_str(), a.records.len()), ("NOERROR", 0), "JP / unknown location: NODATA ({opts:?})");
    }
    f.set("geo", "198.18.13.1", MonitorStatus::Degraded);
    assert_eq!(one(f.addr, "geo.tm.test", "A", &["+subnet=198.18.1.0/24"]).await.addrs(), ["198.18.13.1"], "Q3");
    f.set("geo", "198.18.13.1", MonitorStatus::Stopped);
    let a = one(f.addr, "geo.tm.test", "A", &["+subnet=198.18.1.0/24"]).await;
    assert_eq!((a.status.as_str(), a.records.len()), ("NOERROR", 0), "Q4: Stopped -> NODATA");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subnet_source_address_or_client_subnet_then_fallback_or_nodata() {
    let mut f = Front::start().await;
    assert_eq!(one(f.addr, "subnet.tm.test", "A", &[]).await.addrs(), ["198.18.14.2"], "source 127.0.0.1 without ECS");
    let a = one(f.addr, "subnet.tm.test", "A", &["+subnet=10.9.0.0/16"]).await;
    assert_eq!(a.addrs(), ["198.18.14.1"], "N4: ECS wins over the source");
    let a = one(f.addr, "subnet.tm.test", "A", &["+subnet=198.18.4.0/24"]).await;
    assert_eq!((a.status.as_str(), a.records.len()), ("NOERROR", 0), "N2: unmatched, no fallback: NODATA");
    assert_eq!(one(f.addr, "subnet-fb.tm.test", "A", &[]).await.addrs(), ["198.18.18.9"], "N1: fallback");
    f.set("subnet-fb", "198.18.18.1", MonitorStatus::Degraded);
    let a = one(f.addr, "subnet-fb.tm.test", "A", &["+subnet=10.1.2.0/24"]).await;
    assert_eq!(a.addrs(), ["198.18.18.9"], "N6: mapped Degraded -> fallback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multivalue_count_limit_families_and_nodata() {
    let mut f = Front::start().await;
    let answers = dig(f.addr, &vec![("multi.tm.test", "A"); 30], &[]).await;
    for a in &answers {
        let mut addrs = a.addrs();
        assert_eq!(addrs.len(), 2, "M1: max_return = 2: {a:?}");
        addrs.dedup();
        assert_eq!(addrs.len(), 2, "distinct records: {a:?}");
        assert!(a.records.iter().all(|r| r.1 == "A"));
    }
    assert_eq!(counts(&answers).len(), 4, "every A endpoint is returned sometimes");
    let a = one(f.addr, "multi.tm.test", "AAAA", &["+subnet=2001:db8:1::/48"]).await;
    assert_eq!(a.addrs(), ["2001:db8:15::1"], "M3: the one AAAA endpoint");
    let a = one(f.addr, "multi.tm.test", "CNAME", &[]).await;
    assert_eq!((a.status.as_str(), a.records.len()), ("NOERROR", 0), "M3: CNAME query -> NODATA");
    for e in ["198.18.15.1", "198.18.15.2", "198.18.15.3"] {
        f.set("multi", e, MonitorStatus::Degraded);
    }
    let answers = dig(f.addr, &[("multi.tm.test", "A"); 5], &[]).await;
    assert!(answers.iter().all(|a| a.addrs() == ["198.18.15.4"]), "M2: only the healthy one: {answers:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_profile_nxdomain_and_unknown_name_refused() {
    let f = Front::start().await;
    assert_eq!(one(f.addr, "off.tm.test", "A", &[]).await.status, "NXDOMAIN", "O6");
    assert_eq!(one(f.addr, "nothere.tm.test", "A", &[]).await.status, "REFUSED");
    // Every answer sent is counted by its response code (`lb_dns_answers_total`).
    let text = metrics::render(&Default::default(), &f.metrics);
    for line in [r#"lb_dns_answers_total{rcode="NXDOMAIN"} 1"#, r#"lb_dns_answers_total{rcode="REFUSED"} 1"#] {
        assert!(text.lines().any(|l| l == line), "{line} in:\n{text}");
    }
}

/// A TCP client that sends a length prefix and then nothing is disconnected (RFC 7766
/// §6.2.3) instead of holding its connection and task for good; queries still get answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_tcp_connection_is_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = Front::start().await;
    let mut stalled = tokio::net::TcpStream::connect(f.addr).await.unwrap();
    stalled.write_all(&[0, 30]).await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(std::time::Duration::from_secs(60), stalled.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "the server closes the stalled connection: {read:?}");
    assert_eq!(one(f.addr, "prio.tm.test", "A", &["+tcp"]).await.addrs(), ["198.18.10.1"]);
}
