//! End to end: a health-checked backend takes new connections only after it passed a probe
//! (item 8 of issue #31). Backends a reload adds, one down and one whose service port answers
//! but whose health port does not yet, get no new connection right after the reload (not one
//! refused) nor after their first failed probe; each joins once it passes.
use lb_tests::e2e::*;
use lb_tests::topology::{Host, Topology, TopologySpec};
use std::collections::BTreeMap;
use std::time::Duration;

/// The health-check port, apart from the service port 80, so that a backend can serve while
/// its check fails.
const HC_PORT: u16 = 8080;

/// `web` over `hosts`, checked every second on [`HC_PORT`]; 10 failures turn a healthy backend
/// unhealthy, so a backend counted healthy before its first probe would stay in for seconds.
fn config(hosts: &[&Host]) -> String {
    zones_toml(1)
        + &service_block("web", false, "", "", HC_PORT, &backends_toml_of(hosts.iter().copied(), false))
            .replace("unhealthy_threshold = 2", "unhealthy_threshold = 10")
}

/// `n` new connections from `client`: the backends that answered, and the failures.
fn burst(client: &Host, n: usize) -> (BTreeMap<String, usize>, Vec<String>) {
    let mut reached = BTreeMap::new();
    let mut failed = Vec::new();
    for _ in 0..n {
        match tcp_hello(client, vip(false, 80)) {
            Ok(name) => *reached.entry(name).or_insert(0) += 1,
            Err(e) => failed.push(format!("{e:#}")),
        }
    }
    (reached, failed)
}

#[test]
fn backends_added_by_a_reload_get_connections_only_after_a_pass() {
    let topo = Topology::build(&TopologySpec { prefix: "fv4".into(), zones: vec![(1, 4)], outside_clients: 0 })
        .expect("topology (needs root)");
    let host = |name: &str| topo.backend(name).unwrap();
    let (steady, down, late) = ([host("b1-1"), host("b1-2")], host("b1-3"), host("b1-4"));
    let mut servers = Vec::new();
    for b in steady {
        servers.push(start_server(b, 80).unwrap());
        servers.push(start_server(b, HC_PORT).unwrap());
    }
    // b1-4 serves on port 80 but fails its health check until its HC_PORT server starts.
    servers.push(start_server(late, 80).unwrap());
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-fv4-decap")).unwrap();
    let mut d = Daemon::start_keeping(&topo, "fv4", &config(&steady)).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let (reached, failed) = burst(client, 24);
    assert!(failed.is_empty(), "{failed:?}\n{}", d.diagnostics());
    assert_eq!(reached.keys().collect::<Vec<_>>(), ["b1-1", "b1-2"]);

    // The reload adds b1-3 (down) and b1-4 (health port closed). A burst right after it,
    // before or after their first probe: not one connection refused, none to either.
    d.rewrite_config(&config(&[steady[0], steady[1], down, late])).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e));
    let (reached, failed) = burst(client, 60);
    println!("burst right after the reload: {reached:?}, {} failed", failed.len());
    assert!(failed.is_empty(), "connections failed after the reload: {failed:?}\n{}", d.diagnostics());
    assert_eq!(reached.keys().collect::<Vec<_>>(), ["b1-1", "b1-2"], "only the checked backends");

    // Their first probes fail: unhealthy (no longer unchecked); still no connection to them.
    for b in [down, late] {
        let addr = b.addr(false).to_string();
        wait_for(&format!("the first verdict of {}", b.name), Duration::from_secs(30), || {
            d.backend_status("web", &addr).ok().filter(|s| s.health == lb_user::daemon::reply::Health::Unhealthy)
        })
        .unwrap_or_else(|e| fail(e));
    }
    let (reached, failed) = burst(client, 30);
    assert!(failed.is_empty(), "{failed:?}\n{}", d.diagnostics());
    assert_eq!(reached.keys().collect::<Vec<_>>(), ["b1-1", "b1-2"]);

    // b1-4's health port opens: after its pass it takes new connections.
    servers.push(start_server(late, HC_PORT).unwrap());
    let addr = late.addr(false).to_string();
    wait_for("b1-4 to pass its check", Duration::from_secs(30), || d.is_healthy("web", &addr).ok().filter(|h| *h))
        .unwrap_or_else(|e| fail(e));
    wait_for("new connections to reach b1-4", Duration::from_secs(30), || {
        let (reached, failed) = burst(client, 12);
        assert!(failed.is_empty(), "{failed:?}\n{}", d.diagnostics());
        reached.contains_key("b1-4").then_some(())
    })
    .unwrap_or_else(|e| fail(e));

    // A restart that adopts the data plane keeps the verdicts: no backend starts over
    // unchecked (no first verdict is logged again), and b1-3 stays out.
    d.restart().unwrap();
    let log = d.log();
    let after = &log[log.rfind("adopting the pinned data plane").unwrap_or_else(|| panic!("not adopted:\n{log}"))..];
    assert!(!after.contains("health: service"), "verdicts after the restart:\n{after}");
    let (reached, failed) = burst(client, 30);
    assert!(failed.is_empty(), "{failed:?}\n{}", d.diagnostics());
    assert!(!reached.contains_key("b1-3"), "{reached:?}");
}

/// A balancer that starts with unreachable backends announces nothing (behind ECMP it would
/// take its share of new connections into a black hole); it announces once a backend passes.
/// A crash-loop restart with the backends down again announces nothing either.
#[test]
fn a_balancer_announces_only_after_a_backend_passed() {
    use lb_tests::bgp::{ScaleOut, ScaleOutSpec, PORT};
    let spec = ScaleOutSpec { prefix: "fva".into(), balancers: 1, backends: 2, clients: vec![1] };
    let mut so = ScaleOut::build(&spec).expect("scale-out topology (needs root and bird2)");
    for s in &mut so.servers {
        s.stop();
    }
    let config = so.lb_config();
    // Returns once every backend has its first verdict (here: unhealthy).
    so.balancers[0].start(&config).unwrap();
    let never_announced = |so: &ScaleOut, what: &str| {
        let lb = so.balancers[0].lb();
        let announce = lb.status().unwrap().announce.expect("[announce] is configured");
        assert!(announce.announced.is_empty(), "{what}: {announce:?}\n{}", so.diagnostics());
        assert!(!lb.log().contains("announce: announced"), "{what}: announced at some point\n{}", so.diagnostics());
        assert!(so.paths().unwrap().is_empty(), "{what}: the router has a route\n{}", so.diagnostics());
    };
    never_announced(&so, "started with every backend down");

    // One backend comes up: its pass announces the VIP, the router routes it.
    so.servers[0] = lb_tests::e2e::start_server(&so.backends[0], PORT).unwrap();
    so.wait_paths("the VIP announced after a backend passed", Duration::from_secs(30), |h| h.len() == 1)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", so.diagnostics()));

    // Down again: withdrawn; a crash and a fresh start find it down and announce nothing.
    so.servers[0].stop();
    so.wait_paths("the VIP withdrawn with every backend down", Duration::from_secs(30), |h| h.is_empty())
        .unwrap_or_else(|e| panic!("{e:#}\n{}", so.diagnostics()));
    so.balancers[0].lb_mut().kill();
    // Dropped first: it removes its directory and pins, which the next start makes afresh.
    so.balancers[0].daemon = None;
    so.balancers[0].start(&config).unwrap();
    never_announced(&so, "restarted with every backend down");
}
