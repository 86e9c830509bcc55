//! Live traffic through `lb` against nftables DNAT and a trivial XDP forwarder, side by side
//! (run by `cargo xtask bench --live`, needs root and `nft`). Topology, generator and sinks:
//! `lb_tests::live`; method and recorded figures: BENCHMARKS.md, "Live traffic".
//!
//! Per case (UDP and TCP; 10k and 1M established flows, a new flow per frame), ROUNDS rounds of
//! each system, the three in turn, the order rotated each round: each round puts the system in place, sends
//! every established flow once, then sends for SECS seconds and counts what the sinks got.
//! Printed: median forwarded packets per second and median softirq CPU time per forwarded
//! packet (machine-wide, from /proc/stat), the ratios lb/nft and whether the targets
//! are met (>= 3x packets per CPU-second on established flows, >= 5x on new flows); then `lb`'s
//! CPU per packet against the forwarder's (what `lb` adds to any XDP forwarding).
//!
//! Usage: live_bench [--quick] [--rounds N] [--secs S]

use anyhow::{bail, Result};
use lb_tests::live::{round, Case, ConntrackMax, Flows, LiveTopology, Proto, Round, System};

const BACKENDS: usize = 8;
/// Room for the 1M-flow cases plus new flows in nftables' conntrack (kube-proxy sizes it by
/// cores; the hash stays at the host's bucket count).
const CONNTRACK_MAX: u64 = 1 << 21;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1));
    let rounds: usize = value("--rounds").map(|s| s.parse()).transpose()?.unwrap_or(if quick { 1 } else { 3 });
    let secs: f64 = value("--secs").map(|s| s.parse()).transpose()?.unwrap_or(if quick { 0.5 } else { 3.0 });
    let big: u32 = if quick { 100_000 } else { 1_000_000 };
    if rounds == 0 || secs <= 0.0 {
        bail!("--rounds and --secs must be positive");
    }

    let topo = LiveTopology::build("lvb", BACKENDS)?;
    let _ct = ConntrackMax::raise(&topo.lb, CONNTRACK_MAX)?;
    println!(
        "live traffic: {BACKENDS} backends, {rounds} round(s) of {secs} s per system and case, systems alternating; \
         generator pinned to CPU 0"
    );
    println!("CPU = machine-wide softirq time (/proc/stat) per packet the sinks counted; gen = generator thread's CPU");
    let mut cases = Vec::new();
    for proto in [Proto::Udp, Proto::Tcp] {
        for flows in [Flows::Established(10_000), Flows::Established(big), Flows::New] {
            cases.push(Case { proto, flows });
        }
    }
    let (mut summary, mut fwd) = (Vec::new(), Vec::new());
    for case in cases {
        let g = topo.generator(case)?;
        let mut by_system: [Vec<Round>; 3] = [Vec::new(), Vec::new(), Vec::new()];
        let systems = [System::Lb, System::Nft, System::Fwd];
        for r in 0..rounds {
            // Each round in another order, so that no system always follows the same one.
            for k in 0..systems.len() {
                let i = (r + k) % systems.len();
                let system = systems[i];
                let res = round(&topo, &g, case, system, secs)?;
                println!(
                    "  {:<18} round {} {:<3}: sent {:>9} fwd {:>9} in {:.2} s = {:>9.0} pps, CPU {:>6.0} ns/pkt, \
                     gen {:>5.0} ns/frame, machine busy {:.2} s{}",
                    case.name(),
                    r + 1,
                    system.name(),
                    res.sent.frames,
                    res.forwarded,
                    res.sent.secs,
                    res.pps(),
                    res.cpu_ns(),
                    res.sent.thread_ns.saturating_sub(res.softirq_ns) as f64 / res.sent.frames.max(1) as f64,
                    res.busy_ns as f64 / 1e9,
                    res.lb_counters
                        .as_ref()
                        .map(|c| format!(
                            " (lb: new_flow {} ct_hit {} tx {} redirect {})",
                            c["new_flow"], c["ct_hit"], c["tx"], c["redirect"]
                        ))
                        .unwrap_or_default()
                );
                by_system[i].push(res);
            }
        }
        let pps = |rs: &[Round]| median(rs.iter().map(Round::pps).collect());
        let cpu = |rs: &[Round]| median(rs.iter().map(Round::cpu_ns).collect());
        summary.push((case, pps(&by_system[0]), pps(&by_system[1]), cpu(&by_system[0]), cpu(&by_system[1])));
        fwd.push((case, pps(&by_system[2]), cpu(&by_system[0]), cpu(&by_system[2])));
    }

    println!();
    println!(
        "{:<18} {:>11} {:>11} {:>10} {:>10} {:>8} {:>12} {:>7} {:>5}",
        "case", "lb pps", "nft pps", "lb ns/pkt", "nft ns/pkt", "pps x", "pkt/CPU-s x", "target", "met"
    );
    for (case, lb_pps, nft_pps, lb_cpu, nft_cpu) in summary {
        let target = if case.flows == Flows::New { 5.0 } else { 3.0 };
        let per_cpu = nft_cpu / lb_cpu;
        println!(
            "{:<18} {:>11.0} {:>11.0} {:>10.0} {:>10.0} {:>8.2} {:>12.2} {:>6}x {:>5}",
            case.name(),
            lb_pps,
            nft_pps,
            lb_cpu,
            nft_cpu,
            lb_pps / nft_pps,
            per_cpu,
            target,
            if per_cpu >= target { "yes" } else { "no" }
        );
    }
    println!();
    println!(
        "{:<18} {:>11} {:>10} {:>10} {:>10} {:>8}",
        "case", "fwd pps", "lb ns/pkt", "fwd ns/pkt", "lb - fwd", "lb/fwd"
    );
    for (case, fwd_pps, lb_cpu, fwd_cpu) in fwd {
        println!(
            "{:<18} {:>11.0} {:>10.0} {:>10.0} {:>10.0} {:>8.2}",
            case.name(),
            fwd_pps,
            lb_cpu,
            fwd_cpu,
            lb_cpu - fwd_cpu,
            lb_cpu / fwd_cpu
        );
    }
    Ok(())
}
