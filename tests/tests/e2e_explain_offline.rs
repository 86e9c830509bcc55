//! `lb explain --config FILE [--unhealthy ...]` (offline) gives the same answer as `lb explain`
//! against a daemon running that configuration with those backends unhealthy: JSON and text,
//! for clients of every zone and outside them, IPv4 and IPv6, several source ports.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::process::Command;
use std::time::Duration;

const HC_PORT: u16 = 81;
const SPILL: &str =
    "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 0.6\n";

fn offline(config: &std::path::Path, args: &[&str], unhealthy: &[String]) -> String {
    let mut cmd = Command::new(bin("lb"));
    cmd.arg("explain").arg("--config").arg(config).args(args);
    if !unhealthy.is_empty() {
        cmd.arg("--unhealthy").arg(unhealthy.join(","));
    }
    let out = cmd.output().expect("running lb explain --config");
    assert!(out.status.success(), "lb explain --config {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn offline_explain_agrees_with_the_daemon() {
    let topo = Topology::build(&TopologySpec { prefix: "exo".into(), zones: vec![(1, 3), (2, 2)], outside_clients: 1 })
        .expect("topology (needs root)");
    // Backends decapsulate: health probes reach them through the data path (IPIP).
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-exo-decap")).unwrap();
    let config = zones_toml(2)
        + &service_toml(&topo, "web", false, "", SPILL, HC_PORT, &|_| false)
        + &service_toml(&topo, "web6", true, "session_affinity = \"CLIENT_IP\"", "", HC_PORT, &|_| false);
    let _checks: Vec<_> = topo.backends.iter().map(|b| start_server(b, HC_PORT).unwrap()).collect();
    let d = Daemon::start(&topo, "exo", &config).unwrap();
    for b in &topo.backends {
        for (service, v6) in [("web", false), ("web6", true)] {
            let addr = b.addr(v6).to_string();
            wait_for("backends healthy", Duration::from_secs(30), || d.is_healthy(service, &addr).ok().filter(|h| *h))
                .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
        }
    }
    let compare = |unhealthy: &[String]| {
        for client in &topo.clients {
            for (service, v6) in [("web", false), ("web6", true)] {
                for sport in ["40000", "51234", "1025"] {
                    let ip = client.addr(v6).to_string();
                    let args = ["--service", service, "--client", &ip, "--sport", sport];
                    for json in [true, false] {
                        let args: Vec<&str> = args.iter().copied().chain(json.then_some("--json")).collect();
                        let live = d.cli(&[&["explain"], &args[..]].concat()).unwrap();
                        assert_eq!(offline(&d.config, &args, unhealthy), live, "{args:?} with {unhealthy:?} unhealthy");
                    }
                }
            }
        }
    };
    let zone1 = topo.clients_in_zone(1).next().unwrap().addr(false).to_string();
    let zone1_web = || d.cli(&["explain", "--service", "web", "--client", &zone1, "--json"]).unwrap();
    let before = zone1_web();
    compare(&[]);
    // Two of zone 1's three backends down: 1/3 < 0.6, zone 1's clients spill (IPv4 service).
    let down: Vec<String> = ["b1-1", "b1-2"].iter().map(|n| topo.backend(n).unwrap().addr(false).to_string()).collect();
    for a in &down {
        d.set_health("web", a, "unhealthy").unwrap();
    }
    // The state differs: zone 1's clients now spill (the why names the arithmetic).
    let after = zone1_web();
    assert_ne!(before, after);
    assert!(before.contains("REFINED") && after.contains("UNCHANGED"), "{before}\n{after}");
    compare(&down);
}
