//! `cargo xtask demo next-hop`: the balancer as the next hop of the routes between networks A
//! and B, with three stateful nftables firewalls behind it (`lb_tests::next_hop`). Shows the
//! routes A and B use, 60 long-lived connections spread over the firewalls (each seen by one
//! firewall in both directions), then one firewall failing: its connections break, the others
//! go on, and new connections go to the two left.

use crate::check_interrupt;
use anyhow::{Context, Result};
use lb_tests::e2e::{wait_for, Daemon, Session};
use lb_tests::next_hop::{ask_all, open, require_nft, Scene, B, PORT};
use std::time::Duration;

const CONNECTIONS: usize = 60;

/// Connections per firewall (from the firewalls' own flow records), and those no single
/// firewall saw both ways.
fn per_firewall(scene: &Scene, sessions: &[Session]) -> Result<(Vec<Vec<usize>>, usize)> {
    let seen: Vec<_> = (0..scene.fws.len()).map(|i| scene.seen(i)).collect::<Result<_>>()?;
    let mut by_fw = vec![Vec::new(); scene.fws.len()];
    let mut split = 0;
    for (i, s) in sessions.iter().enumerate() {
        match Scene::firewall_of(&seen, 6, s.local_addr()?.port()) {
            Ok(fw) => by_fw[fw].push(i),
            Err(_) => split += 1,
        }
    }
    Ok((by_fw, split))
}

fn healthy(d: &Daemon, scene: &Scene, fw: usize, want: bool) -> Result<()> {
    let addr = scene.fws[fw].v4.to_string();
    wait_for(&format!("{} healthy = {want}", scene.fws[fw].name), Duration::from_secs(60), || {
        (d.is_healthy("firewalls", &addr).ok()? == want).then_some(())
    })
}

pub fn run() -> Result<()> {
    require_nft()?;
    println!(
        "Building: client network A, server network B, the balancer, 3 stateful firewalls (namespaces demnh-*)..."
    );
    let scene = Scene::build("demnh", 3).context("building the next-hop scene (run as root)")?;
    let daemon = Daemon::start_in(&scene.lb.ns, "demo-next-hop", &scene.config(3, true))?;
    for fw in 0..3 {
        healthy(&daemon, &scene, fw, true)?;
    }
    println!("\nRoutes, as a cloud route would give them (the balancer is the next hop):");
    println!("  a# ip route   {}", scene.a.ns.ip(&["route", "show", "198.18.20.0/24"])?.trim());
    println!("  b# ip route   {}", scene.b.ns.ip(&["route", "show", "198.18.10.0/24"])?.trim());
    println!("\n{}", daemon.cli(&["status"])?);
    check_interrupt()?;

    let mut sessions: Vec<Session> = open(&scene.a, scene.target(), CONNECTIONS).into_iter().collect::<Result<_>>()?;
    let answered = ask_all(&mut sessions, "hello").iter().filter(|&&ok| ok).count();
    let (by_fw, split) = per_firewall(&scene, &sessions)?;
    println!("{CONNECTIONS} TCP connections from A to {B}:{PORT}: {answered} answered; per firewall (both directions seen by it):");
    for (i, conns) in by_fw.iter().enumerate() {
        println!("  {:<4} {:>3} connections", scene.fws[i].name, conns.len());
    }
    println!("  seen by no single firewall both ways: {split} (symmetric hashing)");
    println!("\n{}", daemon.cli(&Scene::explain_args())?);
    check_interrupt()?;

    println!("Stopping fw2 (its link goes down)...");
    scene.stop_firewall(1)?;
    healthy(&daemon, &scene, 1, false)?;
    let answered = ask_all(&mut sessions, "again");
    let broke: Vec<usize> = (0..CONNECTIONS).filter(|&i| !answered[i]).collect();
    let on_fw2 = by_fw[1].len();
    let broke_elsewhere = broke.iter().filter(|i| !by_fw[1].contains(i)).count();
    println!(
        "  fw2 carried {on_fw2} connections: {} of them broke; {broke_elsewhere} broke on fw1/fw3",
        broke.len() - broke_elsewhere
    );
    let fresh: Vec<Session> = open(&scene.a, scene.target(), 30).into_iter().collect::<Result<_>>()?;
    let (by_fw, _) = per_firewall(&scene, &fresh)?;
    println!(
        "  30 new connections: fw1 {}, fw2 {}, fw3 {} (the health checks took fw2 out)",
        by_fw[0].len(),
        by_fw[1].len(),
        by_fw[2].len()
    );
    println!("\n{}", daemon.cli(&["status"])?);
    Ok(())
}
