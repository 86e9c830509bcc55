//! Flow hashing (kernel and userspace), the service table's slot hash and probe (kernel and
//! userspace) and Maglev permutation hashing (userspace).
//!
//! The flow hash multiplies each 64-bit pair of a [`FlowTuple`]'s ten words by its own odd
//! constant, combines the products and finishes with MurmurHash3's 64-bit mix, with a fixed
//! seed: cheap in eBPF (no loops the verifier dislikes, no tables; the multiplications are
//! independent, so the critical path is two multiplies deep, not ten), well mixed, and
//! identical on every host, so two balancers behind ECMP choose the same backend for a flow.

use crate::maps::{FlowTuple, ServiceInfo, ServiceSlot, SERVICE_PROBES};

/// Seed of the per-packet flow hash. Changing it (or the hash) moves every new flow's backend
/// choice: treat as part of the ABI.
pub const FLOW_HASH_SEED: u64 = 0x4c42_0002_9e37_79b9;
/// One odd multiplier per 64-bit pair of words hashed by [`pair_hash`] (fractional parts of
/// irrational numbers and MurmurHash3/xxHash constants: any distinct odd 64-bit values do).
/// A [`FlowTuple`] uses the first five, a connection-table key up to six.
const PAIR_MUL: [u64; 6] = [
    0x9e37_79b9_7f4a_7c15,
    0xc2b2_ae3d_27d4_eb4f,
    0x1656_67b1_9e37_79f9,
    0x27d4_eb2f_1656_67c5,
    0x85eb_ca77_c2b2_ae63,
    0xd6e8_feb8_6659_fd93,
];
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

/// MurmurHash3's 64-bit finalizer: every input bit affects every output bit.
#[inline(always)]
const fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Hash of a flow tuple whose fields outside the session-affinity hash key are zeroed.
/// Each pair of words is multiplied by its own constant and rotated to its own position before
/// the products are combined, so equal values in different fields do not cancel; the mix then
/// spreads every input bit over the result. For an IPv4 tuple the zero address words fold away
/// at compile time (three multiplies remain).
#[inline(always)]
pub fn flow_hash(t: &FlowTuple) -> u32 {
    let w = t.words();
    pair_hash(|i| w[i], FlowTuple::WORDS, FLOW_HASH_SEED) as u32
}

/// The flow hash's construction over `n` words (`word(i)` for `i < n`, at most 12): pair `i`
/// of words (the first one xored with `seed`) is multiplied by its own constant and rotated by
/// `13 * i` bits, the products are xored and MurmurHash3's 64-bit finalizer mixes them. The
/// connection tables hash their keys with it too, with their own seed (`ct_table`).
#[inline(always)]
pub fn pair_hash(word: impl Fn(usize) -> u32, n: usize, seed: u64) -> u64 {
    let w = |i: usize| if i < n { word(i) as u64 } else { 0 };
    let mut h = 0;
    let mut i = 0;
    while i < n.div_ceil(2) {
        let mut pair = w(2 * i) | w(2 * i + 1) << 32;
        if i == 0 {
            pair ^= seed;
        }
        h ^= pair.wrapping_mul(PAIR_MUL[i]).rotate_left(13 * i as u32);
        i += 1;
    }
    fmix64(h)
}

/// The Maglev table slot a flow hash selects: `table[hash % m]`.
#[inline(always)]
pub fn maglev_slot(hash: u32, m: u32) -> u32 {
    hash % m
}

/// Home slot hash of a service key ([`crate::maps::ServiceKey::words`]) in a service table half built
/// with `seed`; the slot is `hash & (S - 1)`. Each word is multiplied by its own odd constant
/// (the multiplications are independent, so the critical path is one multiply, not five:
/// the hash runs on every packet), the products are combined and finished with a
/// multiply/xor-shift mix. For an IPv4 key the three zero address words fold away at compile
/// time. It only needs to spread keys well (the writer retries with another seed if some key
/// lands too far from home), not to resist chosen keys: only the operator's configuration
/// chooses them.
#[inline(always)]
pub const fn service_slot_hash(key_words: &[u32; 5], seed: u32) -> u32 {
    let a = (key_words[0] ^ seed).wrapping_mul(0x9e37_79b1);
    let b = key_words[1].wrapping_mul(0x85eb_ca77);
    let c = key_words[2].wrapping_mul(0xc2b2_ae3d);
    let d = key_words[3].wrapping_mul(0x27d4_eb2f);
    let e = (key_words[4] ^ seed.rotate_left(16)).wrapping_mul(0x1656_67b1);
    let mut h = a ^ b.rotate_left(8) ^ c.rotate_left(16) ^ d.rotate_left(24) ^ e.rotate_left(13);
    h ^= h >> 16;
    h = h.wrapping_mul(0x7feb_352d);
    h ^= h >> 15;
    h = h.wrapping_mul(0x846c_a68b);
    h ^ (h >> 16)
}

/// Looks `key_words` up in one half of the service table: the half's slots are
/// `slot(base) ..= slot(base + mask)` (S = mask + 1 slots, a power of two), built with `seed`.
/// Probes at most [`SERVICE_PROBES`] consecutive slots from the home slot, wrapping within the
/// half; stops at the key or at an empty slot. `slot` is the data plane's array lookup (inlined
/// by the verifier) or a slice access in userspace: both run this very routine.
#[inline(always)]
pub fn find_service<'a>(
    slot: impl Fn(u32) -> Option<&'a ServiceSlot>,
    key_words: &[u32; 5],
    seed: u32,
    mask: u32,
    base: u32,
) -> Option<&'a ServiceInfo> {
    let home = service_slot_hash(key_words, seed);
    let mut p = 0;
    while p < SERVICE_PROBES {
        let s = slot(base + (home.wrapping_add(p) & mask))?;
        let w = s.key.words();
        // Word-wise, branch-free: no memcmp in eBPF.
        let diff = (w[0] ^ key_words[0])
            | (w[1] ^ key_words[1])
            | (w[2] ^ key_words[2])
            | (w[3] ^ key_words[3])
            | (w[4] ^ key_words[4]);
        if diff == 0 {
            return Some(&s.info);
        }
        // Empty (family 0): the writer zeroes empty slots, and a used slot's last word holds
        // its nonzero family, so testing the word is the same as testing the family.
        if w[4] == 0 {
            return None;
        }
        p += 1;
    }
    None
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

    fn key(i: u32) -> [u32; 5] {
        // IPv4 VIPs 10.0.x.y, ports 1.., TCP: the shape of real keys (three zero words).
        let addr = u32::from_ne_bytes([10, 0, (i >> 8) as u8, i as u8]);
        [addr, 0, 0, 0, ((i % 7 + 1) as u16).to_be() as u32 | 6 << 16 | 4 << 24]
    }

    #[test]
    fn service_slot_hash_is_deterministic_and_seeded() {
        let k = key(3);
        assert_eq!(service_slot_hash(&k, 1), service_slot_hash(&k, 1));
        assert_ne!(service_slot_hash(&k, 1), service_slot_hash(&k, 2));
        // A fixed value: kernel and userspace must agree, and so must two builds over time
        // (a restarted daemon reads the half its predecessor built, with the stored seed).
        // Reference values from an independent (Python) implementation of the same rounds.
        assert_eq!(service_slot_hash(&[0, 0, 0, 0, 0], 1), 0xf4fe_28dd);
        assert_eq!(service_slot_hash(&[0x0a00_0001, 0, 0, 0, 0x0406_0050], 7), 0x891c_70ba);
        assert_eq!(service_slot_hash(&[0xb80d_0120, 0, 0, 0x0001_0000, 0x0606_0050], 3), 0xfe12_8473);
    }

    #[test]
    fn service_slot_hash_spreads_similar_keys() {
        // 4096 keys that differ in few bits, into 8192 buckets: no bucket much fuller than
        // a uniform hash would make it, and about the expected number of buckets used
        // (8192 * (1 - e^-0.5) ~ 3223).
        for seed in [0u32, 1, 0xdead_beef] {
            let mut buckets = [0u16; 8192];
            for i in 0..4096 {
                buckets[(service_slot_hash(&key(i), seed) & 8191) as usize] += 1;
            }
            let used = buckets.iter().filter(|&&b| b > 0).count();
            let max = *buckets.iter().max().unwrap();
            assert!((3000..3450).contains(&used), "seed {seed}: {used} buckets used");
            assert!(max <= 7, "seed {seed}: a bucket holds {max} keys");
        }
        // Every bit of the home slot depends on the port word and on the address.
        let base = service_slot_hash(&key(0), 0);
        let mut flipped = 0u32;
        for bit in 0..32 {
            let mut k = key(0);
            k[4] ^= 1 << bit;
            flipped |= service_slot_hash(&k, 0) ^ base;
            let mut k = key(0);
            k[0] ^= 1 << bit;
            flipped |= service_slot_hash(&k, 0) ^ base;
        }
        assert_eq!(flipped, u32::MAX);
    }

    fn slot_of(k: [u32; 5], id: u32) -> ServiceSlot {
        let key = crate::maps::ServiceKey {
            addr: [k[0], k[1], k[2], k[3]],
            port: k[4] as u16,
            proto: (k[4] >> 16) as u8,
            family: (k[4] >> 24) as u8,
        };
        ServiceSlot { key, _pad: 0, info: ServiceInfo { id, ..Default::default() } }
    }

    #[test]
    fn service_key_words_match_the_data_plane_layout() {
        let k = key(9);
        assert_eq!(slot_of(k, 0).key.words(), k);
    }

    #[test]
    fn find_service_probes_wrapping_within_the_half_and_stops_at_empty() {
        // A half of 8 slots at base 8 of a 16-slot table; place key(1) by hand at its home
        // slot + 3 (wrapping), the slots between it and home occupied by other keys.
        let (s, base, seed) = (8u32, 8u32, 5u32);
        let mut table = [ServiceSlot::default(); 16];
        let k = key(1);
        let home = service_slot_hash(&k, seed) & (s - 1);
        for d in 0..3 {
            table[(base + ((home + d) & (s - 1))) as usize] = slot_of(key(100 + d), 100 + d);
        }
        table[(base + ((home + 3) & (s - 1))) as usize] = slot_of(k, 1);
        let get = |i: u32| table.get(i as usize);
        assert_eq!(find_service(get, &k, seed, s - 1, base).map(|i| i.id), Some(1));
        // The other half (base 0) is empty: not found, and not found under another seed
        // whose home slot is empty.
        assert_eq!(find_service(get, &k, seed, s - 1, 0), None);
        // An empty slot between home and the key ends the probe.
        table[(base + ((home + 1) & (s - 1))) as usize] = ServiceSlot::default();
        let get = |i: u32| table.get(i as usize);
        assert_eq!(find_service(get, &k, seed, s - 1, base), None);
        // Beyond SERVICE_PROBES: a full half never finds a key that is not there.
        let full: [ServiceSlot; 8] = core::array::from_fn(|i| slot_of(key(200 + i as u32), 0));
        assert_eq!(find_service(|i| full.get(i as usize), &k, seed, 7, 0), None);
    }

    /// `flow_hash` of the three tuples in `flow_hash_reference_values`.
    const FLOW_REF: [u32; 3] = [0x1b7e_77f2, 0x453d_f3fb, 0xcc17_a5cc];

    #[test]
    fn flow_hash_reference_values() {
        // The hash is ABI (ECMP peers and `lb explain` must agree with the kernel): pinned.
        // Reference values from an independent (Python) implementation.
        let t = FlowTuple { src: [1, 2, 3, 4], dst: [5, 6, 7, 8], sport: 40000, dport: 80, proto: 6, _pad: [0; 3] };
        assert_eq!(flow_hash(&t), FLOW_REF[0]);
        assert_eq!(flow_hash(&FlowTuple::default()), FLOW_REF[1]);
        let v4 = FlowTuple {
            src: [0x0501_12c6, 0, 0, 0],
            dst: [0x6400_12c6, 0, 0, 0],
            sport: 0x409c,
            dport: 0x5000,
            proto: 6,
            _pad: [0; 3],
        };
        assert_eq!(flow_hash(&v4), FLOW_REF[2]);
    }

    /// IPv4 tuples 198.18.x.y:sport -> 198.18.0.100:80/TCP.
    fn v4_tuple(client: u32, sport: u16) -> FlowTuple {
        let src = u32::from_ne_bytes([198, 18, (client >> 8) as u8, client as u8]);
        let dst = u32::from_ne_bytes([198, 18, 0, 100]);
        FlowTuple {
            src: [src, 0, 0, 0],
            dst: [dst, 0, 0, 0],
            sport: sport.to_be(),
            dport: 80u16.to_be(),
            proto: 6,
            _pad: [0; 3],
        }
    }

    #[test]
    fn flow_hash_spreads_structured_flows_over_maglev_slots() {
        // Flows that differ only in the source port, or only in the client address (the
        // shapes real traffic has), over M = 16381 slots: a chi-square statistic within what a
        // uniform hash gives (mean M - 1 = 16380, sd ~181; bound at +-5 sd).
        let m = 16381u32;
        let sets: [&dyn Fn(u32) -> FlowTuple; 3] =
            [&|i| v4_tuple(7, (1024 + i) as u16), &|i| v4_tuple(i, 40000), &|i| {
                v4_tuple(i % 256, 30000 + (i / 256) as u16)
            }];
        for (n, make) in sets.iter().enumerate() {
            // Four flows per slot on average (fewer than 2^16: the ports sets stay in range).
            let flows = 4 * m;
            let mut counts = [0u32; 16381];
            for i in 0..flows {
                counts[maglev_slot(flow_hash(&make(i)), m) as usize] += 1;
            }
            let expected = flows as f64 / m as f64;
            let chi2: f64 = counts.iter().map(|&c| (c as f64 - expected).powi(2) / expected).sum();
            assert!((15475.0..17285.0).contains(&chi2), "set {n}: chi-square {chi2:.0}");
        }
    }

    #[test]
    fn flow_hash_avalanches() {
        // Flipping any one input bit (every bit of every field, IPv6-sized addresses) flips
        // each output bit with probability 1/2: over 1024 pseudo-random base tuples, every
        // (input bit, output bit) pair within 0.5 +- 0.1 (6 standard deviations).
        const BASES: u32 = 1024;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (rng >> 32) as u32
        };
        // 9 full words and the protocol byte.
        let mut flips = [[0u16; 32]; 9 * 32 + 8];
        for _ in 0..BASES {
            let t = FlowTuple {
                src: [next(), next(), next(), next()],
                dst: [next(), next(), next(), next()],
                sport: next() as u16,
                dport: next() as u16,
                proto: next() as u8,
                _pad: [0; 3],
            };
            let h = flow_hash(&t);
            for (input, row) in flips.iter_mut().enumerate() {
                let (word, bit) = (input / 32, input % 32);
                let mut u = t;
                match word {
                    0..=3 => u.src[word] ^= 1 << bit,
                    4..=7 => u.dst[word - 4] ^= 1 << bit,
                    8 if bit < 16 => u.sport ^= 1 << bit,
                    8 => u.dport ^= 1 << (bit - 16),
                    _ => u.proto ^= 1 << bit,
                }
                let d = flow_hash(&u) ^ h;
                for (out, n) in row.iter_mut().enumerate() {
                    *n += (d >> out & 1) as u16;
                }
            }
        }
        for (input, row) in flips.iter().enumerate() {
            for (out, &n) in row.iter().enumerate() {
                let p = n as f64 / BASES as f64;
                assert!((0.4..0.6).contains(&p), "input bit {input} flips output bit {out} with p = {p:.3}");
            }
        }
    }
}
