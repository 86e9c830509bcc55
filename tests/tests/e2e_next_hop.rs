//! The balancer as the next hop of the routes between networks A and B, with three stateful
//! nftables firewalls behind it (issue 29; the scene: `lb_tests::next_hop`). Real TCP and UDP
//! from A to B through `lb run`, IPv4 and IPv6: with symmetric hashing every connection crosses
//! one firewall both ways (the firewalls' `seen` sets show it) and works; without it, a measured share breaks;
//! a failed firewall breaks only its own connections, and an added one takes new flows only.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::time::Duration;

use lb_tests::e2e::{wait_for, Daemon, Session};
use lb_tests::next_hop::{ask_all, open, require_nft, Scene, Seen, A6, B6};
use lb_tests::topology::Host;

const TCP: u8 = 6;
const UDP: u8 = 17;

fn port(s: &Session) -> u16 {
    s.local_addr().expect("local address").port()
}

/// One UDP request/response from A to B; A's source port.
fn udp_exchange(a: &Host, target: SocketAddr) -> anyhow::Result<u16> {
    a.ns.run(move || -> anyhow::Result<u16> {
        let s = UdpSocket::bind(if target.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" })?;
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
    // IPv6 the same way (::/0 routed; the firewalls' IPv4 addresses name them, their MACs
    // carry both families).
    let mut sessions6: Vec<Session> = open(&scene.a, scene.target6(), 60)
        .into_iter()
        .map(|s| s.expect("an IPv6 connection through a firewall"))
        .collect();
    assert!(ask_all(&mut sessions6, "6").iter().all(|&ok| ok), "every IPv6 connection answers");
    let udp6: Vec<u16> =
        (0..10).map(|_| udp_exchange(&scene.a, scene.target6()).expect("an IPv6 UDP exchange")).collect();
    let seen = seen_all(&scene);
    let ends6 = (IpAddr::V6(A6), IpAddr::V6(B6));
    let mut per_fw6 = [0usize; 3];
    for s in &sessions6 {
        per_fw6[Scene::firewall_of_flow(&seen, ends6, TCP, port(s)).unwrap_or_else(|e| panic!("IPv6: {e}"))] += 1;
    }
    for p in &udp6 {
        Scene::firewall_of_flow(&seen, ends6, UDP, *p).unwrap_or_else(|e| panic!("IPv6 UDP: {e}"));
    }
    println!("60 IPv6 connections per firewall: {per_fw6:?}");
    drop(sessions6);
    let status = d.cli(&["status"]).unwrap();
    assert!(status.contains("next hop for 0.0.0.0/0"), "{status}");
    let explain = d.cli(&Scene::explain_args()).unwrap();
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

/// Which firewall (0-based) each session crossed, both ways.
fn firewalls_of(scene: &Scene, sessions: &[Session]) -> Vec<usize> {
    let seen = seen_all(scene);
    sessions.iter().map(|s| Scene::firewall_of(&seen, TCP, port(s)).unwrap_or_else(|e| panic!("{e}"))).collect()
}

/// An active/standby pair (a failover policy, fw2 the failover backend): every connection goes
/// to the active fw1; when it fails, new connections go to fw2; when it is back, new ones go to
/// fw1 again while those opened on fw2 continue there (connections drain across a pool change,
/// spec §1.2).
#[test]
fn an_active_standby_pair_fails_over_and_back() {
    require_nft().unwrap();
    let scene = Scene::build("nhf", 2).unwrap();
    let d = Daemon::start_in(&scene.lb.ns, "next-hop-failover", &scene.config_active_standby()).unwrap();
    for fw in 0..2 {
        wait_health(&d, &scene, fw, true);
    }
    let target = scene.target();
    let active = open(&scene.a, target, 20).into_iter().map(|s| s.expect("a connection")).collect::<Vec<_>>();
    assert!(firewalls_of(&scene, &active).iter().all(|&fw| fw == 0), "all on the active fw1");

    scene.stop_firewall(0).unwrap();
    wait_health(&d, &scene, 0, false);
    let mut standby = open(&scene.a, target, 20).into_iter().map(|s| s.expect("a connection")).collect::<Vec<_>>();
    assert!(firewalls_of(&scene, &standby).iter().all(|&fw| fw == 1), "failed over to fw2");

    scene.start_firewall(0).unwrap();
    wait_health(&d, &scene, 0, true);
    let back = open(&scene.a, target, 20).into_iter().map(|s| s.expect("a connection")).collect::<Vec<_>>();
    assert!(firewalls_of(&scene, &back).iter().all(|&fw| fw == 0), "failed back to fw1");
    assert!(ask_all(&mut standby, "still").iter().all(|&ok| ok), "the connections on fw2 continue");
    assert!(firewalls_of(&scene, &standby).iter().all(|&fw| fw == 1));
}

/// The scene with one firewall, `lb run` on it, the firewall healthy.
fn one_firewall(prefix: &str) -> (Scene, Daemon) {
    require_nft().unwrap();
    let scene = Scene::build(prefix, 1).unwrap();
    let d = Daemon::start_in(&scene.lb.ns, &format!("next-hop-{prefix}"), &scene.config(1, true)).unwrap();
    wait_health(&d, &scene, 0, true);
    (scene, d)
}

/// A firewall whose route to B points back at the balancer: the packet returns from the MAC the
/// balancer would send it to and is dropped (`drop_loop`), not bounced between the two until its
/// TTL runs out.
#[test]
fn a_packet_a_firewall_routes_back_is_dropped_not_bounced() {
    let (scene, d) = one_firewall("nhl");
    scene.fws[0].ns.ip(&["route", "add", "198.18.20.5/32", "via", "198.18.10.1"]).unwrap();
    let opened = open(&scene.a, scene.target(), 1);
    assert!(opened[0].is_err(), "the connection cannot open through a looping firewall");
    let stats = d.cli(&["stats", "--json"]).unwrap();
    let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
    let get = |name: &str| v["global"][name].as_u64().unwrap_or_else(|| panic!("no counter {name}: {stats}"));
    let (looped, rx) = (get("drop_loop"), get("rx_packets"));
    println!("drop_loop {looped}, rx_packets {rx}");
    // One drop per SYN the client sent (a few retransmissions), not one per bounce.
    assert!(looped >= 1, "{stats}");
    assert!(looped <= 10, "{stats}");
}

/// An address the balancer's host gains while it runs (DHCP, an operator) stays the host's
/// inside the routed 0.0.0.0/0: the daemon follows the host's addresses and exempts the new one,
/// so a connection from A to it reaches the balancer's own stack instead of a firewall.
#[test]
fn an_address_the_balancer_gains_later_stays_its_own() {
    let (scene, d) = one_firewall("nhn");
    scene.lb.ns.ip(&["addr", "add", "198.18.20.99/24", "dev", "eth0"]).unwrap();
    let srv = lb_tests::e2e::bin("lb-testsrv");
    let _own = scene.lb.ns.spawn(&[srv.to_str().unwrap(), "LB", "198.18.20.99:9999"]).unwrap();
    let own: SocketAddr = "198.18.20.99:9999".parse().unwrap();
    let greeting = wait_for("the new address to be exempted", Duration::from_secs(60), || {
        lb_tests::e2e::tcp_hello(&scene.a, own).ok()
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", d.diagnostics()));
    assert_eq!(greeting, "LB");
    assert!(d.log().contains("this host's addresses changed"), "{}", d.log());
}
