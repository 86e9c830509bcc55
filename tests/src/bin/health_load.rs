//! What checking 1,000 backends every second costs the daemon (issue #30 item 5; run by
//! `cargo xtask bench --health-load`, needs root). Topology, server and sampling:
//! `lb_tests::health_load`; recorded figures: BENCHMARKS.md, "Health checks: 1,000 backends at 1 s".
//!
//! Per run (along each path, `VIP` then `DIRECT`, each check, TCP and HTTP): starts `lb` (the one
//! built next to this binary) with 1,000 backends checked every second, waits until `lb status`
//! shows all healthy, then samples the daemon once a second for SECS seconds and stops it.
//! Printed per run: probes per second (connections the backends' server accepted), the daemon's
//! CPU share (utime + stime over wall time, % of one core) and per probe, its most descriptors and
//! resident memory at a sample, the most TIME_WAIT sockets in its namespace, and the verdict
//! changes it logged meanwhile (0: none lost).
//!
//! Usage: health_load [--secs S] [--check TCP|HTTP] [--path VIP|DIRECT]   (default: 60 s, all four)

use anyhow::{bail, Result};
use lb_tests::health_load::{sample, start, table, Bed, Check, Server, BACKENDS};

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str);
    if let Some(a) = args.iter().find(|a| a.starts_with("--") && !["--secs", "--check", "--path"].contains(&a.as_str()))
    {
        bail!("unknown option {a}; usage: health_load [--secs S] [--check TCP|HTTP] [--path VIP|DIRECT]");
    }
    let secs: u64 = value("--secs").map(str::parse).transpose()?.unwrap_or(60);
    if secs == 0 {
        bail!("--secs must be positive");
    }
    let checks = match value("--check") {
        None => vec![Check::Tcp, Check::Http],
        Some("TCP") => vec![Check::Tcp],
        Some("HTTP") => vec![Check::Http],
        Some(c) => bail!("--check {c}: TCP or HTTP"),
    };
    let paths = match value("--path") {
        None => vec!["VIP", "DIRECT"],
        Some(p @ ("VIP" | "DIRECT")) => vec![p],
        Some(p) => bail!("--path {p}: VIP or DIRECT"),
    };

    let bed = Bed::build("hlb")?;
    let server = Server::start(bed.backend_ns())?;
    println!(
        "health checks: {BACKENDS} backends (4 services of 250) on one host, checked every second (timeout 1 s, \
         thresholds 1 / 2); sampled once a second for {secs} s after all are healthy"
    );
    let mut rows = Vec::new();
    // The `VIP` runs first: TIME_WAIT sockets of `DIRECT` probes outlive their run by 60 s.
    for &path in &paths {
        for &check in &checks {
            let (mut d, settled) = start(&bed, check, path)?;
            let f = sample(&bed, &d, &server, check, path, settled, secs, |_, _, _| {})?;
            d.stop()?;
            println!(
                "{} {path}: {:.0} probes/s, daemon CPU {:.1} % of one core, at most {} descriptors, {:.0} MiB",
                check.name(),
                f.probes_per_sec,
                f.cpu_pct,
                f.max_fds,
                f.max_rss_kib as f64 / 1024.0
            );
            rows.push(f);
        }
    }
    println!("\n{}", table(&rows));
    let nproc = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("host: {nproc} CPUs, kernel {}, load average {}", kernel.trim(), load.trim());
    Ok(())
}
