//! The physical floor of a cold hit (issue 35 item 4): one memory round trip, measured as a
//! chase of dependent loads over a buffer as large as the connection table, in a random cyclic
//! order of its cache lines, so that every load misses the caches (and, mostly, the TLB) and
//! must wait for the one before it. A cold hit reads its flow's line from memory at least once;
//! its target is the hot hit plus this round trip plus 30 ns.

use lb_user::rng::{Rng, SplitMix64};

/// Bytes per cache line.
const LINE: usize = 64;
/// Loads timed per measurement (after one pass over part of the buffer to fault its pages in).
const STEPS: usize = 1 << 21;

/// ns per dependent load over `bytes` of memory: the median of `runs` chases.
pub fn round_trip_ns(bytes: usize, runs: usize) -> f64 {
    let lines = (bytes / LINE).max(2);
    // next[i] (at the start of line i) is the line the chase visits after i: one cycle through
    // every line (Sattolo's shuffle), so no line repeats before all were visited.
    let words = LINE / std::mem::size_of::<u64>();
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut rng = SplitMix64(0x00c0_ffee);
    for i in (1..lines).rev() {
        let j = rng.below(i as u64) as usize;
        order.swap(i, j);
    }
    let mut next = vec![0u64; lines * words];
    for k in 0..lines {
        next[order[k] as usize * words] = order[(k + 1) % lines] as u64;
    }
    drop(order);
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let mut at = 0usize;
            let start = std::time::Instant::now();
            for _ in 0..STEPS {
                at = next[at * words] as usize;
            }
            let ns = start.elapsed().as_nanos() as f64 / STEPS as f64;
            std::hint::black_box(at);
            ns
        })
        .collect();
    times.sort_unstable_by(f64::total_cmp);
    times[times.len() / 2]
}
