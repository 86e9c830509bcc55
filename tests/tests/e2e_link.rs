//! End to end: the daemon keeps its data plane through interface and pin changes.
//!
//! - The balancer's interface is deleted under a running daemon: the log says so, `lb status`
//!   reports it detached, and when it is created again the daemon attaches to it again and
//!   traffic flows; a start over the severed link a kept data plane left pinned replaces it.
//! - The pin directory is removed under a running daemon: the daemon holds its link, so the
//!   program stays attached; it notices the lost pins, says so in the log and `lb status`, and
//!   does not claim at exit that the data plane keeps running.
//! - The balancer's interface changes its MAC under a running daemon (a replaced NIC, VRRP): the
//!   daemon follows it, says so in the log and `lb status`, makes the backends' neighbour entries
//!   the change flushed again, and the established connection and new ones go on once the peers
//!   learn the new MAC, also past the data plane's cached next hops.
//! - A `--keep-dataplane` restart with one interface fewer: the new daemon detaches the one no
//!   longer listed (no program, no pin left) and says so in the log and `lb status`.
//! - `lb run --keep-dataplane` and `lb decap attach` under `ip netns exec` (a bpffs private to
//!   the command) are refused with a message that says why and what to use instead.
use lb_tests::e2e::*;
use lb_tests::netns::ChildGuard;
use lb_tests::topology::{Topology, TopologySpec};
use std::time::Duration;

fn config(topo: &Topology) -> String {
    format!(
        "{}[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\n{}",
        zones_toml(1),
        backends_toml(topo, false, &|_| false)
    )
}

/// A balancer with two backends serving port 80, and a daemon keeping its data plane.
fn balancer(prefix: &str) -> (Topology, Vec<ChildGuard>, DecapGuard, Daemon) {
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let decap =
        DecapGuard::attach(&topo, std::path::Path::new(&format!("/sys/fs/bpf/lb-test-{prefix}-decap"))).unwrap();
    let d = Daemon::start_keeping(&topo, prefix, &config(&topo)).unwrap();
    (topo, servers, decap, d)
}

#[test]
fn interface_deleted_and_recreated_under_the_daemon_and_at_start() {
    let (topo, _servers, _decap, mut d) = balancer("ln1");
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    assert_eq!(tcp_spread(client, vip(false, 80), 4).unwrap_or_else(|e| fail(e, &d)).len(), 4);
    assert_eq!(d.link_state().as_deref(), Some("attached"));

    // Deleted under the running daemon: logged, and `lb status` says detached.
    topo.delete_lb_link();
    wait_for("the daemon to notice eth0 is gone", Duration::from_secs(10), || {
        d.link_state().filter(|s| s.starts_with("detached"))
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert!(d.log().contains("interface eth0 was removed"), "{}", d.log());

    // Back: attached again, traffic flows.
    topo.recreate_lb_link("ln1");
    wait_for("the daemon to attach to eth0 again", Duration::from_secs(10), || {
        d.link_state().filter(|s| s == "attached")
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert!(d.log().contains("interface eth0 is back"), "{}", d.log());
    let back = wait_for("traffic through the new eth0", Duration::from_secs(20), || {
        tcp_spread(client, vip(false, 80), 4).ok()
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert_eq!(back.len(), 4);

    // The daemon exits keeping the data plane; the interface goes and comes back while none
    // runs, severing the pinned link: the next start replaces it.
    d.stop().unwrap();
    topo.delete_lb_link();
    topo.recreate_lb_link("ln1");
    d.restart().unwrap_or_else(|e| fail(e, &d));
    assert!(d.log().contains("severed"), "{}", d.log());
    assert_eq!(d.link_state().as_deref(), Some("attached"));
    let after = wait_for("traffic after a start over a severed link", Duration::from_secs(20), || {
        tcp_spread(client, vip(false, 80), 4).ok()
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert_eq!(after.len(), 4);
}

#[test]
fn pins_removed_under_the_daemon_are_reported_and_the_program_stays() {
    let (topo, _servers, _decap, mut d) = balancer("ln2");
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let mut s = Session::open(client, vip(false, 80)).unwrap_or_else(|e| fail(e, &d));
    assert_eq!(d.status().unwrap().pins, "ok");

    std::fs::remove_dir_all(&d.pin_dir).unwrap();
    // The daemon holds the link: the program stays attached and keeps the connection.
    assert_eq!(s.ask("after the pins went").unwrap_or_else(|e| fail(e, &d)), s.greeting);
    assert_eq!(tcp_spread(client, vip(false, 80), 4).unwrap_or_else(|e| fail(e, &d)).len(), 4);
    let pins = wait_for("the daemon to notice the lost pins", Duration::from_secs(15), || {
        d.status().ok().map(|st| st.pins).filter(|p| p != "ok")
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert!(pins.contains("lost"), "{pins}");
    assert!(d.log().contains("pins") && d.log().contains("were removed"), "{}", d.log());

    // Exiting cannot keep the data plane any more: the daemon says so.
    d.stop().unwrap();
    assert!(d.log().contains("the data plane stops with this daemon"), "{}", d.log());
    assert!(!d.log().contains("the data plane keeps running"), "{}", d.log());
}

#[test]
fn commands_that_pin_into_a_private_bpffs_are_refused() {
    let topo = Topology::build(&TopologySpec { prefix: "ln3".into(), zones: vec![(1, 1)], outside_clients: 0 })
        .expect("topology (needs root)");
    let dir = std::path::PathBuf::from("/run/lb-test-ln3");
    std::fs::create_dir_all(&dir).unwrap();
    let cfg = dir.join("lb.toml");
    std::fs::write(&cfg, config(&topo)).unwrap();
    let ip_netns_exec = |ns: &str, args: &[&str]| {
        // A regression would run the daemon: bounded, it fails instead of hanging.
        std::process::Command::new("timeout")
            .args(["30", "ip", "netns", "exec", ns])
            .arg(bin("lb"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = ip_netns_exec(
        topo.lb.ns.name(),
        &[
            "run",
            "--keep-dataplane",
            "--interface",
            "eth0",
            "--config",
            cfg.to_str().unwrap(),
            "--socket",
            dir.join("lb.sock").to_str().unwrap(),
            "--pin-dir",
            "/sys/fs/bpf/lb-test-ln3",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("private") && err.contains("nsenter --net"), "{out:?}");
    let out = ip_netns_exec(
        topo.backends[0].ns.name(),
        &["decap", "attach", "--interface", "eth0", "--pin-dir", "/sys/fs/bpf/lb-test-ln3-decap"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("private") && err.contains("nsenter --net"), "{out:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn interface_mac_changed_under_the_daemon_is_followed() {
    let (topo, _servers, _decap, d) = balancer("ln4");
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let mut s = Session::open(client, vip(false, 80)).unwrap_or_else(|e| fail(e, &d));
    assert_eq!(tcp_spread(client, vip(false, 80), 4).unwrap_or_else(|e| fail(e, &d)).len(), 4);

    let new_mac = "02:00:c6:12:fe:01";
    assert_ne!(topo.lb.mac, new_mac);
    topo.lb.ns.ip(&["link", "set", "eth0", "address", new_mac]).unwrap();
    // The peers learn the new MAC, as from the gratuitous ARP of a takeover (clients send to
    // the VIP through it, backends answer the health checks to it).
    for h in topo.clients.iter().chain(&topo.backends) {
        h.ns.ip(&["neigh", "replace", &topo.lb.v4.to_string(), "lladdr", new_mac, "dev", "eth0"]).unwrap();
    }

    let back = wait_for("new connections through the new MAC", Duration::from_secs(30), || {
        tcp_spread(client, vip(false, 80), 4).ok()
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert_eq!(back.len(), 4);
    // The MAC change flushed the balancer's neighbour entries (permanent and managed ones
    // too): the daemon makes its backends' entries again at once. Past the data plane's cached
    // next hops (1 s), the established connection's next packet is routed through them.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(s.ask("after the MAC changed").unwrap_or_else(|e| fail(e, &d)), s.greeting);
    assert_eq!(tcp_spread(client, vip(false, 80), 4).unwrap_or_else(|e| fail(e, &d)).len(), 4);
    let link = d.status().unwrap_or_else(|e| fail(e, &d)).links.into_iter().find(|l| l.interface == "eth0").unwrap();
    assert_eq!(link.state, "attached");
    let note = link.mac.unwrap_or_default();
    assert!(note.contains(new_mac) && note.contains("followed"), "{note:?}");
    assert!(d.log().contains(&format!("changed its MAC from {} to {new_mac}", topo.lb.mac)), "{}", d.log());
    let human = d.cli(&["status"]).unwrap_or_else(|e| fail(e, &d));
    assert!(human.contains(&format!("interface eth0: MAC changed from {} to {new_mac}", topo.lb.mac)), "{human}");
}

/// Whether `ifname` in the balancer's namespace has an XDP program (`ip link` shows `prog/xdp`).
fn has_xdp(topo: &Topology, ifname: &str) -> bool {
    topo.lb.ns.ip(&["-d", "link", "show", "dev", ifname]).unwrap().contains("prog/xdp")
}

#[test]
fn an_interface_dropped_across_a_kept_restart_is_detached_and_reported() {
    let (topo, _servers, _decap, mut d) = balancer("ln5");
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    // A second interface (one end of a veth pair), inside the topology's namespace.
    topo.lb.ns.ip(&["link", "add", "eth1", "type", "veth", "peer", "name", "eth1p"]).unwrap();
    topo.lb.ns.ip(&["link", "set", "eth1", "up"]).unwrap();
    topo.lb.ns.ip(&["link", "set", "eth1p", "up"]).unwrap();
    d.interfaces = vec!["eth0".into(), "eth1".into()];
    d.restart().unwrap_or_else(|e| fail(e, &d));
    let pin = d.pin_dir.join("link_eth1");
    assert!(pin.exists() && has_xdp(&topo, "eth1"), "{}", d.log());

    // Restarted keeping the data plane, with eth1 no longer listed.
    d.interfaces = vec!["eth0".into()];
    d.restart().unwrap_or_else(|e| fail(e, &d));
    assert!(!pin.exists(), "link_eth1 is still pinned\n{}", d.diagnostics());
    assert!(!has_xdp(&topo, "eth1"), "eth1 still has an XDP program\n{}", d.diagnostics());
    assert!(d.log().contains("interface eth1 is no longer listed"), "{}", d.log());
    let links = d.status().unwrap_or_else(|e| fail(e, &d)).links;
    let eth1 = links.iter().find(|l| l.interface == "eth1").unwrap_or_else(|| panic!("{links:?}"));
    assert!(eth1.state.starts_with("detached at start: no longer listed"), "{links:?}");
    let human = d.cli(&["status"]).unwrap_or_else(|e| fail(e, &d));
    assert!(human.contains("interface eth1: detached at start"), "{human}");
    // The listed interface was adopted and balances.
    assert_eq!(d.link_state().as_deref(), Some("attached"));
    assert_eq!(tcp_spread(client, vip(false, 80), 4).unwrap_or_else(|e| fail(e, &d)).len(), 4);
}
