//! End to end: real TCP/UDP connections through the attached XDP program, zonal affinity.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::collections::BTreeSet;

fn names(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

fn service(topo: &Topology, spillover: &str, extra: &str, v6: bool) -> String {
    format!(
        "{}[[service]]\nname = \"web\"\nvip = \"{}\"\nprotocol = \"TCP\"\nports = [80]\n{extra}\n\
         [service.zonal_affinity]\nspillover = \"{spillover}\"\n\n\
         [service.health_check]\nprotocol = \"TCP\"\nport = 80\ncheck_interval_sec = 1\ntimeout_sec = 1\nhealthy_threshold = 1\nunhealthy_threshold = 2\n\n{}",
        zones_toml(3),
        vip(v6, 80).ip(),
        backends_toml(topo, v6, &|_| false)
    )
}

/// Zones 1 and 2 have two backends each, zone 3 has clients but no backends.
fn spec(prefix: &str) -> TopologySpec {
    TopologySpec { prefix: prefix.into(), zones: vec![(1, 2), (1, 2), (1, 0)], outside_clients: 1 }
}

#[test]
fn stay_within_zone_refine_replace_no_match_and_non_compatible_ipip() {
    let topo = Topology::build(&spec("ez1")).expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-ez1-decap")).unwrap();
    let d = Daemon::start(&topo, "ez1", &service(&topo, "ZONAL_AFFINITY_STAY_WITHIN_ZONE", "", false)).unwrap();
    let target = vip(false, 80);
    let zone = |z: usize| topo.clients_in_zone(z).next().unwrap();
    let zone1 = names(
        &tcp_spread(zone(1), target, 20)
            .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", d.log(), d.cli(&["stats"]).unwrap_or_default())),
    );
    assert_eq!(
        zone1,
        BTreeSet::from(["b1-1".to_string(), "b1-2".to_string()]),
        "refine: zone-1 clients stay in zone 1"
    );
    let zone2 = names(&tcp_spread(zone(2), target, 20).unwrap());
    assert_eq!(zone2, BTreeSet::from(["b2-1".to_string(), "b2-2".to_string()]));
    // Zone 3 has no backends: no zonal match, spread over all.
    let zone3 = names(&tcp_spread(zone(3), target, 24).unwrap());
    assert!(zone3.len() >= 3, "no zonal match spreads across zones: {zone3:?}");
    let outside = names(&tcp_spread(zone(0), target, 24).unwrap());
    assert!(
        outside.len() >= 3
            && outside.iter().any(|n| n.starts_with("b1"))
            && outside.iter().any(|n| n.starts_with("b2")),
        "non-compatible client spreads: {outside:?}"
    );
    assert!(udp_hello(zone(1), vip(false, 80)).is_err(), "a TCP service does not carry UDP to the VIP");

    // Replace: both zone-1 backends unhealthy -> zone-1 clients still land in zone 1.
    for a in ["198.18.11.1", "198.18.11.2"] {
        d.cli(&["backend", "set", "--service", "web", "--address", a, "--health", "unhealthy"]).unwrap();
    }
    let st = d.status().unwrap();
    assert_eq!(st.services[0].zones[0].affinity, "REPLACED", "{st:?}");
    let zone1 = names(&tcp_spread(zone(1), target, 20).unwrap());
    assert_eq!(
        zone1,
        BTreeSet::from(["b1-1".to_string(), "b1-2".to_string()]),
        "replace keeps zone-1 clients in zone 1"
    );
    let zone2 = names(&tcp_spread(zone(2), target, 20).unwrap());
    assert_eq!(zone2, BTreeSet::from(["b2-1".to_string(), "b2-2".to_string()]));
}
