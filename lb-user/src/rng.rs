//! A small deterministic generator for the per-query random choices of the DNS view
//! (WEIGHTED, MULTIVALUE): callers seed it, tests replay it. Neutral (no layer of its own), so
//! that the data plane's tests can draw reproducible keys from it too.

/// Source of 64-bit random values.
pub trait Rng {
    fn next_u64(&mut self) -> u64;

    /// Uniform in `0..n` (n > 0); the modulo bias is below 2^-40 for the small n used here.
    fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

/// The SplitMix64 output function, also used as a plain 64-bit mixer.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix64(self.0)
    }
}
