//! The headline cases: the production program `lb` on many flows, one `BPF_PROG_TEST_RUN` call
//! per frame (`repeat = 1`: with more, the kernel reuses one buffer) and a different frame each
//! call, so that flow entries, buckets and frames come cold, as on a busy balancer.
//!
//! - *Cold hit*: the connection table is first filled to its configured capacity with
//!   established flows (each flow's SYN and first ACK, through `lb`), then each run sends the ACKs of a
//!   random sample of those flows in a random order.
//! - *New flow into a full table*: the table is then filled further, one new flow per slot
//!   (about nine slots in ten then hold a flow, the rest lost to collisions: most inserts evict,
//!   the steady state of a busy balancer whose closed connections wait to be evicted), and each
//!   run sends SYNs of flows never seen.
//!
//! The floor is the empty program `bench_empty` called the same way on the same frames, just
//! before each case run: the figure is the case's mean kernel-reported ns per call minus the
//! floor's, per run; median and spread over the runs. Every call's verdict is checked, and
//! every batch's counter deltas (hit: rx = ct_hit = tx = frames; new flow: rx = ct_miss =
//! new_flow = tx = frames; no drop counter moves).

use anyhow::{bail, Context, Result};
use aya::programs::Xdp;
use lb_tests::packet::{TCP_ACK, TCP_SYN};
use lb_user::dataplane::{XDP_PASS, XDP_TX};
use lb_user::rng::{Rng, SplitMix64};
use std::net::{Ipv4Addr, Ipv6Addr};

use super::{
    frame4_from, frame6_from, test_run_xdp, Bench, CT_HIT_PATH, NEW_FLOW_PATH, NOTHING_COUNTED, STATELESS_SYN_PATH,
};

/// Sizes of the cold cases.
#[derive(Clone, Copy)]
pub struct Params {
    /// The connection table's configured capacity, filled with established flows.
    pub ct_entries: u32,
    /// Frames per timed run.
    pub frames: usize,
    /// Timed runs per case.
    pub runs: usize,
}

/// Frames built and sent per batch while filling the table (bounds the memory they take).
const FILL_BATCH: u32 = 1 << 16;

/// One case's ns above the floor over the runs.
#[derive(Clone, Copy)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    pub fn of(mut v: Vec<f64>) -> Self {
        v.sort_unstable_by(f64::total_cmp);
        Spread { median: v[v.len() / 2], min: v[0], max: v[v.len() - 1] }
    }
}

/// One family's cold cases.
pub struct Cold {
    /// The floor's own median, ns per call (the kernel's per-call overhead included).
    pub floor: f64,
    pub hit: Spread,
    pub new_flow: Spread,
    /// One established flow's ACK every call, the table filled to capacity (as the cold hit's).
    pub hot_hit: Spread,
    /// One memory round trip over the table's bytes, ns (`memory::round_trip_ns`).
    pub round_trip: f64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }
}

/// Flow `i`'s frame: a distinct client address and port per flow (2^14 ports per address, the
/// addresses from 198.18.128.0/17 or 2001:db8:1::/64), to VIP:80/TCP.
pub fn flow_frame(family: Family, i: u32, flags: u8) -> Vec<u8> {
    let sport = 1024 + (i & 0x3fff) as u16;
    match family {
        Family::V4 => {
            let base = u32::from(Ipv4Addr::new(198, 18, 128, 0));
            frame4_from(Ipv4Addr::from(base + (i >> 14)), sport, 80, flags)
        }
        Family::V6 => {
            let base = u128::from(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0));
            frame6_from(Ipv6Addr::from(base + (i >> 14) as u128), sport, flags)
        }
    }
}

/// Calls `prog` (named `name`) on device `ifindex` once per frame; fails unless every verdict
/// is `action`. Returns the mean kernel-reported ns per call.
pub fn call_each(prog: &Xdp, name: &str, ifindex: u32, frames: &[Vec<u8>], action: u32) -> Result<f64> {
    let mut total = 0u64;
    for frame in frames {
        let (verdict, _, ns) =
            test_run_xdp(prog, ifindex, frame, 1).with_context(|| format!("BPF_PROG_TEST_RUN of {name}"))?;
        if verdict != action {
            bail!("{name}: verdict {verdict} instead of {action}");
        }
        total += ns;
    }
    Ok(total as f64 / frames.len() as f64)
}

/// `call_each` of one of `b`'s programs, also failing unless the counters moved by `per_frame`
/// times the frames.
pub fn run_each(b: &Bench, prog: &str, frames: &[Vec<u8>], action: u32, per_frame: &[(u32, u64)]) -> Result<f64> {
    let before = b.counters()?;
    let ns = call_each(b.program(prog)?, prog, b.ingress_ifindex, frames, action)?;
    let after = b.counters()?;
    Bench::check_counters(prog, &before, &after, per_frame, frames.len() as u64)?;
    Ok(ns)
}

/// Hands flows `range`'s frames (TCP `flags`) to `f` in batches of at most `batch`.
pub fn in_batches(
    family: Family,
    range: std::ops::Range<u32>,
    flags: u8,
    batch: u32,
    mut f: impl FnMut(&[Vec<u8>]) -> Result<()>,
) -> Result<()> {
    let mut start = range.start;
    while start < range.end {
        let end = range.end.min(start + batch);
        let frames: Vec<Vec<u8>> = (start..end).map(|i| flow_frame(family, i, flags)).collect();
        f(&frames)?;
        start = end;
    }
    Ok(())
}

/// Sends flows `range`'s SYNs through `lb`: each makes a new, unconfirmed entry (the bench's
/// slots are dirty: its tables are never scanned).
fn fill(b: &Bench, family: Family, range: std::ops::Range<u32>) -> Result<()> {
    in_batches(family, range, TCP_SYN, FILL_BATCH, |frames| {
        run_each(b, "lb", frames, XDP_TX, NEW_FLOW_PATH).map(|_| ())
    })
}

/// Establishes flows `range`: each flow's SYN, then its first ACK, which confirms the entry.
/// The cold hit is then what it is on a busy balancer, a packet of an established flow, and
/// not a flow's first ACK, which also writes the confirmation (once per flow).
pub fn establish(b: &Bench, family: Family, range: std::ops::Range<u32>) -> Result<()> {
    fill(b, family, range.clone())?;
    in_batches(family, range, TCP_ACK, FILL_BATCH, |frames| run_each(b, "lb", frames, XDP_TX, CT_HIT_PATH).map(|_| ()))
}

/// The ACK frames of `frames` flows drawn at random from flows `0..flows`, in a random order.
pub fn hit_sample(rng: &mut SplitMix64, family: Family, flows: u32, frames: usize) -> Vec<Vec<u8>> {
    sample(rng, flows, frames).into_iter().map(|i| flow_frame(family, i, TCP_ACK)).collect()
}

/// The SYN frames of flows `first..first + frames`.
pub fn new_flows(family: Family, first: u32, frames: usize) -> Vec<Vec<u8>> {
    (first..first + frames as u32).map(|i| flow_frame(family, i, TCP_SYN)).collect()
}

/// The floor: the empty program on `frames`, ns per call.
pub fn floor(b: &Bench, frames: &[Vec<u8>]) -> Result<f64> {
    run_each(b, "bench_empty", frames, XDP_PASS, NOTHING_COUNTED)
}

/// The floor, then `lb`, on the same frames; returns (floor, lb minus floor), ns per call.
fn timed(b: &Bench, frames: &[Vec<u8>], per_frame: &[(u32, u64)]) -> Result<(f64, f64)> {
    let floor = floor(b, frames)?;
    let case = run_each(b, "lb", frames, XDP_TX, per_frame)?;
    Ok((floor, case - floor))
}

/// `k` distinct indices below `n` in a random order (a partial Fisher-Yates shuffle), drawn
/// from `rng` (fixed seeds, so that runs are reproducible).
fn sample(rng: &mut SplitMix64, n: u32, k: usize) -> Vec<u32> {
    let mut all: Vec<u32> = (0..n).collect();
    let k = k.min(all.len());
    for i in 0..k {
        let j = i + rng.below((all.len() - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(k);
    all
}

/// Both cold cases of one family on `b`, a freshly loaded object whose connection table holds
/// `p.ct_entries` flows at most (see the module comment).
pub fn measure(b: &Bench, p: &Params, family: Family, ct_slots: u32) -> Result<Cold> {
    let mut rng = SplitMix64(0x5eed + family as u64);
    establish(b, family, 0..p.ct_entries)?;
    let mut floors = Vec::new();
    let mut hits = Vec::new();
    for _ in 0..p.runs {
        let frames = hit_sample(&mut rng, family, p.ct_entries, p.frames);
        let (floor, above) = timed(b, &frames, CT_HIT_PATH)?;
        floors.push(floor);
        hits.push(above);
    }
    // The hot hit in the same table: flow 0's ACK every call.
    let mut hots = Vec::new();
    for _ in 0..p.runs {
        let (floor, above) = timed(b, &vec![flow_frame(family, 0, TCP_ACK); p.frames], CT_HIT_PATH)?;
        floors.push(floor);
        hots.push(above);
    }
    let bucket = match family {
        Family::V4 => std::mem::size_of::<lb_common::ct_table::Bucket4>(),
        Family::V6 => std::mem::size_of::<lb_common::ct_table::Bucket6>(),
    };
    let round_trip = super::memory::round_trip_ns(ct_slots as usize / lb_common::ct_table::WAYS * bucket, p.runs);
    // Full: one new flow per slot in all.
    fill(b, family, p.ct_entries..ct_slots)?;
    let mut news = Vec::new();
    let mut next = ct_slots;
    for _ in 0..p.runs {
        let frames = new_flows(family, next, p.frames);
        next += p.frames as u32;
        let (floor, above) = timed(b, &frames, NEW_FLOW_PATH)?;
        floors.push(floor);
        news.push(above);
    }
    Ok(Cold {
        floor: Spread::of(floors).median,
        hit: Spread::of(hits),
        new_flow: Spread::of(news),
        hot_hit: Spread::of(hots),
        round_trip,
    })
}

/// A case of `profile`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ProfileCase {
    /// Cold hits over a table filled to capacity.
    Hit,
    /// New flows into a full table.
    New,
    /// One established flow's ACK, every call, the table filled to capacity (the side-by-side's
    /// hot hit runs after its new-flow case, in a full table).
    Hot,
}

/// Fills `b`'s table as `measure` does for one case and then runs that case's frames through
/// `lb` for `secs` seconds, each batch checked: for `perf record`, with no floor runs in
/// between.
pub fn profile(b: &Bench, p: &Params, family: Family, case: ProfileCase, ct_slots: u32, secs: u64) -> Result<()> {
    let mut rng = SplitMix64(0x5eed + family as u64);
    establish(b, family, 0..p.ct_entries)?;
    if case == ProfileCase::New {
        fill(b, family, p.ct_entries..ct_slots)?;
    }
    let hot = if case == ProfileCase::Hot { vec![flow_frame(family, 0, TCP_ACK); p.frames] } else { Vec::new() };
    let end = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut next = ct_slots;
    while std::time::Instant::now() < end {
        match case {
            ProfileCase::New => {
                run_each(b, "lb", &new_flows(family, next, p.frames), XDP_TX, NEW_FLOW_PATH)?;
                next += p.frames as u32;
            }
            ProfileCase::Hit => {
                run_each(b, "lb", &hit_sample(&mut rng, family, p.ct_entries, p.frames), XDP_TX, CT_HIT_PATH)?;
            }
            ProfileCase::Hot => {
                run_each(b, "lb", &hot, XDP_TX, CT_HIT_PATH)?;
            }
        }
    }
    Ok(())
}

/// Per-round ns above the floor of two loaded objects, `[first loaded, second loaded]`, for one
/// cold case (`compare`).
pub type Rounds = [Vec<f64>; 2];

/// The cold cases of `--compare-cold` on two loaded objects, alternating them round by round:
/// (case, per-round values). Cold hit; new flow into the full table; then, every Maglev slot
/// clean (`Bench::set_clean`), first ACK: per round the SYNs of new flows (untimed: they make no
/// entry), then their first ACKs, timed, each of which misses and inserts its flow.
pub fn compare(
    objs: [&mut Bench; 2],
    p: &Params,
    family: Family,
    ct_slots: u32,
    rounds: usize,
) -> Result<Vec<(&'static str, Rounds)>> {
    let mut rng = SplitMix64(0x5eed + family as u64);
    let mut cases = Vec::new();
    for b in &objs {
        establish(b, family, 0..p.ct_entries)?;
    }
    let mut above: Rounds = [Vec::new(), Vec::new()];
    for r in 0..rounds {
        let frames = hit_sample(&mut rng, family, p.ct_entries, p.frames);
        for k in [r % 2, 1 - r % 2] {
            above[k].push(timed(&*objs[k], &frames, CT_HIT_PATH)?.1);
        }
    }
    cases.push(("cold hit", above));
    for b in &objs {
        fill(b, family, p.ct_entries..ct_slots)?;
    }
    let mut above: Rounds = [Vec::new(), Vec::new()];
    let mut next = ct_slots;
    for r in 0..rounds {
        let frames = new_flows(family, next, p.frames);
        next += p.frames as u32;
        for k in [r % 2, 1 - r % 2] {
            above[k].push(timed(&*objs[k], &frames, NEW_FLOW_PATH)?.1);
        }
    }
    cases.push(("new flow", above));
    let [a, b] = objs;
    a.set_clean()?;
    b.set_clean()?;
    let objs = [&*a, &*b];
    let mut above: Rounds = [Vec::new(), Vec::new()];
    for r in 0..rounds {
        let syns = new_flows(family, next, p.frames);
        let acks: Vec<Vec<u8>> = (next..next + p.frames as u32).map(|i| flow_frame(family, i, TCP_ACK)).collect();
        next += p.frames as u32;
        for k in [r % 2, 1 - r % 2] {
            run_each(objs[k], "lb", &syns, XDP_TX, STATELESS_SYN_PATH)?;
            let f = floor(objs[k], &acks)?;
            above[k].push(super::katran::first_acks(objs[k], &acks)? - f);
        }
    }
    cases.push(("first ACK", above));
    Ok(cases)
}

/// The headline table.
pub fn report(p: &Params, v4: &Cold, v6: &Cold) {
    println!();
    println!("Headline: the production program `lb` on many flows, one BPF_PROG_TEST_RUN call per frame (repeat 1),");
    println!("a different frame each call; ns above the floor (the empty program called the same way on the same");
    println!(
        "frames): median of {} runs of {} frames [fastest, slowest run]; every call's verdict and every run's counters checked",
        p.runs, p.frames
    );
    println!(
        "  connection table: capacity {} flows; cold hit = ACKs of a random sample of the {} established flows, random order;",
        p.ct_entries, p.ct_entries
    );
    println!(
        "  new flow = SYN of a flow never seen, the table full (one flow per slot sent before: most inserts evict)"
    );
    println!();
    println!("  {:<44} {:>22}   {:>22}", "case", "IPv4 +floor", "IPv6 +floor");
    let cell = |s: &Spread| format!("{:+.0} [{:+.0}, {:+.0}]", s.median, s.min, s.max);
    println!(
        "  {:<44} {:>22}   {:>22}",
        "floor, single calls (ns per call)",
        format!("{:.0}", v4.floor),
        format!("{:.0}", v6.floor)
    );
    println!("  {:<44} {:>22}   {:>22}", "lb, cold hit (one of many established flows)", cell(&v4.hit), cell(&v6.hit));
    println!("  {:<44} {:>22}   {:>22}", "lb, new flow into a full table", cell(&v4.new_flow), cell(&v6.new_flow));
    println!(
        "  {:<44} {:>22}   {:>22}",
        "lb, hot hit (one flow's ACK, same table)",
        cell(&v4.hot_hit),
        cell(&v6.hot_hit)
    );
    let ns = |v: f64| format!("{v:.0}");
    println!(
        "  {:<44} {:>22}   {:>22}",
        "memory round trip over the table's bytes (ns)",
        ns(v4.round_trip),
        ns(v6.round_trip)
    );
    for (name, c) in [("IPv4", v4), ("IPv6", v6)] {
        let bound = c.hot_hit.median + c.round_trip + 30.0;
        println!(
            "  target {name} cold hit <= hot hit + one round trip + 30 ns = {bound:.0}: {:+.0} -> {}",
            c.hit.median,
            if c.hit.median <= bound { "met" } else { "not met" }
        );
    }
}

/// `--cold-by-slot`: where a cold hit's time goes. The table is filled as for the headline, each
/// flow is then located (its candidate bucket, first or second, and its way in it), and cold
/// hits are timed per location (a bucket's places with too few flows to stay cold as one
/// group): a flow in its first bucket's way 0 needs one line, a flow in the second bucket's
/// way 7 is found after all 16 slots. Then the same flows mixed, as in the
/// headline. Within one place the search ends at the same slot every frame, which the branch
/// predictor learns; mixed, it cannot. Beside them the hot hit and the memory round trip, so
/// that each case's excess over the target's terms (cold - hot - round trip) is printed, and
/// the round trip's parts (`memory::Chase`: with 2 MiB pages, with a second line per step).
pub fn by_slot(b: &Bench, p: &Params, family: Family, ct_slots: u32) -> Result<()> {
    use lb_common::ct_table::{self, state, WAYS};
    let mut rng = SplitMix64(0x51a7 + family as u64);
    establish(b, family, 0..p.ct_entries)?;
    let seed = b.ct_seed;
    let buckets = ct_slots / WAYS as u32;
    let mask = buckets - 1;
    // Flow indices by location, `candidate * WAYS + way` (`flow_frame`'s numbering).
    let mut at: Vec<Vec<u32>> = vec![Vec::new(); 2 * WAYS];
    let index4 = |src: u32, ports: u32| {
        let base = u32::from(Ipv4Addr::new(198, 18, 128, 0));
        let host = u32::from(Ipv4Addr::from(src.to_ne_bytes()));
        ((host - base) << 14) | (u16::from_be(ports as u16) as u32 - 1024)
    };
    match family {
        Family::V4 => {
            let ct: aya::maps::Array<_, ct_table::Bucket4> =
                aya::maps::Array::try_from(b.ebpf.map("CONNTRACK4").context("no CONNTRACK4 map")?)?;
            for i in 0..buckets {
                for (w, s) in ct.get(&i, 0)?.slots.iter().enumerate() {
                    if s.state & state::LIVE != 0 {
                        let c = (ct_table::buckets::<ct_table::Slot4>(&s.key, seed, mask)[0] != i) as usize;
                        at[c * WAYS + w].push(index4(s.key.src, s.key.ports));
                    }
                }
            }
        }
        Family::V6 => {
            let ct: aya::maps::Array<_, ct_table::Bucket6> =
                aya::maps::Array::try_from(b.ebpf.map("CONNTRACK").context("no CONNTRACK map")?)?;
            let base = u128::from(Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0));
            for i in 0..buckets {
                for (w, s) in ct.get(&i, 0)?.slots.iter().enumerate() {
                    if s.state & state::LIVE != 0 {
                        let c = (ct_table::buckets::<ct_table::Slot6>(&s.key, seed, mask)[0] != i) as usize;
                        let mut bytes = [0u8; 16];
                        for (k, word) in s.key.src.iter().enumerate() {
                            bytes[4 * k..4 * k + 4].copy_from_slice(&word.to_ne_bytes());
                        }
                        let high = (u128::from(Ipv6Addr::from(bytes)) - base) as u32;
                        let port = u16::from_be(s.key.ports as u16) as u32 - 1024;
                        at[c * WAYS + w].push((high << 14) | port);
                    }
                }
            }
        }
    }
    let located: usize = at.iter().map(Vec::len).sum();
    if located != p.ct_entries as usize {
        bail!("located {located} flows in the table, expected {}", p.ct_entries);
    }
    let hot = vec![flow_frame(family, 0, TCP_ACK); p.frames];
    let mut hots = Vec::new();
    for _ in 0..p.runs {
        hots.push(timed(b, &hot, CT_HIT_PATH)?.1);
    }
    let hot = Spread::of(hots).median;
    let bucket = match family {
        Family::V4 => std::mem::size_of::<ct_table::Bucket4>(),
        Family::V6 => std::mem::size_of::<ct_table::Bucket6>(),
    };
    let bytes = buckets as usize * bucket;
    let round_trip = super::memory::round_trip_ns(bytes, p.runs);
    // What the round trip is made of, and what a second line costs.
    use super::memory::{chase_ns, Also, Chase};
    let (huge, huge_share) = chase_ns(bytes, p.runs, Chase { huge_pages: true, also: Also::Nothing });
    let same_page = chase_ns(bytes, p.runs, Chase { huge_pages: false, also: Also::SamePage }).0;
    let other_page = chase_ns(bytes, p.runs, Chase { huge_pages: false, also: Also::OtherPage }).0;
    let name = family.name();
    println!(
        "{name}: memory over the table's {} MiB: round trip {round_trip:.0} ns with 4 KiB pages (the floor's), {huge:.0} \
         with 2 MiB pages ({:.0} % of them huge); a second line loaded with the first, per step: {:+.0} ns in the same \
         page, {:+.0} in another page",
        bytes >> 20,
        huge_share * 100.0,
        same_page - round_trip,
        other_page - round_trip
    );
    println!(
        "{name}: hot hit {hot:+.0}, memory round trip {round_trip:.0} ns; cold hit by the flow's place (ns above the floor, \
         median of {} runs of up to {} frames; excess = cold - hot - round trip)",
        p.runs, p.frames
    );
    // Each place with enough flows alone; per bucket, the places with too few pooled into one
    // group (the second bucket's 15 % spread over its ways, the first bucket's last ways).
    let mut groups: Vec<(String, Vec<u32>)> = Vec::new();
    for bucket in 0..2 {
        let mut pooled = (Vec::new(), Vec::new());
        for way in 0..WAYS {
            let flows = &at[bucket * WAYS + way];
            // Fewer flows than a few runs' frames would be timed warm (each run draws from them).
            if flows.len() < 4 * p.frames {
                pooled.0.push(way.to_string());
                pooled.1.extend_from_slice(flows);
            } else {
                groups.push((format!("bucket {} way {way}", bucket + 1), flows.clone()));
            }
        }
        if pooled.0.len() == WAYS {
            groups.push((format!("bucket {} all ways", bucket + 1), pooled.1));
        } else if !pooled.1.is_empty() {
            groups.push((format!("bucket {} ways {}", bucket + 1, pooled.0.join(",")), pooled.1));
        }
    }
    let mut all = Vec::new();
    for (name, flows) in &groups {
        if flows.len() < 4 * p.frames {
            println!("  {name}: {} flows, too few to stay cold: not timed", flows.len());
            continue;
        }
        let mut runs = Vec::new();
        for _ in 0..p.runs {
            let frames: Vec<Vec<u8>> = sample(&mut rng, flows.len() as u32, p.frames)
                .into_iter()
                .map(|j| flow_frame(family, flows[j as usize], TCP_ACK))
                .collect();
            runs.push(timed(b, &frames, CT_HIT_PATH)?.1);
        }
        let s = Spread::of(runs);
        all.push((s.median, flows.len()));
        println!(
            "  {name:<28} {:>7} flows ({:>4.1} %)  cold hit {:+.0} [{:+.0}, {:+.0}]  excess {:+.0}",
            flows.len(),
            flows.len() as f64 * 100.0 / located as f64,
            s.median,
            s.min,
            s.max,
            s.median - hot - round_trip
        );
    }
    if all.is_empty() {
        println!("  no place has enough flows to stay cold (a larger --ct-entries has)");
    } else {
        let flows = all.iter().map(|(_, n)| *n as f64).sum::<f64>();
        let mean = all.iter().map(|(m, n)| m * *n as f64).sum::<f64>() / flows;
        println!("  weighted by the flows in each place: cold hit {mean:+.0}, excess {:+.0}", mean - hot - round_trip);
    }
    // The same flows mixed, as the headline sends them: the place varies from frame to frame.
    let mut runs = Vec::new();
    for _ in 0..p.runs {
        runs.push(timed(b, &hit_sample(&mut rng, family, p.ct_entries, p.frames), CT_HIT_PATH)?.1);
    }
    let s = Spread::of(runs);
    println!(
        "  all places mixed (the headline's cold hit): cold hit {:+.0} [{:+.0}, {:+.0}]  excess {:+.0}",
        s.median,
        s.min,
        s.max,
        s.median - hot - round_trip
    );
    Ok(())
}
