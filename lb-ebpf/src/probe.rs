//! The health prober's object, `lb_probe`: a TC egress program on the daemon's probe device
//! (`lb-user` `daemon::probe_path`). A health probe's socket connects to the VIP with the mark
//! `probe::MARK_BASE | slot`; a policy route sends marked packets to the probe device, and
//! here each one is delivered to the backend `PROBE_TARGETS[mark]` names, the way the balancer
//! delivers that backend's client packets: encapsulated (IPIP / IP6IP6, the service's outer
//! source) or as it is to the backend's MAC (L2 DSR). The backend answers from the VIP straight
//! to the probe's socket (direct server return), so a probe passes only if the backend serves
//! the VIP as clients reach it. It never meets the balancer's XDP choice: the packet leaves by
//! the egress path, to the one backend named.
//!
//! An object of its own, like `lb_decap`: the balancer's object and its verifier budget are
//! untouched.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{bpf_adj_room_mode::BPF_ADJ_ROOM_MAC, bpf_redir_neigh, TC_ACT_SHOT},
    helpers::bpf_redirect_neigh,
    macros::{classifier, map},
    maps::{HashMap, PerCpuArray},
    programs::TcContext,
};
use lb_common::maps::{probe, stat, GlobalStats, ProbeTarget, FAMILY_V4, FAMILY_V6};
use lb_ebpf::consts::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_IPIP, IPPROTO_IPV6, IPV4_HDR_LEN, IPV6_HDR_LEN};
use lb_ebpf::counters::Counters;
use lb_ebpf::packet::ipv4_checksum;

/// The object's licence, as the kernel reads it: the same as the balancer's (see
/// src/main.rs); `bpf_redirect_neigh` is GPL-only.
#[no_mangle]
#[link_section = "license"]
#[used]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// Where each probe in flight goes, by its socket's mark (written by the daemon before the
/// probe connects, removed when it ends).
#[map]
static PROBE_TARGETS: HashMap<u32, ProbeTarget> = HashMap::with_max_entries(probe::SLOTS, 0);
/// The counters, as the balancer's `STATS` record; only the `probe` ones are used here.
#[map]
static STATS: PerCpuArray<GlobalStats> = PerCpuArray::with_max_entries(1, 0);

/// `bpf_skb_adjust_room` flags: the grown room is an IPv4 / IPv6 outer header (so GSO and
/// checksum offload treat the packet as encapsulated).
const ADJ_ROOM_ENCAP_L3_IPV4: u64 = 1 << 1;
const ADJ_ROOM_ENCAP_L3_IPV6: u64 = 1 << 2;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
/// TTL / hop limit of the outer header.
const OUTER_TTL: u8 = 64;

#[classifier]
pub fn lb_probe(ctx: TcContext) -> i32 {
    // SAFETY: the context's `__sk_buff` is valid for the program's run.
    let mark = unsafe { (*ctx.skb.skb).mark };
    // Not a probe: the kernel's own traffic on the device (IPv6 neighbour discovery, MLD),
    // which goes nowhere, uncounted.
    if mark & probe::MARK_MASK != probe::MARK_BASE {
        return TC_ACT_SHOT;
    }
    let counters = Counters::get(&STATS);
    match run(&ctx, mark) {
        Ok(action) => {
            counters.inc(stat::PROBE_SENT);
            action
        }
        Err(reason) => {
            counters.inc(reason);
            TC_ACT_SHOT
        }
    }
}

#[inline(always)]
fn run(ctx: &TcContext, mark: u32) -> Result<i32, u32> {
    // SAFETY: a hash map value read, copied out at once.
    let target = match unsafe { PROBE_TARGETS.get(mark) } {
        Some(t) => *t,
        None => return Err(stat::DROP_PROBE_NO_TARGET),
    };
    let ethertype = u16::from_be(ctx.load::<u16>(12).map_err(|_| stat::DROP_PROBE_NO_TARGET)?);
    let (want, family) = if target.family == FAMILY_V4 { (ETH_P_IP, AF_INET) } else { (ETH_P_IPV6, AF_INET6) };
    if ethertype != want || (target.family != FAMILY_V4 && target.family != FAMILY_V6) {
        return Err(stat::DROP_PROBE_NO_TARGET);
    }
    // The kernel's route lookups from here on must not see the mark: it leads back here.
    ctx.skb.set_mark(0);
    if target.forward == probe::FORWARD_L2 {
        // The packet as it is, to the backend's MAC: the backend is the next hop.
        let mut nh = bpf_redir_neigh { nh_family: family, __bindgen_anon_1: unsafe { core::mem::zeroed() } };
        nh.__bindgen_anon_1.ipv6_nh = target.backend;
        // SAFETY: `nh` lives across the call; its size is passed.
        let action =
            unsafe { bpf_redirect_neigh(target.ifindex, &mut nh, core::mem::size_of::<bpf_redir_neigh>() as i32, 0) };
        return if action == TC_ACT_SHOT as i64 { Err(stat::DROP_PROBE_SEND) } else { Ok(action as i32) };
    }
    let inner_len = ctx.len() as usize - ETH_LEN;
    if target.family == FAMILY_V4 {
        // Identification and DF of the inner header, as the balancer copies them.
        let id_df = ctx.load::<u32>(ETH_LEN + 4).map_err(|_| stat::DROP_PROBE_SEND)?;
        ctx.skb
            .adjust_room(IPV4_HDR_LEN as i32, BPF_ADJ_ROOM_MAC, ADJ_ROOM_ENCAP_L3_IPV4)
            .map_err(|_| stat::DROP_PROBE_SEND)?;
        let len = ((inner_len + IPV4_HDR_LEN) as u16).to_be() as u32;
        let mut h = [
            0x45 | len << 16,
            id_df,
            OUTER_TTL as u32 | (IPPROTO_IPIP as u32) << 8,
            target.outer_source[0],
            target.backend[0],
        ];
        h[2] |= ipv4_checksum(&h) << 16;
        ctx.store(ETH_LEN, &h, 0).map_err(|_| stat::DROP_PROBE_SEND)?;
    } else {
        ctx.skb
            .adjust_room(IPV6_HDR_LEN as i32, BPF_ADJ_ROOM_MAC, ADJ_ROOM_ENCAP_L3_IPV6)
            .map_err(|_| stat::DROP_PROBE_SEND)?;
        let (s, d) = (target.outer_source, target.backend);
        let h = [
            (6u32 << 28).to_be(),
            (((inner_len as u32) << 16) | ((IPPROTO_IPV6 as u32) << 8) | OUTER_TTL as u32).to_be(),
            s[0],
            s[1],
            s[2],
            s[3],
            d[0],
            d[1],
            d[2],
            d[3],
        ];
        ctx.store(ETH_LEN, &h, 0).map_err(|_| stat::DROP_PROBE_SEND)?;
    }
    // The kernel routes the outer destination out of the backend's device and resolves its
    // next hop (the backend, or the gateway to it).
    // SAFETY: no parameters: the helper looks the next hop up itself.
    let action = unsafe { bpf_redirect_neigh(target.ifindex, core::ptr::null_mut(), 0, 0) };
    if action == TC_ACT_SHOT as i64 {
        Err(stat::DROP_PROBE_SEND)
    } else {
        Ok(action as i32)
    }
}
