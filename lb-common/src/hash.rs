//! Flow hashing (kernel and userspace) and Maglev permutation hashing (userspace).
//!
//! The flow hash is a MurmurHash3 (x86_32) body over the ten 32-bit words of a [`FlowTuple`],
//! with a fixed seed: cheap in eBPF (no loops the verifier dislikes, no tables), well mixed, and
//! identical on every host, so two balancers behind ECMP choose the same backend for a flow.

use crate::maps::FlowTuple;

/// Seed of the per-packet flow hash. Changing it moves every flow: treat as part of the ABI.
pub const FLOW_HASH_SEED: u32 = 0x4c42_0001;
/// Seeds of the two Maglev permutation hashes (offset and skip).
pub const MAGLEV_OFFSET_SEED: u32 = 0x6d61_676c;
pub const MAGLEV_SKIP_SEED: u32 = 0x736b_6970;

#[inline(always)]
const fn mix_word(mut h: u32, k: u32) -> u32 {
    let mut k = k.wrapping_mul(0xcc9e_2d51);
    k = k.rotate_left(15);
    k = k.wrapping_mul(0x1b87_3593);
    h ^= k;
    h = h.rotate_left(13);
    h.wrapping_mul(5).wrapping_add(0xe654_6b64)
}

#[inline(always)]
const fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// Hash of a flow tuple whose fields outside the session-affinity hash key are zeroed.
#[inline(always)]
pub fn flow_hash(t: &FlowTuple) -> u32 {
    let w = t.words();
    let mut h = FLOW_HASH_SEED;
    // Written out so that the eBPF build needs no loop.
    h = mix_word(h, w[0]);
    h = mix_word(h, w[1]);
    h = mix_word(h, w[2]);
    h = mix_word(h, w[3]);
    h = mix_word(h, w[4]);
    h = mix_word(h, w[5]);
    h = mix_word(h, w[6]);
    h = mix_word(h, w[7]);
    h = mix_word(h, w[8]);
    h = mix_word(h, w[9]);
    fmix32(h ^ (FlowTuple::WORDS as u32 * 4))
}

/// The Maglev table slot a flow hash selects: `table[hash % m]`.
#[inline(always)]
pub fn maglev_slot(hash: u32, m: u32) -> u32 {
    hash % m
}

/// MurmurHash3 (x86_32) of a byte string: Maglev's permutation input (userspace only).
pub fn murmur3_bytes(data: &[u8], seed: u32) -> u32 {
    let mut h = seed;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        h = mix_word(h, u32::from_le_bytes([c[0], c[1], c[2], c[3]]));
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut k = 0u32;
        for (i, b) in rest.iter().enumerate() {
            k |= (*b as u32) << (8 * i);
        }
        k = k.wrapping_mul(0xcc9e_2d51).rotate_left(15).wrapping_mul(0x1b87_3593);
        h ^= k;
    }
    fmix32(h ^ data.len() as u32)
}

/// Maglev permutation of a backend: `(offset, skip)` with `offset < m`, `1 <= skip < m`.
/// `m` must be prime so that every skip walks all slots.
pub fn maglev_permutation(name: &[u8], m: u32) -> (u32, u32) {
    let offset = murmur3_bytes(name, MAGLEV_OFFSET_SEED) % m;
    let skip = murmur3_bytes(name, MAGLEV_SKIP_SEED) % (m - 1) + 1;
    (offset, skip)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur3_reference_values() {
        // Reference values of MurmurHash3_x86_32 (Appleby's smhasher).
        assert_eq!(murmur3_bytes(b"", 0), 0);
        assert_eq!(murmur3_bytes(b"", 1), 0x514e_28b7);
        assert_eq!(murmur3_bytes(b"hello", 0), 0x248b_fa47);
        assert_eq!(murmur3_bytes(b"Hello, world!", 1234), 0xfaf6_cdb3);
    }

    #[test]
    fn flow_hash_matches_byte_murmur() {
        let t = FlowTuple { src: [1, 2, 3, 4], dst: [5, 6, 7, 8], sport: 40000, dport: 80, proto: 6, _pad: [0; 3] };
        let mut bytes = [0u8; 40];
        for (i, w) in t.words().iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
        }
        assert_eq!(flow_hash(&t), murmur3_bytes(&bytes, FLOW_HASH_SEED));
    }
}
