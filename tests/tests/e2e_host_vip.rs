//! End to end (issue #31-2): a VIP that is one of the balancer's own addresses is refused. The
//! daemon runs in the balancer's namespace, whose eth0 holds 198.18.0.1 and 2001:db8::1: a
//! reload naming either as a VIP is refused (both at once, naming eth0) and the running tables
//! keep serving; `lb validate` refuses the file in that namespace and accepts it where no
//! interface holds those addresses; a start with it fails, naming the VIP.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec, LB4, LB6, VIP4, VIP6};
use std::collections::BTreeSet;

#[test]
fn vip_on_the_balancers_own_address_is_refused() {
    let topo = Topology::build(&TopologySpec { prefix: "hv1".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-hv1-decap")).unwrap();
    let good = zones_toml(1)
        + &service_toml(&topo, "web", false, "", "", 80, &|_| false)
        + &service_toml(&topo, "web6", true, "", "", 80, &|_| false);
    let bad = good
        .replace(&format!("vip = \"{VIP4}\""), &format!("vip = \"{LB4}\""))
        .replace(&format!("vip = \"{VIP6}\""), &format!("vip = \"{LB6}\""));
    assert_ne!(good, bad);
    let mut d = Daemon::start(&topo, "hv1", &good).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let both: BTreeSet<String> = topo.backends.iter().map(|b| b.name.clone()).collect();
    let reach = || -> BTreeSet<String> {
        tcp_spread(client, vip(false, 80), 24).unwrap_or_else(|e| fail(e)).into_iter().collect()
    };
    assert_eq!(reach(), both);
    let before = d.status().unwrap().services;

    // Reload: refused with both VIPs named, nothing changes.
    d.rewrite_config(&bad).unwrap();
    let err = match d.cli(&["reload"]) {
        Ok(out) => panic!("a reload with the balancer's own address as VIP was applied: {out}"),
        Err(e) => format!("{e:#}"),
    };
    for w in [
        "lb.toml",
        "2 problems",
        "service \"web\": vip: 198.18.0.1 is an address of this host (interface eth0)",
        "service \"web6\": vip: 2001:db8::1 is an address of this host (interface eth0)",
    ] {
        assert!(err.contains(w), "the refusal names {w:?}: {err}");
    }
    assert_eq!(d.status().unwrap().services, before, "a refused reload changes nothing");
    assert_eq!(d.status().unwrap().reloads.refused, 1);
    assert_eq!(reach(), both, "the running tables still serve");

    // lb validate: in the balancer's namespace the file is refused, where no interface holds
    // those addresses (this test's own empty namespace) it is valid.
    let path = d.config.to_str().unwrap().to_owned();
    let err = format!("{:#}", lb_in(&topo.lb.ns, &["validate", "--config", &path]).unwrap_err());
    assert!(err.contains("198.18.0.1 is an address of this host (interface eth0)"), "{err}");
    let empty = lb_tests::netns::Netns::new("hv1-empty").unwrap();
    let ok = lb_in(&empty, &["validate", "--config", &path]).unwrap_or_else(|e| panic!("{e:#}"));
    assert!(ok.contains("valid (2 services"), "{ok}");
    drop(empty);

    // Start: refused, naming the VIP.
    d.stop().unwrap();
    let err = match Daemon::start(&topo, "hv1b", &bad) {
        Ok(_) => panic!("lb run started with the balancer's own address as a VIP"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("198.18.0.1 is an address of this host (interface eth0)"), "{err}");
}
