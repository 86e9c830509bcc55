//! End to end: `lb run` beside a running daemon (same pin directory, another control socket)
//! is refused before it touches that daemon's data plane, and a start that fails after loading
//! (an interface that does not exist) removes what it made: no pins, no socket. A restart that
//! adopts the pinned data plane with a configuration that dropped a service stops serving it.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::process::Command;

#[test]
fn second_daemon_is_refused_and_a_failed_start_leaves_nothing() {
    let topo = Topology::build(&TopologySpec { prefix: "su1".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-su1-decap")).unwrap();
    let cfg = format!(
        "{}[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\n{}",
        zones_toml(1),
        backends_toml(&topo, false, &|_| false)
    );
    let d = Daemon::start(&topo, "su1", &cfg).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let before = tcp_spread(client, vip(false, 80), 12).unwrap_or_else(|e| panic!("{e:#}\n{}", d.log()));
    // (Without the connection-table scan's figures, which move on by themselves.)
    let status_now = || lb_user::daemon::reply::Status { clean_slots: None, ..d.status().unwrap() };
    let status = status_now();
    let lb_run = |socket: &std::path::Path, pin_dir: &std::path::Path, iface: &str| {
        Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", topo.lb.ns.name()))
            .arg(bin("lb"))
            .args(["run", "--interface", iface, "--config"])
            .arg(&d.config)
            .arg("--socket")
            .arg(socket)
            .arg("--pin-dir")
            .arg(pin_dir)
            .output()
            .unwrap()
    };

    // Same pins, another socket: refused, and the first daemon's data plane is untouched.
    let other = d.dir.join("other.sock");
    let out = lb_run(&other, &d.pin_dir, "eth0");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("another lb daemon is running with the pin directory"), "{out:?}");
    assert!(!other.exists(), "the refused daemon removed its socket");
    assert_eq!(status_now(), status);
    assert_eq!(tcp_spread(client, vip(false, 80), 12).unwrap().len(), before.len(), "the first daemon still serves");

    // Fresh pins, and an interface that does not exist: the start fails after loading and
    // pinning, and takes its pins and socket with it.
    let pins = std::path::PathBuf::from("/sys/fs/bpf/lb-test-su1-failed");
    let socket = d.dir.join("failed.sock");
    let out = lb_run(&socket, &pins, "nosuch0");
    assert!(!out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("nosuch0"), "{out:?}");
    assert!(!pins.exists(), "a failed start left {} behind", pins.display());
    assert!(!socket.exists(), "a failed start left its socket behind");
    assert_eq!(status_now(), status);
}

#[test]
fn a_restart_with_a_service_dropped_stops_serving_it() {
    let topo = Topology::build(&TopologySpec { prefix: "su2".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> =
        topo.backends.iter().flat_map(|b| [start_server(b, 80).unwrap(), start_server(b, 8080).unwrap()]).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-su2-decap")).unwrap();
    let service = |name: &str, port: u16| {
        format!(
            "[[service]]\nname = \"{name}\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [{port}]\n\n{}",
            backends_toml(&topo, false, &|_| false)
        )
    };
    let both = format!("{}{}{}", zones_toml(1), service("web", 80), service("alt", 8080));
    let mut d = Daemon::start_keeping(&topo, "su2", &both).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.log()) };
    tcp_spread(client, vip(false, 8080), 4).unwrap_or_else(|e| fail(e, &d));
    // Restart on the pinned data plane with `alt` gone from the configuration.
    d.rewrite_config(&format!("{}{}", zones_toml(1), service("web", 80))).unwrap();
    d.restart().unwrap_or_else(|e| fail(e, &d));
    assert!(d.log().contains("removed what the previous configuration left: 1 service keys"), "{}", d.log());
    assert!(tcp_spread(client, vip(false, 8080), 1).is_err(), "port 8080 is no longer balanced");
    assert_eq!(tcp_spread(client, vip(false, 80), 4).unwrap_or_else(|e| fail(e, &d)).len(), 4, "web still is");
}
