//! `lb unload`: the explicit end of a data plane a `--keep-dataplane` daemon (the packaged
//! service) left forwarding. Refused while the daemon runs; after its stop, traffic still flows
//! (the stop kept the data plane), and `lb unload` detaches the balancer from the interface,
//! removes every pin and the state file, so the VIP no longer answers.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::path::Path;

#[test]
fn unload_detaches_and_unpins_what_a_stopped_keeping_daemon_left() {
    let topo = Topology::build(&TopologySpec { prefix: "unl".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _checks: Vec<_> = topo.backends.iter().map(|b| start_server(b, 81).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, Path::new("/sys/fs/bpf/lb-test-unl-decap")).unwrap();
    let config = zones_toml(1) + &service_toml(&topo, "web", false, "", "", 81, &|_| false);
    let mut d = Daemon::start_keeping(&topo, "unl", &config).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    tcp_hello(client, vip(false, 80)).unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    let (pins, socket) = (d.pin_dir.to_str().unwrap().to_owned(), d.socket.to_str().unwrap().to_owned());
    let unload = || lb_in(&topo.lb.ns, &["unload", "--pin-dir", &pins, "--socket", &socket]);

    let err = unload().expect_err("lb unload while the daemon runs").to_string();
    assert!(err.contains("another lb daemon is running") && err.contains("systemctl stop lb"), "{err}");

    d.stop().unwrap();
    let state = d.socket.parent().unwrap().join("state.json");
    assert!(state.exists(), "the keeping stop wrote its state");
    tcp_hello(client, vip(false, 80)).expect("the stopped daemon's data plane still forwards");

    let out = unload().unwrap();
    assert!(out.contains("detached from eth0"), "{out}");
    assert!(!d.pin_dir.exists(), "pins left in {}", d.pin_dir.display());
    assert!(!state.exists(), "the state file is left");
    let link = topo.lb.ns.ip(&["-d", "link", "show", "eth0"]).unwrap();
    assert!(!link.contains("xdp"), "still attached:\n{link}");
    assert!(tcp_hello(client, vip(false, 80)).is_err(), "the VIP still answers after lb unload");
    assert_eq!(unload().unwrap().trim(), format!("nothing pinned in {pins}"));
}

/// A daemon killed (no clean stop) leaves its health probes' device, policy rule and routes;
/// `lb unload` removes them with the pins.
#[test]
fn unload_removes_the_probe_device_a_killed_daemon_left() {
    let topo = Topology::build(&TopologySpec { prefix: "unp".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, Path::new("/sys/fs/bpf/lb-test-unp-decap")).unwrap();
    let config = zones_toml(1) + &service_toml(&topo, "web", false, "", "", 80, &|_| false);
    let mut d = Daemon::start_keeping(&topo, "unp", &config).unwrap();
    let lb = &topo.lb.ns;
    wait_for("the probe device", std::time::Duration::from_secs(30), || lb.ip(&["link", "show", "lb-probe"]).ok())
        .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    d.kill();
    assert!(lb.ip(&["link", "show", "lb-probe"]).is_ok(), "a killed daemon cannot remove its device");
    let (pins, socket) = (d.pin_dir.to_str().unwrap().to_owned(), d.socket.to_str().unwrap().to_owned());
    let out = lb_in(lb, &["unload", "--pin-dir", &pins, "--socket", &socket]).unwrap();
    assert!(out.contains("removed the health probes' device lb-probe"), "{out}");
    assert!(lb.ip(&["link", "show", "lb-probe"]).is_err(), "the device is gone");
    let rules = lb.ip(&["rule", "show"]).unwrap();
    assert!(!rules.contains("0x4c42"), "the rule is gone: {rules}");
}
