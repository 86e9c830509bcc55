//! End to end: an established TCP connection keeps working and stays on its backend through
//! health changes, table swaps, reloads (`lb reload` and SIGHUP) and a daemon restart that keeps
//! the data plane (spec §1.4: DEFAULT_FOR_PROTOCOL persists TCP; zonal affinity and table
//! changes never touch existing entries).
//!
//! Backends serve the VIP on port 80 and answer health checks on port 81, so a backend can fail
//! its health check for real while its established connection on port 80 lives on.
use lb_tests::e2e::*;
use lb_tests::netns::ChildGuard;
use lb_tests::topology::{Topology, TopologySpec};
use std::collections::BTreeMap;
use std::time::Duration;

const HC_PORT: u16 = 81;

/// How packets reach the backends in one run.
#[derive(Clone, Copy)]
struct Mode {
    v6: bool,
    dsr: bool,
}

fn run(prefix: &str, mode: Mode) {
    let keys = if mode.dsr { "forwarding = \"L2_DSR\"\n" } else { "" };
    let config = |topo: &Topology, include: &dyn Fn(&str) -> bool| -> String {
        zones_toml(1)
            + &service_block(
                "web",
                mode.v6,
                keys,
                "",
                HC_PORT,
                &backends_toml_where(topo, mode.v6, &|b| include(&b.name)),
            )
    };
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 4)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let mut checks: BTreeMap<String, ChildGuard> =
        topo.backends.iter().map(|b| (b.name.clone(), start_server(b, HC_PORT).unwrap())).collect();
    // L2 DSR needs no decapsulation on the backends.
    let _decap = (!mode.dsr).then(|| {
        DecapGuard::attach(&topo, std::path::Path::new(&format!("/sys/fs/bpf/lb-test-{prefix}-decap"))).unwrap()
    });
    // b1-4 joins only with the first reload.
    let mut d = Daemon::start_keeping(&topo, prefix, &config(&topo, &|n| n != "b1-4")).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    let target = vip(mode.v6, 80);
    let addr = |name: &str| topo.backend(name).unwrap().addr(mode.v6).to_string();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };

    let mut s = Session::open(client, target).unwrap_or_else(|e| fail(e, &d));
    let home = s.greeting.clone();
    assert_eq!(s.ask("hello").unwrap(), home);
    let other = ["b1-1", "b1-2", "b1-3"].into_iter().find(|n| *n != home).unwrap();

    // 1. Its backend fails the health check for real: the connection persists (TCP,
    //    DEFAULT_FOR_PROTOCOL); new connections avoid the backend.
    checks.get_mut(&home).unwrap().stop();
    wait_for("the session's backend to turn unhealthy", Duration::from_secs(30), || {
        (d.is_healthy("web", &addr(&home)).ok() == Some(false)).then_some(())
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert_eq!(s.ask("while unhealthy").unwrap_or_else(|e| fail(e, &d)), home, "persists on its unhealthy backend");
    let fresh = tcp_spread(client, target, 16).unwrap_or_else(|e| fail(e, &d));
    assert!(!fresh.contains(&home), "new connections avoid the unhealthy {home}: {:?}", tally(&fresh));

    // 2. A health change elsewhere swaps the tables again.
    d.set_health("web", &addr(other), "unhealthy").unwrap();
    assert_eq!(s.ask("after a swap").unwrap(), home);
    d.set_health("web", &addr(other), "auto").unwrap();
    assert_eq!(s.ask("after a second swap").unwrap(), home);

    // The backend recovers; the connection is still where it was.
    checks.insert(home.clone(), start_server(topo.backend(&home).unwrap(), HC_PORT).unwrap());
    wait_for("the session's backend to recover", Duration::from_secs(30), || {
        d.is_healthy("web", &addr(&home)).ok().filter(|h| *h)
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert_eq!(s.ask("recovered").unwrap(), home);

    // 3. `lb reload` with a new backend: the Maglev tables change, the connection does not.
    d.rewrite_config(&config(&topo, &|_| true)).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e, &d));
    assert_eq!(s.ask("after lb reload").unwrap(), home);
    // b1-4 takes new connections once it passed its first check.
    d.wait_first_verdicts().unwrap_or_else(|e| fail(e, &d));
    let fresh = tcp_spread(client, target, 32).unwrap_or_else(|e| fail(e, &d));
    assert!(
        fresh.iter().any(|n| n == "b1-4"),
        "the reload took effect (b1-4 gets new connections): {:?}",
        tally(&fresh)
    );

    // 4. SIGHUP with another backend (not the session's) removed.
    let removed = ["b1-1", "b1-2", "b1-3"].into_iter().find(|n| *n != home).unwrap();
    d.rewrite_config(&config(&topo, &|n| n != removed)).unwrap();
    d.sighup().unwrap();
    wait_for("SIGHUP reload to apply", Duration::from_secs(30), || {
        let st = d.status().ok()?;
        (st.services[0].backends.len() == 3).then_some(())
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert_eq!(s.ask("after SIGHUP").unwrap(), home);
    let fresh = tcp_spread(client, target, 16).unwrap_or_else(|e| fail(e, &d));
    assert!(!fresh.iter().any(|n| n == removed), "removed {removed} gets no new connections: {:?}", tally(&fresh));

    // 5. Restart with the data plane kept: the connection carries on, new ones work.
    d.restart().unwrap_or_else(|e| fail(e, &d));
    assert!(d.log().contains("adopting the pinned data plane"), "{}", d.log());
    assert_eq!(s.ask("after restart").unwrap_or_else(|e| fail(e, &d)), home, "same backend after the restart");
    let fresh = tcp_spread(client, target, 16).unwrap_or_else(|e| fail(e, &d));
    assert!(
        fresh.len() == 16 && !fresh.iter().any(|n| n == removed),
        "new connections after the restart: {:?}",
        tally(&fresh)
    );
    let mut s2 = Session::open(client, target).unwrap();
    assert_eq!(s2.ask("new session").unwrap(), s2.greeting);
    assert_eq!(s.ask("still").unwrap(), home);
}

#[test]
fn session_survives_unhealthy_swap_reload_sighup_restart_ipip_v4() {
    run("es1", Mode { v6: false, dsr: false });
}

#[test]
fn session_survives_unhealthy_swap_reload_sighup_restart_l2dsr_v6() {
    run("es2", Mode { v6: true, dsr: true });
}
