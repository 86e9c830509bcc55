//! End to end: failover policy (spec §1.2 rows E-3..E-9) over real TCP through XDP.
//! One zone, five backends: b1-1..b1-3 primaries, b1-4 and b1-5 failover backends.
use lb_tests::e2e::*;
use lb_tests::topology::{Host, Topology, TopologySpec};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

const PRIMARIES: [&str; 3] = ["b1-1", "b1-2", "b1-3"];
const FAILOVERS: [&str; 2] = ["b1-4", "b1-5"];

fn spec(prefix: &str) -> TopologySpec {
    TopologySpec { prefix: prefix.into(), zones: vec![(1, 5)], outside_clients: 0 }
}

fn is_failover(b: &Host) -> bool {
    FAILOVERS.contains(&b.name.as_str())
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The backends `n` new connections reach, or None if any connection failed.
fn reached(client: &Host, target: SocketAddr, n: usize) -> Option<BTreeSet<String>> {
    tcp_spread(client, target, n).ok().map(|v| v.into_iter().collect())
}

/// Failover when healthy primaries fall below failover_ratio 0.5 (servers stopped, real health
/// checks), failback when one recovers.
#[test]
fn failover_below_ratio_and_failback_real_health_checks() {
    let topo = Topology::build(&spec("fo1")).expect("topology (needs root)");
    let mut servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-fo1-decap")).unwrap();
    let policy = "[service.failover_policy]\nfailover_ratio = 0.5\n";
    let cfg = zones_toml(1) + &service_toml(&topo, "web", false, "", policy, 80, &is_failover);
    let d = Daemon::start(&topo, "fo1", &cfg).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let target = vip(false, 80);
    let idx = |name: &str| topo.backends.iter().position(|b| b.name == name).unwrap();

    // E-6: all primaries healthy -> primaries only.
    let got = reached(client, target, 40).unwrap_or_else(|| panic!("{}", d.diagnostics()));
    assert_eq!(got, set(&PRIMARIES), "all healthy: only primaries");

    // One primary down: 2/3 ≥ 0.5 -> still primaries (E-6), without b1-1.
    servers[idx("b1-1")].stop();
    let got = wait_for("b1-1 to leave the primary pool", Duration::from_secs(30), || {
        reached(client, target, 40).filter(|s| !s.contains("b1-1"))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    assert_eq!(got, set(&["b1-2", "b1-3"]), "ratio 2/3 ≥ 0.5 keeps primaries");
    assert_eq!(d.status().unwrap().services[0].active_pool.as_deref(), Some("PRIMARY"));

    // Second primary down: 1/3 < 0.5 -> failover mode (E-7): failover backends only.
    servers[idx("b1-2")].stop();
    let got = wait_for("failover to b1-4/b1-5", Duration::from_secs(30), || {
        reached(client, target, 40).filter(|s| s.iter().all(|n| FAILOVERS.contains(&n.as_str())))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    assert_eq!(got, set(&FAILOVERS), "ratio 1/3 < 0.5: failover mode");
    let st = d.status().unwrap();
    assert_eq!(st.services[0].active_pool.as_deref(), Some("FAILOVER"), "{st:?}");

    // b1-1 recovers: 2/3 ≥ 0.5 -> failback to the healthy primaries.
    servers[idx("b1-1")] = start_server(topo.backend("b1-1").unwrap(), 80).unwrap();
    let got = wait_for("failback to primaries", Duration::from_secs(30), || {
        reached(client, target, 40).filter(|s| s.iter().all(|n| PRIMARIES.contains(&n.as_str())))
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    assert_eq!(got, set(&["b1-1", "b1-3"]), "failback to the healthy primaries");
}

/// drop_traffic_if_unhealthy = true: with every backend down, new connections fail (E-8); with
/// one backend back they work again. Then the same config with drop = false sends them to all
/// primaries (E-9), failover backends excluded.
#[test]
fn drop_traffic_if_unhealthy_all_down() {
    let topo = Topology::build(&spec("fo2")).expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-fo2-decap")).unwrap();
    let cfg = |drop: bool| {
        let policy = format!("[service.failover_policy]\nfailover_ratio = 0.5\ndrop_traffic_if_unhealthy = {drop}\n");
        zones_toml(1) + &service_toml(&topo, "web", false, "", &policy, 80, &is_failover)
    };
    let d = Daemon::start(&topo, "fo2", &cfg(true)).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let target = vip(false, 80);
    assert_eq!(reached(client, target, 40).unwrap_or_else(|| panic!("{}", d.diagnostics())), set(&PRIMARIES));

    // Overrides keep the servers answering, so a failed connection can only be the balancer's drop.
    for b in &topo.backends {
        d.set_health("web", &b.v4.to_string(), "unhealthy").unwrap();
    }
    let before = d.status().unwrap();
    for _ in 0..3 {
        assert!(tcp_hello(client, target).is_err(), "E-8: new connections are dropped when all are down: {before:?}");
    }
    assert!(udp_hello(client, target).is_err(), "a TCP service carries no UDP");

    // One failover backend back: E-3 -> it alone.
    d.set_health("web", &topo.backend("b1-5").unwrap().v4.to_string(), "auto").unwrap();
    assert_eq!(
        reached(client, target, 40).unwrap_or_else(|| panic!("{}", d.diagnostics())),
        set(&["b1-5"]),
        "E-3: only healthy failover"
    );
    d.set_health("web", &topo.backend("b1-5").unwrap().v4.to_string(), "unhealthy").unwrap();
    assert!(tcp_hello(client, target).is_err(), "E-8 again");

    // drop = false: all primaries, no failover backend (E-9), overrides survive the reload.
    d.rewrite_config(&cfg(false)).unwrap();
    d.cli(&["reload"]).unwrap();
    let got = reached(client, target, 40).unwrap_or_else(|| panic!("{}", d.diagnostics()));
    assert_eq!(got, set(&PRIMARIES), "E-9: all primaries as last resort");
}

/// An established connection on a primary that stays healthy while the service fails over
/// (1/3 < 0.5): with disable_connection_drain_on_failover = false it keeps its backend; with
/// true its tracking entry is flushed, so its next packet is a new flow on a failover backend,
/// which knows no such connection and resets it.
fn session_across_failover(prefix: &str, flush: bool) {
    let topo = Topology::build(&spec(prefix)).expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap =
        DecapGuard::attach(&topo, std::path::Path::new(&format!("/sys/fs/bpf/lb-test-{prefix}-decap"))).unwrap();
    let policy =
        format!("[service.failover_policy]\nfailover_ratio = 0.5\ndisable_connection_drain_on_failover = {flush}\n");
    let cfg = zones_toml(1) + &service_toml(&topo, "web", false, "", &policy, 80, &is_failover);
    let d = Daemon::start(&topo, prefix, &cfg).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let target = vip(false, 80);
    let mut s = Session::open(client, target).unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    let home = s.greeting.clone();
    assert!(PRIMARIES.contains(&home.as_str()));
    assert_eq!(s.ask("before").unwrap(), home);

    // The two other primaries go down: failover mode, though the session's backend is healthy.
    for p in PRIMARIES.iter().filter(|p| **p != home) {
        d.set_health("web", &topo.backend(p).unwrap().v4.to_string(), "unhealthy").unwrap();
    }
    assert_eq!(d.status().unwrap().services[0].active_pool.as_deref(), Some("FAILOVER"));
    assert_eq!(reached(client, target, 40).unwrap_or_else(|| panic!("{}", d.diagnostics())), set(&FAILOVERS));
    let answer = s.ask("after failover");
    if flush {
        // The failover backend answers the unknown connection with a reset.
        let err = answer
            .err()
            .map(|e| format!("{e:#}"))
            .unwrap_or_else(|| panic!("flushed on failover: the connection must not reach {home} any more"));
        assert!(err.contains("reset"), "expected a reset from the failover backend: {err}");
    } else {
        assert_eq!(
            answer.unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics())),
            home,
            "drains on its backend after failover"
        );
    }

    // Failback: new connections go to the primaries again.
    for p in PRIMARIES.iter().filter(|p| **p != home) {
        d.set_health("web", &topo.backend(p).unwrap().v4.to_string(), "auto").unwrap();
    }
    assert_eq!(
        reached(client, target, 40).unwrap_or_else(|| panic!("{}", d.diagnostics())),
        set(&PRIMARIES),
        "failback"
    );
    if !flush {
        assert_eq!(s.ask("after failback").unwrap(), home);
    }
}

#[test]
fn session_drains_across_failover() {
    session_across_failover("fo3", false);
}

#[test]
fn session_flushed_on_failover_when_drain_disabled() {
    session_across_failover("fo4", true);
}
