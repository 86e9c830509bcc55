//! Next-hop cache: the result of `bpf_fib_lookup` (egress device, next-hop and source MACs)
//! per backend, in a per-CPU array indexed by backend id, so that the route and neighbour
//! lookup (about 300 ns) runs once per backend, CPU and second instead of once per packet.
//!
//! An entry is used only while all of this holds, else the lookup runs again (and a successful
//! result replaces the entry; a failed lookup drops the packet as before and is not cached):
//! * it is younger than `NEXT_HOP_TTL_NS` (1 s): route and neighbour changes are followed
//!   within a second;
//! * it was resolved for the same backend address and family (ids are reused), the same ingress
//!   device, the same outer source prefix (the fixed bits of the service's encapsulation source
//!   and its hashed-bit mask);
//! * the outer datagram is not longer than the longest one the lookup accepted
//!   (`bpf_fib_lookup` checks it against the route's MTU), so a longer packet is looked up
//!   and, if too long, dropped exactly as without the cache.
//!
//! With a hashed outer source, the entry holds the result for the source of the packet that
//! filled it: routes that differ between sources of the encapsulation prefix (source policy
//! rules, multipath routes hashing the source) are followed per backend, CPU and second rather
//! than per packet. Per CPU, so there is no shared writer and no torn entry.

use aya_ebpf::{
    bindings::bpf_fib_lookup as bpf_fib_lookup_t, helpers::bpf_fib_lookup, macros::map, maps::PerCpuArray,
    programs::XdpContext,
};
use lb_common::maps::stat;

/// Backend id -> cached `bpf_fib_lookup` result (this CPU's copy), sized like `BACKENDS` by the loader.
#[map]
pub static NEXT_HOPS: PerCpuArray<NextHop> = PerCpuArray::with_max_entries(1, 0);
/// This CPU's `bpf_fib_lookup` parameter block (`nexthop::resolve`; off the BPF stack).
#[map]
pub static FIB_PARAMS: PerCpuArray<FibParams> = PerCpuArray::with_max_entries(1, 0);

/// How long a resolved next hop is reused.
pub const NEXT_HOP_TTL_NS: u64 = 1_000_000_000;

const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
/// `BPF_FIB_LKUP_RET_FWD_DISABLED`: forwarding is off on the ingress device (no lookup done).
const FIB_FWD_DISABLED: i64 = 5;
/// `BPF_FIB_LKUP_RET_NO_NEIGH`: routed, but no valid neighbour entry for the next hop.
const FIB_NO_NEIGH: i64 = 7;
/// `BPF_FIB_LKUP_RET_FRAG_NEEDED`: the datagram (`tot_len`) exceeds the route's MTU, which the
/// kernel returns in `mtu_result` (the same 16 bits as `tot_len`).
const FIB_FRAG_NEEDED: i64 = 8;
/// Marks the error of `route` for a datagram longer than the route's MTU: `TOO_BIG | mtu`
/// (the MTU in the low 16 bits). Every other error is a drop reason (`stat::*`, small).
pub const TOO_BIG: u32 = 1 << 31;
/// Marks an entry filled by a rewrite's lookup in `NextHop::family`: its MACs may be zero (no
/// neighbour entry), so an encapsulation must not use it. (An encapsulation's entry carries
/// its outer protocol in bits 24..32.)
const L2_LOOKUP: u32 = 1 << 16;
/// With `L2_LOOKUP`: the lookup wanted the neighbour's MAC (`MacFrom::Neighbour`), so the entry's
/// MACs are real; kept apart from the entries of lookups that did not need them.
const L2_NEIGH: u32 = 1 << 17;

/// One backend's cached route lookup (this CPU's copy).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NextHop {
    /// Used while the data-plane clock (`clock::now_ns()`) is below this; 0 = never filled.
    pub expires_ns: u64,
    /// What it was resolved for: backend address, outer source with the hashed bits cleared.
    pub dst: [u32; 4],
    pub src: [u32; 4],
    /// The service's hashed-bit mask of the outer source, the address family and method
    /// (`Outer::new`) and the ingress device.
    pub src_mask: u32,
    pub family: u32,
    pub ingress_ifindex: u32,
    /// Longest outer datagram (IPv4 total length / IPv6 40 + payload) the lookup accepted.
    pub max_len: u32,
    /// Device to send on.
    pub egress_ifindex: u32,
    /// The outer Ethernet header's first 12 bytes: next-hop MAC, then source MAC.
    pub macs: [u32; 3],
}
const _: () = assert!(core::mem::size_of::<NextHop>() == 72);

/// What the outer header needs from the route.
#[derive(Clone, Copy)]
pub struct Route {
    pub egress_ifindex: u32,
    pub macs: [u32; 3],
    /// The ingress device, read once: in XDP that read is three dependent loads.
    pub ingress_ifindex: u32,
}

/// The packet's address family, for the lookup and the cache.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    #[inline(always)]
    fn af(self) -> u32 {
        match self {
            Family::V4 => AF_INET,
            Family::V6 => AF_INET6,
        }
    }
}

/// Where the destination's MAC of a rewritten frame comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MacFrom {
    /// The configuration (the backend record's MAC): only the egress device and its MAC are
    /// wanted. Back out of the ingress device such a lookup succeeds without a neighbour entry
    /// for the destination, with both MACs zero (the kernel fills the device's MAC only with
    /// the neighbour's); these entries are cached apart from the others.
    Config,
    /// The host's neighbour table: the lookup needs the neighbour entry as an encapsulation
    /// does (NO_NEIGH is `drop_no_neigh`, and forwarding must be on).
    Neighbour,
}

/// How the packet leaves, as far as the route lookup and its cache are concerned: the
/// forwarding method's descriptor.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// A new outer packet of this IP protocol (IPIP, IPV6) carrying the packet.
    Encap { proto: u8 },
    /// The packet itself, its Ethernet header rewritten (L2 DSR).
    Rewrite { mac: MacFrom },
}

/// The packet to route: an encapsulation's outer packet, or a rewritten frame. Passed by value:
/// the cache check reads its fields as values, and only a lookup (the cold path) puts a copy in
/// memory, so the common packet does not build it on the stack.
#[derive(Clone, Copy)]
pub struct Outer {
    /// The family and the forwarding descriptor as one word, the way `NextHop::family` holds
    /// them (see [`Outer::new`]): one value to compare and store instead of three (and the
    /// lookup's frame, which adds to the balancer's 512 bytes of stack, stays small).
    tag: u32,
    /// Outer datagram length.
    pub len: u32,
    /// Outer source (the hashed bits filled in) and the mask of those bits in the word that
    /// carries them (word 0 for IPv4, word 3 for IPv6), host order. Zero for a rewrite.
    pub src: [u32; 4],
    pub src_mask: u32,
    pub dst: [u32; 4],
}

impl Outer {
    /// The packet `forward` sends, of `family`. Its tag: the address family (AF_INET or
    /// AF_INET6), and for an encapsulation the outer protocol in bits 24..32, for a rewrite
    /// `L2_LOOKUP` (and `L2_NEIGH` when the neighbour's MAC is wanted), so that cache entries of
    /// different methods are never mixed up.
    #[inline(always)]
    pub fn new(family: Family, forward: Forward, len: u32, src: [u32; 4], src_mask: u32, dst: [u32; 4]) -> Self {
        let method = match forward {
            Forward::Encap { proto } => (proto as u32) << 24,
            Forward::Rewrite { mac: MacFrom::Config } => L2_LOOKUP,
            Forward::Rewrite { mac: MacFrom::Neighbour } => L2_LOOKUP | L2_NEIGH,
        };
        Outer { tag: family.af() | method, len, src, src_mask, dst }
    }

    #[inline(always)]
    fn af(&self) -> u32 {
        self.tag & 0xffff
    }

    #[inline(always)]
    fn ipv6(&self) -> bool {
        self.af() == AF_INET6
    }

    /// The IP protocol the lookup is for: the encapsulation's, 0 for a rewrite.
    #[inline(always)]
    fn l4_proto(&self) -> u32 {
        self.tag >> 24
    }

    /// A rewrite to a configured MAC: the lookup needs no neighbour entry.
    #[inline(always)]
    fn mac_configured(&self) -> bool {
        self.tag & (L2_LOOKUP | L2_NEIGH) == L2_LOOKUP
    }
}

/// The source with the hashed bits cleared: what the cache entry is keyed on.
#[inline(always)]
fn src_fixed(o: &Outer) -> [u32; 4] {
    let m = !o.src_mask.to_be();
    if o.ipv6() {
        [o.src[0], o.src[1], o.src[2], o.src[3] & m]
    } else {
        [o.src[0] & m, 0, 0, 0]
    }
}

/// Next hop towards `backend_id`'s address `o.dst` from device `ingress` (the packet's, read by
/// the caller): cached, or looked up (Err = a drop reason, or `TOO_BIG | mtu`).
#[inline(always)]
pub fn route(ctx: &XdpContext, backend_id: u32, o: Outer, now: u64, ingress: u32) -> Result<Route, u32> {
    // Sized like BACKENDS, so a backend that was read has a slot.
    let hop = NEXT_HOPS.get_ptr_mut(backend_id).ok_or(stat::DROP_FIB)?;
    let h = unsafe { &*hop };
    let family = o.tag;
    let src = src_fixed(&o);
    // An IPv4 entry holds zeros in the other address words (`resolve` stores `src_fixed` and
    // the backend's address, IPv4 in word 0), and the family is compared: word 0 decides.
    let same_addrs = if o.ipv6() { h.dst == o.dst && h.src == src } else { h.dst[0] == o.dst[0] && h.src[0] == src[0] };
    if now < h.expires_ns
        && o.len <= h.max_len
        && same_addrs
        && h.src_mask == o.src_mask
        && h.family == family
        && h.ingress_ifindex == ingress
    {
        return Ok(Route { egress_ifindex: h.egress_ifindex, macs: h.macs, ingress_ifindex: ingress });
    }
    // Copies made here, on the cold path, the only place that needs them in memory (without
    // them LLVM builds `o` on the stack before the check above).
    let (o, src) = (o, src);
    match resolve(ctx, hop, &o, &src, now) {
        // Read through the pointer `resolve` wrote through, not through `h`.
        0 => Ok(Route {
            egress_ifindex: unsafe { (*hop).egress_ifindex },
            macs: unsafe { (*hop).macs },
            ingress_ifindex: ingress,
        }),
        reason => Err(reason),
    }
}

/// `struct bpf_fib_lookup` (64 bytes) as words, so it is filled without byte stores:
/// 0 family, l4_protocol, sport | 1 dport, tot_len | 2 ifindex | 3 tos/flowinfo | 4..8 src |
/// 8..12 dst | 12 vlan / tbid | 13..16 smac[6], dmac[6] (mark on input).
pub type FibParams = [u32; 16];

/// Runs `bpf_fib_lookup` from the ingress device and caches a success in `hop`; returns 0,
/// the drop reason, or `TOO_BIG | mtu`. Not inlined, and its 64-byte parameter block is in a per-CPU map
/// (`FIB_PARAMS`), not on the stack: the BPF stack of the balancer plus a call's frame must
/// fit in 512 bytes. (A BPF call takes at most five scalar or pointer arguments.)
#[inline(never)]
fn resolve(ctx: &XdpContext, hop: *mut NextHop, o: &Outer, src_fixed: &[u32; 4], now: u64) -> u32 {
    let p = match FIB_PARAMS.get_ptr_mut(0) {
        Some(p) => unsafe { &mut *p },
        None => return stat::DROP_FIB,
    };
    let family = o.af();
    let l4 = o.l4_proto();
    let ingress = ctx.ingress_ifindex() as u32;
    let s = o.src;
    let d = o.dst;
    *p = [
        family | l4 << 8,
        (o.len & 0xffff) << 16,
        ingress,
        0,
        s[0],
        s[1],
        s[2],
        s[3],
        d[0],
        d[1],
        d[2],
        d[3],
        0,
        0,
        0,
        0,
    ];
    let rc = unsafe { bpf_fib_lookup(ctx.ctx as *mut _, p as *mut FibParams as *mut bpf_fib_lookup_t, 64, 0) };
    match rc {
        0 => {}
        // L2 DSR back out of the ingress device needs no MAC from the route. (The kernel has
        // set the egress device, word 2, before looking for the neighbour.) Towards another
        // device it needs that device's MAC, which comes only with a neighbour entry: a drop,
        // not cached, so that it works as soon as the entry exists.
        FIB_NO_NEIGH if o.mac_configured() && p[2] == ingress => {}
        // L2 DSR is not routing: with forwarding off on the ingress device the kernel looks
        // nothing up, and the frame goes back out of the ingress (the segment the operator
        // configured the backend's MAC for), as IPIP cannot.
        FIB_FWD_DISABLED if o.mac_configured() => p[2] = ingress,
        // Blackhole, unreachable, prohibit, not forwarded: there is no route.
        1..=4 => return stat::DROP_UNROUTABLE,
        // Longer than the egress MTU: the caller answers with ICMP (never cached, so the next
        // packet of the new size is looked up again).
        FIB_FRAG_NEEDED => return TOO_BIG | p[1] >> 16,
        // Routed, but the next hop's MAC is unknown: counted apart (and as `drop_fib`, see
        // `icmp::route_failed`); the daemon keeps neighbour entries for the backends.
        FIB_NO_NEIGH => return stat::DROP_NO_NEIGH,
        // Forwarding disabled, unsupported lwt, error.
        _ => return stat::DROP_FIB,
    }
    // Bytes 52..64 are smac[6], dmac[6]; the header wants dmac, then smac.
    let (w13, w14, w15) = (p[13], p[14], p[15]);
    let egress_ifindex = p[2];
    let macs = [(w14 >> 16) | (w15 << 16), (w15 >> 16) | (w13 << 16), (w13 >> 16) | (w14 << 16)];
    // Field by field into the (per-CPU) entry: a whole `NextHop` built first would take 72
    // bytes of this call's stack frame, which adds to the balancer's (512 in all).
    unsafe {
        (*hop).expires_ns = now + NEXT_HOP_TTL_NS;
        (*hop).dst = d;
        (*hop).src = *src_fixed;
        (*hop).src_mask = o.src_mask;
        (*hop).family = o.tag;
        (*hop).ingress_ifindex = ingress;
        (*hop).max_len = o.len;
        (*hop).egress_ifindex = egress_ifindex;
        (*hop).macs = macs;
    }
    0
}
