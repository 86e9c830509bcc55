//! Forwarding to the chosen backend: IPIP / IP6IP6 encapsulation with the next hop from
//! `bpf_fib_lookup`, or L2 DSR (destination MAC rewrite). The outer frame is untagged: the
//! route decides the egress device, so an ingress VLAN tag is dropped with the old header.

use aya_ebpf::{
    bindings::{bpf_fib_lookup as bpf_fib_lookup_t, xdp_action},
    helpers::{bpf_fib_lookup, bpf_redirect, bpf_xdp_adjust_head},
    programs::XdpContext,
};
use lb_common::{encap_source_word, stat, Backend, ServiceInfo, FAMILY_V4, FAMILY_V6};

use crate::parse::{ptr_at, read, Packet, ETH_LEN, ETH_P_IP, ETH_P_IPV6};
use crate::stats;

const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_IPIP: u8 = 4;
const IPPROTO_IPV6: u8 = 41;
const IPV4_HDR_LEN: usize = 20;
const IPV6_HDR_LEN: usize = 40;
/// TTL / hop limit of the outer header; the inner packet is not touched.
const OUTER_TTL: u8 = 64;

/// `struct bpf_fib_lookup` with its unions flattened (64 bytes, kernel ABI).
#[repr(C)]
struct FibParams {
    family: u8,
    l4_protocol: u8,
    sport: u16,
    dport: u16,
    tot_len: u16,
    ifindex: u32,
    flowinfo: u32,
    src: [u32; 4],
    dst: [u32; 4],
    vlan: u32,
    smac: [u8; 6],
    dmac: [u8; 6],
}
const _: () = assert!(core::mem::size_of::<FibParams>() == 64);

/// Route lookup from the ingress device: Ok((egress ifindex, source MAC, next-hop MAC)).
#[inline(always)]
fn fib(ctx: &XdpContext, family: u8, tot_len: usize, src: [u32; 4], dst: [u32; 4]) -> Result<FibParams, u32> {
    let mut p = FibParams {
        family,
        l4_protocol: if family == AF_INET { IPPROTO_IPIP } else { IPPROTO_IPV6 },
        sport: 0,
        dport: 0,
        tot_len: tot_len as u16,
        ifindex: ctx.ingress_ifindex() as u32,
        flowinfo: 0,
        src,
        dst,
        vlan: 0,
        smac: [0; 6],
        dmac: [0; 6],
    };
    let rc = unsafe {
        bpf_fib_lookup(
            ctx.ctx as *mut _,
            &mut p as *mut FibParams as *mut bpf_fib_lookup_t,
            core::mem::size_of::<FibParams>() as i32,
            0,
        )
    };
    match rc {
        0 => Ok(p),
        // Blackhole, unreachable, prohibit, not forwarded: there is no route.
        1..=4 => Err(stat::DROP_UNROUTABLE),
        // Forwarding disabled, unsupported lwt, no neighbour, fragmentation needed, error.
        _ => Err(stat::DROP_FIB),
    }
}

/// Transmit on the ingress device or redirect to the route's device.
#[inline(always)]
fn transmit(ctx: &XdpContext, ifindex: u32) -> u32 {
    if ifindex == ctx.ingress_ifindex() as u32 {
        stats::inc(stat::TX);
        xdp_action::XDP_TX
    } else {
        stats::inc(stat::REDIRECT);
        unsafe { bpf_redirect(ifindex, 0) as u32 }
    }
}

fn drop(reason: u32) -> u32 {
    stats::inc(reason);
    xdp_action::XDP_DROP
}

#[inline(always)]
fn ipv4_checksum(h: &[u8; IPV4_HDR_LEN]) -> u16 {
    let mut sum: u32 = 0;
    let mut i = 0;
    while i < IPV4_HDR_LEN {
        sum += u16::from_be_bytes([h[i], h[i + 1]]) as u32;
        i += 2;
    }
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// Grows the head so that the frame becomes eth + `outer_len` bytes + the inner IP datagram,
/// and writes the Ethernet header. Ok(()) leaves the outer header area to be written.
#[inline(always)]
fn push_outer(ctx: &XdpContext, pkt: &Packet, outer_len: usize, f: &FibParams, ethertype: u16) -> Result<(), u32> {
    let delta = (ETH_LEN + outer_len) as i32 - pkt.l3_off as i32;
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -delta) } != 0 {
        return Err(stat::DROP_ENCAP);
    }
    let eth = ptr_at::<[u8; ETH_LEN]>(ctx, 0).ok_or(stat::DROP_ENCAP)?;
    let mut h = [0u8; ETH_LEN];
    h[0..6].copy_from_slice(&f.dmac);
    h[6..12].copy_from_slice(&f.smac);
    h[12..14].copy_from_slice(&ethertype.to_be_bytes());
    unsafe { core::ptr::write_unaligned(eth, h) };
    Ok(())
}

/// IPv4-in-IPv4 to the backend.
#[inline(always)]
pub fn ipip_v4(ctx: &XdpContext, pkt: &Packet, backend: &Backend, svc: &ServiceInfo, hash: u32) -> u32 {
    if backend.family != FAMILY_V4 {
        return drop(stat::DROP_ENCAP);
    }
    let inner: [u8; 8] = match read(ctx, pkt.l3_off) {
        Some(b) => b,
        None => return drop(stat::DROP_ENCAP),
    };
    let tot_len = pkt.l3_len + IPV4_HDR_LEN;
    if tot_len > 0xffff {
        return drop(stat::DROP_ENCAP);
    }
    let src = encap_source_word(svc.encap_src[0], svc.encap_src_hash_mask, hash);
    let f = match fib(ctx, AF_INET, tot_len, [src, 0, 0, 0], [backend.addr[0], 0, 0, 0]) {
        Ok(f) => f,
        Err(reason) => return drop(reason),
    };
    if let Err(reason) = push_outer(ctx, pkt, IPV4_HDR_LEN, &f, ETH_P_IP) {
        return drop(reason);
    }
    let mut h = [0u8; IPV4_HDR_LEN];
    h[0] = 0x45;
    h[1] = inner[1]; // TOS/DSCP of the inner packet
    h[2..4].copy_from_slice(&(tot_len as u16).to_be_bytes());
    // Identification 0; DF copied from the inner header.
    h[6] = inner[6] & 0x40;
    h[8] = OUTER_TTL;
    h[9] = IPPROTO_IPIP;
    h[12..16].copy_from_slice(&src.to_ne_bytes());
    h[16..20].copy_from_slice(&backend.addr[0].to_ne_bytes());
    let csum = ipv4_checksum(&h);
    h[10..12].copy_from_slice(&csum.to_be_bytes());
    match ptr_at::<[u8; IPV4_HDR_LEN]>(ctx, ETH_LEN) {
        Some(p) => unsafe { core::ptr::write_unaligned(p, h) },
        None => return drop(stat::DROP_ENCAP),
    }
    transmit(ctx, f.ifindex)
}

/// IPv6-in-IPv6 to the backend.
#[inline(always)]
pub fn ip6ip6(ctx: &XdpContext, pkt: &Packet, backend: &Backend, svc: &ServiceInfo, hash: u32) -> u32 {
    if backend.family != FAMILY_V6 {
        return drop(stat::DROP_ENCAP);
    }
    let inner: [u8; 4] = match read(ctx, pkt.l3_off) {
        Some(b) => b,
        None => return drop(stat::DROP_ENCAP),
    };
    if pkt.l3_len > 0xffff {
        return drop(stat::DROP_ENCAP);
    }
    let s = svc.encap_src;
    let src = [s[0], s[1], s[2], encap_source_word(s[3], svc.encap_src_hash_mask, hash)];
    let f = match fib(ctx, AF_INET6, pkt.l3_len + IPV6_HDR_LEN, src, backend.addr) {
        Ok(f) => f,
        Err(reason) => return drop(reason),
    };
    if let Err(reason) = push_outer(ctx, pkt, IPV6_HDR_LEN, &f, ETH_P_IPV6) {
        return drop(reason);
    }
    let mut h = [0u32; 10];
    // Version 6, the inner traffic class, flow label from the flow hash (spreads ECMP/RSS).
    let tclass = ((inner[0] as u32 & 0x0f) << 4) | (inner[1] as u32 >> 4);
    h[0] = ((6u32 << 28) | (tclass << 20) | (hash & 0x000f_ffff)).to_be();
    h[1] = (((pkt.l3_len as u32) << 16) | ((IPPROTO_IPV6 as u32) << 8) | OUTER_TTL as u32).to_be();
    h[2..6].copy_from_slice(&src);
    h[6..10].copy_from_slice(&backend.addr);
    match ptr_at::<[u32; 10]>(ctx, ETH_LEN) {
        Some(p) => unsafe { core::ptr::write_unaligned(p, h) },
        None => return drop(stat::DROP_ENCAP),
    }
    transmit(ctx, f.ifindex)
}

/// L2 DSR: the backend shares the segment and owns the VIP on a loopback; rewrite the
/// destination MAC to the backend's (source = the MAC the frame was sent to) and send it back
/// out of the ingress device.
#[inline(always)]
pub fn l2_dsr(ctx: &XdpContext, backend: &Backend) -> u32 {
    let eth = match ptr_at::<[u8; 12]>(ctx, 0) {
        Some(p) => p,
        None => return drop(stat::DROP_ENCAP),
    };
    let old = unsafe { core::ptr::read_unaligned(eth) };
    let mut h = [0u8; 12];
    h[0..6].copy_from_slice(&backend.mac);
    h[6..12].copy_from_slice(&old[0..6]);
    unsafe { core::ptr::write_unaligned(eth, h) };
    stats::inc(stat::TX);
    xdp_action::XDP_TX
}
