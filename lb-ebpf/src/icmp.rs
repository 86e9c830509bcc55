//! Path MTU: a packet that would leave longer than the egress MTU (after encapsulation) is
//! answered from XDP, as a router answers it: ICMP "fragmentation needed" (type 3 code 4) for
//! IPv4 with DF set, ICMPv6 "packet too big" for IPv6, from the VIP to the client, with the MTU
//! the client's packets must keep to (the egress MTU minus the outer header). The client lowers
//! its path MTU for the VIP and sends again (TCP at once, with a smaller MSS). An IPv4 packet
//! without DF would be fragmented by a router; XDP cannot send two packets for one, so it is
//! dropped and counted (`drop_too_big_no_df`, and `drop_too_big`). Packets over this CPU's ICMP
//! rate limit are dropped as `drop_too_big` only.
//!
//! The reply reuses the packet's buffer: the tail is cut to the part quoted, the head grows by
//! the new IP and ICMP headers, the Ethernet addresses are swapped, and it leaves by XDP_TX.
//! Only untagged frames are answered (a VLAN-tagged one is dropped as `drop_too_big`).

use aya_ebpf::{
    bindings::xdp_action,
    helpers::{bpf_csum_diff, bpf_xdp_adjust_head, bpf_xdp_adjust_tail},
    programs::XdpContext,
};
use lb_common::maps::{stat, FAMILY_V4};
use lb_ebpf::consts::{ETH_LEN, ETH_P_IP, ETH_P_IPV6, IPV4_HDR_LEN, IPV6_HDR_LEN};
use lb_ebpf::packet::{ipv4_checksum, put_word, word};

use crate::maps::ICMP_RATE;
use crate::nexthop::TOO_BIG;
use crate::parse::Packet;
use crate::stats::{drop, Counters};

/// ICMP errors each CPU sends per second at most, with bursts of up to `BURST` (the kernel's
/// own defaults, `net.ipv4.icmp_msgs_per_sec` and `icmp_msgs_burst`, are 1000 and 50).
pub const RATE_PER_SEC: u64 = 1000;
const BURST: u64 = 50;
const NS_PER_TOKEN: u64 = 1_000_000_000 / RATE_PER_SEC;

/// Bytes of the client's datagram quoted in the IPv4 error: the longest IPv4 header (60) and
/// the 8 bytes of transport header the client matches the error to its socket with.
const QUOTE4: usize = 68;
/// Bytes quoted in the ICMPv6 error: as many as fit in the IPv6 minimum MTU (RFC 4443 2.4(c)).
const QUOTE6: usize = 1280 - IPV6_HDR_LEN - ICMP_HDR_LEN;
const ICMP_HDR_LEN: usize = 8;
/// `bpf_csum_diff` sums at most 512 bytes per call.
const CSUM_CHUNK: usize = 512;
const IPPROTO_ICMP: u32 = 1;
const IPPROTO_ICMPV6: u32 = 58;
/// IPv4 DF in `Packet::id_df` (the header's second word, little-endian).
const DF: u32 = 0x0040_0000;

/// A route lookup for the packet failed with `reason` (from `nexthop::route`): drop it counted
/// as that reason, or, if it was too long for the egress MTU (`TOO_BIG | mtu`), answer the
/// client with the MTU its packets must keep to, `outer_len` bytes of encapsulation less.
#[inline(always)]
pub fn route_failed(ctx: &XdpContext, pkt: &Packet, reason: u32, outer_len: u32, now: u64, counters: Counters) -> u32 {
    if reason & TOO_BIG == 0 {
        // A missing neighbour is a `drop_fib` as it always was, and counted apart as well.
        if reason == stat::DROP_NO_NEIGH {
            counters.inc(stat::DROP_NO_NEIGH);
            return drop(stat::DROP_FIB, counters);
        }
        return drop(reason, counters);
    }
    let mtu = (reason & 0xffff).saturating_sub(outer_len);
    // No DF: no ICMP is due (a router would fragment), so nothing tells the client; counted
    // apart, so that an operator sees this case (and as `drop_too_big`, as it always was).
    if pkt.family == FAMILY_V4 && pkt.id_df & DF == 0 {
        counters.inc(stat::DROP_TOO_BIG_NO_DF);
        return drop(stat::DROP_TOO_BIG, counters);
    }
    if pkt.l3_off != ETH_LEN || !take_token(now) {
        return drop(stat::DROP_TOO_BIG, counters);
    }
    let built = if pkt.family == FAMILY_V4 { too_big_v4(ctx, mtu) } else { too_big_v6(ctx, mtu) };
    if built != 0 {
        return drop(stat::DROP_TOO_BIG, counters);
    }
    counters.inc(stat::ICMP_TOO_BIG_SENT);
    xdp_action::XDP_TX
}

/// Takes one token of this CPU's bucket (`ICMP_RATE`: tokens, time of the last refill).
#[inline(always)]
fn take_token(now: u64) -> bool {
    let b = match ICMP_RATE.get_ptr_mut(0) {
        Some(b) => unsafe { &mut *b },
        None => return false,
    };
    let earned = now.saturating_sub(b[1]) / NS_PER_TOKEN;
    if earned > 0 {
        b[0] = if b[0] + earned > BURST { BURST } else { b[0] + earned };
        b[1] = now;
    }
    if b[0] == 0 {
        return false;
    }
    b[0] -= 1;
    true
}

/// The Ethernet addresses of words 0..3 of a frame, swapped (little-endian words: destination
/// bytes 0..6, source 6..12), so that the reply goes back to the sender from the address the
/// frame was sent to.
#[inline(always)]
fn swapped_macs(m: [u32; 3]) -> [u32; 3] {
    [(m[1] >> 16) | (m[2] << 16), (m[2] >> 16) | (m[0] << 16), (m[0] >> 16) | (m[1] << 16)]
}

/// Folds a sum of little-endian 32-bit words to the 16-bit one's-complement checksum, to be
/// stored little-endian like the words (RFC 1071: the sum does not depend on byte order).
#[inline(always)]
fn fold(sum: u64) -> u32 {
    let mut s = (sum & 0xffff_ffff) + (sum >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    !(s as u32) & 0xffff
}

/// Turns the frame into the reply's: cuts it to Ethernet + `quote` bytes of the datagram, grows
/// the head by `grow` bytes and writes the Ethernet header (addresses swapped, `ethertype`).
/// Returns the new frame start, bounds-checked for `ETH_LEN + grow + quote` bytes.
#[inline(always)]
fn reshape(ctx: &XdpContext, quote: usize, grow: usize, ethertype: u16) -> Option<*mut u8> {
    if ctx.data() + ETH_LEN > ctx.data_end() {
        return None;
    }
    let f = ctx.data() as *const u32;
    let macs = swapped_macs([word(f, 0), word(f, 1), word(f, 2)]);
    let len = (ctx.data_end() - ctx.data()) as i32;
    if unsafe { bpf_xdp_adjust_tail(ctx.ctx, (ETH_LEN + quote) as i32 - len) } != 0 {
        return None;
    }
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -(grow as i32)) } != 0 {
        return None;
    }
    if ctx.data() + ETH_LEN + grow + quote > ctx.data_end() {
        return None;
    }
    let p = ctx.data() as *mut u8;
    put_word(p, 0, macs[0]);
    put_word(p, 4, macs[1]);
    put_word(p, 8, macs[2]);
    unsafe { core::ptr::write(p.add(12) as *mut u16, ethertype.to_be()) };
    Some(p)
}

/// ICMP "fragmentation needed" with next-hop MTU `mtu` for the untagged IPv4 frame in `ctx`,
/// built in its place; 0 on success. Not inlined: the balancer's body stays as it was.
#[inline(never)]
fn too_big_v4(ctx: &XdpContext, mtu: u32) -> u32 {
    if ctx.data() + ETH_LEN + QUOTE4 > ctx.data_end() {
        return 1;
    }
    let ip = (ctx.data() + ETH_LEN) as *const u32;
    let (client, vip) = (word(ip, 3), word(ip, 4));
    const GROW: usize = IPV4_HDR_LEN + ICMP_HDR_LEN;
    let p = match reshape(ctx, QUOTE4, GROW, ETH_P_IP) {
        Some(p) => p,
        None => return 1,
    };
    // Version/IHL, TOS 0xc0 (internetwork control, as the kernel's ICMP), total length |
    // identification 0, no flags | TTL 64, ICMP, checksum | the VIP | the client.
    let tot_len = (GROW + QUOTE4) as u16;
    let mut h = [0xc045 | (tot_len.to_be() as u32) << 16, 0, 64 | IPPROTO_ICMP << 8, vip, client];
    h[2] |= ipv4_checksum(&h) << 16;
    for (i, w) in h.iter().enumerate() {
        put_word(p, ETH_LEN + 4 * i, *w);
    }
    // Type 3 "destination unreachable", code 4 "fragmentation needed", checksum | unused,
    // next-hop MTU (RFC 1191).
    let icmp = ETH_LEN + IPV4_HDR_LEN;
    put_word(p, icmp, 3 | 4 << 8);
    put_word(p, icmp + 4, ((mtu as u16).to_be() as u32) << 16);
    let sum =
        unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, p.add(icmp) as *mut u32, (ICMP_HDR_LEN + QUOTE4) as u32, 0) };
    unsafe { core::ptr::write(p.add(icmp + 2) as *mut u16, fold(sum as u32 as u64) as u16) };
    0
}

/// ICMPv6 "packet too big" with MTU `mtu` for the untagged IPv6 frame in `ctx`, built in its
/// place; 0 on success.
#[inline(never)]
fn too_big_v6(ctx: &XdpContext, mtu: u32) -> u32 {
    if ctx.data() + ETH_LEN + QUOTE6 > ctx.data_end() {
        return 1;
    }
    let ip = (ctx.data() + ETH_LEN) as *const u32;
    let client = [word(ip, 2), word(ip, 3), word(ip, 4), word(ip, 5)];
    let vip = [word(ip, 6), word(ip, 7), word(ip, 8), word(ip, 9)];
    const GROW: usize = IPV6_HDR_LEN + ICMP_HDR_LEN;
    const ICMP_LEN: u32 = (ICMP_HDR_LEN + QUOTE6) as u32;
    let p = match reshape(ctx, QUOTE6, GROW, ETH_P_IPV6) {
        Some(p) => p,
        None => return 1,
    };
    let h = [
        (6u32 << 28).to_be(),
        ((ICMP_LEN << 16) | (IPPROTO_ICMPV6 << 8) | 64).to_be(),
        vip[0],
        vip[1],
        vip[2],
        vip[3],
        client[0],
        client[1],
        client[2],
        client[3],
    ];
    for (i, w) in h.iter().enumerate() {
        put_word(p, ETH_LEN + 4 * i, *w);
    }
    // Type 2 "packet too big", code 0, checksum | MTU.
    let icmp = ETH_LEN + IPV6_HDR_LEN;
    put_word(p, icmp, 2);
    put_word(p, icmp + 4, mtu.to_be());
    // Pseudo-header (addresses, upper-layer length, next header), then the message.
    let mut sum: u64 = ICMP_LEN.to_be() as u64 + IPPROTO_ICMPV6.to_be() as u64;
    for w in &h[2..] {
        sum += *w as u64;
    }
    let mut partial = 0u32;
    let mut off = 0;
    while off < ICMP_LEN as usize {
        let n = if ICMP_LEN as usize - off > CSUM_CHUNK { CSUM_CHUNK } else { ICMP_LEN as usize - off };
        partial =
            unsafe { bpf_csum_diff(core::ptr::null_mut(), 0, p.add(icmp + off) as *mut u32, n as u32, partial) } as u32;
        off += n;
    }
    sum += partial as u64;
    unsafe { core::ptr::write(p.add(icmp + 2) as *mut u16, fold(sum) as u16) };
    0
}
