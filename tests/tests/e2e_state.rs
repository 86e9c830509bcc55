//! End to end: the daemon's state file. A `--keep-dataplane` restart over a state file that is
//! truncated or of the wrong shape starts anyway (the bad file moved aside, where is logged),
//! keeps forwarding the established connection and counts the fault in `lb status`.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};

#[test]
fn a_corrupt_state_file_is_moved_aside_and_forwarding_goes_on() {
    let topo = Topology::build(&TopologySpec { prefix: "stf".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    // IPIP forwarding: the backends decapsulate.
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-stf-decap")).unwrap();
    let mut d = Daemon::start_keeping(
        &topo,
        "stf",
        &(zones_toml(1) + &service_toml(&topo, "web", false, "", "", 80, &|_| false)),
    )
    .unwrap();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let mut s = Session::open(client, vip(false, 80)).unwrap_or_else(|e| fail(e, &d));
    let home = s.greeting.clone();
    let state = d.dir.join("state.json");
    let bad: [(&str, String); 2] = [
        ("truncated", {
            let text = std::fs::read_to_string(&state).expect("the daemon wrote its state");
            text[..text.len() / 2].to_owned()
        }),
        ("wrong shape", r#"{"generations": 3}"#.to_owned()),
    ];
    for (round, (what, text)) in bad.into_iter().enumerate() {
        d.stop().unwrap();
        std::fs::write(&state, &text).unwrap();
        d.restart().unwrap_or_else(|e| fail(e, &d));
        let log = d.log();
        let line = log
            .lines()
            .filter(|l| l.contains("cannot read the previous daemon's state"))
            .nth(round)
            .unwrap_or_else(|| panic!("{what}: no log line about the bad state file\n{log}"));
        let aside = line
            .split("moved it to ")
            .nth(1)
            .and_then(|r| r.split(';').next())
            .unwrap_or_else(|| panic!("{what}: the log does not say where the bad file went: {line}"));
        assert_eq!(std::fs::read_to_string(aside).unwrap(), text, "{what}: the bad file is kept at {aside}");
        assert_eq!(d.fault("state_file_quarantined").unwrap(), 1, "{what}: counted once by this daemon");
        assert_eq!(s.ask(what).unwrap_or_else(|e| fail(e, &d)), home, "{what}: the connection carries on");
        assert!(
            !tcp_hello(client, vip(false, 80)).unwrap_or_else(|e| fail(e, &d)).is_empty(),
            "{what}: new connections"
        );
        // The new daemon writes a good state file again.
        let fresh: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
        assert!(fresh.get("ids").is_some(), "{what}: {fresh}");
    }
}
