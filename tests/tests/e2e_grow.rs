//! End to end: a configuration that outgrows the maps loaded at start is refused by a reload
//! (it asks for a restart), and the restart with `--keep-dataplane` that applies it, which
//! loads maps of other sizes, carries the connection table over: every established connection
//! keeps its backend, also where the grown configuration's Maglev table now points elsewhere.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use lb_user::error::ErrorKind;

/// Long-lived connections held through the restart.
const SESSIONS: usize = 48;

#[test]
fn a_restart_into_bigger_maps_keeps_every_connection() {
    let topo = Topology::build(&TopologySpec { prefix: "gr1".into(), zones: vec![(1, 5)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> =
        topo.backends.iter().flat_map(|b| [start_server(b, 80).unwrap(), start_server(b, 8008).unwrap()]).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-gr1-decap")).unwrap();
    let service = |name: &str, port: u16, include: &dyn Fn(&str) -> bool| {
        format!(
            "[[service]]\nname = \"{name}\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [{port}]\n\n{}",
            backends_toml_where(&topo, false, &|b| include(&b.name))
        )
    };
    // One service on four backends; the grown configuration adds b1-5 to it (its Maglev table
    // moves about a fifth of the flows) and eight services more: 9 services of 2 client
    // classes need more table slots than the 32 loaded for one.
    let small = zones_toml(1) + &service("web", 80, &|n| n != "b1-5");
    let mut grown = zones_toml(1) + &service("web", 80, &|_| true);
    for i in 1..=8 {
        grown += &service(&format!("extra{i}"), 8000 + i, &|_| true);
    }
    let mut d = Daemon::start_keeping(&topo, "gr1", &small).unwrap();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let mut sessions: Vec<Session> =
        (0..SESSIONS).map(|_| Session::open(client, vip(false, 80)).unwrap_or_else(|e| fail(e, &d))).collect();
    for s in &mut sessions {
        assert_eq!(s.ask("before").unwrap(), s.greeting);
    }

    // The reload does not fit the maps loaded at start: refused, nothing changes.
    d.rewrite_config(&grown).unwrap();
    let (code, err) = d.cli_failure(&["reload"]).expect("a reload beyond the loaded sizes is refused");
    assert_eq!(code, Some(ErrorKind::NeedsRestart.exit_code().into()), "{err}");

    // The restart applies it on maps of other sizes; the connection table comes along.
    d.restart().unwrap_or_else(|e| fail(e, &d));
    let log = d.log();
    assert!(log.contains("other sizes or layout") && log.contains("connections carried over"), "{log}");
    let kept = sessions.iter_mut().filter_map(|s| s.ask("after").ok().filter(|name| *name == s.greeting)).count();
    assert_eq!(
        kept,
        SESSIONS,
        "established connections that kept their backend across the restart\n{}",
        d.diagnostics()
    );
    // The grown configuration is live: b1-5 takes new connections, the new services answer.
    let fresh = tcp_spread(client, vip(false, 80), 40).unwrap_or_else(|e| fail(e, &d));
    assert!(fresh.iter().any(|n| n == "b1-5"), "b1-5 gets new connections: {:?}", tally(&fresh));
    assert_eq!(tcp_spread(client, vip(false, 8008), 1).unwrap_or_else(|e| fail(e, &d)).len(), 1);
}
