//! End to end: health detection. Stopping a backend's server makes new flows avoid it once the
//! health checks notice (2 failures at 1 s); starting it again brings flows back (1 success).
//! A TCP service on port 80 and a UDP service on port 5353 share the backends; each probes its
//! own port, so stopping one server affects one service only.
use lb_tests::e2e::*;
use lb_tests::netns::ChildGuard;
use lb_tests::topology::{Topology, TopologySpec};
use std::collections::BTreeSet;
use std::time::Duration;

const UDP_PORT: u16 = 5353;

fn udp_service(topo: &Topology, v6: bool) -> String {
    format!(
        "[[service]]\nname = \"dns\"\nvip = \"{}\"\nprotocol = \"UDP\"\nports = [{UDP_PORT}]\n\n\
         [service.health_check]\nprotocol = \"TCP\"\nport = {UDP_PORT}\ncheck_interval_sec = 1\ntimeout_sec = 1\nhealthy_threshold = 1\nunhealthy_threshold = 2\n\n{}",
        vip(v6, UDP_PORT).ip(),
        backends_toml(topo, v6, &|_| false)
    )
}

fn run(prefix: &str, v6: bool) {
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 3)], outside_clients: 0 })
        .expect("topology (needs root)");
    let mut tcp: Vec<ChildGuard> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let mut udp: Vec<ChildGuard> = topo.backends.iter().map(|b| start_server(b, UDP_PORT).unwrap()).collect();
    let _decap =
        DecapGuard::attach(&topo, std::path::Path::new(&format!("/sys/fs/bpf/lb-test-{prefix}-decap"))).unwrap();
    let cfg = zones_toml(1) + &service_toml(&topo, "web", v6, "", "", 80, &|_| false) + &udp_service(&topo, v6);
    let d = Daemon::start(&topo, prefix, &cfg).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let (t_tcp, t_udp) = (vip(v6, 80), vip(v6, UDP_PORT));
    let all: BTreeSet<String> = topo.backends.iter().map(|b| b.name.clone()).collect();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let reach_tcp = || tcp_spread(client, t_tcp, 36).ok().map(|v| v.into_iter().collect::<BTreeSet<_>>());
    let reach_udp = || udp_spread(client, t_udp, 36).ok().map(|v| v.into_iter().collect::<BTreeSet<_>>());
    assert_eq!(reach_tcp(), Some(all.clone()), "TCP: all three backends\n{}", d.diagnostics());
    assert_eq!(reach_udp(), Some(all.clone()), "UDP: all three backends\n{}", d.diagnostics());

    // b1-2's TCP server stops: new TCP flows avoid it (every connection succeeds again).
    tcp[1].stop();
    let got = wait_for("TCP flows to avoid the stopped b1-2", Duration::from_secs(30), || {
        reach_tcp().filter(|s| !s.contains("b1-2"))
    })
    .unwrap_or_else(|e| fail(e));
    assert_eq!(got, BTreeSet::from(["b1-1".to_string(), "b1-3".to_string()]));
    assert!(!d.is_healthy("web", &topo.backends[1].addr(v6).to_string()).unwrap());
    // `lb status` shows each backend's last probe: the stopped one's error, the others' latency.
    let probes = d.status().unwrap_or_else(|e| fail(e)).probes;
    let last = |b: usize| {
        let addr = topo.backends[b].addr(v6);
        probes.iter().find(|p| p.service == "web" && p.address == addr).map(|p| p.last.clone())
    };
    let down = last(1).expect("a probed backend shows its last probe");
    assert!(!down.passed && down.error.as_deref().unwrap_or_default().contains("connect"), "{down:?}");
    let up = last(0).expect("a probed backend shows its last probe");
    assert!(up.passed && up.error.is_none() && up.latency_ms >= 0.0, "{up:?}");
    assert_eq!(reach_udp(), Some(all.clone()), "the UDP service still uses b1-2 (its own check passes)");

    // b1-3's UDP server stops (its probe port is 5353): UDP flows avoid it.
    udp[2].stop();
    let got = wait_for("UDP flows to avoid the stopped b1-3", Duration::from_secs(30), || {
        reach_udp().filter(|s| !s.contains("b1-3"))
    })
    .unwrap_or_else(|e| fail(e));
    assert_eq!(got, BTreeSet::from(["b1-1".to_string(), "b1-2".to_string()]));

    // Both come back.
    tcp[1] = start_server(&topo.backends[1], 80).unwrap();
    udp[2] = start_server(&topo.backends[2], UDP_PORT).unwrap();
    wait_for("TCP flows to reach b1-2 again", Duration::from_secs(30), || reach_tcp().filter(|s| *s == all))
        .unwrap_or_else(|e| fail(e));
    wait_for("UDP flows to reach b1-3 again", Duration::from_secs(30), || reach_udp().filter(|s| *s == all))
        .unwrap_or_else(|e| fail(e));
}

#[test]
fn health_checks_remove_and_restore_backends_v4() {
    run("he4", false);
}

#[test]
fn health_checks_remove_and_restore_backends_v6() {
    run("he6", true);
}
