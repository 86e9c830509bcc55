//! `cargo xtask demo scale-out`: three balancers behind a router's ECMP, each announcing the
//! VIP over BGP with BIRD (`lb_tests::bgp`). Shows the balancers and their announcements, the
//! router's multipath route, where 60 long-lived connections run, then a balancer killed with
//! SIGKILL: its route disappears from the router and its connections continue through the
//! others, on the same backends.

use crate::check_interrupt;
use anyhow::{Context, Result};
use lb_tests::bgp::{broken, ScaleOut, ScaleOutSpec, VIP_TABLE};
use lb_tests::topology::VIP4;
use std::time::{Duration, Instant};

const CONNECTIONS: usize = 60;

/// One row per balancer: address, what lb announces, the BGP session, the router's path, and
/// the connections the router's hash sends it.
fn print_balancers(so: &ScaleOut, choices: &[usize]) {
    let paths = so.paths().unwrap_or_default();
    println!(
        "  {:<5} {:<10} {:<8} {:<22} {:<12} {:<11} {:>11}",
        "", "address", "lb", "announced (table 100)", "BGP session", "router path", "connections"
    );
    for (i, b) in so.balancers.iter().enumerate() {
        let lb = b.daemon.as_ref().and_then(|d| d.status().ok());
        let announced = lb.as_ref().map(|s| {
            s.announce
                .as_ref()
                .map(|a| a.announced.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(","))
                .unwrap_or_default()
        });
        let bgp = b.bird.cli(&["show", "protocols", "uplink"]).unwrap_or_default();
        let session = if bgp.contains("Established") { "Established" } else { "down" };
        println!(
            "  {:<5} {:<10} {:<8} {:<22} {:<12} {:<11} {:>11}",
            b.host.name,
            b.host.v4.to_string(),
            if lb.is_some() { "running" } else { "killed" },
            announced.filter(|a| !a.is_empty()).unwrap_or_else(|| "-".into()),
            session,
            if paths.contains(&b.host.v4) { "yes" } else { "no" },
            choices.iter().filter(|&&c| c == i).count()
        );
    }
}

fn print_route(so: &ScaleOut) -> Result<()> {
    println!("  router# ip route show {VIP4}");
    for line in so.router.ip(&["route", "show", "exact", &format!("{VIP4}/32")])?.lines() {
        println!("    {line}");
    }
    Ok(())
}

pub fn run() -> Result<()> {
    let spec = ScaleOutSpec { prefix: "demso".into(), balancers: 3, backends: 6, clients: vec![2, 2] };
    println!("Building: a router (BIRD, ECMP with an L4 hash), 3 balancers (lb + BIRD each), 6 backends, 4 clients (namespaces demso-*)...");
    let mut so = ScaleOut::build(&spec)
        .context("building the scale-out topology (run as root; needs bird2: cargo xtask setup)")?;
    let config = so.lb_config();
    so.start_all(&config)?;
    check_interrupt()?;
    let mut conns = so.open_sessions(CONNECTIONS)?;
    let before = so.choices(&conns)?;
    println!("\nThe balancers announce the VIP {VIP4} (lb keeps a route in kernel table {VIP_TABLE}; BIRD exports it); {CONNECTIONS} long-lived TCP connections:");
    print_balancers(&so, &before);
    println!();
    print_route(&so)?;
    let same = conns.iter().all(|c| {
        let reached = so.backend_addr(&c.backend);
        (0..3).all(|i| so.explain(i, c.client, c.sport).ok() == reached)
    });
    println!(
        "\n  `lb explain` on each of the 3 balancers names, for every connection, the backend it reached: {}",
        if same { "yes" } else { "NO" }
    );
    check_interrupt()?;

    let victim = 1;
    println!("\nKilling lb on {} with SIGKILL...", so.balancers[victim].host.name);
    so.balancers[victim].daemon.as_mut().expect("running").kill();
    let gone = so.wait_paths("the router to drop the killed balancer", Duration::from_secs(30), |h| h.len() == 2)?;
    println!(
        "  the router's route lost it {} ms after the kill (TUN device gone with the process -> BIRD withdraws)\n",
        gone.as_millis()
    );
    print_route(&so)?;
    let started = Instant::now();
    let failed = broken(&mut conns, "after the crash");
    let after = so.choices(&conns)?;
    println!("\nEvery connection asked again ({} ms):", started.elapsed().as_millis());
    print_balancers(&so, &after);
    let carried: Vec<usize> = (0..CONNECTIONS).filter(|&i| before[i] == victim).collect();
    let lost = carried.iter().filter(|i| failed.contains(i)).count();
    println!(
        "\n  lb2 carried {} connections: {} continued on their backend through lb1/lb3 (no connection-table entry there: Maglev), {} broke; {} broke elsewhere.",
        carried.len(),
        carried.len() - lost,
        lost,
        failed.len() - lost
    );
    Ok(())
}
