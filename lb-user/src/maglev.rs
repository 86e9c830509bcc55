//! Weighted Maglev lookup tables (Eisenbud et al., "Maglev", NSDI 2016, §3.4), pure Rust.
//!
//! The kernel picks `table[maglev_slot(flow_hash(tuple), m)]`; this module builds `table`.
//! The same backend set and `m` must give a byte-identical table on every host and version, so
//! that balancers behind ECMP agree on a flow's backend. Hence:
//! - backends are ordered by `key` (not by input order), and duplicate keys are rejected;
//! - the permutations come from `lb_common::maglev_permutation` (fixed-seed MurmurHash3);
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
//! Cost: ~`m·ln m` probes (bit tests in an `m/8`-byte bitmap that stays in L1, several at a
//! time near the end) plus `N` credit updates per round, i.e. ~`m·W/mean weight` credit updates
//! in all: negligible unless weights are very skewed (one 1000 among 999 of weight 1 at
//! m = 65537: ~33M updates, tens of ms).

use lb_common::{maglev_permutation, BACKEND_DROP};
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
                write!(
                    f,
                    "Maglev table size {m} is smaller than the number of backends ({backends})"
                )
            }
            Self::DuplicateKey { first, second } => {
                write!(
                    f,
                    "backends #{first} and #{second} have the same Maglev key"
                )
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
        return Err(MaglevError::TooManyBackends {
            backends: backends.len(),
        });
    }
    let order = claim_order(backends)?;
    if order.len() > m as usize {
        return Err(MaglevError::TooSmall {
            m,
            backends: order.len(),
        });
    }
    if order.is_empty() {
        return Ok(vec![BACKEND_DROP; m as usize]);
    }

    let weights: Vec<u32> = order.iter().map(|&i| backends[i as usize].weight).collect();
    let schedule = claim_schedule(&weights, m);
    let mut walkers: Vec<Walker> = order
        .iter()
        .map(|&i| {
            let (offset, skip) = maglev_permutation(backends[i as usize].key, m);
            Walker::new(i, offset, skip, m)
        })
        .collect();
    let mut slots = Slots::new(m);
    populate(&schedule, &mut walkers, &mut slots);
    Ok(slots.table)
}

/// The first `m` claims of the credit rounds (module docs), as ranks in key order: round by
/// round, and within a round in key order. Backends are only visited when they claim.
///
/// Backend `i` makes its `k`-th claim in round `r_k = ⌈(k·W − ⌊W/2⌋) / w_i⌉` (the first round
/// whose credit reaches `k·W`). Consecutive claims are `⌊W/w⌋` or `⌈W/w⌉` rounds apart, so
/// `r_k` is stepped Bresenham-style without a division per claim. A counting sort by round
/// (stable, ranks visited in key order) then gives the exact claim order.
fn claim_schedule(weights: &[u32], m: u32) -> Vec<u32> {
    let max_weight = u64::from(weights.iter().copied().max().unwrap_or(1));
    let first_due = max_weight - max_weight / 2; // credit still missing before the 1st claim
    // After r rounds the claims number Σ⌊(r·w + ⌊W/2⌋)/W⌋ > r·Σw/W − N, so ⌈(m + N)·W/Σw⌉
    // rounds make at least m claims; so do m rounds (the heaviest claim every round).
    let total_weight: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let needed = (u128::from(m) + weights.len() as u128) * u128::from(max_weight);
    let rounds = needed.div_ceil(total_weight).min(u128::from(m)) as u64;

    // Claim rounds of one backend, up to `rounds`.
    let claim_rounds = |w: u32| {
        let w = u64::from(w);
        let (step, step_rem) = (max_weight / w, max_weight % w);
        let mut round = first_due.div_ceil(w);
        // round·w − (k·W − ⌊W/2⌋), in [0, w): the credit left over at the claim.
        let mut excess = round * w - first_due;
        std::iter::from_fn(move || {
            let this = round;
            round += step;
            if excess >= step_rem {
                excess -= step_rem;
            } else {
                excess = excess + w - step_rem;
                round += 1;
            }
            Some(this)
        })
        .take_while(move |&r| r <= rounds)
    };

    // Counting sort by round: `starts[r]` = claims in earlier rounds.
    let mut starts = vec![0usize; rounds as usize + 2];
    for &w in weights {
        for r in claim_rounds(w) {
            starts[r as usize + 1] += 1;
        }
    }
    let mut total = 0usize;
    for s in starts.iter_mut() {
        total += *s;
        *s = total;
    }
    debug_assert!(total >= m as usize, "{rounds} rounds make only {total} < {m} claims");
    let mut schedule = vec![0u32; total];
    for (rank, &w) in weights.iter().enumerate() {
        for r in claim_rounds(w) {
            let at = &mut starts[r as usize];
            schedule[*at] = rank as u32;
            *at += 1;
        }
    }
    schedule.truncate(m as usize);
    schedule
}

/// Makes the claims of `schedule` (ranks into `walkers`) until the table is full.
fn populate(schedule: &[u32], walkers: &mut [Walker], slots: &mut Slots) {
    let end_phase_at = end_phase_free(slots.m);
    let mut claims = schedule.iter();
    for &rank in claims.by_ref() {
        slots.claim(&mut walkers[rank as usize]);
        if slots.free <= end_phase_at {
            break;
        }
    }
    if slots.free > 0 {
        end_phase(claims.as_slice(), walkers, slots);
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
        Self {
            index,
            next: offset,
            strides,
        }
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
        Self {
            m,
            table: vec![BACKEND_DROP; m as usize],
            taken: vec![0; (m as usize).div_ceil(64)],
            free: m,
        }
    }

    #[inline(always)]
    fn is_taken(&self, slot: u32) -> bool {
        self.taken[(slot / 64) as usize] & (1 << (slot % 64)) != 0
    }

    /// Gives `walker` the first untaken slot of its walk.
    #[inline(always)]
    fn claim(&mut self, walker: &mut Walker) {
        let mut slot = walker.next;
        if self.is_taken(slot) {
            slot = loop {
                let candidates = walker.strides.map(|stride| add_mod(slot, stride, self.m));
                let free_mask = candidates.iter().enumerate().fold(0u32, |mask, (k, &c)| {
                    mask | (u32::from(!self.is_taken(c)) << k)
                });
                if free_mask != 0 {
                    break candidates[free_mask.trailing_zeros() as usize];
                }
                slot = candidates[PROBE_BLOCK - 1];
            };
        }
        self.take(slot, walker.index);
        walker.next = add_mod(slot, walker.strides[0], self.m);
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

/// Free slots at which [`end_phase`] takes over from walking: a walk then needs ~`m/free`
/// probes per claim, the end phase `free` position computations (each a few times a probe).
fn end_phase_free(m: u32) -> u32 {
    m.isqrt()
}

/// Makes the last claims (as many as there are free slots) by search instead of walks.
///
/// Invariant: every slot of a backend's walk before its `next` is taken (slots are never
/// released), so the slot its walk would reach first is the free slot `s` with the smallest
/// position `(s − next)·skip⁻¹ mod m` in the walk from `next`; `m` is prime, so `skip` is
/// invertible. With few free slots, computing that for each is much cheaper than walking.
fn end_phase(claims: &[u32], walkers: &[Walker], slots: &mut Slots) {
    let m = slots.m;
    let reduce = ModReducer::new(m);
    let mut free = slots.free_slots();
    // Per rank: skip⁻¹ mod m, computed on a backend's first end-phase claim (0 = not yet).
    let mut inverses = vec![0u32; walkers.len()];
    for &rank in claims {
        if free.is_empty() {
            break;
        }
        let walker = &walkers[rank as usize];
        let inverse = &mut inverses[rank as usize];
        if *inverse == 0 {
            *inverse = inverse_mod(walker.strides[0], m);
        }
        let inverse = u64::from(*inverse);
        let next = walker.next;
        let position = |slot: u32| {
            let distance = if slot >= next { slot - next } else { slot.wrapping_sub(next).wrapping_add(m) };
            reduce.reduce(u64::from(distance) * inverse)
        };
        let mut best = (u64::MAX, 0);
        for (k, &slot) in free.iter().enumerate() {
            let p = position(slot);
            if p < best.0 {
                best = (p, k);
            }
        }
        let slot = free.swap_remove(best.1);
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
        Self {
            m: u64::from(m),
            magic: u64::MAX / u64::from(m),
        }
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
    let mut order: Vec<u32> = (0..backends.len() as u32)
        .filter(|&i| backends[i as usize].weight > 0)
        .collect();
    order.sort_unstable_by(|&a, &b| backends[a as usize].key.cmp(backends[b as usize].key));
    if let Some(pair) = order
        .windows(2)
        .find(|p| backends[p[0] as usize].key == backends[p[1] as usize].key)
    {
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
        assert_eq!(
            primes,
            [2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59]
        );
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
        assert!(w
            .strides
            .iter()
            .enumerate()
            .all(|(k, &s)| s as usize == (k + 1) * 5 % 13));
    }

    #[test]
    fn credit_handles_extreme_weights() {
        let keys: [&[u8]; 3] = [b"x", b"y", b"z"];
        let weights = [u32::MAX, u32::MAX - 1, 1];
        let set: Vec<_> = keys
            .iter()
            .zip(weights)
            .map(|(k, w)| MaglevBackend { key: k, weight: w })
            .collect();
        let table = build_table(&set, 13).expect("valid");
        assert!(
            table.iter().all(|&e| e < 2),
            "the tiny weight gets no slot: {table:?}"
        );
    }
}
