//! Forwarding to the chosen backend: IPIP / IP6IP6 encapsulation with the next hop from
//! `bpf_fib_lookup` (cached per backend for up to a second, see `nexthop`), or L2 DSR
//! (destination MAC rewrite). The outer frame is untagged: the route decides the egress
//! device, so an ingress VLAN tag is dropped with the old header.
//!
//! Headers are written as 32-bit words (see `parse::word` on alignment), not byte by byte.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_redirect, bpf_xdp_adjust_head},
    programs::XdpContext,
};
use lb_common::{encap_source_word, stat, Backend, ServiceInfo, FAMILY_V4, FAMILY_V6};

use crate::nexthop::{self, Outer, Route};
use crate::parse::{ptr_at, put_word, Packet, ETH_LEN, ETH_P_IP, ETH_P_IPV6};
use crate::stats::Counters;

const IPPROTO_IPIP: u32 = 4;
const IPPROTO_IPV6: u32 = 41;
const IPV4_HDR_LEN: usize = 20;
const IPV6_HDR_LEN: usize = 40;
/// TTL / hop limit of the outer header; the inner packet is not touched.
const OUTER_TTL: u32 = 64;

/// Transmit on the ingress device or redirect to the route's device.
#[inline(always)]
fn transmit(ctx: &XdpContext, ifindex: u32, counters: Counters) -> u32 {
    if ifindex == ctx.ingress_ifindex() as u32 {
        counters.inc(stat::TX);
        xdp_action::XDP_TX
    } else {
        counters.inc(stat::REDIRECT);
        unsafe { bpf_redirect(ifindex, 0) as u32 }
    }
}

#[inline(always)]
fn drop(reason: u32, counters: Counters) -> u32 {
    counters.inc(reason);
    xdp_action::XDP_DROP
}

/// IPv4 header checksum of the five header words (checksum field zero). The one's-complement
/// sum does not depend on byte order (RFC 1071), so the little-endian words are summed as they
/// are and the result is stored the same way.
#[inline(always)]
fn ipv4_checksum(w: &[u32; 5]) -> u32 {
    let mut sum = w[0] as u64 + w[1] as u64 + w[2] as u64 + w[3] as u64 + w[4] as u64;
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    sum = (sum & 0xffff_ffff) + (sum >> 32);
    let mut s = (sum as u32 & 0xffff) + (sum as u32 >> 16);
    s = (s & 0xffff) + (s >> 16);
    !s & 0xffff
}

/// Grows the head so that the frame becomes eth + `outer_len` bytes + the inner IP datagram,
/// and writes the Ethernet header. Returns the frame start, with eth + `outer_len` bytes
/// bounds-checked for writing.
#[inline(always)]
fn push_outer<const OUTER: usize>(ctx: &XdpContext, pkt: &Packet, route: &Route, ethertype: u16) -> Result<*mut u8, u32> {
    let delta = (ETH_LEN + OUTER) as i32 - pkt.l3_off as i32;
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -delta) } != 0 {
        return Err(stat::DROP_ENCAP);
    }
    let p = ctx.data() as *mut u8;
    if ctx.data() + ETH_LEN + OUTER > ctx.data_end() {
        return Err(stat::DROP_ENCAP);
    }
    put_word(p, 0, route.macs[0]);
    put_word(p, 4, route.macs[1]);
    put_word(p, 8, route.macs[2]);
    unsafe { core::ptr::write(p.add(12) as *mut u16, ethertype.to_be()) };
    Ok(p)
}

/// IPv4-in-IPv4 to the backend.
#[inline(always)]
pub fn ipip_v4(
    ctx: &XdpContext,
    pkt: &Packet,
    backend_id: u32,
    backend: &Backend,
    svc: &ServiceInfo,
    hash: u32,
    now: u64,
    counters: Counters,
) -> u32 {
    if backend.family != FAMILY_V4 {
        return drop(stat::DROP_ENCAP, counters);
    }
    let tot_len = pkt.l3_len + IPV4_HDR_LEN;
    if tot_len > 0xffff {
        return drop(stat::DROP_ENCAP, counters);
    }
    let src = encap_source_word(svc.encap_src[0], svc.encap_src_hash_mask, hash);
    let outer = Outer {
        ipv6: false,
        len: tot_len as u32,
        src: &[src, 0, 0, 0],
        src_mask: svc.encap_src_hash_mask,
        dst: &backend.addr,
    };
    let route = match nexthop::route(ctx, backend_id, &outer, now) {
        Ok(r) => r,
        Err(reason) => return drop(reason, counters),
    };
    let p = match push_outer::<IPV4_HDR_LEN>(ctx, pkt, &route, ETH_P_IP) {
        Ok(p) => p,
        Err(reason) => return drop(reason, counters),
    };
    // Version/IHL, the inner TOS, total length | identification 0, DF copied from the inner
    // header | TTL, protocol, checksum | source | destination.
    let mut h = [
        0x45 | (pkt.tclass as u32) << 8 | ((tot_len as u16).to_be() as u32) << 16,
        (pkt.df as u32) << 16,
        OUTER_TTL | IPPROTO_IPIP << 8,
        src,
        backend.addr[0],
    ];
    h[2] |= ipv4_checksum(&h) << 16;
    for (i, w) in h.iter().enumerate() {
        put_word(p, ETH_LEN + 4 * i, *w);
    }
    transmit(ctx, route.egress_ifindex, counters)
}

/// IPv6-in-IPv6 to the backend.
#[inline(always)]
pub fn ip6ip6(
    ctx: &XdpContext,
    pkt: &Packet,
    backend_id: u32,
    backend: &Backend,
    svc: &ServiceInfo,
    hash: u32,
    now: u64,
    counters: Counters,
) -> u32 {
    if backend.family != FAMILY_V6 {
        return drop(stat::DROP_ENCAP, counters);
    }
    if pkt.l3_len > 0xffff {
        return drop(stat::DROP_ENCAP, counters);
    }
    let s = svc.encap_src;
    let src = [s[0], s[1], s[2], encap_source_word(s[3], svc.encap_src_hash_mask, hash)];
    let outer = Outer {
        ipv6: true,
        len: (pkt.l3_len + IPV6_HDR_LEN) as u32,
        src: &src,
        src_mask: svc.encap_src_hash_mask,
        dst: &backend.addr,
    };
    let route = match nexthop::route(ctx, backend_id, &outer, now) {
        Ok(r) => r,
        Err(reason) => return drop(reason, counters),
    };
    let p = match push_outer::<IPV6_HDR_LEN>(ctx, pkt, &route, ETH_P_IPV6) {
        Ok(p) => p,
        Err(reason) => return drop(reason, counters),
    };
    // Version 6, the inner traffic class, flow label from the flow hash (spreads ECMP/RSS).
    let h = [
        ((6u32 << 28) | ((pkt.tclass as u32) << 20) | (hash & 0x000f_ffff)).to_be(),
        (((pkt.l3_len as u32) << 16) | (IPPROTO_IPV6 << 8) | OUTER_TTL).to_be(),
        src[0],
        src[1],
        src[2],
        src[3],
        backend.addr[0],
        backend.addr[1],
        backend.addr[2],
        backend.addr[3],
    ];
    for (i, w) in h.iter().enumerate() {
        put_word(p, ETH_LEN + 4 * i, *w);
    }
    transmit(ctx, route.egress_ifindex, counters)
}

/// L2 DSR: the backend shares the segment and owns the VIP on a loopback; rewrite the
/// destination MAC to the backend's (source = the MAC the frame was sent to) and send it back
/// out of the ingress device.
#[inline(always)]
pub fn l2_dsr(ctx: &XdpContext, backend: &Backend, counters: Counters) -> u32 {
    let eth = match ptr_at::<[u8; 12]>(ctx, 0) {
        Some(p) => p,
        None => return drop(stat::DROP_ENCAP, counters),
    };
    let old = unsafe { core::ptr::read_unaligned(eth) };
    let mut h = [0u8; 12];
    h[0..6].copy_from_slice(&backend.mac);
    h[6..12].copy_from_slice(&old[0..6]);
    unsafe { core::ptr::write_unaligned(eth, h) };
    counters.inc(stat::TX);
    xdp_action::XDP_TX
}
