//! Issue #30 item 1, end to end: health probes follow the packet's path. By default a probe is
//! addressed to the VIP and delivered to the one backend checked the way its client packets
//! are (IPIP / IP6IP6 here, L2 rewrite for L2_DSR), with the daemon's XDP program attached.
//! A backend whose VIP is removed from its loopback, and one whose decapsulator is detached,
//! still answer at their own address, but fail the default probe and get no new flows; fixed,
//! they are healthy again. A second service on the same backends with `path = "DIRECT"` keeps
//! them healthy, and its clients' connections to them are lost: the black hole the default
//! avoids.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec, VIP4, VIP6};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

/// The second service's port (its checks: `path = "DIRECT"`).
const DIRECT_PORT: u16 = 8080;

fn config(topo: &Topology, v6: bool, forwarding: &str) -> String {
    let check = |port: u16, path: &str| {
        format!(
            "[service.health_check]\nprotocol = \"TCP\"\nport = {port}\n{path}check_interval_sec = 1\ntimeout_sec = 1\n\
             healthy_threshold = 1\nunhealthy_threshold = 2\n\n"
        )
    };
    let vip = vip(v6, 80).ip();
    let backends = backends_toml(topo, v6, &|_| false);
    zones_toml(1)
        + &format!(
            "[[service]]\nname = \"web\"\nvip = \"{vip}\"\nprotocol = \"TCP\"\nports = [80]\nforwarding = \"{forwarding}\"\n\n{}{backends}",
            check(80, "")
        )
        + &format!(
            "[[service]]\nname = \"direct\"\nvip = \"{vip}\"\nprotocol = \"TCP\"\nports = [{DIRECT_PORT}]\nforwarding = \"{forwarding}\"\n\n{}{backends}",
            check(DIRECT_PORT, "path = \"DIRECT\"\n")
        )
}

/// The backends `service` holds healthy, by name.
fn healthy(d: &Daemon, topo: &Topology, service: &str, v6: bool) -> BTreeSet<String> {
    topo.backends
        .iter()
        .filter(|b| d.is_healthy(service, &b.addr(v6).to_string()).unwrap_or(false))
        .map(|b| b.name.clone())
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Connections from `client` to `target`: (backends that answered, connections that failed).
fn attempts(client: &lb_tests::topology::Host, target: SocketAddr, n: usize) -> (BTreeSet<String>, usize) {
    let mut seen = BTreeSet::new();
    let mut failed = 0;
    for _ in 0..n {
        match tcp_hello(client, target) {
            Ok(name) => {
                seen.insert(name);
            }
            Err(_) => failed += 1,
        }
    }
    (seen, failed)
}

fn run(prefix: &str, v6: bool, forwarding: &str) {
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 3)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _web: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _direct: Vec<_> = topo.backends.iter().map(|b| start_server(b, DIRECT_PORT).unwrap()).collect();
    let pins = std::path::PathBuf::from(format!("/sys/fs/bpf/lb-test-{prefix}-decap"));
    let _decap = DecapGuard::attach(&topo, &pins).unwrap();
    let d = Daemon::start(&topo, prefix, &config(&topo, v6, forwarding)).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let all = names(&["b1-1", "b1-2", "b1-3"]);
    wait_for("every backend healthy through the data path", Duration::from_secs(30), || {
        (healthy(&d, &topo, "web", v6) == all && healthy(&d, &topo, "direct", v6) == all).then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    let client = topo.clients_in_zone(1).next().unwrap();
    assert_eq!(attempts(client, vip(v6, 80), 30), (all.clone(), 0), "{}", d.diagnostics());
    // `lb status` says where each service's probes go.
    let text = d.cli(&["status"]).unwrap_or_else(|e| fail(e));
    let via = if forwarding == "L2_DSR" { "L2_DSR" } else { "IPIP" };
    let vip_ip = vip(v6, 80).ip();
    assert!(text.contains(&format!("health check: TCP port 80, through the VIP {vip_ip} ({via})")), "{text}");
    let direct_line = format!("health check: TCP port {DIRECT_PORT}, at the backends' own addresses (path DIRECT)");
    assert!(text.contains(&direct_line), "{text}");
    // The probes went through lb_probe (counted), not to the backends' own addresses.
    let sent = d.cli(&["stats"]).unwrap_or_else(|e| fail(e));
    assert!(sent.lines().any(|l| l.contains("probe_sent") && !l.trim_end().ends_with(" 0")), "{sent}");

    // Break b1-2: its VIP leaves its loopback. Break b1-3 (IPIP only): no decapsulation.
    let (b2, b3) = (topo.backend("b1-2").unwrap(), topo.backend("b1-3").unwrap());
    let vip_on_lo = |op: &str| {
        let (family, addr) = if v6 { ("-6", format!("{VIP6}/128")) } else { ("-4", format!("{VIP4}/32")) };
        let mut args = vec![family, "addr", op, addr.as_str(), "dev", "lo"];
        if v6 && op == "add" {
            args.push("nodad");
        }
        b2.ns.ip(&args).unwrap();
    };
    vip_on_lo("del");
    let encap = forwarding == "IPIP";
    let pin_dir = pins.to_str().unwrap().to_owned();
    if encap {
        lb_in(&b3.ns, &["decap", "detach", "--interface", "eth0", "--pin-dir", &pin_dir]).unwrap();
    }
    let broken: BTreeSet<String> = if encap { names(&["b1-1"]) } else { names(&["b1-1", "b1-3"]) };
    wait_for("the broken backends unhealthy by the default probe", Duration::from_secs(30), || {
        (healthy(&d, &topo, "web", v6) == broken).then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    // Their own addresses still answer: a probe of them would pass.
    for b in [b2, b3] {
        let own = SocketAddr::new(b.addr(v6), 80);
        assert_eq!(tcp_hello(client, own).unwrap_or_else(|e| fail(e)), b.name, "{} answers at its own address", b.name);
    }
    // The last probe says why.
    let probes = d.status().unwrap_or_else(|e| fail(e)).probes;
    let last = probes.iter().find(|p| p.service == "web" && p.address == b2.addr(v6)).expect("b1-2's last probe");
    assert!(!last.last.passed && last.last.error.is_some(), "{:?}", last.last);
    // New flows of the default service go to the working backends only, and all succeed.
    assert_eq!(attempts(client, vip(v6, 80), 30), (broken.clone(), 0), "{}", d.diagnostics());

    // `path = "DIRECT"`: the same backends stay healthy, and clients sent to them are lost.
    assert_eq!(healthy(&d, &topo, "direct", v6), all, "DIRECT probes the backends' own addresses");
    // Their clients' connections are lost. Shown with encapsulation, where both broken
    // backends drop them (no VIP, no decapsulation). With L2_DSR the test bed did not show the
    // loss reliably (one run in five saw no lost connection among 60), so there only the
    // verdicts above are checked.
    if encap {
        let (answered, lost) = attempts(client, vip(v6, DIRECT_PORT), 15);
        assert!(answered.is_subset(&broken), "only the working backends answer: {answered:?}");
        assert!(
            lost > 0,
            "the black hole: connections to the broken but healthy backends fail\n{}\n{}",
            d.cli(&["stats"]).unwrap_or_default(),
            d.diagnostics()
        );
    }

    // Fixed: healthy again, by the default probe.
    vip_on_lo("add");
    if encap {
        lb_in(&b3.ns, &["decap", "attach", "--interface", "eth0", "--pin-dir", &pin_dir]).unwrap();
    }
    wait_for("the fixed backends healthy again", Duration::from_secs(30), || {
        (healthy(&d, &topo, "web", v6) == all).then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    assert_eq!(attempts(client, vip(v6, 80), 30), (all, 0), "{}", d.diagnostics());

    // A clean stop takes the probe device, its rule and its routes away.
    let lb = &topo.lb.ns;
    assert!(lb.ip(&["link", "show", "lb-probe"]).is_ok(), "the probe device while running");
    let mut d = d;
    d.stop().unwrap();
    assert!(lb.ip(&["link", "show", "lb-probe"]).is_err(), "no probe device after a clean stop");
    for family in ["-4", "-6"] {
        let rules = lb.ip(&[family, "rule", "show"]).unwrap();
        assert!(!rules.contains("0x4c42"), "no probe rule after a clean stop: {rules}");
        let routes = lb.ip(&[family, "route", "show", "table", "19522"]).unwrap_or_default();
        assert!(routes.trim().is_empty(), "no probe routes after a clean stop: {routes}");
    }
}

#[test]
fn probes_follow_the_ipip_path() {
    run("hpa4", false, "IPIP");
}

#[test]
fn probes_follow_the_ip6ip6_path() {
    run("hpa6", true, "IPIP");
}

#[test]
fn probes_follow_the_l2_path() {
    run("hpl4", false, "L2_DSR");
}
