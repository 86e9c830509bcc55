//! End to end: `lb run` under a service manager (`Type=notify`, packaging/lb.service), with a
//! datagram socket of the test as NOTIFY_SOCKET. READY=1 comes only after the program is
//! attached and the tables are written: when it arrives, the daemon's log already says it
//! attached (the tables are written before the attach), the link is pinned and a connection to
//! the VIP reaches a backend. Then watchdog pings (WATCHDOG_USEC), RELOADING=1 .. READY=1 around
//! a SIGHUP, and STOPPING=1 on SIGTERM.
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The daemon and its files; stopped (SIGTERM, then SIGKILL) and removed on drop.
struct Run {
    child: Option<Child>,
    dir: PathBuf,
    pin_dir: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.pin_dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Run {
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("lb.log")).unwrap_or_default()
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().unwrap().id() as i32;
        // SAFETY: signalling our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }
}

/// The next notification (one datagram, `KEY=value` lines), or None after `timeout`.
fn next(sock: &UnixDatagram, timeout: Duration) -> Option<String> {
    sock.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Notifications until one has the line `want` (watchdog pings in between are skipped).
fn until(sock: &UnixDatagram, want: &str, run: &Run) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Some(msg) = next(sock, Duration::from_secs(1)) {
            let done = msg.lines().any(|l| l == want);
            seen.push(msg);
            if done {
                return seen;
            }
        }
    }
    panic!("no {want} within 60 s; got {seen:?}; log:\n{}", run.log());
}

#[test]
fn ready_comes_after_attach_and_tables_then_watchdog_reload_and_stop() {
    let topo = Topology::build(&TopologySpec { prefix: "sn1".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-sn1-decap")).unwrap();
    let cfg = format!(
        "{}[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\n{}",
        zones_toml(1),
        backends_toml(&topo, false, &|_| false)
    );
    let dir = PathBuf::from("/run/lb-test-sn1");
    let pin_dir = PathBuf::from("/sys/fs/bpf/lb-test-sn1");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&pin_dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("lb.toml"), &cfg).unwrap();
    let notify_path = dir.join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    let log = std::fs::File::create(dir.join("lb.log")).unwrap();
    let child = Command::new("nsenter")
        .arg(format!("--net=/run/netns/{}", topo.lb.ns.name()))
        .arg(bin("lb"))
        .args(["run", "--interface", "eth0", "--config"])
        .arg(dir.join("lb.toml"))
        .arg("--socket")
        .arg(dir.join("lb.sock"))
        .arg("--pin-dir")
        .arg(&pin_dir)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("WATCHDOG_USEC", "400000")
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut run = Run { child: Some(child), dir: dir.clone(), pin_dir: pin_dir.clone() };

    // READY=1, and at that moment everything it promises is already there.
    let seen = until(&notify, "READY=1", &run);
    let log = run.log();
    assert!(
        seen.len() == 1 && seen[0].contains("STATUS=1 services on eth0"),
        "READY=1 is the first notification: {seen:?}"
    );
    let attached = log.find("eth0: attached").unwrap_or_else(|| panic!("READY=1 before the attach; log:\n{log}"));
    let ready =
        log.find("ready: notifying the service manager").unwrap_or_else(|| panic!("no ready line; log:\n{log}"));
    assert!(attached < ready, "the attach is logged before READY=1; log:\n{log}");
    assert!(pin_dir.join("link_eth0").exists(), "the XDP link is pinned at READY=1");
    let client = topo.clients_in_zone(1).next().unwrap();
    let name = tcp_hello(client, vip(false, 80)).unwrap_or_else(|e| panic!("{e:#}; log:\n{}", run.log()));
    assert!(name.starts_with("b1-"), "a backend answers through the tables: {name}");

    // Watchdog pings, at about half of WATCHDOG_USEC.
    let started = Instant::now();
    let pings = (0..3)
        .filter(|_| next(&notify, Duration::from_secs(2)).is_some_and(|m| m.lines().any(|l| l == "WATCHDOG=1")))
        .count();
    assert_eq!(pings, 3, "watchdog pings; log:\n{}", run.log());
    assert!(started.elapsed() < Duration::from_secs(3), "pinged every ~200 ms: {:?}", started.elapsed());

    // SIGHUP: RELOADING=1 (with the monotonic time), then READY=1 again.
    run.signal(libc::SIGHUP);
    let seen = until(&notify, "RELOADING=1", &run);
    assert!(seen.last().unwrap().lines().any(|l| l.starts_with("MONOTONIC_USEC=")), "{seen:?}");
    until(&notify, "READY=1", &run);

    // SIGTERM: STOPPING=1, and the daemon exits cleanly.
    run.signal(libc::SIGTERM);
    until(&notify, "STOPPING=1", &run);
    let mut child = run.child.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit within 30 s of SIGTERM; log:\n{}", run.log());
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}; log:\n{}", run.log());
    assert!(!pin_dir.exists(), "detached and unpinned on SIGTERM");
}
