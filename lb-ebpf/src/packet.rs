//! Bounds-checked packet access and the Ethernet header.

use aya_ebpf::programs::XdpContext;
use lb_common::maps::stat;

use crate::consts::{ETH_LEN, ETH_P_8021Q};

/// The parser's verdict on a packet it does not hand on as a `Packet`.
pub enum Verdict {
    /// Not addressed to a VIP (or not IP): leave it to the stack.
    Pass,
    /// Unusable before the destination is known: drop and count this stat.
    Drop(u32),
    /// Malformed, destination (address, family) known: drop and count this stat if the
    /// destination is a VIP, else pass.
    DropIfVip(u32, [u32; 4], u8),
}

/// Bounds-checked pointer to a `T` at `offset` in the packet.
#[inline(always)]
pub fn ptr_at<T>(ctx: &XdpContext, offset: usize) -> Option<*mut T> {
    // Hide the offset from LLVM: otherwise it drops this check as implied by earlier length
    // checks, and the verifier, which cannot follow that reasoning, rejects the access.
    let offset = core::hint::black_box(offset);
    let start = ctx.data();
    let end = ctx.data_end();
    if start + offset + core::mem::size_of::<T>() > end {
        return None;
    }
    Some((start + offset) as *mut T)
}

/// The `index`-th 32-bit word at `p`, bytes as they lie in the packet (network order kept).
///
/// A plain (not `read_unaligned`) load, so LLVM emits one 32-bit load instead of four byte
/// loads: the BPF target has no unaligned-access lowering, and packet data is only 2-aligned
/// behind an Ethernet header. BPF allows misaligned packet access (the verifier only enforces
/// alignment with BPF_F_STRICT_ALIGNMENT or on architectures without efficient unaligned
/// access, which the kernel then handles), so this is how C XDP programs read headers too.
///
/// Safe to call although it dereferences `p`: packet memory is checked by the verifier, which
/// refuses to load a program with any access not proven inside `data..data_end`, so an
/// unchecked caller cannot corrupt memory, it fails to load.
#[expect(clippy::not_unsafe_ptr_arg_deref, reason = "the verifier checks every packet access")]
#[inline(always)]
pub fn word(p: *const u32, index: usize) -> u32 {
    unsafe { core::ptr::read(p.add(index)) }
}

/// Stores a 32-bit word at byte `offset` from `p`, see [`word`] for the alignment.
#[expect(clippy::not_unsafe_ptr_arg_deref, reason = "the verifier checks every packet access")]
#[inline(always)]
pub fn put_word(p: *mut u8, offset: usize, value: u32) {
    unsafe { core::ptr::write(p.add(offset) as *mut u32, value) }
}

/// A map key of `N` words as the `#[repr(C)]` key type `K` (same size, no implicit padding),
/// so keys are built with word stores instead of byte stores and memsets for the pad bytes.
#[inline(always)]
pub fn as_key<K, const N: usize>(words: &[u32; N]) -> &K {
    const { assert!(core::mem::size_of::<K>() == N * 4) };
    unsafe { &*(words as *const [u32; N] as *const K) }
}

#[inline(always)]
pub fn read<T: Copy>(ctx: &XdpContext, offset: usize) -> Option<T> {
    ptr_at::<T>(ctx, offset).map(|p| unsafe { core::ptr::read_unaligned(p) })
}

#[inline(always)]
fn be16(ctx: &XdpContext, offset: usize) -> Option<u16> {
    read::<[u8; 2]>(ctx, offset).map(u16::from_be_bytes)
}

/// Offset of the IP header and the ethertype behind at most one VLAN tag.
#[inline(always)]
pub fn parse_eth(ctx: &XdpContext) -> Result<(usize, u16), Verdict> {
    let ethertype = be16(ctx, 12).ok_or(Verdict::Drop(stat::DROP_TRUNCATED_ETH))?;
    if ethertype != ETH_P_8021Q {
        return Ok((ETH_LEN, ethertype));
    }
    let inner = be16(ctx, 16).ok_or(Verdict::Drop(stat::DROP_TRUNCATED_ETH))?;
    Ok((ETH_LEN + 4, inner))
}

/// IPv4 header checksum of the five header words (checksum field zero). The one's-complement
/// sum does not depend on byte order (RFC 1071), so the little-endian words are summed as they
/// are and the result is stored the same way.
#[inline(always)]
pub fn ipv4_checksum(w: &[u32; 5]) -> u32 {
    let sum = w[0] as u64 + w[1] as u64 + w[2] as u64 + w[3] as u64 + w[4] as u64;
    // Below 2^35; 2^16 = 1 modulo 0xffff, so its three 16-bit parts add to the same sum
    // (below 3 * 2^16), and two folds bring that to 16 bits (a shorter chain than folding
    // 64 -> 32 -> 16 bits).
    let mut s = (sum & 0xffff) + ((sum >> 16) & 0xffff) + (sum >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u32) & 0xffff
}
