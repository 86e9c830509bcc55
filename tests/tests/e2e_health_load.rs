//! Issue #30 item 5: 1,000 backends checked every second on this 2-core machine. One backend
//! host holds the 1,000 addresses (routed to it by the balancer: one neighbour, not a thousand)
//! and one server on every address, and decapsulates; the daemon checks each at 1 s (TCP, IPIP:
//! through the data path, the default `path = "VIP"`; then `path = "DIRECT"`).
//! Once every backend is healthy, the daemon's descriptors and memory are sampled every second:
//! they stay bounded (each probe task holds at most its one connection, closed at its verdict or
//! timeout), and its CPU share is printed (not asserted: the machine is shared). The server
//! stopped, all 1,000 turn unhealthy; started again, healthy.
//!
//! `LB_HEALTH_LOAD_SECS` (default 10) sets the sampling time; BENCHMARKS.md's figures come from
//! `LB_HEALTH_LOAD_SECS=60 cargo test -p lb-tests --test e2e_health_load -- --nocapture`.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec, LB4, VIP4};
use lb_user::daemon::reply::Health;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const BACKENDS: u32 = 1000;

/// The i-th backend address: 198.18.200.0 onwards, on the segment (198.18.0.0/16).
fn address(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 200, 0)) + i)
}

/// Services of at most 250 backends each (the per-service limit): four on ports 80 to 83, all
/// checked on port 80.
const SERVICES: u32 = 4;

fn config(path: &str) -> String {
    let mut s = format!("[dataplane]\nencap_source_v4 = \"{LB4}\"\n\n");
    let per = BACKENDS / SERVICES;
    for k in 0..SERVICES {
        s += &format!(
            "[[service]]\nname = \"load{k}\"\nvip = \"{VIP4}\"\nprotocol = \"TCP\"\nports = [{}]\n\
             [service.health_check]\nprotocol = \"TCP\"\nport = 80\npath = \"{path}\"\ncheck_interval_sec = 1\n\
             timeout_sec = 1\nhealthy_threshold = 1\nunhealthy_threshold = 2\n\n",
            80 + k
        );
        for i in k * per..(k + 1) * per {
            s += &format!("[[service.backend]]\naddress = \"{}\"\n", address(i));
        }
    }
    s
}

/// User + system CPU seconds of process `pid` so far.
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap();
    // SAFETY: sysconf has no preconditions.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}

/// (healthy, unhealthy) backends over the `load*` services, from one `lb status`.
fn verdicts(d: &Daemon) -> Option<(usize, usize)> {
    let st = d.status().ok()?;
    let backends = st.services.iter().filter(|s| s.name.starts_with("load")).flat_map(|s| s.backends.iter());
    let (mut healthy, mut unhealthy) = (0, 0);
    for b in backends {
        if b.health == Health::Healthy {
            healthy += 1;
        } else {
            unhealthy += 1;
        }
    }
    Some((healthy, unhealthy))
}

fn run(topo: &Topology, prefix: &str, path: &str, secs: u64) {
    let backend = &topo.backends[0];
    let mut server = backend.ns.spawn(&[bin("lb-testsrv").to_str().unwrap(), "many", "0.0.0.0:80"]).unwrap();
    let started = Instant::now();
    let mut d = Daemon::start(topo, prefix, &config(path)).unwrap();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    wait_for("all 1,000 backends healthy", Duration::from_secs(180), || {
        verdicts(&d).filter(|(healthy, _)| *healthy == BACKENDS as usize)
    })
    .unwrap_or_else(|e| fail(e, &d));
    let settled = started.elapsed();
    let pid = d.pid().unwrap();
    let (cpu0, t0) = (cpu_seconds(pid), Instant::now());
    let (mut max_rss, mut max_fds) = (0u64, 0usize);
    let mut lost = 0;
    for _ in 0..secs {
        std::thread::sleep(Duration::from_secs(1));
        let (rss, fds) = d.usage().unwrap_or_else(|e| fail(e, &d));
        (max_rss, max_fds) = (max_rss.max(rss), max_fds.max(fds));
        lost = lost.max(verdicts(&d).map_or(0, |(_, unhealthy)| unhealthy));
    }
    let cpu = (cpu_seconds(pid) - cpu0) / t0.elapsed().as_secs_f64();
    let probes = d.cli(&["stats"]).unwrap_or_default();
    let sent = probes.lines().find(|l| l.contains("probe_sent")).unwrap_or("").trim().to_owned();
    println!(
        "path {path}: {BACKENDS} backends at 1 s: all healthy {:.1} s after the start; over {secs} s: daemon CPU {:.1} % of \
         one core, at most {max_fds} descriptors, at most {} MiB resident; backends lost meanwhile {lost}; {sent}",
        settled.as_secs_f64(),
        cpu * 100.0,
        max_rss / 1024
    );
    assert_eq!(lost, 0, "a backend of a healthy server turned unhealthy under load\n{}", d.diagnostics());
    // One probe connection per backend at most, plus the daemon's own (maps, sockets, logs).
    assert!(max_fds <= BACKENDS as usize + 200, "{max_fds} descriptors for {BACKENDS} backends");
    assert!(max_rss < 512 * 1024, "{max_rss} KiB resident");

    if path == "VIP" {
        server.stop();
        wait_for("all 1,000 unhealthy once the server stops", Duration::from_secs(120), || {
            verdicts(&d).filter(|(healthy, _)| *healthy == 0)
        })
        .unwrap_or_else(|e| fail(e, &d));
        server = backend.ns.spawn(&[bin("lb-testsrv").to_str().unwrap(), "many", "0.0.0.0:80"]).unwrap();
        wait_for("all 1,000 healthy again", Duration::from_secs(120), || {
            verdicts(&d).filter(|(healthy, _)| *healthy == BACKENDS as usize)
        })
        .unwrap_or_else(|e| fail(e, &d));
    }
    d.stop().unwrap();
    drop(server);
}

#[test]
fn a_thousand_backends_checked_every_second() {
    let secs = std::env::var("LB_HEALTH_LOAD_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let topo = Topology::build(&TopologySpec { prefix: "hld".into(), zones: vec![(1, 1)], outside_clients: 0 })
        .expect("topology (needs root)");
    // The 1,000 addresses on the backend's eth0 (one batch), routed to it by the balancer.
    let backend = &topo.backends[0];
    let batch = std::env::temp_dir().join("lb-test-hld-addrs");
    let lines: String = (0..BACKENDS).map(|i| format!("addr add {}/32 dev eth0\n", address(i))).collect();
    std::fs::write(&batch, lines).unwrap();
    backend.ns.ip(&["-batch", batch.to_str().unwrap()]).unwrap();
    let _ = std::fs::remove_file(&batch);
    let range = format!("{}/22", address(0));
    topo.lb.ns.ip(&["route", "add", &range, "via", &backend.v4.to_string()]).unwrap();
    // lb_decap for all of them (the interface's addresses).
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-hld-decap")).unwrap();
    for path in ["VIP", "DIRECT"] {
        run(&topo, "hld", path, secs);
    }
}
