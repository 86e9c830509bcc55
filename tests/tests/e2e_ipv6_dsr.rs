//! End to end: IPv6 clients and backends through IP6IP6 (lb_decap on the backends), and L2 DSR
//! forwarding (destination MAC rewrite, no encapsulation, no decap) for IPv4 and IPv6.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::collections::BTreeSet;

const STAY: &str = "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_STAY_WITHIN_ZONE\"\n";

fn spec(prefix: &str) -> TopologySpec {
    TopologySpec { prefix: prefix.into(), zones: vec![(1, 2), (1, 2)], outside_clients: 1 }
}

fn names(v: Vec<String>) -> BTreeSet<String> {
    v.into_iter().collect()
}

fn set(v: &[&str]) -> BTreeSet<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// STAY_WITHIN_ZONE: zone clients stay in their zone, the outside client spreads over both
/// zones; TCP sessions and (for a UDP service on the same VIP) datagrams get through.
fn check_zonal(topo: &Topology, d: &Daemon, v6: bool) {
    let target = vip(v6, 80);
    let client = |z: usize| topo.clients_in_zone(z).next().unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    assert_eq!(names(tcp_spread(client(1), target, 24).unwrap_or_else(|e| fail(e))), set(&["b1-1", "b1-2"]));
    assert_eq!(names(tcp_spread(client(2), target, 24).unwrap_or_else(|e| fail(e))), set(&["b2-1", "b2-2"]));
    let outside = names(tcp_spread(client(0), target, 40).unwrap_or_else(|e| fail(e)));
    assert!(outside.len() >= 3, "outside client spreads over both zones: {outside:?}");
    let mut s = Session::open(client(2), target).unwrap_or_else(|e| fail(e));
    for i in 0..5 {
        assert_eq!(s.ask(&format!("line {i}")).unwrap(), s.greeting);
    }
    let udp = names(udp_spread(client(1), vip(v6, 53), 24).unwrap_or_else(|e| fail(e)));
    assert_eq!(udp, set(&["b1-1", "b1-2"]), "UDP service, zone 1");
}

fn config(topo: &Topology, v6: bool, keys: &str) -> String {
    let udp = format!(
        "[[service]]\nname = \"dns\"\nvip = \"{}\"\nprotocol = \"UDP\"\nports = [53]\n{keys}\n{STAY}\n{}",
        vip(v6, 53).ip(),
        backends_toml(topo, v6, &|_| false)
    );
    zones_toml(2) + &service_toml(topo, "web", v6, keys, STAY, 80, &|_| false) + &udp
}

fn start_servers(topo: &Topology) -> Vec<lb_tests::netns::ChildGuard> {
    topo.backends.iter().flat_map(|b| [start_server(b, 80).unwrap(), start_server(b, 53).unwrap()]).collect()
}

#[test]
fn ipv6_ip6ip6_zonal() {
    let topo = Topology::build(&spec("v6i")).expect("topology (needs root)");
    let _servers = start_servers(&topo);
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-v6i-decap")).unwrap();
    let d = Daemon::start(&topo, "v6i", &config(&topo, true, "")).unwrap();
    check_zonal(&topo, &d, true);
}

#[test]
fn l2_dsr_v4() {
    let topo = Topology::build(&spec("ds4")).expect("topology (needs root)");
    let _servers = start_servers(&topo);
    let d = Daemon::start(&topo, "ds4", &config(&topo, false, "forwarding = \"L2_DSR\"\n")).unwrap();
    check_zonal(&topo, &d, false);
}

#[test]
fn l2_dsr_v6() {
    let topo = Topology::build(&spec("ds6")).expect("topology (needs root)");
    let _servers = start_servers(&topo);
    let d = Daemon::start(&topo, "ds6", &config(&topo, true, "forwarding = \"L2_DSR\"\n")).unwrap();
    check_zonal(&topo, &d, true);
}
