//! End to end, the daemon under churn (issue 19 item 5): 200 reloads adding and removing a
//! backend, 10,000 control requests (status, stats, explain, health overrides and drains that
//! swap tables, malformed and refused ones), then the interface deleted and recreated under it
//! several times. Its descriptors return to the start count (give or take a few) and its RSS
//! grows less than a stated bound, and it keeps serving. `cargo xtask soak`: 1,000 reloads,
//! 100,000 requests, 20 interface cycles. (A single interface loss, a start over a severed
//! link and pins removed by someone else are `e2e_link`'s.)
use lb_tests::e2e::*;
use lb_tests::load::scale;
use lb_tests::topology::{Topology, TopologySpec};
use std::time::Duration;

/// RSS may grow this much over the whole run (allocator caches, the runtime's buffers).
const RSS_BOUND_KIB: u64 = 20 * 1024;
/// Descriptors back to the start count, give or take this many.
const FD_SLACK: usize = 4;

fn config(topo: &Topology, with_b3: bool) -> String {
    zones_toml(1)
        + &service_block("web", false, "", "", 80, &backends_toml_where(topo, false, &|b| with_b3 || b.name != "b1-3"))
}

/// Request `i` of the churn, and whether the daemon must accept it.
fn request(i: usize, b1: &str) -> (String, bool) {
    let svc = "\"service\":\"web\"";
    match i % 10 {
        0 => (r#"{"request":"status"}"#.into(), true),
        1 => (r#"{"request":"stats"}"#.into(), true),
        2 => (format!(r#"{{"request":"explain",{svc},"client":"198.18.1.10","dport":80,"proto":"tcp"}}"#), true),
        3 => (format!(r#"{{"request":"backend_set",{svc},"address":"{b1}","health":"unhealthy"}}"#), true),
        4 => (format!(r#"{{"request":"backend_set",{svc},"address":"{b1}","health":"auto"}}"#), true),
        5 => (format!(r#"{{"request":"backend_drain",{svc},"address":"{b1}"}}"#), true),
        6 => (format!(r#"{{"request":"backend_undrain",{svc},"address":"{b1}"}}"#), true),
        7 => (r#"{"request":"status""#.into(), false),
        8 => (r#"{"request":"no_such_request"}"#.into(), false),
        _ => (format!(r#"{{"request":"backend_drain","service":"nope","address":"{b1}"}}"#), false),
    }
}

#[test]
fn reloads_requests_and_interface_loss_leak_neither_descriptors_nor_memory() {
    let topo = Topology::build(&TopologySpec { prefix: "chn".into(), zones: vec![(1, 3)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-chn-decap")).unwrap();
    let d = Daemon::start(&topo, "chn", &config(&topo, true)).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = topo.clients_in_zone(1).next().unwrap();
    let serves = |when: &str| {
        let got = tcp_spread(client, vip(false, 80), 8).unwrap_or_else(|e| fail(e.context(when.to_owned())));
        assert_eq!(got.len(), 8, "{when}");
    };
    let b1 = topo.backends[0].v4.to_string();
    let (reloads, requests, cycles) = (scale(200, 1000), scale(10_000, 100_000), scale(3, 20));
    let reload = |i: usize| {
        d.rewrite_config(&config(&topo, i.is_multiple_of(2))).unwrap();
        let r = d.raw(b"{\"request\":\"reload\"}\n").unwrap_or_else(|e| fail(e));
        assert_eq!(r["ok"], true, "reload {i}: {r}\n{}", d.diagnostics());
    };
    let ask = |i: usize| {
        let (req, accepted) = request(i, &b1);
        let r = d.raw(format!("{req}\n").as_bytes()).unwrap_or_else(|e| fail(e.context(req.clone())));
        assert_eq!(r["ok"], accepted, "request {i} {req}: {r}");
    };

    // Warm up (allocator, runtime, caches), then the baseline.
    (0..4).for_each(reload);
    (0..100).for_each(ask);
    serves("at the start");
    let (rss0, fds0) = d.usage().unwrap();

    (0..reloads).for_each(reload);
    serves("after the reloads");
    let (rss1, fds1) = d.usage().unwrap();
    (0..requests).for_each(ask);
    serves("after the requests");
    let (rss2, fds2) = d.usage().unwrap();

    for i in 0..cycles {
        topo.delete_lb_link();
        wait_for("the daemon to notice eth0 is gone", Duration::from_secs(30), || {
            d.link_state().filter(|s| s.starts_with("detached"))
        })
        .unwrap_or_else(|e| fail(e.context(format!("cycle {i}"))));
        topo.recreate_lb_link("chn");
        wait_for("the daemon to attach to eth0 again", Duration::from_secs(30), || {
            d.link_state().filter(|s| s == "attached")
        })
        .unwrap_or_else(|e| fail(e.context(format!("cycle {i}"))));
        wait_for("traffic through the new eth0", Duration::from_secs(30), || {
            tcp_spread(client, vip(false, 80), 4).ok()
        })
        .unwrap_or_else(|e| fail(e.context(format!("cycle {i}"))));
    }
    let log = d.log();
    assert_eq!(log.matches("interface eth0 was removed").count(), cycles, "{log}");
    assert_eq!(log.matches("interface eth0 is back").count(), cycles, "{log}");
    let (rss3, fds3) = d.usage().unwrap();

    println!("bounds: RSS +{RSS_BOUND_KIB} KiB, descriptors +{FD_SLACK} over the start");
    println!("start:                        RSS {rss0:>7} KiB, {fds0} descriptors");
    println!("after {reloads:>6} reloads:         RSS {rss1:>7} KiB, {fds1} descriptors");
    println!("after {requests:>6} requests:        RSS {rss2:>7} KiB, {fds2} descriptors");
    println!("after {cycles:>6} interface cycles: RSS {rss3:>7} KiB, {fds3} descriptors");
    for (what, rss, fds) in [("reloads", rss1, fds1), ("requests", rss2, fds2), ("interface cycles", rss3, fds3)] {
        assert!(fds <= fds0 + FD_SLACK, "descriptors {fds0} -> {fds} after the {what}\n{}", d.diagnostics());
        assert!(rss <= rss0 + RSS_BOUND_KIB, "RSS {rss0} KiB -> {rss} KiB after the {what}\n{}", d.diagnostics());
    }
    assert!(!log.contains("panicked"), "{log}");
}
