//! `cargo xtask demo`: the spec's zonal-affinity example, live.
//!
//! Two client zones, five backends in each, `ZONAL_AFFINITY_SPILL_CROSS_ZONE` with a spill-over
//! ratio of 0.8. Clients in each zone open real TCP connections to the VIP through the XDP
//! balancer; then two zone-2 backends fail (their servers stop, the health checks notice) and
//! the clients connect again. Printed: where the connections landed, per client zone, before
//! and after, with a one-line reading. Everything is torn down at the end, also on Ctrl-C.
//!
//! `demo scale-out`: the second scene (`scale_out.rs`), three balancers behind ECMP with BGP.
//! `demo next-hop`: the third (`next_hop.rs`), the balancer as a route's next hop in front of
//! stateful firewalls.

mod next_hop;
mod scale_out;

use anyhow::{Context, Result};
use lb_tests::e2e::{self, Daemon, DecapGuard};
use lb_tests::netns::ChildGuard;
use lb_tests::topology::{Topology, TopologySpec};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
const CONNECTIONS: usize = 40;

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub(crate) fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        anyhow::bail!("interrupted; cleaning up");
    }
    Ok(())
}

fn config(topo: &Topology) -> String {
    format!(
        "{}[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\n\
         [service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 0.8\n\n\
         [service.health_check]\nprotocol = \"TCP\"\nport = 80\ncheck_interval_sec = 1\ntimeout_sec = 1\nhealthy_threshold = 1\nunhealthy_threshold = 2\n\n{}",
        e2e::zones_toml(2),
        e2e::backends_toml(topo, false, &|_| false)
    )
}

/// Connections per backend, for each client zone.
fn round(topo: &Topology) -> Result<BTreeMap<usize, BTreeMap<String, usize>>> {
    let mut out = BTreeMap::new();
    for zone in [1, 2] {
        let mut landed = BTreeMap::new();
        for c in topo.clients_in_zone(zone) {
            for _ in 0..CONNECTIONS / topo.clients_in_zone(zone).count() {
                check_interrupt()?;
                let name = e2e::tcp_hello(c, e2e::vip(false, 80))?;
                *landed.entry(name).or_insert(0) += 1;
            }
        }
        out.insert(zone, landed);
    }
    Ok(out)
}

fn print_round(title: &str, r: &BTreeMap<usize, BTreeMap<String, usize>>) {
    println!("\n{title}");
    for (zone, landed) in r {
        let in_zone: usize = landed.iter().filter(|(n, _)| n.starts_with(&format!("b{zone}-"))).map(|(_, c)| c).sum();
        let total: usize = landed.values().sum();
        let spread: Vec<String> = landed.iter().map(|(n, c)| format!("{n}:{c}")).collect();
        println!("  zone-{zone} clients: {in_zone}/{total} in their own zone   [{}]", spread.join(" "));
    }
}

fn run() -> Result<()> {
    let spec = TopologySpec { prefix: "demo".into(), zones: vec![(2, 5), (2, 5)], outside_clients: 0 };
    println!("Building the topology: 2 zones x (2 clients, 5 backends), one balancer (namespaces demo-*)...");
    let topo = Topology::build(&spec).context("building the namespace topology (run as root)")?;
    let mut servers: BTreeMap<String, ChildGuard> =
        topo.backends.iter().map(|b| Ok((b.name.clone(), e2e::start_server(b, 80)?))).collect::<Result<_>>()?;
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-demo-decap"))?;
    let daemon = Daemon::start(&topo, "demo", &config(&topo))?;
    println!(
        "lb daemon running in demo-lb with XDP on eth0; service web = 198.18.0.100:80, SPILL_CROSS_ZONE ratio 0.8"
    );
    check_interrupt()?;
    let before = round(&topo)?;
    print_round(&format!("Before the failure ({CONNECTIONS} connections per zone):"), &before);

    println!("\nStopping the servers of b2-4 and b2-5 (zone 2 now has 3 of 5 backends healthy)...");
    for name in ["b2-4", "b2-5"] {
        servers.get_mut(name).expect("backend").stop();
    }
    e2e::wait_for("the health checks to mark b2-4 and b2-5 unhealthy", Duration::from_secs(60), || {
        let st = daemon.status().ok()?;
        let unhealthy = st
            .services
            .first()?
            .backends
            .iter()
            .filter(|b| b.health == lb_user::daemon::reply::Health::Unhealthy)
            .count();
        (unhealthy == 2 || INTERRUPTED.load(Ordering::SeqCst)).then_some(())
    })?;
    check_interrupt()?;
    let after = round(&topo)?;
    print_round(&format!("After the failure ({CONNECTIONS} connections per zone):"), &after);
    println!("\n{}", daemon.cli(&["status"])?);
    println!(
        "Reading: zone 1 keeps 5/5 = 1.0 >= 0.8 healthy, so its clients stay in zone 1; zone 2 drops to 3/5 = 0.6 < 0.8,\n\
         so its clients spill over all 8 healthy backends of both zones, and no connection reaches the failed ones."
    );
    Ok(())
}

fn main() -> std::process::ExitCode {
    // SAFETY: installing a handler that only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let scene = std::env::args().nth(1);
    let result = match scene.as_deref() {
        None | Some("zonal") => run(),
        Some("scale-out") => scale_out::run(),
        Some("next-hop") => next_hop::run(),
        Some(other) => Err(anyhow::anyhow!("no scene {other:?}: zonal (default), scale-out or next-hop")),
    };
    match result {
        Ok(()) => {
            println!("\nDemo done; namespaces and pins removed.");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("demo: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
