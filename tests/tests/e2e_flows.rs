//! End to end: `lb flows` lists the connection tables' entries of a known set of live TCP
//! connections (IPv4 and IPv6) one for one, each with the backend that answers it, filters them
//! by service, backend, client prefix and VIP, sums them per backend, and does the same on the
//! pins a stopped `--keep-dataplane` daemon left (no daemon running).
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

const HC_PORT: u16 = 81;
/// Drained backends keep their flows for 5 minutes, which the test sees as `draining`.
const DRAINING: &str = "[service.connection_draining]\ndraining_timeout_sec = 300\n";

/// One connection the test holds open: client side, service, answering backend's address.
struct Open {
    session: Session,
    client: std::net::SocketAddr,
    service: &'static str,
    backend: String,
}

fn flows(d: &Daemon, filter: &[&str]) -> Value {
    let out = Command::new(bin("lb"))
        .arg("flows")
        .arg("--pin-dir")
        .arg(&d.pin_dir)
        .arg("--socket")
        .arg(&d.socket)
        .arg("--json")
        .args(filter)
        .output()
        .expect("running lb flows");
    assert!(out.status.success(), "lb flows {filter:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("lb flows --json: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// The flows of `v` as (client, client port, service, backend, state).
fn rows(v: &Value) -> Vec<(String, u64, String, String, String)> {
    v["flows"]
        .as_array()
        .expect("flows array")
        .iter()
        .map(|f| {
            (
                f["client"].as_str().unwrap().to_owned(),
                f["client_port"].as_u64().unwrap(),
                f["service"].as_str().unwrap().to_owned(),
                f["backend"].as_str().unwrap_or("none").to_owned(),
                f["state"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// `lb flows` shows exactly `open`, each live on its backend.
fn assert_one_for_one(v: &Value, open: &[&Open], what: &str) {
    let mut got = rows(v);
    got.sort();
    let mut want: Vec<_> = open
        .iter()
        .map(|o| {
            (
                o.client.ip().to_string(),
                o.client.port() as u64,
                o.service.to_owned(),
                o.backend.clone(),
                "live".to_owned(),
            )
        })
        .collect();
    want.sort();
    assert_eq!(got, want, "{what}: lb flows against the open connections");
}

#[test]
fn flows_lists_live_connections_one_for_one() {
    let topo = Topology::build(&TopologySpec { prefix: "flw".into(), zones: vec![(1, 3)], outside_clients: 0 })
        .expect("topology (needs root)");
    let config = zones_toml(1)
        + &service_toml(&topo, "web", false, "", DRAINING, HC_PORT, &|_| false)
        + &service_toml(&topo, "web6", true, "", "", HC_PORT, &|_| false);
    let _servers: Vec<_> =
        topo.backends.iter().flat_map(|b| [start_server(b, 80).unwrap(), start_server(b, HC_PORT).unwrap()]).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-flw-decap")).unwrap();
    let mut d = Daemon::start_keeping(&topo, "flw", &config).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    for b in &topo.backends {
        for v6 in [false, true] {
            let addr = b.addr(v6).to_string();
            let service = if v6 { "web6" } else { "web" };
            wait_for("backends healthy", std::time::Duration::from_secs(30), || {
                d.is_healthy(service, &addr).ok().filter(|h| *h)
            })
            .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
        }
    }
    let address_of = |name: &str, v6: bool| topo.backend(name).unwrap().addr(v6).to_string();

    let mut open: Vec<Open> = Vec::new();
    for (service, v6, n) in [("web", false, 8), ("web6", true, 5)] {
        for _ in 0..n {
            let mut session =
                Session::open(client, vip(v6, 80)).unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
            let name = session.greeting.clone();
            assert_eq!(session.ask("hello").unwrap(), name);
            let client = session.local_addr().unwrap();
            open.push(Open { session, client, service, backend: address_of(&name, v6) });
        }
    }
    let all: Vec<&Open> = open.iter().collect();

    // Every connection, one for one, with the summary per backend and service.
    let v = flows(&d, &[]);
    assert_one_for_one(&v, &all, "no filter");
    let mut per_backend: BTreeMap<String, u64> = BTreeMap::new();
    for o in &open {
        *per_backend.entry(o.backend.clone()).or_default() += 1;
    }
    let summary: BTreeMap<String, u64> = v["summary"]["per_backend"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, c)| (k.clone(), c["live"].as_u64().unwrap()))
        .collect();
    assert_eq!(summary, per_backend, "summary per backend");
    assert_eq!(v["summary"]["per_service"]["web"]["total"], 8);
    assert_eq!(v["summary"]["per_service"]["web6"]["total"], 5);
    assert_eq!(v["summary"]["all"]["live"], 13);
    // The VIP and port of each flow are the service's.
    for f in v["flows"].as_array().unwrap() {
        let v6 = f["service"] == "web6";
        assert_eq!(f["vip"].as_str().unwrap(), vip(v6, 80).ip().to_string());
        assert_eq!(f["port"], 80);
        assert_eq!(f["proto"], "tcp");
    }

    // Filters.
    let some_backend = open[0].backend.clone();
    let on_backend: Vec<&Open> = open.iter().filter(|o| o.backend == some_backend).collect();
    assert_one_for_one(&flows(&d, &["--backend", &some_backend]), &on_backend, "--backend");
    let v6_only: Vec<&Open> = open.iter().filter(|o| o.service == "web6").collect();
    assert_one_for_one(&flows(&d, &["--service", "web6"]), &v6_only, "--service web6");
    assert_one_for_one(&flows(&d, &["--vip", &vip(true, 80).ip().to_string()]), &v6_only, "--vip");
    let v4_prefix = format!("{}/24", open[0].client.ip());
    let v4_only: Vec<&Open> = open.iter().filter(|o| o.service == "web").collect();
    assert_one_for_one(&flows(&d, &["--client", &v4_prefix]), &v4_only, "--client prefix");
    assert_one_for_one(&flows(&d, &["--client", "198.19.255.1"]), &[], "--client elsewhere");

    // An unknown service is an error naming the known ones.
    let out = Command::new(bin("lb"))
        .args(["flows", "--service", "nope", "--pin-dir"])
        .arg(&d.pin_dir)
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("--service") && err.contains("web6"), "{err}");

    // The human form has a line per flow and the summary.
    let human = Command::new(bin("lb"))
        .arg("flows")
        .arg("--pin-dir")
        .arg(&d.pin_dir)
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&human.stdout);
    for o in &open {
        let client = match o.client {
            std::net::SocketAddr::V4(a) => a.to_string(),
            std::net::SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
        };
        assert!(
            text.lines().any(|l| l.starts_with(&client) && l.contains(&o.backend) && l.ends_with("live")),
            "{client} in:\n{text}"
        );
    }
    assert!(text.contains("13 flows: 13 live"), "{text}");

    // A drained backend's flows are `draining` (they continue until the draining timeout);
    // undrained, `live` again.
    let drained = open.iter().find(|o| o.service == "web").unwrap().backend.clone();
    let drain = |verb: &str| {
        d.cli(&["backend", verb, "--service", "web", "--address", &drained])
            .unwrap_or_else(|e| panic!("lb backend {verb}: {e:#}"))
    };
    drain("drain");
    let v = flows(&d, &["--backend", &drained]);
    let states: Vec<String> = rows(&v).into_iter().map(|r| r.4).collect();
    assert!(!states.is_empty() && states.iter().all(|s| s == "draining"), "after drain: {states:?}");
    assert_eq!(v["summary"]["all"]["draining"], states.len());
    drain("undrain");

    // The daemon stops, keeping the data plane: the pins alone give the same flows, and the
    // connections still work.
    d.stop().unwrap();
    assert_one_for_one(&flows(&d, &[]), &all, "on the pins of a stopped daemon");
    for o in &mut open {
        let name = o.session.ask("still there").unwrap();
        assert_eq!(address_of(&name, o.service == "web6"), o.backend);
    }
}
