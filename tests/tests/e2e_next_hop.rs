//! The balancer as the next hop of the routes between networks A and B, with three stateful
//! nftables firewalls behind it (issue 29; the scene: `lb_tests::next_hop`). Real TCP and UDP
//! from A to B through `lb run`: with symmetric hashing every connection crosses one firewall
//! both ways (the firewalls' `seen` sets show it) and works; without it, a measured share breaks;
//! a failed firewall breaks only its own connections, and an added one takes new flows only.

use std::collections::BTreeSet;
use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use lb_tests::e2e::{wait_for, Daemon, Session};
use lb_tests::next_hop::{require_nft, Scene, Seen};
use lb_tests::topology::Host;

const TCP: u8 = 6;
const UDP: u8 = 17;

/// `n` connections from A to B opened at once; each is a session or why it failed.
fn open(a: &Host, target: SocketAddr, n: usize) -> Vec<anyhow::Result<Session>> {
    let mut all = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let opened: Vec<anyhow::Result<Session>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|_| s.spawn(|| Session::open(a, target))).collect();
            handles.into_iter().map(|h| h.join().expect("opening thread")).collect()
        });
        all.extend(opened);
    }
    all
}

/// Asks on every session at once: which answered (`B`) and which did not.
fn ask_all(sessions: &mut [Session], line: &str) -> Vec<bool> {
    std::thread::scope(|s| {
        let handles: Vec<_> =
            sessions.iter_mut().map(|sess| s.spawn(move || sess.ask(line).is_ok_and(|n| n == "B"))).collect();
        handles.into_iter().map(|h| h.join().expect("asking thread")).collect()
    })
}

fn port(s: &Session) -> u16 {
    s.local_addr().expect("local address").port()
}

/// One UDP request/response from A to B; A's source port.
fn udp_exchange(a: &Host, target: SocketAddr) -> anyhow::Result<u16> {
    a.ns.run(move || -> anyhow::Result<u16> {
        let s = UdpSocket::bind("0.0.0.0:0")?;
        s.connect(target)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [0u8; 64];
        for _ in 0..3 {
            s.send(b"ping")?;
            if let Ok(n) = s.recv(&mut buf) {
                anyhow::ensure!(&buf[..n] == b"B", "answer {:?}", String::from_utf8_lossy(&buf[..n]));
                return Ok(s.local_addr()?.port());
            }
        }
        anyhow::bail!("no UDP answer from {target}")
    })?
}

fn seen_all(scene: &Scene) -> Vec<BTreeSet<Seen>> {
    (0..scene.fws.len()).map(|i| scene.seen(i).expect("listing a firewall's flows")).collect()
}

fn wait_health(d: &Daemon, scene: &Scene, fw: usize, healthy: bool) {
    let addr = scene.fws[fw].v4.to_string();
    wait_for(&format!("{} healthy = {healthy}", scene.fws[fw].name), Duration::from_secs(60), || {
        (d.is_healthy("firewalls", &addr).ok()? == healthy).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.diagnostics()));
}

#[test]
fn stateful_firewalls_see_both_directions_and_only_a_failed_ones_connections_break() {
    require_nft().unwrap();
    let mut scene = Scene::build("nhs", 3).unwrap();
    let d = Daemon::start_in(&scene.lb.ns, "next-hop", &scene.config(3, true)).unwrap();
    for fw in 0..3 {
        wait_health(&d, &scene, fw, true);
    }
    let target = scene.target();

    // 300 TCP connections and 20 UDP exchanges: each works, and each crossed one firewall in
    // both directions.
    let mut sessions: Vec<Session> =
        open(&scene.a, target, 300).into_iter().map(|s| s.expect("a connection through a firewall")).collect();
    assert!(ask_all(&mut sessions, "1").iter().all(|&ok| ok), "every connection answers");
    let udp: Vec<u16> = (0..20).map(|_| udp_exchange(&scene.a, target).expect("a UDP exchange")).collect();
    let seen = seen_all(&scene);
    let mut per_fw = [0usize; 3];
    let fw_of: Vec<usize> =
        sessions.iter().map(|s| Scene::firewall_of(&seen, TCP, port(s)).unwrap_or_else(|e| panic!("{e}"))).collect();
    for &fw in &fw_of {
        per_fw[fw] += 1;
    }
    for p in &udp {
        Scene::firewall_of(&seen, UDP, *p).unwrap_or_else(|e| panic!("UDP: {e}"));
    }
    println!("300 connections per firewall: {per_fw:?}");
    assert!(per_fw.iter().all(|&n| n > 30), "the firewalls share the connections: {per_fw:?}");
    let status = d.cli(&["status"]).unwrap();
    assert!(status.contains("next hop for 0.0.0.0/0"), "{status}");
    let explain = d
        .cli(&[
            "explain",
            "--service",
            "firewalls",
            "--client",
            "198.18.10.2",
            "--dst",
            "198.18.20.5",
            "--dport",
            "8080",
        ])
        .unwrap();
    assert!(explain.contains("reverse flow") && explain.contains("symmetric true"), "{explain}");

    // fw2 fails: only its connections break; new ones go to the others.
    scene.stop_firewall(1).unwrap();
    wait_health(&d, &scene, 1, false);
    let answered = ask_all(&mut sessions, "2");
    for (i, ok) in answered.iter().enumerate() {
        assert_eq!(*ok, fw_of[i] != 1, "connection {i} (port {}) on fw{}", port(&sessions[i]), fw_of[i] + 1);
    }
    let fresh: Vec<Session> =
        open(&scene.a, target, 60).into_iter().map(|s| s.expect("a new connection avoids fw2")).collect();
    drop(fresh);

    // fw4 joins: the surviving connections keep their firewalls, new ones spread onto fw4 too.
    let mut survivors: Vec<Session> =
        sessions.into_iter().zip(&fw_of).filter(|(_, &fw)| fw != 1).map(|(s, _)| s).collect();
    let _fw4 = scene.add_firewall().unwrap();
    d.rewrite_config(&scene.config(4, true)).unwrap();
    d.sighup().unwrap();
    wait_health(&d, &scene, 3, true);
    assert!(ask_all(&mut survivors, "3").iter().all(|&ok| ok), "established connections keep working");
    let newer: Vec<Session> =
        open(&scene.a, target, 90).into_iter().map(|s| s.expect("a connection after fw4 joined")).collect();
    let fw4 = scene.seen(3).unwrap();
    let on_fw4 = |s: &Session| fw4.iter().any(|f| f.3 == port(s) || f.4 == port(s));
    assert!(!survivors.iter().any(on_fw4), "no established connection moved to fw4");
    let moved = newer.iter().filter(|s| on_fw4(s)).count();
    println!("{moved} of 90 new connections crossed fw4");
    assert!(moved > 0, "fw4 takes new connections");
}

/// The control: the same scene without symmetric hashing. A reply hashed to another firewall
/// than its connection's opening packet is dropped there (conntrack: invalid), so about two in
/// three connections never open.
#[test]
fn without_symmetric_hashing_a_share_of_connections_breaks() {
    require_nft().unwrap();
    let scene = Scene::build("nha", 3).unwrap();
    let d = Daemon::start_in(&scene.lb.ns, "next-hop-asym", &scene.config(3, false)).unwrap();
    for fw in 0..3 {
        wait_health(&d, &scene, fw, true);
    }
    let opened = open(&scene.a, scene.target(), 60);
    let broken = opened.iter().filter(|s| s.is_err()).count();
    println!("without symmetric hashing, {broken} of 60 connections through stateful firewalls failed");
    assert!(broken >= 10, "{broken} of 60");
}
