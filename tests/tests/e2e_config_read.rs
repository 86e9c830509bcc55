//! End to end (issue #31-4): a configuration file that cannot be read promptly does not freeze
//! the daemon. The file is replaced by a FIFO without a writer (what a hung network mount does
//! to a read); after SIGHUP and `lb reload` the daemon still answers `lb status` and still acts
//! on health events; both reloads are refused naming the file and why, logged and counted in
//! `lb status`. A file over the size limit is refused likewise; a good file then applies.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use lb_user::daemon::api::Request;
use lb_user::daemon::reply::Status;
use std::collections::BTreeSet;
use std::time::Duration;

/// One request on the control socket, with the read timeout of [`Daemon::raw`] (20 s): a
/// daemon whose loop is stuck fails the test instead of hanging it.
fn ask(d: &Daemon, req: &Request) -> anyhow::Result<serde_json::Value> {
    let mut line = serde_json::to_vec(req)?;
    line.push(b'\n');
    d.raw(&line)
}

fn status(d: &Daemon) -> Status {
    let reply = ask(d, &Request::Status).unwrap_or_else(|e| panic!("lb status must answer: {e:#}\n{}", d.log()));
    assert_eq!(reply["ok"], true, "{reply}");
    serde_json::from_value(reply["result"].clone()).unwrap()
}

fn mkfifo(path: &std::path::Path) {
    let _ = std::fs::remove_file(path);
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo: {}", std::io::Error::last_os_error());
}

#[test]
fn unreadable_config_is_refused_and_the_daemon_keeps_serving() {
    let topo = Topology::build(&TopologySpec { prefix: "cr1".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let mut servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-cr1-decap")).unwrap();
    let good = zones_toml(1) + &service_toml(&topo, "web", false, "", "", 80, &|_| false);
    let d = Daemon::start(&topo, "cr1", &good).unwrap();
    // The log only: `lb stats` would wait for ever on a daemon whose loop is stuck.
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n--- lb.log ---\n{}", d.log()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let reach = || tcp_spread(client, vip(false, 80), 24).ok().map(|v| v.into_iter().collect::<BTreeSet<String>>());
    let both: BTreeSet<String> = topo.backends.iter().map(|b| b.name.clone()).collect();
    assert_eq!(reach(), Some(both.clone()), "{}", d.log());
    let b2 = topo.backends[1].addr(false).to_string();

    // The file becomes a FIFO that nobody writes.
    mkfifo(&d.config);
    d.sighup().unwrap();
    let reply = ask(&d, &Request::Reload).unwrap_or_else(|e| fail(e));
    assert_eq!(reply["ok"], false, "a reload of a FIFO must be refused: {reply}");
    let err = reply["error"].as_str().unwrap().to_owned();
    for w in ["lb.toml", "cannot read configuration", "FIFO", "regular file"] {
        assert!(err.contains(w), "the refusal names {w:?}: {err}");
    }
    // Health events still flow: b1-2's server stops, and the checks take it out.
    servers[1].stop();
    wait_for("b1-2 to turn unhealthy while the file is a FIFO", Duration::from_secs(60), || {
        status(&d)
            .services
            .iter()
            .flat_map(|s| s.backends.iter())
            .any(|b| b.address.to_string() == b2 && b.health == lb_user::daemon::reply::Health::Unhealthy)
            .then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    wait_for("the SIGHUP refusal in the log", Duration::from_secs(30), || {
        d.log().lines().any(|l| l.contains("reload refused (SIGHUP)") && l.contains("FIFO")).then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    let st = status(&d);
    assert_eq!(st.reloads.refused, 2, "{:?}", st.reloads);
    assert!(st.reloads.last_refusal.as_deref().is_some_and(|e| e.contains("FIFO")), "{:?}", st.reloads);
    servers[1] = start_server(&topo.backends[1], 80).unwrap();

    // Over the size limit: refused before it is parsed.
    std::fs::remove_file(&d.config).unwrap();
    let pad = format!("# {}\n", "x".repeat(1 << 20));
    d.rewrite_config(&(good.clone() + &pad.repeat(17))).unwrap();
    let reply = ask(&d, &Request::Reload).unwrap_or_else(|e| fail(e));
    assert_eq!(reply["ok"], false, "{reply}");
    let err = reply["error"].as_str().unwrap();
    assert!(err.contains("lb.toml") && err.contains("larger than the limit"), "{err}");
    assert_eq!(status(&d).reloads.refused, 3);

    // A good file applies; the balancer served all along.
    d.rewrite_config(&good).unwrap();
    let reply = ask(&d, &Request::Reload).unwrap_or_else(|e| fail(e));
    assert_eq!(reply["ok"], true, "{reply}");
    let st = status(&d);
    assert_eq!((st.reloads.applied, st.reloads.refused, st.reloads.last_refusal.clone()), (1, 3, None));
    wait_for("both backends again", Duration::from_secs(60), || reach().filter(|s| *s == both))
        .unwrap_or_else(|e| fail(e));
    let human = d.cli(&["status"]).unwrap_or_else(|e| fail(e));
    assert!(!human.contains("last reload refused"), "{human}");
}
