//! End to end, issue 35 item 2: the daemon scans its connection table and marks clean the Maglev
//! slots where no live entry names another backend; SYNs there go without the table and their
//! flows are inserted at their first ACK. Real TCP connections through the daemon: all slots
//! clean before any flow, connections counted `ct_syn_stateless` and tracked, a reload adding a
//! backend leaves dirty the slots of flows it would move (at most one per flow and table), and
//! the open connections keep their backends while new ones reach the added backend.
use lb_tests::e2e::*;
use lb_tests::topology::{Host, Topology, TopologySpec};
use std::time::Duration;

const HC_PORT: u16 = 81;
const SESSIONS: usize = 40;

/// Backends b1-1 .. b1-`n` in the service "web".
fn config(topo: &Topology, n: usize) -> String {
    let backends = backends_toml_where(topo, false, &|b: &Host| b.name.as_str() <= format!("b1-{n}").as_str());
    zones_toml(1) + &service_block("web", false, "", "", HC_PORT, &backends)
}

/// The global counter `name` of `lb stats --json`.
fn counter(d: &Daemon, name: &str) -> u64 {
    let stats: serde_json::Value = serde_json::from_str(&d.cli(&["stats", "--json"]).unwrap()).unwrap();
    stats["global"][name].as_u64().unwrap_or_else(|| panic!("no counter {name}: {stats}"))
}

#[test]
fn syns_in_clean_slots_make_no_entry_and_a_change_keeps_connections() {
    let topo = Topology::build(&TopologySpec { prefix: "dsy".into(), zones: vec![(1, 3)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _checks: Vec<_> = topo.backends.iter().map(|b| start_server(b, HC_PORT).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-dsy-decap")).unwrap();
    let d = Daemon::start(&topo, "dsy", &config(&topo, 2)).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let target = vip(false, 80);

    // No flow yet: the first scan finds every slot clean.
    let scanned = |what: &str, ok: &dyn Fn(&lb_user::daemon::reply::CleanSlots) -> bool| {
        wait_for(what, Duration::from_secs(60), || d.status().ok()?.clean_slots.filter(|c| ok(c)))
            .unwrap_or_else(|e| fail(e))
    };
    let first = scanned("a scan with every slot clean", &|c| c.slots > 0 && c.clean == c.slots);
    println!("first scan: {first:?}");

    let before = counter(&d, "ct_syn_stateless");
    let mut sessions: Vec<Session> =
        (0..SESSIONS).map(|_| Session::open(client, target).unwrap_or_else(|e| fail(e))).collect();
    let homes: Vec<String> = sessions.iter().map(|s| s.greeting.clone()).collect();
    for (s, home) in sessions.iter_mut().zip(&homes) {
        assert_eq!(&s.ask("tracked").unwrap_or_else(|e| fail(e)), home);
    }
    let stateless = counter(&d, "ct_syn_stateless") - before;
    assert!(stateless >= SESSIONS as u64, "every connection's SYN went without the table: {stateless}");
    let out = std::process::Command::new(bin("lb"))
        .args(["flows", "--json", "--pin-dir"])
        .arg(&d.pin_dir)
        .arg("--socket")
        .arg(&d.socket)
        .output()
        .expect("running lb flows");
    assert!(out.status.success(), "lb flows: {}", String::from_utf8_lossy(&out.stderr));
    let tracked: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let count = tracked["flows"].as_array().map_or(0, |a| a.len());
    assert!(count >= SESSIONS, "the first ACKs inserted the flows: {count} tracked\n{tracked}");

    // b1-3 joins: the slots of connections the new table moves stay dirty (the scan sees their
    // entries), at most one per connection; every connection keeps its backend.
    d.rewrite_config(&config(&topo, 3)).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e));
    // (Once its first probe passes: until then it takes no new connections.)
    wait_for("new connections to reach b1-3", Duration::from_secs(30), || {
        tcp_spread(client, target, 24).ok()?.iter().any(|b| b == "b1-3").then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    let after = scanned("a scan after the change", &|c| c.entries >= SESSIONS as u64 && c.clean < c.slots);
    let dirty = after.slots - after.clean;
    println!("after the reload: {after:?}, {dirty} dirty slots");
    // An entry is compared with each class table of its service (here two: zone-1's and the
    // one for clients outside every zone), so it keeps at most one slot of each dirty.
    assert!(dirty > 0 && dirty <= 2 * after.entries, "at most one dirty slot per table and moved flow: {after:?}");
    for (s, home) in sessions.iter_mut().zip(&homes) {
        assert_eq!(&s.ask("after the change").unwrap_or_else(|e| fail(e)), home);
    }
}
