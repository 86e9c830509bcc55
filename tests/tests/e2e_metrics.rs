//! End to end: the real Prometheus server (Debian package `prometheus`, installed by `cargo xtask
//! setup`) scrapes the daemon's `[metrics]` endpoint in the balancer's namespace; the test asks
//! Prometheus's HTTP API for the series after real TCP connections, a reload and a health change.
use lb_tests::e2e::*;
use lb_tests::topology::{Host, Topology, TopologySpec};
use std::io::{Read, Write};
use std::time::Duration;

const METRICS: &str = "127.0.0.1:9405";
const PROMETHEUS: &str = "127.0.0.1:9090";
/// Zone-1 clients stay in zone 1 while both its backends are healthy.
const ZONAL: &str =
    "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 0.8\n";
/// Connections the test opens through the VIP.
const N: usize = 20;

/// `expr` through Prometheus's `/api/v1/query`, from inside the balancer's namespace: the
/// value of the single series it returns (None if none, or Prometheus is not up yet).
fn query(lb: &Host, expr: &str) -> Option<f64> {
    let encoded: String = expr
        .bytes()
        .map(|b| if b.is_ascii_alphanumeric() { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let body = lb
        .ns
        .run(move || -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(PROMETHEUS)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(s, "GET /api/v1/query?query={encoded} HTTP/1.0\r\nHost: prometheus\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .ok()?
        .ok()?;
    let json: serde_json::Value = serde_json::from_str(body.split_once("\r\n\r\n")?.1).ok()?;
    let result = json["data"]["result"].as_array()?;
    match result.as_slice() {
        [one] => one["value"][1].as_str()?.parse().ok(),
        _ => None,
    }
}

/// Waits (bounded) until `expr` evaluates to `want`.
fn expect(lb: &Host, d: &Daemon, expr: &str, want: f64) {
    let mut last = None;
    let r = wait_for(&format!("{expr} == {want}"), Duration::from_secs(30), || {
        last = query(lb, expr);
        (last == Some(want)).then_some(())
    });
    if let Err(e) = r {
        panic!("{e:#}; last value {last:?}\n{}", d.diagnostics());
    }
}

#[test]
fn prometheus_scrapes_counters_health_reloads_and_occupancy() {
    let topo = Topology::build(&TopologySpec { prefix: "mt1".into(), zones: vec![(1, 2), (1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let mut servers: Vec<_> = topo.backends.iter().map(|b| (b.name.clone(), start_server(b, 80).unwrap())).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-mt1-decap")).unwrap();
    // A connection table of at most 4096 buckets is counted exactly (not sampled).
    let zones = zones_toml(2).replacen("[dataplane]\n", "[dataplane]\nconntrack_entries = 4096\n", 1);
    let cfg = format!("[metrics]\nlisten = \"{METRICS}\"\n")
        + &zones
        + &service_toml(&topo, "web", false, "", ZONAL, 80, &|_| false);
    let mut d = Daemon::start(&topo, "mt1", &cfg).unwrap();

    let dir = d.dir.join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: lb\n    static_configs:\n      - targets: [\"{METRICS}\"]\n"),
    )
    .unwrap();
    // Runs in the balancer's namespace (where the endpoint listens); killed when the guard or
    // the namespace goes, also when an assertion fails.
    let _prometheus = topo
        .lb
        .ns
        .spawn(&[
            "prometheus",
            &format!("--config.file={}", config.display()),
            &format!("--storage.tsdb.path={}", dir.join("data").display()),
            &format!("--web.listen-address={PROMETHEUS}"),
            "--log.level=warn",
        ])
        .expect("prometheus (cargo xtask setup installs it)");
    expect(&topo.lb, &d, "up{job=\"lb\"}", 1.0);

    let client = topo.clients_in_zone(1).next().unwrap();
    let names = tcp_spread(client, vip(false, 80), N).unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    assert!(names.iter().all(|n| n.starts_with("b1-")), "{:?}", tally(&names));
    let n = N as f64;
    expect(&topo.lb, &d, "lb_new_flows_total", n);
    expect(&topo.lb, &d, "sum(lb_backend_new_flows_total{service=\"web\",zone=\"zone-1\"})", n);
    expect(&topo.lb, &d, "sum(lb_backend_new_flows_total{service=\"web\",zone=\"zone-2\"})", 0.0);
    expect(&topo.lb, &d, "lb_class_new_flows_total{service=\"web\",zone=\"zone-1\"}", n);
    // The backends' packets are the classes' packets, and every connection took several.
    expect(&topo.lb, &d, "sum(lb_backend_packets_total) - sum(lb_class_packets_total)", 0.0);
    expect(&topo.lb, &d, "sum(lb_backend_bytes_total) - sum(lb_class_bytes_total)", 0.0);
    expect(&topo.lb, &d, "sum(lb_backend_packets_total) >= bool 60", 1.0);
    expect(&topo.lb, &d, "lb_conntrack_live_slots{family=\"ipv4\"}", n);
    expect(&topo.lb, &d, "count(lb_backend_healthy == 1)", 4.0);
    expect(&topo.lb, &d, "lb_table_swaps_total >= bool 3", 1.0);
    expect(&topo.lb, &d, "lb_interface_attached{interface=\"eth0\"}", 1.0);
    expect(&topo.lb, &d, "count(lb_build_info{ebpf_sha256!=\"\"} == 1)", 1.0);
    expect(&topo.lb, &d, "lb_conntrack_occupancy_ratio{family=\"ipv4\"} > bool 0", 1.0);
    expect(&topo.lb, &d, "sum(lb_dropped_packets_total)", 0.0);
    // The endpoint's classic text passes promtool's linter.
    let text = topo
        .lb
        .ns
        .run(|| -> std::io::Result<String> {
            let mut s = std::net::TcpStream::connect(METRICS)?;
            s.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(s, "GET /metrics HTTP/1.0\r\nHost: lb\r\n\r\n")?;
            let mut out = String::new();
            s.read_to_string(&mut out)?;
            Ok(out)
        })
        .unwrap()
        .unwrap();
    let body = text.split_once("\r\n\r\n").expect("an HTTP answer").1.to_owned();
    if let Err(said) = lb_user::daemon::metrics::promtool_check(&body) {
        panic!("promtool check metrics: {said}\n{body}");
    }

    d.sighup().unwrap();
    expect(&topo.lb, &d, "lb_reloads_total{result=\"applied\"}", 1.0);

    // A backend's server stops: its health check reports the change.
    let (name, guard) = servers.iter_mut().find(|(n, _)| n == "b1-2").unwrap();
    guard.stop();
    let addr = topo.backend(name).unwrap().v4.to_string();
    expect(&topo.lb, &d, &format!("lb_backend_healthy{{backend=\"{addr}\"}}"), 0.0);
    expect(&topo.lb, &d, &format!("lb_backend_health_changes_total{{backend=\"{addr}\",to=\"unhealthy\"}}"), 1.0);
    d.stop().unwrap();
}
