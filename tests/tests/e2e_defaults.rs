//! End to end with no configuration beyond the service: no `[dataplane]` tunnel source, no
//! health check, no backend `mac`, and no neighbour entry for the backends on the balancer (the
//! topology's permanent ones are removed). The daemon defaults the tunnel source to eth0's
//! primary address (logged) and keeps the backends' next hops resolved itself (managed
//! neighbour entries), so the very first IPIP / IP6IP6 connection is forwarded, and so is the
//! first L2_DSR one (the backend's MAC from that neighbour entry).
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};

#[test]
fn ipip_without_tunnel_source_health_check_or_neighbour_forwards_its_first_connection() {
    first_connection_without_neighbours("nd1", "", true, |d| {
        let log = d.log();
        assert!(log.contains("tunnel source 198.18.0.1: the primary address of eth0"), "{log}");
        assert!(log.contains("tunnel source 2001:db8::1: the primary address of eth0"), "{log}");
    });
}

/// Issue 16.5: L2_DSR without `mac`, as IPVS direct routing: the backend's MAC comes from the
/// balancer's neighbour table, which the daemon keeps resolved.
#[test]
fn l2_dsr_without_mac_health_check_or_neighbour_forwards_its_first_connection() {
    first_connection_without_neighbours("nd2", "forwarding = \"L2_DSR\"\n", false, |_| {});
}

/// One backend, its neighbour entries deleted on the balancer, a daemon with one service per
/// family (`keys` added, nothing else configured; `decap`: the backend strips tunnels with
/// `lb_decap`), then `check`; the first TCP connection to each VIP must reach the backend and
/// the balancer must hold a managed neighbour entry for it.
fn first_connection_without_neighbours(prefix: &str, keys: &str, decap: bool, check: impl FnOnce(&Daemon)) {
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 1)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = decap.then(|| {
        DecapGuard::attach(&topo, std::path::Path::new(&format!("/sys/fs/bpf/lb-test-{prefix}-decap"))).unwrap()
    });
    for b in &topo.backends {
        topo.lb.ns.ip(&["neigh", "del", &b.v4.to_string(), "dev", "eth0"]).unwrap();
        topo.lb.ns.ip(&["-6", "neigh", "del", &b.v6.to_string(), "dev", "eth0"]).unwrap();
    }
    let service = |name: &str, v6: bool| {
        let b = &topo.backends[0];
        format!("[[service]]\nname = \"{name}\"\nvip = \"{}\"\nprotocol = \"TCP\"\nports = [80]\n{keys}\n[[service.backend]]\naddress = \"{}\"\n\n", vip(v6, 80).ip(), b.addr(v6))
    };
    let d = Daemon::start(&topo, prefix, &(service("web4", false) + &service("web6", true))).unwrap();
    check(&d);
    let client = topo.clients_in_zone(1).next().unwrap();
    for v6 in [false, true] {
        let name = tcp_hello(client, vip(v6, 80))
            .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", d.diagnostics(), d.cli(&["stats"]).unwrap_or_default()));
        assert_eq!(name, topo.backends[0].name);
    }
    let neigh = topo.lb.ns.ip(&["neigh", "show", "dev", "eth0"]).unwrap();
    assert!(neigh.contains(&format!("{} ", topo.backends[0].v4)) && neigh.contains("managed"), "{neigh}");
}
