//! End to end on 1500-byte links: a client uploads 1 MiB through an IPIP service and through
//! an IP6IP6 service, and the backend receives every byte (it echoes the upload back, directly
//! to the client). Full-size segments do not fit once encapsulated: the balancer answers them
//! with ICMP "fragmentation needed" / ICMPv6 "packet too big", and the client's TCP lowers its
//! segment size (path MTU discovery) instead of hanging.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};

fn upload(prefix: &str, v6: bool) {
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 1)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap =
        DecapGuard::attach(&topo, std::path::Path::new(&format!("/sys/fs/bpf/lb-test-{prefix}-decap"))).unwrap();
    let d = Daemon::start(&topo, prefix, &(zones_toml(1) + &service_toml(&topo, "up", v6, "", "", 80, &|_| false)))
        .unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let fail =
        |e: anyhow::Error| -> ! { panic!("{e:#}\n{}\n{}", d.diagnostics(), d.cli(&["stats"]).unwrap_or_default()) };
    let mut s = Session::open(client, vip(v6, 80)).unwrap_or_else(|e| fail(e));
    // One line of 1 MiB: the backend answers it with its name and the line.
    let line: String = (0..1 << 20).map(|i| (b'a' + (i % 26) as u8) as char).collect();
    assert_eq!(s.ask(&line).unwrap_or_else(|e| fail(e)), s.greeting);
    let stats: serde_json::Value = serde_json::from_str(&d.cli(&["stats", "--json"]).unwrap()).unwrap();
    assert!(stats["global"]["icmp_too_big_sent"].as_u64().unwrap() > 0, "{stats}");
}

#[test]
fn one_mib_upload_through_ipip_arrives_whole() {
    upload("pm4", false);
}

#[test]
fn one_mib_upload_through_ip6ip6_arrives_whole() {
    upload("pm6", true);
}
