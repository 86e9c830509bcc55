//! End to end: `lb backend drain`. No new flows reach the drained backend; an established
//! connection keeps being served by it until `connection_draining.draining_timeout_sec`, after
//! which its packets are treated as new and land on another backend (which resets it, as the
//! spec says the balancer itself never does). `lb backend undrain` lets new flows in again.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::time::Duration;

#[test]
fn drained_backend_gets_no_new_flows_and_keeps_old_ones_until_the_timeout() {
    let topo = Topology::build(&TopologySpec { prefix: "dr1".into(), zones: vec![(1, 3)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-dr1-decap")).unwrap();
    let cfg = format!(
        "{}[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\n\
         [service.connection_draining]\ndraining_timeout_sec = 10\n\n{}",
        zones_toml(1),
        backends_toml(&topo, false, &|_| false)
    );
    let d = Daemon::start(&topo, "dr1", &cfg).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let mut session = Session::open(client, vip(false, 80)).unwrap_or_else(|e| panic!("{e:#}\n{}", d.log()));
    let drained = session.greeting.clone();
    let addr = topo.backend(&drained).unwrap().v4.to_string();
    d.cli(&["backend", "drain", "--service", "web", "--address", &addr]).unwrap();
    let st = d.status().unwrap();
    let b = st.services[0].backends.iter().find(|b| b.address.to_string() == addr).unwrap().clone();
    assert!(b.draining, "{st:?}");
    let new = tcp_spread(client, vip(false, 80), 20).unwrap();
    assert!(!new.contains(&drained), "no new connection reaches the drained {drained}: {new:?}");
    assert_eq!(session.ask("still there").unwrap(), drained, "the established connection stays during the drain");
    // Past the timeout the kernel voids the flow: the next packet goes to another backend,
    // which knows no such connection and resets it.
    std::thread::sleep(Duration::from_secs(12));
    let after = session.ask("after the timeout");
    assert!(after.is_err(), "the connection outlived the drain timeout: {after:?}");
    assert!(tcp_spread(client, vip(false, 80), 10).unwrap().iter().all(|n| n != &drained));
    // Undrained: new flows reach it again (30 connections over 3 backends).
    d.cli(&["backend", "undrain", "--service", "web", "--address", &addr]).unwrap();
    assert!(
        tcp_spread(client, vip(false, 80), 30).unwrap().contains(&drained),
        "the undrained {drained} takes new flows"
    );
}
