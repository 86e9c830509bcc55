//! End to end: SPILL_CROSS_ZONE with spillover_ratio 0.8 (spec Z13a/Z13b) over real TCP through
//! the attached XDP program. Two zones with five backends each; two zone-2 backends go down.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::collections::BTreeSet;
use std::time::Duration;

const SPILL: &str =
    "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 0.8\n";
const DOWN: [&str; 2] = ["b2-4", "b2-5"];

fn spec(prefix: &str) -> TopologySpec {
    TopologySpec { prefix: prefix.into(), zones: vec![(1, 5), (1, 5)], outside_clients: 1 }
}

fn names(v: &[String]) -> BTreeSet<String> {
    v.iter().cloned().collect()
}

/// Z13a: zone-1 clients stay in zone 1 (5/5 ≥ 0.8). Z13b: zone-2 clients (3/5 < 0.8) spread
/// over all 8 healthy backends, roughly 5/8 of them landing in zone 1; never on a down one.
fn check_z13(topo: &Topology, d: &Daemon, v6: bool) {
    let target = vip(v6, 80);
    let client = |z: usize| topo.clients_in_zone(z).next().unwrap();
    let zone1 = tcp_spread(client(1), target, 30).unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    assert!(zone1.iter().all(|n| n.starts_with("b1-")), "Z13a: zone-1 clients stay in zone 1: {:?}", tally(&zone1));
    assert!(names(&zone1).len() >= 3, "Z13a: spread within zone 1: {:?}", tally(&zone1));

    let zone2 = tcp_spread(client(2), target, 80).unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    let t = tally(&zone2);
    assert!(zone2.iter().all(|n| !DOWN.contains(&n.as_str())), "Z13b: never an unhealthy backend: {t:?}");
    assert!(
        zone2.iter().any(|n| n.starts_with("b1-")) && zone2.iter().any(|n| n.starts_with("b2-")),
        "Z13b: both zones: {t:?}"
    );
    eprintln!("Z13b zone-2 client, v6={v6}: {t:?}");
    let in_zone1 = zone2.iter().filter(|n| n.starts_with("b1-")).count() as f64 / zone2.len() as f64;
    // Expected 5/8 = 0.625; binomial σ over 80 draws ≈ 0.054 (plus Maglev's small unevenness).
    assert!((0.40..=0.85).contains(&in_zone1), "Z13b: share in zone 1 {in_zone1:.2}, expected ≈ 0.625: {t:?}");
    assert!(names(&zone2).len() >= 6, "Z13b: spread over the 8 healthy backends: {t:?}");

    // A non-compatible client (outside every zone) gets the unrefined set: all 8 healthy.
    let outside = tcp_spread(client(0), target, 40).unwrap();
    let t = tally(&outside);
    assert!(outside.iter().all(|n| !DOWN.contains(&n.as_str())), "outside client: never an unhealthy backend: {t:?}");
    assert!(
        outside.iter().any(|n| n.starts_with("b1-")) && outside.iter().any(|n| n.starts_with("b2-")),
        "outside client spreads: {t:?}"
    );
}

/// The two zone-2 backends go down for real: their servers stop and the health checks notice.
/// When they come back, zone-2 clients are refined to zone 2 again (5/5 ≥ 0.8).
#[test]
fn z13_spill_ratio_08_real_health_checks_ipip_v4() {
    let topo = Topology::build(&spec("sp1")).expect("topology (needs root)");
    let mut servers: Vec<_> = topo.backends.iter().map(|b| (b.name.clone(), start_server(b, 80).unwrap())).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-sp1-decap")).unwrap();
    let cfg = zones_toml(2) + &service_toml(&topo, "web", false, "", SPILL, 80, &|_| false);
    let d = Daemon::start(&topo, "sp1", &cfg).unwrap();

    // All healthy: Z13a for both zones.
    let zone2 = tcp_spread(topo.clients_in_zone(2).next().unwrap(), vip(false, 80), 20)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    assert!(
        zone2.iter().all(|n| n.starts_with("b2-")),
        "all healthy: zone-2 clients stay in zone 2: {:?}",
        tally(&zone2)
    );

    for (name, guard) in servers.iter_mut() {
        if DOWN.contains(&name.as_str()) {
            guard.stop();
        }
    }
    let down_addrs: Vec<String> = DOWN.iter().map(|n| topo.backend(n).unwrap().v4.to_string()).collect();
    wait_for("health checks to mark b2-4 and b2-5 unhealthy", Duration::from_secs(30), || {
        down_addrs.iter().all(|a| d.is_healthy("web", a).ok() == Some(false)).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
    for a in &down_addrs {
        assert_eq!(
            d.backend_status("web", a).unwrap().health_source,
            lb_user::daemon::reply::HealthSource::HealthCheck
        );
    }
    check_z13(&topo, &d, false);

    // Recovery: servers back, checks pass, zone-2 clients refined to zone 2 again.
    for (name, guard) in servers.iter_mut() {
        if DOWN.contains(&name.as_str()) {
            *guard = start_server(topo.backend(name).unwrap(), 80).unwrap();
        }
    }
    wait_for("zone-2 clients to return to zone 2 after recovery", Duration::from_secs(30), || {
        let v = tcp_spread(topo.clients_in_zone(2).next().unwrap(), vip(false, 80), 20).ok()?;
        v.iter().all(|n| n.starts_with("b2-")).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
}

/// The same with IPv6 clients and backends (IP6IP6 + lb_decap), the backends taken down by
/// operator override.
#[test]
fn z13_spill_ratio_08_overrides_ipip_v6() {
    let topo = Topology::build(&spec("sp2")).expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-sp2-decap")).unwrap();
    let cfg = zones_toml(2) + &service_toml(&topo, "web", true, "", SPILL, 80, &|_| false);
    let d = Daemon::start(&topo, "sp2", &cfg).unwrap();
    for n in DOWN {
        d.set_health("web", &topo.backend(n).unwrap().v6.to_string(), "unhealthy").unwrap();
    }
    let st = d.status().unwrap();
    let zones = st.services[0].zones.clone();
    let eligible = |zone: &str| zones.iter().find(|z| z.client_zone.as_deref() == Some(zone)).map(|z| z.eligible.len());
    assert_eq!(eligible("zone-1"), Some(5), "{st:?}");
    assert_eq!(eligible("zone-2"), Some(8), "{st:?}");
    check_z13(&topo, &d, true);
}
