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
use lb_ebpf::packet::{ipv4_checksum, put_word};

use crate::icmp;
use crate::nexthop::{self, Family, Forward, MacFrom, Outer, Route};
use crate::parse::Packet;
use crate::stats::{drop, Counters};

/// TTL / hop limit of the outer header; the inner packet is not touched.
const OUTER_TTL: u32 = 64;

/// The backend a packet goes to: its id (the next-hop cache's index), its record, and the
/// packet's flow hash (the hashed bits of an outer source, IPv6's flow label).
#[derive(Clone, Copy)]
pub struct Target<'a> {
    pub id: u32,
    pub backend: &'a Backend,
    pub hash: u32,
}

/// What every way out needs from the packet's context: the data-plane clock, the ingress device
/// (read once by the caller) and the counters.
#[derive(Clone, Copy)]
pub struct Context {
    pub now: u64,
    pub ingress: u32,
    pub counters: Counters,
}

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

/// Grows the head so that the frame becomes eth + `outer_len` bytes + the inner IP datagram,
/// and writes the Ethernet header. Returns the frame start, with eth + `outer_len` bytes
/// bounds-checked for writing. (`outer_len` is a constant of each encapsulation.)
#[inline(always)]
fn push_outer(ctx: &XdpContext, pkt: &Packet, route: &Route, outer_len: usize, ethertype: u16) -> Result<*mut u8, u32> {
    let delta = (ETH_LEN + outer_len) as i32 - pkt.l3_off as i32;
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -delta) } != 0 {
        return Err(stat::DROP_ENCAP);
    }
    let p = ctx.data() as *mut u8;
    if ctx.data() + ETH_LEN + outer_len > ctx.data_end() {
        return Err(stat::DROP_ENCAP);
    }
    put_word(p, 0, route.macs[0]);
    put_word(p, 4, route.macs[1]);
    put_word(p, 8, route.macs[2]);
    unsafe { core::ptr::write(p.add(12) as *mut u16, ethertype.to_be()) };
    Ok(p)
}

/// What differs between the IP-in-IP encapsulations; [`encapsulate`] is the sequence they
/// share (route, push the outer header, write it, transmit).
pub trait IpInIp {
    /// The backend's family this encapsulation carries to (the inner packet's).
    const FAMILY: u8;
    /// The outer header's family, length, ethertype and protocol.
    const OUTER_FAMILY: Family;
    const OUTER_LEN: usize;
    const ETHERTYPE: u16;
    const PROTO: u8;
    /// The outer datagram's length; None if it does not fit the length field.
    fn outer_len(pkt: &Packet) -> Option<u32>;
    /// The outer source: the service's, with the hashed bits from the flow hash.
    fn source(svc: &ServiceInfo, hash: u32) -> [u32; 4];
    /// Writes the outer IP header at `at` (bounds-checked for `OUTER_LEN` bytes).
    fn write_header(at: *mut u8, pkt: &Packet, src: &[u32; 4], dst: &[u32; 4], hash: u32, len: u32);
}

/// IPv4-in-IPv4 (RFC 2003).
pub struct Ipip;

impl IpInIp for Ipip {
    const FAMILY: u8 = FAMILY_V4;
    const OUTER_FAMILY: Family = Family::V4;
    const OUTER_LEN: usize = IPV4_HDR_LEN;
    const ETHERTYPE: u16 = ETH_P_IP;
    const PROTO: u8 = IPPROTO_IPIP;

    #[inline(always)]
    fn outer_len(pkt: &Packet) -> Option<u32> {
        let tot_len = pkt.l3_len + IPV4_HDR_LEN;
        (tot_len <= 0xffff).then_some(tot_len as u32)
    }

    #[inline(always)]
    fn source(svc: &ServiceInfo, hash: u32) -> [u32; 4] {
        [encap_source_word(svc.encap_src[0], svc.encap_src_hash_mask, hash), 0, 0, 0]
    }

    #[inline(always)]
    fn write_header(at: *mut u8, pkt: &Packet, src: &[u32; 4], dst: &[u32; 4], _hash: u32, len: u32) {
        // Version/IHL, the inner TOS, total length | identification and DF copied from the
        // inner header | TTL, protocol, checksum | source | destination.
        let mut h = [
            0x45 | (pkt.tclass as u32) << 8 | ((len as u16).to_be() as u32) << 16,
            pkt.id_df,
            OUTER_TTL | (IPPROTO_IPIP as u32) << 8,
            src[0],
            dst[0],
        ];
        h[2] |= ipv4_checksum(&h) << 16;
        for (i, w) in h.iter().enumerate() {
            put_word(at, ETH_LEN + 4 * i, *w);
        }
    }
}

/// IPv6-in-IPv6 (RFC 2473).
pub struct Ip6ip6;

impl IpInIp for Ip6ip6 {
    const FAMILY: u8 = FAMILY_V6;
    const OUTER_FAMILY: Family = Family::V6;
    const OUTER_LEN: usize = IPV6_HDR_LEN;
    const ETHERTYPE: u16 = ETH_P_IPV6;
    const PROTO: u8 = IPPROTO_IPV6;

    #[inline(always)]
    fn outer_len(pkt: &Packet) -> Option<u32> {
        (pkt.l3_len <= 0xffff).then_some((pkt.l3_len + IPV6_HDR_LEN) as u32)
    }

    #[inline(always)]
    fn source(svc: &ServiceInfo, hash: u32) -> [u32; 4] {
        let s = svc.encap_src;
        [s[0], s[1], s[2], encap_source_word(s[3], svc.encap_src_hash_mask, hash)]
    }

    #[inline(always)]
    fn write_header(at: *mut u8, pkt: &Packet, src: &[u32; 4], dst: &[u32; 4], hash: u32, _len: u32) {
        // Version 6, the inner traffic class, flow label from the flow hash (spreads ECMP/RSS).
        let h = [
            ((6u32 << 28) | ((pkt.tclass as u32) << 20) | (hash & 0x000f_ffff)).to_be(),
            (((pkt.l3_len as u32) << 16) | ((IPPROTO_IPV6 as u32) << 8) | OUTER_TTL).to_be(),
            src[0],
            src[1],
            src[2],
            src[3],
            dst[0],
            dst[1],
            dst[2],
            dst[3],
        ];
        for (i, w) in h.iter().enumerate() {
            put_word(at, ETH_LEN + 4 * i, *w);
        }
    }
}

/// Encapsulates the packet for `to` with `E` and sends it on the route to the backend.
#[inline(always)]
pub fn encapsulate<E: IpInIp>(ctx: &XdpContext, pkt: &Packet, to: Target, svc: &ServiceInfo, at: Context) -> u32 {
    if to.backend.family != E::FAMILY {
        return drop(stat::DROP_ENCAP, at.counters);
    }
    let Some(len) = E::outer_len(pkt) else {
        return drop(stat::DROP_ENCAP, at.counters);
    };
    let src = E::source(svc, to.hash);
    let forward = Forward::Encap { proto: E::PROTO };
    let outer = Outer::new(E::OUTER_FAMILY, forward, len, src, svc.encap_src_hash_mask, to.backend.addr);
    let route = match nexthop::route(ctx, to.id, outer, at.now, at.ingress) {
        Ok(r) => r,
        Err(reason) => return icmp::route_failed(ctx, pkt, reason, E::OUTER_LEN as u32, at.now, at.counters),
    };
    let p = match push_outer(ctx, pkt, &route, E::OUTER_LEN, E::ETHERTYPE) {
        Ok(p) => p,
        Err(reason) => return drop(reason, at.counters),
    };
    E::write_header(p, pkt, &src, &to.backend.addr, to.hash, len);
    transmit(&route, at.counters)
}

/// L2 DSR: the backend shares a segment with the balancer and owns the VIP on a loopback; the
/// frame goes to the backend's MAC: the configured one, or, when the record has none (zero), the
/// one the host's neighbour table holds for the backend's address (from the route lookup, as
/// IPVS direct routing does; the daemon keeps that entry resolved). An untagged frame leaves by
/// the device the route to the backend's address uses: the ingress device (XDP_TX; source = the
/// MAC the frame was sent to, which `parse::local_ingress` checked is that device's own) or
/// another one (redirect; source = that device's MAC). A VLAN-tagged frame goes back out of
/// the ingress on its VLAN, tag kept: the host's route to a backend on that VLAN points at a VLAN
/// device, on which native XDP cannot transmit. The same rewrite sends a next-hop service's
/// packets, unchanged, to an appliance; for those (`next_hop`) a frame from the MAC it would be
/// sent to is a loop, dropped (`drop_loop`).
#[inline(always)]
pub fn l2_dsr(ctx: &XdpContext, pkt: &Packet, to: Target, at: Context, next_hop: bool) -> u32 {
    let Context { now, ingress, counters } = at;
    let backend = to.backend;
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
        let family = if backend.family == FAMILY_V6 { Family::V6 } else { Family::V4 };
        let forward = Forward::Rewrite { mac: if from_neigh { MacFrom::Neighbour } else { MacFrom::Config } };
        let outer = Outer::new(family, forward, pkt.l3_len as u32, [0; 4], 0, backend.addr);
        match nexthop::route(ctx, to.id, outer, now, ingress) {
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
    // A next hop's frame that came from the MAC it would go to: the appliance sent it back
    // (its route points at the balancer). Sending it again would bounce it until its TTL runs
    // out. (A VIP's packet from its backend is a martian, dropped before.) Source MAC: bytes
    // 6..12, the high half of word 1 and word 2.
    if next_hop {
        let (w1, w2) = unsafe { (core::ptr::read(p.add(4) as *const u32), core::ptr::read(p.add(8) as *const u32)) };
        if dmac_lo == (w1 >> 16 | w2 << 16) && dmac_hi == w2 >> 16 {
            return drop(stat::DROP_LOOP, counters);
        }
    }
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
