//! End to end: a bad reload (invalid values, broken TOML, a size change that needs a restart,
//! more service keys than the loaded data plane holds) is refused with the validation error — `lb reload` exits non-zero naming the field, SIGHUP
//! logs it — and the running tables keep serving exactly as before. A good reload then applies.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::collections::BTreeSet;
use std::time::Duration;

fn config(topo: &Topology, zonal: &str, dataplane: &str) -> String {
    zones_toml(2).replacen("[dataplane]\n", &format!("[dataplane]\n{dataplane}"), 1)
        + &service_toml(topo, "web", false, "", zonal, 80, &|_| false)
}

const STAY: &str = "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_STAY_WITHIN_ZONE\"\n";
/// Would spread zone-1 clients over both zones, if it were ever applied.
const DISABLED_BAD_RATIO: &str =
    "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_DISABLED\"\nspillover_ratio = 1.2\n";
const DISABLED: &str = "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_DISABLED\"\n";

#[test]
fn bad_reload_refused_running_tables_serve() {
    let topo = Topology::build(&TopologySpec { prefix: "rl1".into(), zones: vec![(1, 2), (1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-rl1-decap")).unwrap();
    let d = Daemon::start(&topo, "rl1", &config(&topo, STAY, "")).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let target = vip(false, 80);
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let zone1: BTreeSet<String> = ["b1-1", "b1-2"].iter().map(|s| s.to_string()).collect();
    let reach =
        || -> BTreeSet<String> { tcp_spread(client, target, 24).unwrap_or_else(|e| fail(e)).into_iter().collect() };
    assert_eq!(reach(), zone1);
    let mut s = Session::open(client, target).unwrap_or_else(|e| fail(e));
    let home = s.greeting.clone();
    let status_before = d.status().unwrap().services;

    // Each bad file: `lb reload` fails naming the problem; nothing changes.
    let bad = [
        (
            config(&topo, DISABLED_BAD_RATIO, ""),
            vec!["lb.toml", "service \"web\"", "zonal_affinity.spillover_ratio", "1.2"],
        ),
        (
            config(&topo, STAY, "").replace("protocol = \"TCP\"\nports", "protocol = \"TCP\nports"),
            vec!["lb.toml", "TOML parse error", "line"],
        ),
        (config(&topo, DISABLED, "maglev_table_size = 65537\n"), vec!["maglev_table_size", "restart"]),
        // Valid, but more service keys (one per port) than the loaded service table holds:
        // refused before anything is written.
        (
            config(&topo, DISABLED, "").replace(
                "ports = [80]",
                &format!("ports = [{}]", (80..380).map(|p| p.to_string()).collect::<Vec<_>>().join(", ")),
            ),
            vec!["does not fit the data plane", "restart", "service keys", "300"],
        ),
    ];
    for (text, words) in &bad {
        d.rewrite_config(text).unwrap();
        let err = match d.cli(&["reload"]) {
            Ok(out) => panic!("reload of a bad config succeeded: {out}\n{text}"),
            Err(e) => format!("{e:#}"),
        };
        for w in words {
            assert!(err.contains(w), "the error names {w:?}: {err}");
        }
        assert_eq!(d.status().unwrap().services, status_before, "status unchanged after refusing:\n{err}");
        assert_eq!(reach(), zone1, "the running tables still serve (zone 1 only) after refusing:\n{err}");
        assert_eq!(s.ask("still here").unwrap(), home);
    }

    // SIGHUP with the invalid ratio: refused in the log, tables unchanged.
    d.rewrite_config(&bad[0].0).unwrap();
    d.sighup().unwrap();
    wait_for("SIGHUP refusal in the log", Duration::from_secs(30), || {
        d.log().lines().any(|l| l.contains("reload refused") && l.contains("spillover_ratio")).then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    assert_eq!(d.status().unwrap().services, status_before);
    assert_eq!(reach(), zone1);

    // A good reload applies: zonal affinity off, zone-1 clients reach zone 2 as well.
    d.rewrite_config(&config(&topo, DISABLED, "")).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e));
    let got: BTreeSet<String> = tcp_spread(client, target, 32).unwrap_or_else(|e| fail(e)).into_iter().collect();
    assert!(got.len() >= 3 && got.iter().any(|n| n.starts_with("b2-")), "DISABLED spreads over both zones: {got:?}");
    assert_eq!(s.ask("after the good reload").unwrap(), home);
}
