//! Maglev table build time at M = 65537.
//!
//! `cargo run --release -p lb-user --example maglev_bench [FILTER]` (FILTER: run only the cases
//! whose name contains it)
//!
//! Each case: a few warm-up builds, then at least `MIN_RUNS` timed builds (more while under
//! `TIME_PER_CASE`); prints the median and the minimum per build. Reference: the Maglev paper
//! (NSDI 2016, §5.3) reports 1.8 ms for M = 65537, N = 1000 on its hardware.

use lb_user::compile::maglev::{build_table, MaglevBackend};
use std::hint::black_box;
use std::time::{Duration, Instant};

const M: u32 = 65537;
const WARMUP_RUNS: usize = 3;
const MIN_RUNS: usize = 21;
const MAX_RUNS: usize = 2001;
const TIME_PER_CASE: Duration = Duration::from_millis(1500);
const PAPER_N1000: Duration = Duration::from_micros(1800);

/// IPv4-like keys 10.0.x.y, as the data-plane writer would pass an address's bytes.
fn keys(n: usize) -> Vec<[u8; 4]> {
    (0..n).map(|i| [10, (i >> 16) as u8, (i >> 8) as u8, i as u8]).collect()
}

fn fmt_duration(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:8.3} ms", us / 1000.0)
    } else {
        format!("{:8.1} µs", us)
    }
}

fn bench(name: &str, weights: &[u32]) -> Option<Duration> {
    if let Some(filter) = std::env::args().nth(1) {
        if !name.contains(filter.as_str()) {
            return None;
        }
    }
    let keys = keys(weights.len());
    let set: Vec<MaglevBackend> = keys.iter().zip(weights).map(|(k, &w)| MaglevBackend { key: k, weight: w }).collect();
    let build = || build_table(black_box(&set), black_box(M)).expect("valid benchmark input");
    for _ in 0..WARMUP_RUNS {
        black_box(build());
    }
    let mut times = Vec::with_capacity(MIN_RUNS);
    let started = Instant::now();
    while times.len() < MIN_RUNS || (started.elapsed() < TIME_PER_CASE && times.len() < MAX_RUNS) {
        let t = Instant::now();
        let table = build();
        times.push(t.elapsed());
        black_box(table);
    }
    times.sort_unstable();
    let median = times[times.len() / 2];
    println!("{name:<40} median {}  min {}  ({} runs)", fmt_duration(median), fmt_duration(times[0]), times.len());
    Some(median)
}

fn main() {
    if cfg!(debug_assertions) {
        eprintln!("warning: debug build; run with --release for meaningful numbers");
    }
    println!("Maglev table build, M = {M}");
    bench("N=10, equal weights", &[1; 10]);
    bench("N=100, equal weights", &[1; 100]);
    let equal = bench("N=1000, equal weights", &[1; 1000]);
    let mixed: Vec<u32> = (0..1000).map(|i| i % 4 + 1).collect();
    bench("N=1000, mixed weights 1,2,3,4", &mixed);
    let spread: Vec<u32> = (0..1000).map(|i| i % 1000 + 1).collect();
    bench("N=1000, weights 1..=1000", &spread);
    // Worst case of the credit rounds: ~M·W/mean(w) credit updates.
    let skewed: Vec<u32> = (0..1000).map(|i| if i == 0 { 1000 } else { 1 }).collect();
    bench("N=1000, one weight 1000, 999 weight 1", &skewed);
    if let Some(equal) = equal {
        println!(
            "reference: Maglev paper, N=1000, M=65537: {}  (equal weights here: {:.2}x of it)",
            fmt_duration(PAPER_N1000),
            equal.as_secs_f64() / PAPER_N1000.as_secs_f64()
        );
    }
}
