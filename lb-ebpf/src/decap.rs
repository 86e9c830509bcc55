//! The decapsulator's XDP object, `lb_decap`: on a backend host, strip the outer IPIP / IP6IP6
//! header of packets addressed to one of this host's tunnel endpoints (`DECAP_ADDRS`) and pass
//! the inner packet up the stack. Everything else is passed untouched.
//!
//! An object of its own, with only its own maps at their real sizes (`lb decap attach` loads
//! nothing of the balancer).
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::xdp_action,
    helpers::bpf_xdp_adjust_head,
    macros::{map, xdp},
    maps::{HashMap, PerCpuArray},
    programs::XdpContext,
};
use lb_common::maps::{stat, AddrKey, GlobalStats, FAMILY_V4, FAMILY_V6};
use lb_ebpf::consts::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_IPIP, IPPROTO_IPV6};
use lb_ebpf::counters::{drop, Counters};
use lb_ebpf::packet::{parse_eth, ptr_at, read};

/// The object's licence, as the kernel reads it: the same as the balancer's (see
/// src/main.rs): the eBPF crates are dual MIT / GPL-2.0.
#[no_mangle]
#[link_section = "license"]
#[used]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// This host's tunnel endpoint addresses (`lb decap attach --address`, or the interface's).
/// Room for a host with many addresses (a backend serving on a thousand of them).
#[map]
static DECAP_ADDRS: HashMap<AddrKey, u32> = HashMap::with_max_entries(4096, 0);
/// The counters, as the balancer's `STATS` record; only `stat::DECAP` and
/// `stat::DECAP_DROP_MALFORMED` are used here.
#[map]
static STATS: PerCpuArray<GlobalStats> = PerCpuArray::with_max_entries(1, 0);

#[xdp]
#[inline(always)]
pub fn lb_decap(ctx: XdpContext) -> u32 {
    run(&ctx)
}

#[inline(always)]
fn is_local(addr: [u32; 4], family: u8) -> bool {
    let key = AddrKey { addr, family, _pad: [0; 3] };
    unsafe { DECAP_ADDRS.get(key).is_some() }
}

#[inline(always)]
fn run(ctx: &XdpContext) -> u32 {
    let (l3_off, ethertype) = match parse_eth(ctx) {
        Ok(x) => x,
        Err(_) => return xdp_action::XDP_PASS,
    };
    // (outer header length, inner ethertype), or pass.
    let (outer_len, inner_type) = match ethertype {
        ETH_P_IP => {
            let h: [u8; 20] = match read(ctx, l3_off) {
                Some(h) => h,
                None => return xdp_action::XDP_PASS,
            };
            let dst = u32::from_ne_bytes([h[16], h[17], h[18], h[19]]);
            if h[9] != IPPROTO_IPIP || h[0] >> 4 != 4 || !is_local([dst, 0, 0, 0], FAMILY_V4) {
                return xdp_action::XDP_PASS;
            }
            // A piece of a fragmented outer datagram holds no whole inner packet: the stack
            // gets it untouched and reassembles (a host with the ipip module then decapsulates).
            // An IPv6 outer datagram in pieces has a fragment header, not IPPROTO_IPV6, next.
            if u16::from_be_bytes([h[6], h[7]]) & 0x3fff != 0 {
                return xdp_action::XDP_PASS;
            }
            let ihl = ((h[0] & 0x0f) as usize) * 4;
            if ihl < 20 {
                return malformed();
            }
            (ihl, ETH_P_IP)
        }
        ETH_P_IPV6 => {
            let h: [u32; 10] = match read(ctx, l3_off) {
                Some(h) => h,
                None => return xdp_action::XDP_PASS,
            };
            let next = h[1].to_ne_bytes()[2];
            if next != IPPROTO_IPV6 || !is_local([h[6], h[7], h[8], h[9]], FAMILY_V6) {
                return xdp_action::XDP_PASS;
            }
            (40, ETH_P_IPV6)
        }
        _ => return xdp_action::XDP_PASS,
    };
    let inner_off = l3_off + outer_len;
    // The inner header must be there and of the announced version.
    let inner_ver: [u8; 1] = match read(ctx, inner_off) {
        Some(v) => v,
        None => return malformed(),
    };
    let want = if inner_type == ETH_P_IP { 4 } else { 6 };
    if inner_ver[0] >> 4 != want {
        return malformed();
    }
    let eth: [u8; 12] = match read(ctx, 0) {
        Some(e) => e,
        None => return malformed(),
    };
    // Keep the frame's MACs, drop any VLAN tag with the outer header.
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, (inner_off - ETH_LEN) as i32) } != 0 {
        return malformed();
    }
    let p = match ptr_at::<[u8; ETH_LEN]>(ctx, 0) {
        Some(p) => p,
        None => return malformed(),
    };
    let mut h = [0u8; ETH_LEN];
    h[0..12].copy_from_slice(&eth);
    h[12..14].copy_from_slice(&inner_type.to_be_bytes());
    unsafe { core::ptr::write_unaligned(p, h) };
    Counters::get(&STATS).inc(stat::DECAP);
    xdp_action::XDP_PASS
}

fn malformed() -> u32 {
    drop(stat::DECAP_DROP_MALFORMED, Counters::get(&STATS))
}
