//! End to end: `lb trace --client ADDR` against a running daemon prints the verdicts of real TCP
//! packets from that client (and none of another client's), each with its backend; the daemon
//! attaches the traced program only while the trace runs and its own program `lb` again after.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

const HC_PORT: u16 = 81;

/// The name of the XDP program on the balancer's eth0, as `ip -d link` shows it.
fn xdp_program(topo: &Topology) -> String {
    let out = topo.lb.ns.ip(&["-d", "link", "show", "eth0"]).unwrap();
    out.split_whitespace().skip_while(|w| *w != "prog/xdp").nth(4).unwrap_or_default().to_owned()
}

#[test]
fn trace_shows_a_clients_packets_and_restores_lb() {
    let topo = Topology::build(&TopologySpec { prefix: "trc".into(), zones: vec![(1, 2)], outside_clients: 1 })
        .expect("topology (needs root)");
    let config = zones_toml(1) + &service_toml(&topo, "web", false, "", "", HC_PORT, &|_| false);
    let _servers: Vec<_> =
        topo.backends.iter().flat_map(|b| [start_server(b, 80).unwrap(), start_server(b, HC_PORT).unwrap()]).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-trc-decap")).unwrap();
    let d = Daemon::start(&topo, "trc", &config).unwrap();
    for b in &topo.backends {
        let addr = b.addr(false).to_string();
        wait_for("backends healthy", Duration::from_secs(30), || d.is_healthy("web", &addr).ok().filter(|h| *h))
            .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    }
    assert_eq!(xdp_program(&topo), "lb");
    let client = topo.clients_in_zone(1).next().unwrap();
    let outsider = topo.clients.iter().find(|c| c.zone == 0).unwrap();

    let mut trace = Command::new(bin("lb"))
        .args(["trace", "--client", &client.v4.to_string(), "--count", "3", "--json", "--seconds", "60"])
        .arg("--socket")
        .arg(&d.socket)
        .arg("--pin-dir")
        .arg(&d.pin_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Started: it says so on stderr once the daemon attached the traced program.
    let mut stderr = BufReader::new(trace.stderr.take().unwrap());
    let mut said = String::new();
    stderr.read_line(&mut said).unwrap();
    assert!(said.starts_with("tracing on eth0"), "{said}\n{}", d.diagnostics());
    assert_eq!(xdp_program(&topo), "lb_traced");

    // The outsider first: none of its packets may show.
    let other = tcp_hello(outsider, vip(false, 80)).unwrap();
    let name = tcp_hello(client, vip(false, 80)).unwrap();
    let backend = topo.backend(&name).unwrap().v4.to_string();
    let out = trace.wait_with_output().unwrap();
    assert!(out.status.success(), "lb trace: {}", String::from_utf8_lossy(&out.stderr));
    let events: Vec<Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(events.len(), 3, "{events:?}");
    for e in &events {
        assert_eq!(e["client"], client.v4.to_string(), "only the client's packets ({other} served the other): {e}");
        assert_eq!(e["vip"], vip(false, 80).ip().to_string());
        assert_eq!(e["service"], "web");
        assert_eq!(e["backend"], backend.as_str(), "{e}");
        assert!(e["verdict"] == "tx" || e["verdict"] == "redirect", "{e}");
    }
    assert_eq!(events[0]["conntrack"], "new", "the SYN chose the backend: {}", events[0]);
    assert_eq!(events[1]["conntrack"], "hit", "{}", events[1]);

    // Over: the balancer's own program is back.
    wait_for("lb attached again", Duration::from_secs(10), || (xdp_program(&topo) == "lb").then_some(()))
        .unwrap_or_else(|e| panic!("{e:#}: {}\n{}", xdp_program(&topo), d.diagnostics()));
    assert!(d.log().contains("lb trace stopped: lb attached again"), "{}", d.log());
    // New connections still work.
    tcp_hello(client, vip(false, 80)).unwrap();
}
