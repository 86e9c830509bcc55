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
//! The heaviest backends claim every round. Since claims add up to `m`, a backend's slot
//! count differs from its ideal `m·w_i/Σw` by at most about `1/2 + N·w_i/(2·Σw)` slots: a
//! relative error of at most `1/(2·ideal_i) + N/(2m)`, well under 1% when `m >= 100·N` and
//! every ideal share is over ~100 slots. A backend whose ideal share is below half a slot may
//! get no slot at all (proportionality wins over presence).
//!
//! Adding or removing a backend that is not the unique heaviest one leaves everyone else's
//! claim schedule unchanged, so disruption is Maglev's usual ≈1/N. Changing the maximum weight
//! rescales every schedule and may move somewhat more.
//!
//! Cost: `O(m log m)` probes (one bit test each, in an `m/8`-byte bitmap that stays in L1) plus
//! `N` credit updates per round, i.e. `O(m · W / mean weight)` credit updates in all.

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
    if n % 2 == 0 || n % 3 == 0 {
        return false;
    }
    // Candidates 6k ± 1 up to √n; u64 so that d·d cannot overflow.
    let n64 = u64::from(n);
    let mut d: u64 = 5;
    while d * d <= n64 {
        if n64 % d == 0 || n64 % (d + 2) == 0 {
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
    let mut table = vec![BACKEND_DROP; m as usize];
    if order.is_empty() {
        return Ok(table);
    }

    let max_weight = order.iter().map(|&i| backends[i as usize].weight).max().unwrap_or(1);
    let mut walkers: Vec<Walker> = order
        .iter()
        .map(|&i| {
            let b = &backends[i as usize];
            let (offset, skip) = maglev_permutation(b.key, m);
            Walker { index: i, next: offset, skip, wrap: m - skip, weight: b.weight, credit: max_weight / 2 }
        })
        .collect();

    // Taken slots, one bit each: 8 KiB for m = 65537, so probing stays in L1.
    let mut taken = vec![0u64; (m as usize).div_ceil(64)];
    let mut free = m;
    'rounds: loop {
        for w in walkers.iter_mut() {
            // `credit < max_weight` between rounds and `weight <= max_weight`, so the sum
            // fits in u64 and the remainder again in u32.
            let credit = u64::from(w.credit) + u64::from(w.weight);
            if credit < u64::from(max_weight) {
                w.credit = credit as u32;
                continue;
            }
            w.credit = (credit - u64::from(max_weight)) as u32;
            let mut slot = w.next;
            while taken[(slot / 64) as usize] & (1 << (slot % 64)) != 0 {
                slot = w.step(slot);
            }
            taken[(slot / 64) as usize] |= 1 << (slot % 64);
            table[slot as usize] = w.index;
            w.next = w.step(slot);
            free -= 1;
            if free == 0 {
                break 'rounds;
            }
        }
    }
    Ok(table)
}

/// A backend's position in its permutation and its weight credit.
struct Walker {
    /// Index into the caller's slice: the table entry.
    index: u32,
    /// Next slot of the permutation to try.
    next: u32,
    skip: u32,
    /// `m - skip`: `slot + skip` wraps iff `slot >= wrap` (add-and-compare, no modulo).
    wrap: u32,
    weight: u32,
    credit: u32,
}

impl Walker {
    #[inline(always)]
    fn step(&self, slot: u32) -> u32 {
        if slot >= self.wrap {
            slot - self.wrap
        } else {
            slot + self.skip
        }
    }
}

/// Indices of the backends with a non-zero weight, sorted by key; rejects duplicate keys.
fn claim_order(backends: &[MaglevBackend]) -> Result<Vec<u32>, MaglevError> {
    let mut order: Vec<u32> =
        (0..backends.len() as u32).filter(|&i| backends[i as usize].weight > 0).collect();
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
    fn walker_step_wraps_without_overflow() {
        let m = 4_294_967_291u32; // largest u32 prime
        let skip = m - 1;
        let w = Walker { index: 0, next: 0, skip, wrap: m - skip, weight: 1, credit: 0 };
        assert_eq!(w.step(0), m - 1);
        assert_eq!(w.step(m - 1), m - 2);
        assert_eq!(w.step(1), 0);
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
