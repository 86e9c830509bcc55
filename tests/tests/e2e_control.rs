//! End to end: the control socket of a real daemon. A client that connects and sends nothing
//! holds up neither other clients, nor a reload, nor SIGTERM; an oversized request and a
//! non-UTF-8 one each get an error reply, and the daemon's memory stays bounded. Operator
//! actions (accepted and refused) and health changes leave audit lines in the log.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

#[test]
fn stalled_oversized_and_non_utf8_clients() {
    let topo = Topology::build(&TopologySpec { prefix: "ctl".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    // Backends decapsulate: health probes reach them through the data path (IPIP).
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-ctl-decap")).unwrap();
    let mut servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let mut d =
        Daemon::start(&topo, "ctl", &(zones_toml(1) + &service_toml(&topo, "web", false, "", "", 80, &|_| false)))
            .unwrap();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };

    // Connected, silent: the others are served at once.
    let stalled: Vec<UnixStream> = (0..4).map(|_| UnixStream::connect(&d.socket).unwrap()).collect();
    let started = Instant::now();
    d.cli(&["status"]).unwrap_or_else(|e| fail(e, &d));
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e, &d));
    d.sighup().unwrap();
    wait_for("the SIGHUP reload in the log", Duration::from_secs(3), || {
        (d.log().matches("configuration reloaded").count() >= 2).then_some(())
    })
    .unwrap_or_else(|e| fail(e, &d));
    assert!(started.elapsed() < Duration::from_secs(4), "served while clients stall: {:?}", started.elapsed());

    // 300 MB without a newline: refused after the limit, memory stays bounded.
    let before = d.rss_kib().unwrap();
    let chunk = vec![b'x'; 1 << 20];
    let mut s = UnixStream::connect(&d.socket).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut sent = 0usize;
    while sent < 300 << 20 {
        match s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    assert!(sent < 300 << 20, "the daemon stopped reading an oversized request (took {sent} bytes)");
    let mut line = String::new();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    BufReader::new(&s).read_line(&mut line).unwrap();
    let resp: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(resp["ok"], false, "{line}");
    assert!(resp["error"].as_str().unwrap().contains("longer than"), "{line}");
    let after = d.rss_kib().unwrap();
    assert!(after < before + 16 * 1024, "RSS {before} KiB -> {after} KiB after an oversized request");

    let resp = d.raw(b"\xff\xfe{\"request\":\"status\"}\n").unwrap();
    assert_eq!(resp["ok"], false, "{resp}");
    assert!(resp["error"].as_str().unwrap().contains("not UTF-8"), "{resp}");
    let resp = d.raw(b"{\"request\":\"status\"}\n").unwrap();
    assert_eq!(resp["ok"], true, "{resp}");

    // Audit lines: operator actions, accepted and refused, and a health change with the
    // probe's error.
    let b1 = topo.backends[0].v4.to_string();
    let audited = |d: &Daemon, what: &str| {
        wait_for(what, Duration::from_secs(15), || {
            d.log().lines().any(|l| l.contains("audit") && l.contains(what)).then_some(())
        })
        .unwrap_or_else(|e| fail(e, d))
    };
    d.cli(&["backend", "drain", "--service", "web", "--address", &b1]).unwrap_or_else(|e| fail(e, &d));
    audited(&d, &format!("drain accepted (service web backend {b1})"));
    d.cli(&["backend", "undrain", "--service", "web", "--address", &b1]).unwrap_or_else(|e| fail(e, &d));
    audited(&d, &format!("undrain accepted (service web backend {b1})"));
    assert!(d.cli(&["backend", "drain", "--service", "nope", "--address", &b1]).is_err());
    audited(&d, &format!("drain refused (service nope backend {b1}): "));
    d.set_health("web", &b1, "healthy").unwrap_or_else(|e| fail(e, &d));
    audited(&d, &format!("override accepted (service web backend {b1} health Healthy)"));
    d.set_health("web", &b1, "auto").unwrap_or_else(|e| fail(e, &d));
    let good = std::fs::read_to_string(&d.config).unwrap();
    d.rewrite_config("[[service]]\nname = 1\n").unwrap();
    assert!(d.cli(&["reload"]).is_err());
    audited(&d, "reload refused (control socket): ");
    d.rewrite_config(&good).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e, &d));
    audited(&d, "reload accepted (control socket)");
    audited(&d, "reload accepted (SIGHUP)");
    servers[0].stop();
    audited(&d, &format!("health: service web backend {b1} is now unhealthy (last probe: connect: "));

    // SIGTERM with the silent clients still connected: a prompt, clean exit.
    let started = Instant::now();
    d.stop().unwrap_or_else(|e| fail(e, &d));
    assert!(started.elapsed() < Duration::from_secs(5), "SIGTERM took {:?}", started.elapsed());
    assert!(d.log().contains("detached and unpinned"), "{}", d.log());
    drop(stalled);
}

/// 80 idle and 20 half-sent connections from one process: `lb status` succeeds every time,
/// and the refusals are counted in `lb status`.
#[test]
fn slow_clients_do_not_lock_the_operator_out() {
    let topo = Topology::build(&TopologySpec { prefix: "ctlx".into(), zones: vec![(1, 1)], outside_clients: 0 })
        .expect("topology (needs root)");
    // Backends decapsulate: health probes reach them through the data path (IPIP).
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-ctlx-decap")).unwrap();
    let d = Daemon::start(&topo, "ctlx", &(zones_toml(1) + &service_toml(&topo, "web", false, "", "", 80, &|_| false)))
        .unwrap();
    let mut slow: Vec<UnixStream> = (0..80).map(|_| UnixStream::connect(&d.socket).unwrap()).collect();
    for _ in 0..20 {
        let mut s = UnixStream::connect(&d.socket).unwrap();
        let _ = s.write_all(b"{\"request\":");
        slow.push(s);
    }
    for i in 0..20 {
        if let Err(e) = d.cli(&["status"]) {
            panic!("lb status try {i} under 100 slow clients: {e:#}\n{}", d.diagnostics());
        }
    }
    assert!(d.fault("control_refused").unwrap() > 0, "refusals are counted");
    drop(slow);
}
