//! End to end, change under load (issue 19 item 3): 1,000 long-lived TCP connections from
//! clients in two zones, each sending a line every 100 ms and checking the echo, while the test
//! flaps backends' health checks for real, reloads adding and removing backends, drains and
//! undrains, sends SIGHUP, swaps tables (health overrides, zonal affinity off and on) and
//! restarts the daemon keeping the data plane. Broken connections are counted per event and
//! printed; the promise is none on the backends the test leaves healthy and configured.
//!
//! Per zone: backends 1 and 2 are left alone ("kept"), backend 3 is flapped, drained and
//! overridden, backend 4 is removed and added by the reloads ("touched": counted, printed, not
//! asserted). CI runs 50 reloads and 2 flaps; `cargo xtask soak` runs 500 reloads and 10 flaps.
use lb_tests::e2e::*;
use lb_tests::load::{scale, Fleet, Timeline};
use lb_tests::netns::ChildGuard;
use lb_tests::topology::{Host, Topology, TopologySpec};
use std::collections::BTreeMap;
use std::time::Duration;

const HC_PORT: u16 = 81;
const CONNS: usize = 1000;
/// Drains outlast the test: a drained backend keeps its connections (counted as touched).
const KEYS: &str = "[service.connection_draining]\ndraining_timeout_sec = 600\n";
const ZONAL_OFF: &str = "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_DISABLED\"\n";

fn role(name: &str) -> char {
    name.chars().last().unwrap_or('?')
}

/// The test never touches backends 1 and 2 of a zone.
fn kept(name: &str) -> bool {
    matches!(role(name), '1' | '2')
}

fn config(topo: &Topology, with_churn: bool, zonal_off: bool) -> String {
    let include = |b: &Host| with_churn || role(&b.name) != '4';
    zones_toml(2)
        + &service_block(
            "web",
            false,
            "",
            &format!("{KEYS}\n{}", if zonal_off { ZONAL_OFF } else { "" }),
            HC_PORT,
            &backends_toml_where(topo, false, &include),
        )
}

#[test]
fn a_thousand_connections_survive_flaps_reloads_drains_sighup_swaps_and_a_restart() {
    lb_user::daemon::limits::raise_nofile().expect("raising RLIMIT_NOFILE");
    let topo = Topology::build(&TopologySpec { prefix: "cul".into(), zones: vec![(1, 4), (1, 4)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let mut checks: BTreeMap<String, ChildGuard> =
        topo.backends.iter().map(|b| (b.name.clone(), start_server(b, HC_PORT).unwrap())).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-cul-decap")).unwrap();
    let mut d = Daemon::start_keeping(&topo, "cul", &config(&topo, true, false)).unwrap();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let addr = |name: &str| topo.backend(name).unwrap().v4.to_string();
    let flapped = ["b1-3", "b2-3"];
    let (reloads, flaps) = (scale(50, 500), scale(2, 10));

    let per_client = CONNS / topo.clients.len();
    let mut fleets: Vec<Fleet> = topo
        .clients
        .iter()
        .map(|c| {
            Fleet::start(c, vip(false, 80), per_client, Duration::from_millis(100), Duration::from_secs(10))
                .unwrap_or_else(|e| fail(e, &d))
        })
        .collect();
    let all: Vec<String> = fleets.iter().flat_map(|f| f.backends.clone()).collect();
    println!("{} connections, per backend: {:?}", all.len(), tally(&all));
    let mut t = Timeline::default();
    let settle = || std::thread::sleep(Duration::from_secs(1));
    settle();

    for i in 1..=flaps {
        t.mark(format!("health flap {i}: checks of b1-3, b2-3 down"));
        for b in flapped {
            checks.get_mut(b).unwrap().stop();
        }
        wait_for("b1-3 and b2-3 to turn unhealthy", Duration::from_secs(60), || {
            flapped.iter().all(|b| d.is_healthy("web", &addr(b)).ok() == Some(false)).then_some(())
        })
        .unwrap_or_else(|e| fail(e, &d));
        t.mark(format!("health flap {i}: checks up"));
        for b in flapped {
            checks.insert(b.to_owned(), start_server(topo.backend(b).unwrap(), HC_PORT).unwrap());
        }
        wait_for("b1-3 and b2-3 to recover", Duration::from_secs(60), || {
            flapped.iter().all(|b| d.is_healthy("web", &addr(b)).ok() == Some(true)).then_some(())
        })
        .unwrap_or_else(|e| fail(e, &d));
        settle();
    }

    for i in 1..=reloads {
        // Odd reloads remove backend 4 of each zone, even ones add it back.
        let with = i.is_multiple_of(2);
        t.mark(format!("reload {i}: {} b1-4, b2-4", if with { "add" } else { "remove" }));
        d.rewrite_config(&config(&topo, with, false)).unwrap();
        d.cli(&["reload"]).unwrap_or_else(|e| fail(e, &d));
        std::thread::sleep(Duration::from_millis(300));
    }
    settle();

    t.mark("drain b1-3, b2-3");
    for b in flapped {
        d.cli(&["backend", "drain", "--service", "web", "--address", &addr(b)]).unwrap_or_else(|e| fail(e, &d));
    }
    settle();
    t.mark("undrain b1-3, b2-3");
    for b in flapped {
        d.cli(&["backend", "undrain", "--service", "web", "--address", &addr(b)]).unwrap_or_else(|e| fail(e, &d));
    }
    settle();

    t.mark("SIGHUP: add b1-4, b2-4");
    d.rewrite_config(&config(&topo, true, false)).unwrap();
    d.sighup().unwrap();
    wait_for("the SIGHUP reload", Duration::from_secs(30), || {
        let st = d.status().ok()?;
        (st.services.first()?.backends.len() == 8).then_some(())
    })
    .unwrap_or_else(|e| fail(e, &d));
    settle();

    t.mark("table swap: b1-3, b2-3 overridden unhealthy");
    for b in flapped {
        d.set_health("web", &addr(b), "unhealthy").unwrap_or_else(|e| fail(e, &d));
    }
    settle();
    t.mark("table swap: overrides back to auto");
    for b in flapped {
        d.set_health("web", &addr(b), "auto").unwrap_or_else(|e| fail(e, &d));
    }
    settle();
    t.mark("table swap: zonal affinity off (reload)");
    d.rewrite_config(&config(&topo, true, true)).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e, &d));
    settle();
    t.mark("table swap: zonal affinity on (reload)");
    d.rewrite_config(&config(&topo, true, false)).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e, &d));
    settle();

    t.mark("restart --keep-dataplane");
    d.restart().unwrap_or_else(|e| fail(e, &d));
    assert!(d.log().contains("adopting the pinned data plane"), "{}", d.log());
    std::thread::sleep(Duration::from_secs(3));

    let exchanges: u64 = fleets.iter().map(|f| f.exchanges()).sum();
    let breaks: Vec<_> = fleets.iter_mut().flat_map(|f| f.stop().unwrap_or_else(|e| fail(e, &d))).collect();
    let rows = t.rows(&breaks, &kept);
    println!("{reloads} reloads, {flaps} health flaps (CI: 50 and 2; `cargo xtask soak`: 500 and 10)");
    println!("{exchanges} echoes checked; broken connections per event:\n{}", Timeline::table(&rows));
    let on_kept: Vec<_> = breaks.iter().filter(|b| kept(&b.backend)).collect();
    assert!(
        on_kept.is_empty(),
        "{} connections on backends left healthy and configured broke (first: {:?})\n{}\n{}",
        on_kept.len(),
        on_kept.first(),
        Timeline::table(&rows),
        d.diagnostics()
    );
    let kept_conns = all.iter().filter(|b| kept(b)).count();
    assert!(kept_conns >= CONNS / 4, "too few connections on the kept backends: {:?}", tally(&all));
}
