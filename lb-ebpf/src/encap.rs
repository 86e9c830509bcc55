//! Forwarding to the chosen backend: IPIP / IP6IP6 encapsulation with the next hop from
//! `bpf_fib_lookup` (cached per backend for up to a second, see `nexthop`), or L2 DSR
//! (destination MAC rewrite, out of the device the route to the backend uses). The outer frame
//! of an encapsulation is untagged: the route decides the egress device, so an ingress VLAN tag
//! is dropped with the old header.
//!
//! Headers are written as 32-bit words (see `lb_ebpf::packet::word` on alignment), not byte by byte.

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_redirect, bpf_xdp_adjust_head},
    programs::XdpContext,
};
use lb_common::decide::encap_source_word;
use lb_common::maps::{stat, Backend, ServiceInfo, FAMILY_V4, FAMILY_V6};

use lb_ebpf::consts::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_IPIP, IPPROTO_IPV6, IPV4_HDR_LEN, IPV6_HDR_LEN};
use lb_ebpf::packet::put_word;

use crate::icmp;
use crate::nexthop::{self, Outer, Route};
use crate::parse::Packet;
use crate::stats::{drop, Counters};

/// TTL / hop limit of the outer header; the inner packet is not touched.
const OUTER_TTL: u32 = 64;

/// Transmit on the ingress device or redirect to the route's device.
#[inline(always)]
fn transmit(route: &Route, counters: Counters) -> u32 {
    if route.egress_ifindex == route.ingress_ifindex {
        counters.inc(stat::TX);
        xdp_action::XDP_TX
    } else {
        counters.inc(stat::REDIRECT);
        unsafe { bpf_redirect(route.egress_ifindex, 0) as u32 }
    }
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

/// Grows the head so that the frame becomes eth + `outer_len` bytes + the inner IP datagram,
/// and writes the Ethernet header. Returns the frame start, with eth + `outer_len` bytes
/// bounds-checked for writing.
#[inline(always)]
fn push_outer<const OUTER: usize>(
    ctx: &XdpContext,
    pkt: &Packet,
    route: &Route,
    ethertype: u16,
) -> Result<*mut u8, u32> {
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
    ingress: u32,
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
        l2: false,
        neigh: false,
        len: tot_len as u32,
        src: [src, 0, 0, 0],
        src_mask: svc.encap_src_hash_mask,
        dst: backend.addr,
    };
    let route = match nexthop::route(ctx, backend_id, outer, now, ingress) {
        Ok(r) => r,
        Err(reason) => return icmp::route_failed(ctx, pkt, reason, IPV4_HDR_LEN as u32, now, counters),
    };
    let p = match push_outer::<IPV4_HDR_LEN>(ctx, pkt, &route, ETH_P_IP) {
        Ok(p) => p,
        Err(reason) => return drop(reason, counters),
    };
    // Version/IHL, the inner TOS, total length | identification and DF copied from the inner
    // header | TTL, protocol, checksum | source | destination.
    let mut h = [
        0x45 | (pkt.tclass as u32) << 8 | ((tot_len as u16).to_be() as u32) << 16,
        pkt.id_df,
        OUTER_TTL | (IPPROTO_IPIP as u32) << 8,
        src,
        backend.addr[0],
    ];
    h[2] |= ipv4_checksum(&h) << 16;
    for (i, w) in h.iter().enumerate() {
        put_word(p, ETH_LEN + 4 * i, *w);
    }
    transmit(&route, counters)
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
    ingress: u32,
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
        l2: false,
        neigh: false,
        len: (pkt.l3_len + IPV6_HDR_LEN) as u32,
        src,
        src_mask: svc.encap_src_hash_mask,
        dst: backend.addr,
    };
    let route = match nexthop::route(ctx, backend_id, outer, now, ingress) {
        Ok(r) => r,
        Err(reason) => return icmp::route_failed(ctx, pkt, reason, IPV6_HDR_LEN as u32, now, counters),
    };
    let p = match push_outer::<IPV6_HDR_LEN>(ctx, pkt, &route, ETH_P_IPV6) {
        Ok(p) => p,
        Err(reason) => return drop(reason, counters),
    };
    // Version 6, the inner traffic class, flow label from the flow hash (spreads ECMP/RSS).
    let h = [
        ((6u32 << 28) | ((pkt.tclass as u32) << 20) | (hash & 0x000f_ffff)).to_be(),
        (((pkt.l3_len as u32) << 16) | ((IPPROTO_IPV6 as u32) << 8) | OUTER_TTL).to_be(),
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
    transmit(&route, counters)
}

/// L2 DSR: the backend shares a segment with the balancer and owns the VIP on a loopback; the
/// frame goes to the backend's MAC: the configured one, or, when the record has none (zero), the
/// one the host's neighbour table holds for the backend's address (from the route lookup, as
/// IPVS direct routing does; the daemon keeps that entry resolved). An untagged frame leaves by
/// the device the route to the backend's address uses: the ingress device (XDP_TX; source = the
/// MAC the frame was sent to, which `parse::local_ingress` checked is that device's own) or
/// another one (redirect; source = that device's MAC). A VLAN-tagged frame goes back out of
/// the ingress on its VLAN, tag kept: the host's route to a backend on that VLAN points at a VLAN
/// device, on which native XDP cannot transmit.
#[inline(always)]
pub fn l2_dsr(
    ctx: &XdpContext,
    pkt: &Packet,
    backend_id: u32,
    backend: &Backend,
    now: u64,
    ingress: u32,
    counters: Counters,
) -> u32 {
    let m = backend.mac;
    let mut dmac_lo = u32::from_ne_bytes([m[0], m[1], m[2], m[3]]);
    let mut dmac_hi = u16::from_ne_bytes([m[4], m[5]]) as u32;
    // Configuration refuses a zero MAC: zero is "none configured".
    let from_neigh = dmac_lo | dmac_hi == 0;
    let p = ctx.data() as *mut u8;
    if ctx.data() + ETH_LEN > ctx.data_end() {
        return drop(stat::DROP_ENCAP, counters);
    }
    let untagged = pkt.l3_off == ETH_LEN;
    // A tagged frame needs the route only for the neighbour's MAC (it leaves by the ingress).
    let egress = if untagged || from_neigh {
        let outer = Outer {
            ipv6: backend.family == FAMILY_V6,
            l2: true,
            neigh: from_neigh,
            len: pkt.l3_len as u32,
            src: [0; 4],
            src_mask: 0,
            dst: backend.addr,
        };
        match nexthop::route(ctx, backend_id, outer, now, ingress) {
            Ok(r) => {
                if from_neigh {
                    // The next hop's MAC: word 0 and the low half of word 1 (see `Route::macs`).
                    (dmac_lo, dmac_hi) = (r.macs[0], r.macs[1] & 0xffff);
                }
                if untagged && r.egress_ifindex != r.ingress_ifindex {
                    Some(r)
                } else {
                    None
                }
            }
            Err(reason) => return icmp::route_failed(ctx, pkt, reason, 0, now, counters),
        }
    } else {
        None
    };
    let route = match egress {
        Some(r) => r,
        None => {
            // Back out of the ingress. Bytes 4..8: the destination's last two bytes, the
            // source's first two (the old destination's first two); bytes 8..12 become the old
            // destination's last four.
            let old = [unsafe { core::ptr::read(p as *const u32) }, unsafe { core::ptr::read(p.add(4) as *const u32) }];
            put_word(p, 0, dmac_lo);
            put_word(p, 4, dmac_hi | old[0] << 16);
            put_word(p, 8, old[0] >> 16 | old[1] << 16);
            counters.inc(stat::TX);
            return xdp_action::XDP_TX;
        }
    };
    // The source MAC from the route: the high half of word 1 and word 2 (see `Route::macs`).
    // Never zero after a lookup towards another device (see `nexthop::resolve`) unless the
    // device has no MAC: not an Ethernet segment a backend can be on.
    let (smac_lo, smac_hi) = (route.macs[1] & 0xffff_0000, route.macs[2]);
    if smac_lo | smac_hi == 0 {
        return drop(stat::DROP_FIB, counters);
    }
    put_word(p, 0, dmac_lo);
    put_word(p, 4, dmac_hi | smac_lo);
    put_word(p, 8, smac_hi);
    transmit(&route, counters)
}
