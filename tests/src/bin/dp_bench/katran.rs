//! `dp_bench --katran OBJECT`: Katran's XDP balancer side by side with `lb`, in one process, on
//! the same frames, above the same floor. OBJECT is Katran's `balancer.bpf.o`, built by the
//! operator from github.com/facebookincubator/katran (BENCHMARKS.md says which commit and flags
//! were measured); nothing of Katran is in this repository, by rule.
//!
//! Katran's maps are set up as its userspace does: the VIPs (VIP4:80 and VIP6:80/TCP, the
//! bench's own), 10 reals per VIP, each VIP's 65537-slot ring, the gateway MAC in `ctl_array`,
//! and per CPU an LRU hash of the connection table's capacity in `lru_mapping`. The bench
//! thread is pinned to one CPU, so one of those LRUs holds every flow.
//!
//! Cases, each call one frame (`repeat = 1`), on the frames of the cold cases (`cold`):
//! cold hit over the filled LRU, new flow into the full LRU, the hot hit (one flow's ACK
//! again and again), and per connection a new flow's SYN and, a batch later, its first ACK
//! (Katran as shipped under a flood: its SYN inserts nothing, its ACK misses and inserts). Katran skips its LRU insert once a CPU saw more than `MAX_CONN_RATE`
//! (125,000) new flows in a second: its new flow is measured *inserting* (the bench resets the
//! rate counter before each batch of fewer frames than that) and *as shipped* (the counter
//! set past the limit first, so no frame inserts, as under a flood of new flows).
//!
//! Per family it also prints one wait for the table's memory, `lb`'s cold hit minus its hot
//! hit, as a share of Katran's cold hit and of its no-insert new flow (issue 17's targets for
//! those two cases are 0.35 and 1.0 of them).
//!
//! Every run is checked with Katran's own `stats` counters: verdict XDP_TX for every frame,
//! packets through the LRU stage = frames, LRU misses (non-SYN) = 0 and new connections = 0
//! for hits; new connections = SYN misses = frames for new flows; the fallback LRU never used;
//! XDP_TX counter = frames.

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::{Array, HashMap, MapData, PerCpuArray, PerCpuValues};
use aya::programs::Xdp;
use aya::{Ebpf, EbpfLoader, Pod};
use lb_common::maps::stat;
use lb_tests::fixture_net::in_netns;
use lb_tests::packet::{TCP_ACK, TCP_SYN};
use lb_user::dataplane::XDP_TX;
use lb_user::rng::SplitMix64;
use std::net::IpAddr;

use super::cold::{self, call_each, flow_frame, hit_sample, in_batches, new_flows, Family, Spread};
use super::{Bench, BACKENDS_PER_SERVICE, CT_HIT_PATH, NEW_FLOW_PATH, STATELESS_SYN_PATH, VIP4, VIP6};

/// Katran's constants (balancer_consts.h).
const MAX_VIPS: u32 = 512;
const RING_SIZE: u32 = 65537;
const MAX_CONN_RATE: u64 = 125_000;
const F_IPV6: u8 = 1;
/// `stats` indices past `MAX_VIPS`.
const LRU_CNTRS: u32 = MAX_VIPS;
const LRU_MISS_CNTR: u32 = MAX_VIPS + 1;
const NEW_CONN_RATE_CNTR: u32 = MAX_VIPS + 2;
const FALLBACK_LRU_CNTR: u32 = MAX_VIPS + 3;
const XDP_TX_CNTR: u32 = MAX_VIPS + 17;
const XDP_DROP_CNTR: u32 = MAX_VIPS + 18;
/// Frames per batch while Katran's rate counter is reset: fewer than `MAX_CONN_RATE`.
const INSERT_BATCH: u32 = 100_000;
/// The program and the maps the harness sets up: an object without them is not Katran's.
const PROGRAM: &str = "balancer_ingress";
const MAPS: [&str; 6] = ["vip_map", "reals", "ch_rings", "ctl_array", "lru_mapping", "stats"];

/// Katran's structs (balancer_structs.h), as its userspace writes them.
#[repr(C)]
#[derive(Clone, Copy)]
struct VipDefinition {
    addr: [u32; 4],
    port: u16,
    proto: u8,
    _pad: u8,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct VipMeta {
    flags: u32,
    vip_num: u32,
}
#[repr(C)]
#[derive(Clone, Copy)]
struct RealDefinition {
    addr: [u32; 4],
    flags: u8,
    _pad: [u8; 3],
}
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LbStats {
    v1: u64,
    v2: u64,
}
// SAFETY: plain C structs without padding bytes left undeclared.
unsafe impl Pod for VipDefinition {}
// SAFETY: as above.
unsafe impl Pod for VipMeta {}
// SAFETY: as above.
unsafe impl Pod for RealDefinition {}
// SAFETY: as above.
unsafe impl Pod for LbStats {}

/// `struct flow_key` (37 bytes, aligned to 40) -> `struct real_pos_lru` (16 bytes).
const FLOW_KEY_SIZE: u32 = 40;
const REAL_POS_LRU_SIZE: u32 = 16;

/// Reads OBJECT and checks that it is a Katran balancer object, before anything is loaded.
pub fn read_object(path: &str) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).with_context(|| {
        format!("reading the Katran object {path:?} (build balancer.bpf.o from github.com/facebookincubator/katran, see BENCHMARKS.md)")
    })?;
    let obj = aya_obj::Object::parse(&bytes)
        .map_err(|e| anyhow!("{path:?} is not a BPF object ({e}); expected Katran's balancer.bpf.o"))?;
    if !obj.programs.contains_key(PROGRAM) {
        bail!("{path:?} has no program {PROGRAM}: not Katran's balancer.bpf.o");
    }
    for map in MAPS {
        if !obj.maps.contains_key(map) {
            bail!("{path:?} has no map {map}: not Katran's balancer.bpf.o (or a build this harness does not know)");
        }
    }
    Ok(bytes)
}

/// A loaded Katran with one VIP per family.
struct Katran {
    ebpf: Ebpf,
    stats: PerCpuArray<MapData, LbStats>,
    ifindex: u32,
}

fn words(addr: IpAddr) -> [u32; 4] {
    match addr {
        IpAddr::V4(a) => [u32::from_ne_bytes(a.octets()), 0, 0, 0],
        IpAddr::V6(a) => {
            let o = a.octets();
            core::array::from_fn(|i| u32::from_ne_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]]))
        }
    }
}

impl Katran {
    fn load(bytes: &[u8], ifindex: u32, lru_entries: u32) -> Result<Self> {
        let mut ebpf = EbpfLoader::new().load(bytes).context("loading the Katran object")?;
        let prog: &mut Xdp = ebpf.program_mut(PROGRAM).ok_or_else(|| anyhow!("no {PROGRAM}"))?.try_into()?;
        prog.load().context("verifying Katran's balancer_ingress")?;
        let map = |ebpf: &mut Ebpf, name: &str| ebpf.take_map(name).ok_or_else(|| anyhow!("no map {name}"));
        let mut vips: HashMap<_, VipDefinition, VipMeta> = HashMap::try_from(map(&mut ebpf, "vip_map")?)?;
        let mut reals: Array<_, RealDefinition> = Array::try_from(map(&mut ebpf, "reals")?)?;
        let mut rings: Array<_, u32> = Array::try_from(map(&mut ebpf, "ch_rings")?)?;
        // (vip_num, VIP, reals' first index, their addresses)
        let vip_set: [(u32, IpAddr, u32); 2] =
            [(0, IpAddr::V4(VIP4), 1), (1, IpAddr::V6(VIP6), 1 + BACKENDS_PER_SERVICE)];
        for (vip_num, vip, first) in vip_set {
            let key = VipDefinition { addr: words(vip), port: 80u16.to_be(), proto: 6, _pad: 0 };
            vips.insert(key, VipMeta { flags: 0, vip_num }, 0)?;
            for i in 0..BACKENDS_PER_SERVICE {
                let (addr, flags) = match vip {
                    IpAddr::V4(_) => (IpAddr::from([198, 19, 10, 10 + i as u8]), 0),
                    IpAddr::V6(_) => (IpAddr::from([0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 0x10 + i as u16]), F_IPV6),
                };
                reals.set(first + i, RealDefinition { addr: words(addr), flags, _pad: [0; 3] }, 0)?;
            }
            // Katran's userspace fills the ring by Maglev; which real a slot names costs nothing.
            for slot in 0..RING_SIZE {
                rings.set(vip_num * RING_SIZE + slot, first + slot % BACKENDS_PER_SERVICE, 0)?;
            }
        }
        // ctl_array[0]: the gateway's MAC, the encapsulated frames' destination.
        let mut ctl: Array<_, u64> = Array::try_from(map(&mut ebpf, "ctl_array")?)?;
        let mut mac = [0u8; 8];
        mac[..6].copy_from_slice(&[0x02, 0x6b, 0, 0, 0, 1]);
        ctl.set(0, u64::from_ne_bytes(mac), 0)?;
        // Per CPU an LRU of the connection table's capacity.
        let mut lrus: aya::maps::ArrayOfMaps<_, MapData> =
            aya::maps::ArrayOfMaps::try_from(map(&mut ebpf, "lru_mapping")?)?;
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
        for cpu in 0..cpus as u32 {
            let obj = aya_obj::Map::new_from_params(
                aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_LRU_HASH as u32,
                FLOW_KEY_SIZE,
                REAL_POS_LRU_SIZE,
                lru_entries,
                0,
            );
            let inner = MapData::create(obj, "katran_lru", None).context("creating a per-CPU LRU for Katran")?;
            lrus.set(cpu, &inner, 0)?;
        }
        let stats = PerCpuArray::try_from(map(&mut ebpf, "stats")?)?;
        Ok(Self { ebpf, stats, ifindex })
    }

    fn counter(&self, index: u32) -> Result<LbStats> {
        let all = self.stats.get(&index, 0)?;
        Ok(all.iter().fold(LbStats::default(), |a, s| LbStats { v1: a.v1 + s.v1, v2: a.v2 + s.v2 }))
    }

    /// The new-connection rate guard on every CPU: `count` new flows in a quantum that starts now.
    fn set_rate(&mut self, count: u64) -> Result<()> {
        let now = monotonic_ns();
        let cpus = aya::util::nr_cpus().map_err(|(what, e)| anyhow!("{what}: {e}"))?;
        let values = PerCpuValues::try_from(vec![LbStats { v1: count, v2: now }; cpus])?;
        self.stats.set(NEW_CONN_RATE_CNTR, values, 0)?;
        Ok(())
    }

    /// Calls Katran once per frame and checks its counters: `hits` frames found in the LRU, or
    /// else every frame a new connection (SYNs). Returns the mean ns per call.
    fn run(&self, frames: &[Vec<u8>], hits: bool) -> Result<f64> {
        self.run_path(frames, if hits { KPath::Hit } else { KPath::NewSyn })
    }

    /// `run` for frames taking `path`.
    fn run_path(&self, frames: &[Vec<u8>], path: KPath) -> Result<f64> {
        let watched = [LRU_CNTRS, LRU_MISS_CNTR, FALLBACK_LRU_CNTR, XDP_TX_CNTR, XDP_DROP_CNTR];
        let before = watched.iter().map(|i| self.counter(*i)).collect::<Result<Vec<_>>>()?;
        let prog: &Xdp = self.ebpf.program(PROGRAM).ok_or_else(|| anyhow!("no {PROGRAM}"))?.try_into()?;
        let ns = call_each(prog, "katran", self.ifindex, frames, XDP_TX)?;
        let after = watched.iter().map(|i| self.counter(*i)).collect::<Result<Vec<_>>>()?;
        let d = |k: usize| (after[k].v1 - before[k].v1, after[k].v2 - before[k].v2);
        let n = frames.len() as u64;
        let (new, misses) = match path {
            KPath::Hit => (0, (0, 0)),
            KPath::NewSyn => (n, (n, 0)),
            KPath::NewOther => (n, (0, n)),
        };
        let checks = [
            ("packets through the LRU stage, new connections", d(0), (n, new)),
            ("LRU misses (SYN, other)", d(1), misses),
            ("fallback LRU used", (d(2).0, 0), (0, 0)),
            ("XDP_TX", (d(3).0, 0), (n, 0)),
            ("XDP_DROP", (d(4).0, 0), (0, 0)),
        ];
        for (what, got, want) in checks {
            if got != want {
                bail!(
                    "katran: counters {what} moved by {got:?} in {n} frames, expected {want:?}: not the intended path"
                );
            }
        }
        Ok(ns)
    }

    /// `run` of new flows in batches, each with the rate guard reset first, so every SYN inserts.
    fn run_inserting(&mut self, frames: &[Vec<u8>]) -> Result<f64> {
        let mut total = 0.0;
        for batch in frames.chunks(INSERT_BATCH as usize) {
            self.set_rate(0)?;
            total += self.run(batch, false)? * batch.len() as f64;
        }
        Ok(total / frames.len() as f64)
    }

    /// First packets of flows that are not SYNs (a connection's first ACK after a SYN that did
    /// not insert), in batches with the rate guard reset: each misses the LRU and inserts.
    fn run_acks_inserting(&mut self, frames: &[Vec<u8>]) -> Result<f64> {
        let mut total = 0.0;
        for batch in frames.chunks(INSERT_BATCH as usize) {
            self.set_rate(0)?;
            total += self.run_path(batch, KPath::NewOther)? * batch.len() as f64;
        }
        Ok(total / frames.len() as f64)
    }

    /// `run` of new flows with the rate guard past its limit: no SYN inserts, as shipped under a
    /// flood. Fails if the guard's quantum (a second) ended during the run.
    fn run_guarded(&mut self, frames: &[Vec<u8>]) -> Result<f64> {
        let mut total = 0.0;
        for batch in frames.chunks(10_000) {
            self.set_rate(MAX_CONN_RATE + 1)?;
            let start = self.counter(NEW_CONN_RATE_CNTR)?;
            total += self.run(batch, false)? * batch.len() as f64;
            let end = self.counter(NEW_CONN_RATE_CNTR)?;
            if end.v2 != start.v2 {
                bail!(
                    "katran: a batch of {} frames outlasted the rate guard's second; retry on a quieter machine",
                    batch.len()
                );
            }
        }
        Ok(total / frames.len() as f64)
    }
}

/// The path Katran's counters must show for a run (`Katran::run_path`).
#[derive(Clone, Copy)]
enum KPath {
    /// Found in the LRU.
    Hit,
    /// A SYN of a new connection.
    NewSyn,
    /// Another first packet of a new connection (an LRU miss that is no SYN).
    NewOther,
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec; CLOCK_MONOTONIC is bpf_ktime_get_ns's clock.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Pins the calling thread to its current CPU, so that one of Katran's per-CPU LRUs serves it.
fn pin_thread() -> Result<()> {
    // SAFETY: plain libc calls on this thread's own affinity.
    unsafe {
        let cpu = libc::sched_getcpu();
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu as usize, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// One family's figures, ns above the floor per run.
struct Side {
    floor: f64,
    hit: [Spread; 2],
    /// `lb`'s SYN in a dirty slot (its table changed and a live entry there may disagree), inserting.
    new_flow: [Spread; 2],
    /// `lb`'s SYN in a clean slot: no connection-table access (issue 35).
    new_clean: Spread,
    katran_new_shipped: Spread,
    hot_hit: [Spread; 2],
    /// A connection's first two packets, SYN then ACK, each its own call: `lb` in clean slots
    /// (SYN without the table, its ACK misses and inserts), Katran as shipped under a flood (its SYN inserts nothing, its ACK misses and
    /// inserts). The sum of both calls above the floor.
    connection: [Spread; 2],
}

fn measure(ours: &mut Bench, katran: &mut Katran, p: &cold::Params, family: Family) -> Result<Side> {
    let mut rng = SplitMix64(0x6b61 + family as u64);
    // Both tables filled with the same established flows: each flow's SYN, then (ours; Katran
    // has no confirmation) its first ACK, which confirms the entry.
    in_batches(family, 0..p.ct_entries, TCP_SYN, INSERT_BATCH, |frames| {
        cold::run_each(ours, "lb", frames, XDP_TX, NEW_FLOW_PATH)?;
        katran.run_inserting(frames).map(|_| ())
    })?;
    in_batches(family, 0..p.ct_entries, TCP_ACK, INSERT_BATCH, |frames| {
        cold::run_each(ours, "lb", frames, XDP_TX, CT_HIT_PATH).map(|_| ())
    })?;
    let floor = |frames: &[Vec<u8>]| cold::floor(ours, frames);
    let (mut floors, mut hit, mut hit_k) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..p.runs {
        let frames = hit_sample(&mut rng, family, p.ct_entries, p.frames);
        let f = floor(&frames)?;
        hit.push(cold::run_each(ours, "lb", &frames, XDP_TX, CT_HIT_PATH)? - f);
        hit_k.push(katran.run(&frames, true)? - f);
        floors.push(f);
    }
    // Full: ours one new flow per slot, Katran's LRU past its capacity.
    let slots = super::ct_slots(p.ct_entries);
    in_batches(family, p.ct_entries..slots, TCP_SYN, INSERT_BATCH, |frames| {
        cold::run_each(ours, "lb", frames, XDP_TX, NEW_FLOW_PATH)?;
        katran.run_inserting(frames).map(|_| ())
    })?;
    let (mut new, mut new_k, mut new_shipped) = (Vec::new(), Vec::new(), Vec::new());
    let mut next = slots;
    for _ in 0..p.runs {
        let frames = new_flows(family, next, p.frames);
        next += p.frames as u32;
        let f = floor(&frames)?;
        new.push(cold::run_each(ours, "lb", &frames, XDP_TX, NEW_FLOW_PATH)? - f);
        new_k.push(katran.run_inserting(&frames)? - f);
        new_shipped.push(katran.run_guarded(&frames)? - f);
        floors.push(f);
    }
    // The same in clean slots (as after the daemon's scan): the SYN reads no bucket.
    ours.set_clean()?;
    let ours = &*ours;
    let floor = |frames: &[Vec<u8>]| cold::floor(ours, frames);
    let mut new_clean = Vec::new();
    for _ in 0..p.runs {
        let frames = new_flows(family, next, p.frames);
        next += p.frames as u32;
        let f = floor(&frames)?;
        new_clean.push(cold::run_each(ours, "lb", &frames, XDP_TX, STATELESS_SYN_PATH)? - f);
        new_shipped.push(katran.run_guarded(&frames)? - f);
        floors.push(f);
    }
    // Per connection: the SYNs of new flows, then (a batch later, their lines cold again) the
    // first ACK of each, which inserts the flow.
    let (mut conn, mut conn_k) = (Vec::new(), Vec::new());
    for _ in 0..p.runs {
        let syns = new_flows(family, next, p.frames);
        let acks: Vec<Vec<u8>> = (next..next + p.frames as u32).map(|i| flow_frame(family, i, TCP_ACK)).collect();
        next += p.frames as u32;
        let f = floor(&syns)?;
        let ours_ns = cold::run_each(ours, "lb", &syns, XDP_TX, STATELESS_SYN_PATH)? + first_acks(ours, &acks)?;
        let katran_ns = katran.run_guarded(&syns)? + katran.run_acks_inserting(&acks)?;
        conn.push(ours_ns - 2.0 * f);
        conn_k.push(katran_ns - 2.0 * f);
        floors.push(f);
    }
    // Hot: one established flow's ACK, every call (its SYN and a first ACK before: the fill
    // evicted it, and its SYN makes no entry in a clean slot).
    let syn = [flow_frame(family, 0, TCP_SYN)];
    cold::run_each(ours, "lb", &syn, XDP_TX, STATELESS_SYN_PATH)?;
    first_acks(ours, &[flow_frame(family, 0, TCP_ACK)])?;
    katran.run_inserting(&syn)?;
    let hot = vec![flow_frame(family, 0, TCP_ACK); p.frames];
    let (mut hot_ours, mut hot_k) = (Vec::new(), Vec::new());
    for _ in 0..p.runs {
        let f = floor(&hot)?;
        hot_ours.push(cold::run_each(ours, "lb", &hot, XDP_TX, CT_HIT_PATH)? - f);
        hot_k.push(katran.run(&hot, true)? - f);
    }
    Ok(Side {
        floor: Spread::of(floors).median,
        hit: [Spread::of(hit), Spread::of(hit_k)],
        new_flow: [Spread::of(new), Spread::of(new_k)],
        new_clean: Spread::of(new_clean),
        katran_new_shipped: Spread::of(new_shipped),
        hot_hit: [Spread::of(hot_ours), Spread::of(hot_k)],
        connection: [Spread::of(conn), Spread::of(conn_k)],
    })
}

/// `lb` on new flows' first ACKs, ns per call. In a full table a later SYN of the batch may have
/// replaced an earlier flow's unconfirmed entry, so an ACK either hits or misses (and
/// inserts): checked is that every frame is forwarded as one or the other.
pub fn first_acks(ours: &Bench, acks: &[Vec<u8>]) -> Result<f64> {
    let before = ours.counters()?;
    let ns = call_each(ours.program("lb")?, "lb", ours.ingress_ifindex, acks, XDP_TX)?;
    let after = ours.counters()?;
    let d = |i: u32| after[i as usize] - before[i as usize];
    let n = acks.len() as u64;
    let drops: u64 = (0..stat::NAMES.len()).filter(|&i| stat::NAMES[i].starts_with("drop_")).map(|i| d(i as u32)).sum();
    if (d(stat::RX_PACKETS), d(stat::TX), d(stat::CT_HIT) + d(stat::CT_MISS), drops) != (n, n, n, 0) {
        bail!(
            "lb: first ACKs: rx, tx, hits + misses, drops moved by {:?} in {n} frames: not the intended path",
            (d(stat::RX_PACKETS), d(stat::TX), d(stat::CT_HIT) + d(stat::CT_MISS), drops)
        );
    }
    Ok(ns)
}

/// `dp_bench --katran OBJECT`.
pub fn run(object: &str, p: cold::Params) -> Result<()> {
    let bytes = read_object(object)?;
    let sides = in_netns(move |topo| -> Result<Vec<(Family, Side)>> {
        pin_thread()?;
        let mut sides = Vec::new();
        for family in [Family::V4, Family::V6] {
            let mut ours = Bench::load_object(topo.lbv0, &super::read_object()?, p.ct_entries)?;
            let mut katran = Katran::load(&bytes, topo.lbv0, p.ct_entries)?;
            sides.push((family, measure(&mut ours, &mut katran, &p, family)?));
        }
        Ok(sides)
    })?;
    println!();
    println!("lb and Katran ({object}) side by side: one call per frame, the same frames, ns above the same floor;");
    println!(
        "median of {} runs of {} frames [fastest, slowest run]; table / LRU of {} flows; every run checked by counters",
        p.runs, p.frames, p.ct_entries
    );
    let cell = |s: &Spread| format!("{:+.0} [{:+.0}, {:+.0}]", s.median, s.min, s.max);
    for (family, s) in &sides {
        let name = family.name();
        println!();
        println!("  {name}, floor {:.0} ns per call", s.floor);
        println!("  {:<40} {:>22} {:>22} {:>8}", "case", "lb", "Katran", "lb/K");
        let row = |case: &str, a: &Spread, b: &Spread| {
            println!("  {:<40} {:>22} {:>22} {:>8.2}", case, cell(a), cell(b), a.median / b.median);
        };
        row("cold hit (random established flow)", &s.hit[0], &s.hit[1]);
        row("new flow (SYN), dirty slot, inserting", &s.new_flow[0], &s.new_flow[1]);
        row("new flow (SYN), clean slot, vs K as shipped", &s.new_clean, &s.katran_new_shipped);
        row("hot hit (one flow, every call)", &s.hot_hit[0], &s.hot_hit[1]);
        row("per connection: SYN + first ACK", &s.connection[0], &s.connection[1]);
        println!(
            "  target new flow <= 1.0 of Katran's as shipped: {:.2} -> {}; per connection <= 0.6 of Katran's (its ACK inserting): {:.2} -> {}",
            s.new_clean.median / s.katran_new_shipped.median,
            if s.new_clean.median <= s.katran_new_shipped.median { "met" } else { "not met" },
            s.connection[0].median / s.connection[1].median,
            if s.connection[0].median <= 0.6 * s.connection[1].median { "met" } else { "not met" }
        );
        // What item 3 of issue 17 is up against: a cold hit is this wait plus at least the
        // hot hit's path, and a new flow that keeps its no-eviction guarantee reads its
        // buckets, so it pays the wait plus at least as much path (BENCHMARKS.md).
        let wait = s.hit[0].median - s.hot_hit[0].median;
        println!(
            "  one wait for the table's memory (lb cold hit - lb hot hit): {:+.0} ns = {:.2} of Katran's cold hit, {:.2} of its no-insert new flow",
            wait,
            wait / s.hit[1].median,
            wait / s.katran_new_shipped.median
        );
    }
    Ok(())
}
