//! Weighted Maglev lookup tables (Eisenbud et al., "Maglev", NSDI 2016, §3.4), pure Rust.
//!
//! The kernel picks `table[maglev_slot(flow_hash(tuple), m)]`; this module builds `table`.
//! The same backend set and `m` must give a byte-identical table on every host and version, so
//! that balancers behind ECMP agree on a flow's backend. Hence:
//! - backends are ordered by `key` (not by input order), and duplicate keys are rejected;
//! - the permutations come from `lb_common::hash::maglev_permutation` (fixed-seed MurmurHash3);
//! - only integer arithmetic, no randomness, no hash-map iteration.
//!
//! # Population
//! Each backend `i` (key order) walks its own permutation `offset_i, offset_i + skip_i, ...`
//! (mod `m`, a prime, so every walk visits every slot) and, on each *claim*, takes the next slot
//! of its walk that nobody has taken yet. Backends claim in rounds, in key order, until all
//! `m` slots are taken. With equal weights every backend claims once per round: the paper's
//! algorithm exactly.
//!
//! # Weights
//! Credit rounds: let `W = max weight`. Every backend starts with credit `W / 2`; in each round
//! it earns its weight `w`, and if its credit reaches `W` it pays `W` and claims one slot. As
//! `w <= W`, that is at most one claim per round, and after `r` rounds backend `i` has made
//! exactly `floor((r·w_i + W/2) / W)` claims, i.e. `r·w_i/W` rounded to nearest (error <= 1/2).
//! The heaviest backends claim every round. As claims add up to `m` (the last round may be
//! partial), backend `i`'s slot count differs from its ideal `m·w_i/Σw` by at most
//! `w_i/W + 1/2 + N·w_i/(2·Σw)` slots: a relative error of at most
//! `1/(2·ideal_i) + 3N/(2m)` in the worst case; the ±1/2 rounding errors mostly cancel, and
//! measured errors are under 0.25% for `m >= 300·N` (tests/maglev.rs). With equal weights
//! every backend gets `⌊m/N⌋` or `⌈m/N⌉` slots. A backend whose ideal share is below half a
//! slot may get no slot at all (proportionality wins over presence).
//!
//! Adding or removing a backend that is not the unique heaviest one leaves everyone else's
//! claim schedule unchanged, so disruption is Maglev's usual ≈1/N plus a small collateral
//! (measured <= 0.65% of m for N <= 100, m = 65537). Changing the maximum weight rescales every
//! schedule and moves somewhat more (measured <= 0.94%).
//!
//! Cost (the tables do not depend on how they are computed; tests/maglev.rs cross-checks the
//! builder against the textbook algorithm and against the previous, plain implementation):
//! - the claim order comes from a `ClaimSchedule` that visits only the backends claiming in
//!   a window of rounds (their claim rounds are stepped without division), so skewed weights
//!   cost no more than equal ones (one weight 1000 among 999 of weight 1 at m = 65537: ~33M
//!   credit updates before, ~m now);
//! - a claim walks its permutation, probing a bitmap that stays in L1 several slots at a time:
//!   ~`m·ln m` probes in all, most of them near the end;
//! - so the last ~`√m/2` claims use the `EndPhase` search instead: each computes the walk
//!   position of every free slot (`(s − next)·skip⁻¹ mod m`) and takes the smallest.
//!
//! About 1 ms for N = 1000 at m = 65537 on a shared 2-core VM (BENCHMARKS.md).

use lb_common::hash::maglev_permutation;
use lb_common::maps::BACKEND_DROP;
use std::fmt;

/// One member of the set a table is built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MaglevBackend<'a> {
    /// Stable identity (e.g. the address's bytes): decides the backend's permutation and its
    /// place in the claim order. Must be unique within a set.
    pub key: &'a [u8],
    /// Relative share of slots; 0 = excluded from the table.
    pub weight: u32,
}

/// Why a table cannot be built. Config validation rules these out up front.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MaglevError {
    /// `m` is not prime: permutations would not visit every slot.
    NotPrime { m: u32 },
    /// Fewer slots than backends with a non-zero weight.
    TooSmall { m: u32, backends: usize },
    /// Two backends with a non-zero weight share a key (indices into the input slice).
    DuplicateKey { first: usize, second: usize },
    /// An index would not fit a table entry (it would collide with `BACKEND_DROP`).
    TooManyBackends { backends: usize },
}

impl fmt::Display for MaglevError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotPrime { m } => write!(f, "Maglev table size {m} is not prime"),
            Self::TooSmall { m, backends } => {
                write!(f, "Maglev table size {m} is smaller than the number of backends ({backends})")
            }
            Self::DuplicateKey { first, second } => {
                write!(f, "backends #{first} and #{second} have the same Maglev key")
            }
            Self::TooManyBackends { backends } => {
                write!(f, "{backends} backends do not fit a Maglev table entry")
            }
        }
    }
}

impl std::error::Error for MaglevError {}

/// Whether `n` is prime (deterministic trial division; at most ~33k divisions for a `u32`).
pub fn is_prime(n: u32) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) || n.is_multiple_of(3) {
        return false;
    }
    // Candidates 6k ± 1 up to √n; u64 so that d·d cannot overflow.
    let n64 = u64::from(n);
    let mut d: u64 = 5;
    while d * d <= n64 {
        if n64.is_multiple_of(d) || n64.is_multiple_of(d + 2) {
            return false;
        }
        d += 6;
    }
    true
}

/// Builds the weighted Maglev table of size `m` for `backends` (see the module docs).
///
/// Entries are indices into `backends`; a set with no non-zero weight gives a table of
/// [`BACKEND_DROP`]. The result depends only on the set of `(key, weight)` pairs and `m`, not on
/// the input order (apart from the indices naming the same backends).
pub fn build_table(backends: &[MaglevBackend], m: u32) -> Result<Vec<u32>, MaglevError> {
    if !is_prime(m) {
        return Err(MaglevError::NotPrime { m });
    }
    if backends.len() >= BACKEND_DROP as usize {
        return Err(MaglevError::TooManyBackends { backends: backends.len() });
    }
    let order = claim_order(backends)?;
    if order.len() > m as usize {
        return Err(MaglevError::TooSmall { m, backends: order.len() });
    }
    if order.is_empty() {
        return Ok(vec![BACKEND_DROP; m as usize]);
    }

    let weights: Vec<u32> = order.iter().map(|&i| backends[i as usize].weight).collect();
    let mut walkers: Vec<Walker> = order
        .iter()
        .map(|&i| {
            let (offset, skip) = maglev_permutation(backends[i as usize].key, m);
            Walker::new(i, offset, skip, m)
        })
        .collect();
    let mut slots = Slots::new(m);
    populate(&mut ClaimSchedule::new(&weights), &mut walkers, &mut slots);
    Ok(slots.table)
}

/// Makes the claims of `schedule` until the table is full: by walks, then (few slots left)
/// by the [`EndPhase`] search.
fn populate(schedule: &mut ClaimSchedule, walkers: &mut [Walker], slots: &mut Slots) {
    let end_phase_at = end_phase_free(slots.m);
    loop {
        let window = schedule.next_window();
        let walked = walk_claims(window, walkers, slots, end_phase_at);
        if slots.free <= end_phase_at {
            let mut end_phase = EndPhase::new(slots, walkers.len());
            let mut window = &window[walked..];
            loop {
                for &rank in window {
                    if slots.free == 0 {
                        return;
                    }
                    end_phase.claim(rank, &walkers[rank as usize], slots);
                }
                if slots.free == 0 {
                    return;
                }
                window = schedule.next_window();
            }
        }
    }
}

/// Makes the claims of `ranks` by walks while more than `stop_at` slots are free; returns how
/// many it made. The hot loop: `Slots`' fields are held in locals.
fn walk_claims(ranks: &[u32], walkers: &mut [Walker], slots: &mut Slots, stop_at: u32) -> usize {
    let m = slots.m;
    let mut free = slots.free;
    let (taken, table) = (&mut slots.taken[..], &mut slots.table[..]);
    // Unchecked indexing by slot (measured ~7% faster than checked). Every slot here is `< m`:
    // walks start at `offset < m` and only step by `add_mod` of values `< m`.
    assert!(table.len() == m as usize && taken.len() * 64 >= m as usize);
    let is_taken = |taken: &[u64], slot: u32| {
        debug_assert!(slot < m);
        // SAFETY: slot < m <= 64·taken.len() (asserted above).
        let word = unsafe { *taken.get_unchecked((slot / 64) as usize) };
        word & (1 << (slot % 64)) != 0
    };
    // Free slots only decrease, by one per claim: no check inside the loop.
    let made = ranks.len().min(free.saturating_sub(stop_at) as usize);
    for &rank in &ranks[..made] {
        let walker = &mut walkers[rank as usize];
        let mut slot = walker.next;
        if is_taken(taken, slot) {
            slot = loop {
                let free_mask = walker.strides.iter().enumerate().fold(0u32, |mask, (k, &stride)| {
                    mask | (u32::from(!is_taken(taken, add_mod(slot, stride, m))) << k)
                });
                if free_mask != 0 {
                    break add_mod(slot, walker.strides[free_mask.trailing_zeros() as usize], m);
                }
                slot = add_mod(slot, walker.strides[PROBE_BLOCK - 1], m);
            };
        }
        debug_assert!(slot < m);
        // SAFETY: slot < m == table.len() <= 64·taken.len() (asserted above).
        unsafe {
            *taken.get_unchecked_mut((slot / 64) as usize) |= 1 << (slot % 64);
            *table.get_unchecked_mut(slot as usize) = walker.index;
        }
        walker.next = add_mod(slot, walker.strides[0], m);
    }
    free -= made as u32;
    slots.free = free;
    made
}

/// The claims of the credit rounds (module docs) in order, as ranks (key order): round by
/// round, and within a round in key order. Produced a window of rounds at a time, visiting
/// only the backends that claim (plus one check per backend and window).
///
/// Backend `i` makes its `k`-th claim in round `r_k = ⌈(k·W − ⌊W/2⌋) / w_i⌉` (the first round
/// whose credit reaches `k·W`). Consecutive claims are `⌊W/w⌋` or `⌈W/w⌉` rounds apart, so
/// `r_k` is stepped Bresenham-style, without a division per claim. A window spans about
/// `N·W/Σw` rounds (one when most backends claim every round), i.e. ~`N` claims; within it a
/// stable counting sort by round puts the claims (generated in key order) in round order.
struct ClaimSchedule {
    backends: Vec<ClaimClock>,
    /// First round of the next window (rounds count from 1).
    window_start: u64,
    window_rounds: u64,
    /// Equal weights: every backend claims every round, and `by_rank` is always `0..N`.
    all_every_round: bool,
    /// The current window's claims: in key order, then (sorted) in claim order.
    by_rank: Vec<u32>,
    by_round: Vec<u32>,
    /// Per claim in `by_rank`: its round minus `window_start`.
    round_in_window: Vec<u32>,
    /// Counting-sort cursors, one per round of the window.
    cursors: Vec<u32>,
}

/// One backend's next claim round.
struct ClaimClock {
    weight: u64,
    /// `⌊W/w⌋`, `W mod w`: the gap between claims is `step` or `step + 1` rounds.
    step: u64,
    step_rem: u64,
    next_round: u64,
    /// `next_round·w − (k·W − ⌊W/2⌋)` in `[0, w)`: the credit left over at that claim.
    excess: u64,
}

impl ClaimClock {
    /// Moves on to the following claim.
    #[inline(always)]
    fn advance(&mut self) {
        self.next_round += self.step;
        if self.excess >= self.step_rem {
            self.excess -= self.step_rem;
        } else {
            self.excess = self.excess + self.weight - self.step_rem;
            self.next_round += 1;
        }
    }
}

impl ClaimSchedule {
    /// `weights` in key order, all non-zero.
    fn new(weights: &[u32]) -> Self {
        let max_weight = u64::from(weights.iter().copied().max().unwrap_or(1));
        // Credit still missing before the first claim.
        let first_due = max_weight - max_weight / 2;
        let backends = weights
            .iter()
            .map(|&w| {
                let weight = u64::from(w);
                let next_round = first_due.div_ceil(weight);
                ClaimClock {
                    weight,
                    step: max_weight / weight,
                    step_rem: max_weight % weight,
                    next_round,
                    excess: next_round * weight - first_due,
                }
            })
            .collect();
        let total_weight: u128 = weights.iter().map(|&w| u128::from(w)).sum();
        // ~N claims per window; the heaviest claim every round, so never an empty one.
        // At most N rounds, as Σw >= W.
        let window_rounds = (weights.len() as u128 * u128::from(max_weight) / total_weight).max(1) as u64;
        // Equal weights: step 1, no remainder, first claim in round 1 (W − ⌊W/2⌋ <= W).
        let all_every_round = weights.iter().all(|&w| u64::from(w) == max_weight);
        Self {
            backends,
            window_start: 1,
            window_rounds,
            all_every_round,
            by_rank: if all_every_round { (0..weights.len() as u32).collect() } else { Vec::new() },
            by_round: Vec::new(),
            round_in_window: Vec::new(),
            cursors: vec![0; window_rounds as usize + 1],
        }
    }

    /// The claims of the next window of rounds, in order (never empty).
    fn next_window(&mut self) -> &[u32] {
        if self.all_every_round {
            return &self.by_rank;
        }
        let end = self.window_start + self.window_rounds;
        self.by_rank.clear();
        if self.window_rounds == 1 {
            for (rank, clock) in self.backends.iter_mut().enumerate() {
                if clock.next_round < end {
                    self.by_rank.push(rank as u32);
                    clock.advance();
                }
            }
            self.window_start = end;
            return &self.by_rank;
        }
        self.round_in_window.clear();
        self.cursors.fill(0);
        for (rank, clock) in self.backends.iter_mut().enumerate() {
            while clock.next_round < end {
                let offset = (clock.next_round - self.window_start) as u32;
                self.by_rank.push(rank as u32);
                self.round_in_window.push(offset);
                self.cursors[offset as usize + 1] += 1;
                clock.advance();
            }
        }
        let mut before = 0;
        for cursor in self.cursors.iter_mut() {
            before += *cursor;
            *cursor = before;
        }
        self.by_round.clear();
        self.by_round.resize(self.by_rank.len(), 0);
        for (&rank, &offset) in self.by_rank.iter().zip(&self.round_in_window) {
            let at = &mut self.cursors[offset as usize];
            self.by_round[*at as usize] = rank;
            *at += 1;
        }
        self.window_start = end;
        &self.by_round
    }
}

/// Candidates probed at once once a backend's next slot is taken: independent loads overlap,
/// instead of one load-compare-step chain per probe (most probes happen when the table is
/// nearly full: ~M·ln M in all).
const PROBE_BLOCK: usize = 8;

/// A backend's walk through its permutation `offset, offset + skip, ...` (mod m).
struct Walker {
    /// Index into the caller's slice: the table entry.
    index: u32,
    /// Next slot of the permutation to try.
    next: u32,
    /// `k·skip mod m` for k = 1..=PROBE_BLOCK: the block's candidates without a serial chain.
    strides: [u32; PROBE_BLOCK],
}

impl Walker {
    fn new(index: u32, offset: u32, skip: u32, m: u32) -> Self {
        let mut strides = [0; PROBE_BLOCK];
        let mut stride = 0;
        for s in strides.iter_mut() {
            stride = add_mod(stride, skip, m);
            *s = stride;
        }
        Self { index, next: offset, strides }
    }
}

/// `(a + b) mod m` for `a, b < m`, by add-and-compare (u64, so any u32 `m` is fine).
#[inline(always)]
fn add_mod(a: u32, b: u32, m: u32) -> u32 {
    let sum = u64::from(a) + u64::from(b);
    let m = u64::from(m);
    (if sum >= m { sum - m } else { sum }) as u32
}

/// The table under construction.
struct Slots {
    m: u32,
    table: Vec<u32>,
    /// Taken slots, one bit each: 8 KiB for m = 65537, so probing stays in L1.
    taken: Vec<u64>,
    free: u32,
}

impl Slots {
    fn new(m: u32) -> Self {
        Self { m, table: vec![BACKEND_DROP; m as usize], taken: vec![0; (m as usize).div_ceil(64)], free: m }
    }

    #[inline(always)]
    fn take(&mut self, slot: u32, index: u32) {
        self.taken[(slot / 64) as usize] |= 1 << (slot % 64);
        self.table[slot as usize] = index;
        self.free -= 1;
    }

    /// The untaken slots, ascending.
    fn free_slots(&self) -> Vec<u32> {
        let mut free = Vec::with_capacity(self.free as usize);
        for (w, &word) in self.taken.iter().enumerate() {
            let mut untaken = !word;
            while untaken != 0 {
                let slot = w as u32 * 64 + untaken.trailing_zeros();
                if slot >= self.m {
                    break;
                }
                free.push(slot);
                untaken &= untaken - 1;
            }
        }
        free
    }
}

/// Free slots at which [`EndPhase`] takes over from walking: a walk then needs ~`m/free`
/// probes per claim, the end phase `free` position computations (each several times a probe;
/// measured best around `√m/2`).
fn end_phase_free(m: u32) -> u32 {
    m.isqrt() / 2
}

/// The last claims (from `end_phase_free(m)` free slots on), by search instead of walks.
///
/// Invariant: every slot of a backend's walk before its `next` is taken (slots are never
/// released), so the slot its walk would reach first is the free slot `s` with the smallest
/// position `(s − next)·skip⁻¹ mod m` in the walk from `next`; `m` is prime, so `skip` is
/// invertible. With few free slots, computing that for each is much cheaper than walking.
struct EndPhase {
    reduce: ModReducer,
    free: Vec<u32>,
    /// Per rank: skip⁻¹ mod m, computed on a backend's first end-phase claim (0 = not yet).
    inverses: Vec<u32>,
}

impl EndPhase {
    fn new(slots: &Slots, backends: usize) -> Self {
        Self { reduce: ModReducer::new(slots.m), free: slots.free_slots(), inverses: vec![0; backends] }
    }

    /// Gives `walker` (rank `rank`) the slot its walk would reach first.
    fn claim(&mut self, rank: u32, walker: &Walker, slots: &mut Slots) {
        let m = slots.m;
        let inverse = &mut self.inverses[rank as usize];
        if *inverse == 0 {
            *inverse = inverse_mod(walker.strides[0], m);
        }
        let inverse = u64::from(*inverse);
        let next = walker.next;
        let position = |slot: u32| {
            let distance = if slot >= next { slot - next } else { slot.wrapping_sub(next).wrapping_add(m) };
            self.reduce.reduce(u64::from(distance) * inverse)
        };
        let mut best = (u64::MAX, 0);
        for (k, &slot) in self.free.iter().enumerate() {
            let p = position(slot);
            if p < best.0 {
                best = (p, k);
            }
        }
        let slot = self.free.swap_remove(best.1);
        slots.take(slot, walker.index);
    }
}

/// `a⁻¹ mod m` for `0 < a < m`, `m` prime (extended Euclid).
fn inverse_mod(a: u32, m: u32) -> u32 {
    let (mut r, mut next_r) = (i64::from(m), i64::from(a));
    let (mut t, mut next_t) = (0i64, 1i64);
    while next_r != 0 {
        let q = r / next_r;
        (r, next_r) = (next_r, r - q * next_r);
        (t, next_t) = (next_t, t - q * next_t);
    }
    debug_assert_eq!(r, 1, "{a} is not invertible mod {m}");
    t.rem_euclid(i64::from(m)) as u32
}

/// `x mod m` for `x < m²` without a division (Barrett reduction).
struct ModReducer {
    m: u64,
    /// `⌊(2^64 − 1) / m⌋`.
    magic: u64,
}

impl ModReducer {
    fn new(m: u32) -> Self {
        Self { m: u64::from(m), magic: u64::MAX / u64::from(m) }
    }

    /// The quotient estimate `⌊x·magic / 2^64⌋` is at most `⌊x/m⌋` and, for `x < m² < 2^64`,
    /// more than `x/m − 2`: at most two corrections.
    #[inline(always)]
    fn reduce(&self, x: u64) -> u64 {
        let quotient = ((u128::from(x) * u128::from(self.magic)) >> 64) as u64;
        let mut r = x - quotient * self.m;
        if r >= self.m {
            r -= self.m;
        }
        if r >= self.m {
            r -= self.m;
        }
        r
    }
}

/// Indices of the backends with a non-zero weight, sorted by key; rejects duplicate keys.
fn claim_order(backends: &[MaglevBackend]) -> Result<Vec<u32>, MaglevError> {
    let mut order: Vec<u32> = (0..backends.len() as u32).filter(|&i| backends[i as usize].weight > 0).collect();
    order.sort_unstable_by(|&a, &b| backends[a as usize].key.cmp(backends[b as usize].key));
    if let Some(pair) = order.windows(2).find(|p| backends[p[0] as usize].key == backends[p[1] as usize].key) {
        let (first, second) = (pair[0].min(pair[1]) as usize, pair[0].max(pair[1]) as usize);
        return Err(MaglevError::DuplicateKey { first, second });
    }
    Ok(order)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_prime_small_and_edge_values() {
        let primes: Vec<u32> = (0..60).filter(|&n| is_prime(n)).collect();
        assert_eq!(primes, [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]);
        for p in [251, 16381, 65521, 65537, 4_294_967_291] {
            assert!(is_prime(p), "{p}");
        }
        // Carmichael number, a square of a large prime (the √n bound), u32::MAX, 2^16 + 2.
        for c in [561, 65521 * 65521, u32::MAX, 65538, 16383] {
            assert!(!is_prime(c), "{c}");
        }
    }

    #[test]
    fn add_mod_and_strides_near_u32_max() {
        let m = 4_294_967_291u32; // largest u32 prime
        assert_eq!(add_mod(m - 1, m - 1, m), m - 2);
        assert_eq!(add_mod(1, m - 1, m), 0);
        assert_eq!(add_mod(2, 3, m), 5);
        let w = Walker::new(7, 5, m - 1, m);
        assert_eq!(w.strides[..4], [m - 1, m - 2, m - 3, m - 4]);
        let w = Walker::new(7, 5, 5, 13);
        assert_eq!(w.strides[..4], [5, 10, 2, 7]);
        assert!(w.strides.iter().enumerate().all(|(k, &s)| s as usize == (k + 1) * 5 % 13));
    }

    #[test]
    fn inverse_and_barrett_reduction_near_u32_max() {
        for m in [2u32, 13, 65537, 4_294_967_291] {
            let reduce = ModReducer::new(m);
            for a in [1, 2, 3, m / 2, m - 2, m - 1] {
                if a == 0 || a >= m {
                    continue;
                }
                let inv = inverse_mod(a, m);
                assert_eq!(u64::from(a) * u64::from(inv) % u64::from(m), 1, "{a} mod {m}");
                for b in [0, 1, a, m - 1] {
                    let x = u64::from(a) * u64::from(b);
                    assert_eq!(reduce.reduce(x), x % u64::from(m), "{a}·{b} mod {m}");
                }
            }
        }
    }

    /// The windowed schedule against the closed form: after `r` rounds backend `i` has made
    /// `⌊(r·w_i + ⌊W/2⌋)/W⌋` claims, and within a round claims go in rank order.
    #[test]
    fn claim_schedule_matches_closed_form() {
        for weights in [
            vec![1, 1, 1],
            vec![3, 1, 2],
            vec![1000, 1, 1, 1, 1, 1, 1],
            vec![u32::MAX, 1, u32::MAX - 1, 7],
            vec![4, 4, 3],
        ] {
            let max_weight = u128::from(*weights.iter().max().expect("non-empty"));
            let claims_after = |r: u128, w: u32| (r * u128::from(w) + max_weight / 2) / max_weight;
            let mut expected = Vec::new();
            let mut round = 1;
            while expected.len() < 5000 {
                for (rank, &w) in weights.iter().enumerate() {
                    if claims_after(round, w) > claims_after(round - 1, w) {
                        expected.push(rank as u32);
                    }
                }
                round += 1;
            }
            let mut schedule = ClaimSchedule::new(&weights);
            let mut got = Vec::new();
            while got.len() < expected.len() {
                got.extend_from_slice(schedule.next_window());
            }
            assert_eq!(got[..expected.len()], expected[..], "{weights:?}");
        }
    }

    #[test]
    fn credit_handles_extreme_weights() {
        let keys: [&[u8]; 3] = [b"x", b"y", b"z"];
        let weights = [u32::MAX, u32::MAX - 1, 1];
        let set: Vec<_> = keys.iter().zip(weights).map(|(k, w)| MaglevBackend { key: k, weight: w }).collect();
        let table = build_table(&set, 13).expect("valid");
        assert!(table.iter().all(|&e| e < 2), "the tiny weight gets no slot: {table:?}");
    }
}
