//! End to end with no configuration beyond the service: no `[dataplane]` tunnel source, no
//! health check, and no neighbour entry for the backends on the balancer (the topology's
//! permanent ones are removed). The daemon defaults the tunnel source to eth0's primary
//! address (logged) and keeps the backends' next hops resolved itself (managed neighbour
//! entries), so the very first IPIP / IP6IP6 connection is forwarded.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};

#[test]
fn ipip_without_tunnel_source_health_check_or_neighbour_forwards_its_first_connection() {
    let prefix = "nd1";
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 1)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap =
        DecapGuard::attach(&topo, std::path::Path::new(&format!("/sys/fs/bpf/lb-test-{prefix}-decap"))).unwrap();
    for b in &topo.backends {
        topo.lb.ns.ip(&["neigh", "del", &b.v4.to_string(), "dev", "eth0"]).unwrap();
        topo.lb.ns.ip(&["-6", "neigh", "del", &b.v6.to_string(), "dev", "eth0"]).unwrap();
    }
    let service = |name: &str, v6: bool| {
        let b = &topo.backends[0];
        format!("[[service]]\nname = \"{name}\"\nvip = \"{}\"\nprotocol = \"TCP\"\nports = [80]\n\n[[service.backend]]\naddress = \"{}\"\n\n", vip(v6, 80).ip(), b.addr(v6))
    };
    let d = Daemon::start(&topo, prefix, &(service("web4", false) + &service("web6", true))).unwrap();
    let log = d.log();
    assert!(log.contains("tunnel source 198.18.0.1: the primary address of eth0"), "{log}");
    assert!(log.contains("tunnel source 2001:db8::1: the primary address of eth0"), "{log}");
    let client = topo.clients_in_zone(1).next().unwrap();
    for v6 in [false, true] {
        let name = tcp_hello(client, vip(v6, 80))
            .unwrap_or_else(|e| panic!("{e:#}\n{}\n{}", d.diagnostics(), d.cli(&["stats"]).unwrap_or_default()));
        assert_eq!(name, topo.backends[0].name);
    }
    let neigh = topo.lb.ns.ip(&["neigh", "show", "dev", "eth0"]).unwrap();
    assert!(neigh.contains(&format!("{} ", topo.backends[0].v4)) && neigh.contains("managed"), "{neigh}");
}
