//! End to end, scale-out (issue 18): three balancers behind a router's ECMP, each running `lb`
//! and a BIRD that announces the VIP while `lb` can serve it. Real TCP connections show that
//! traffic spreads over all three, that every balancer picks the same backend for a flow, and
//! that long-lived connections survive a balancer crash (SIGKILL), its return and a host drain:
//! the balancer ECMP moves a flow to has no connection-table entry for it and hashes the flow
//! with Maglev to the same backend.
use lb_tests::bgp::{balancer_addr, broken, ScaleOut, ScaleOutSpec};
use std::time::{Duration, Instant};

/// Long-lived connections per test.
const SESSIONS: usize = 150;

#[test]
fn balancers_behind_ecmp_keep_connections_through_crash_return_and_drain() {
    let spec = ScaleOutSpec { prefix: "lbso".into(), balancers: 3, backends: 6, clients: vec![2, 2] };
    let mut so = ScaleOut::build(&spec).expect("scale-out topology (needs root and bird2)");
    let config = so.lb_config();
    so.start_all(&config).unwrap();
    let announced = &so.balancers[0].lb().status().unwrap()["announce"];
    assert_eq!(announced["announced"], serde_json::json!(["198.18.0.100"]), "{announced}");
    let mut conns = so.open_sessions(SESSIONS).unwrap_or_else(|e| panic!("{e:#}\n{}", so.diagnostics()));
    assert!(broken(&mut conns, "hello").is_empty(), "{}", so.diagnostics());

    // Spread: the router's hash sends flows to every balancer, and each one's data plane
    // counted exactly those connections as new flows.
    let before = so.choices(&conns).unwrap();
    for i in 0..3 {
        let n = before.iter().filter(|&&c| c == i).count();
        assert!(n >= SESSIONS / 10, "balancer {i} carries {n} of {SESSIONS} flows");
        let (packets, new_flows) = (so.counter(i, "packets").unwrap(), so.counter(i, "new_flows").unwrap());
        println!("balancer lb{}: {n} flows by the router's hash; lb stats: {new_flows} new flows, {packets} packets", i + 1);
        assert_eq!(new_flows, n as u64, "lb stats of balancer {i}\n{}", so.diagnostics());
    }
    // Same choice everywhere: `lb explain` on every balancer names the backend the flow reached.
    for c in &conns {
        let reached = so.backend_addr(&c.backend).unwrap();
        for i in 0..3 {
            assert_eq!(so.explain(i, c.client, c.sport).unwrap(), reached, "balancer {i}, flow {}:{}", c.client, c.sport);
        }
    }

    // A crash: SIGKILL. Its TUN device and routes vanish, BIRD withdraws, the router drops the
    // path; its flows go to balancers without an entry for them, and continue.
    let victim = 1;
    let carried: Vec<usize> = (0..SESSIONS).filter(|&i| before[i] == victim).collect();
    so.balancers[victim].lb_mut().kill();
    let gone = so
        .wait_paths("the router to drop the killed balancer", Duration::from_secs(30), |h| !h.contains(&balancer_addr(victim)) && h.len() == 2)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", so.diagnostics()));
    let after = so.choices(&conns).unwrap();
    assert!(carried.iter().all(|&i| after[i] != victim));
    let failed = broken(&mut conns, "after the crash");
    let failed_carried = failed.iter().filter(|i| carried.contains(i)).count();
    println!(
        "SIGKILL of lb2: route withdrawn at the router after {} ms; of the {} connections it carried {} continued, {} broke; {} broke elsewhere",
        gone.as_millis(),
        carried.len(),
        carried.len() - failed_carried,
        failed_carried,
        failed.len() - failed_carried
    );
    assert!(failed_carried * 100 <= carried.len(), "more than 1 % of the killed balancer's connections broke: {failed:?}\n{}", so.diagnostics());
    assert!(failed.is_empty(), "connections broke: {failed:?}\n{}", so.diagnostics());

    // Back: a fresh start (no pinned data plane, empty connection table). Flows ECMP moves to
    // it continue as well.
    let _ = std::fs::remove_dir_all(&so.balancers[victim].lb().pin_dir);
    let started = Instant::now();
    so.balancers[victim].lb_mut().restart().unwrap();
    so.wait_paths("the router to route over the returned balancer", Duration::from_secs(30), |h| h.len() == 3)
        .unwrap_or_else(|e| panic!("{e:#}\n{}", so.diagnostics()));
    let back = started.elapsed();
    let now = so.choices(&conns).unwrap();
    let moved: Vec<usize> = (0..SESSIONS).filter(|&i| now[i] == victim).collect();
    assert!(!moved.is_empty(), "ECMP moved no flow to the returned balancer");
    let failed = broken(&mut conns, "after the return");
    println!("lb2 back: on the router {} ms after `lb run` started; {} connections moved to it, {} of all broke", back.as_millis(), moved.len(), failed.len());
    assert!(failed.is_empty(), "connections broke: {failed:?}\n{}", so.diagnostics());

    // A host drain of lb1: withdrawn at once, forwarding for the grace period, then a stop.
    let drained = 0;
    let carried = now.iter().filter(|&&c| c == drained).count();
    so.balancers[drained].lb().cli(&["backend", "drain", "--host"]).unwrap();
    let gone = so
        .wait_paths("the router to drop the drained balancer", Duration::from_secs(30), |h| !h.contains(&balancer_addr(drained)))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", so.diagnostics()));
    let failed = broken(&mut conns, "during the drain");
    assert!(failed.is_empty(), "connections broke during the drain: {failed:?}\n{}", so.diagnostics());
    let d = so.balancers[drained].lb_mut();
    lb_tests::e2e::wait_for("the drained lb to stop", Duration::from_secs(30), || d.exited().then_some(())).unwrap();
    assert!(!so.balancers[drained].host.ns.ip(&["link"]).unwrap().contains("lb-vips"), "the TUN device goes with the daemon");
    let failed = broken(&mut conns, "after the drain");
    println!("host drain of lb1: withdrawn after {} ms; {carried} connections it carried, {} of all broke", gone.as_millis(), failed.len());
    assert!(failed.is_empty(), "connections broke after the drain: {failed:?}\n{}", so.diagnostics());
}
