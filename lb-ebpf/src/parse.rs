//! Packet parsing: Ethernet (one 802.1Q tag), IPv4 (IHL honoured, fragments), IPv6 (hop-by-hop,
//! routing, destination-options and fragment headers skipped), TCP/UDP ports and the SYN bit,
//! and for an ICMP error to a VIP the flow it quotes (`quoted_flow`).
//! A packet whose destination is not a VIP is passed untouched; a VIP packet that is truncated
//! or malformed is dropped with the reason. The parser itself does not look up `VIPS`: the
//! caller does, only when no exact service matched (a service key implies its VIP, see
//! `select::lookup_service`) or the packet is malformed (`Verdict::DropIfVip`).

use aya_ebpf::programs::XdpContext;
use lb_common::maps::{
    local_mac_slot, stat, AddrKey, FlowTuple, SourceKey, FAMILY_V4, FAMILY_V6, PROTO_TCP, PROTO_UDP,
};
use lb_ebpf::consts::{ETH_LEN, IPV6_HDR_LEN};
use lb_ebpf::packet::{as_key, ptr_at, read, word, Verdict};

use crate::maps::{BACKEND_SOURCES, LOCAL_MACS, VIPS};

const PROTO_ICMP: u8 = 1;
const PROTO_ICMPV6: u8 = 58;

/// Extension headers skipped at most; more is treated as malformed.
const MAX_EXT_HEADERS: usize = 6;

/// The identification and DF bits of an IPv4 header's second word (read as a little-endian u32).
const ID_DF: u32 = 0x0040_ffff;

/// What the parser found out about a VIP packet.
pub struct Packet {
    pub family: u8,
    /// Offset of the IP header (14, or 18 behind a VLAN tag).
    pub l3_off: usize,
    /// Length of the IP datagram (IPv4 total length, IPv6 40 + payload length).
    pub l3_len: usize,
    /// src, dst, proto, and the ports when `ports_valid`.
    pub tuple: FlowTuple,
    /// TCP or UDP, not a fragment: the ports may be hashed.
    pub ports_valid: bool,
    /// TCP SYN without ACK.
    pub is_syn: bool,
    /// An ICMP error that took the tuple of the flow it quotes (`quoted_flow`): it follows
    /// that flow's entry or the stateless choice, and never makes an entry.
    pub quoted: bool,
    /// IPv4 TOS or IPv6 traffic class, copied to the outer header.
    pub tclass: u8,
    /// IPv4: the header's second word with only the identification and DF kept, as the outer
    /// header's second word: a DF-clear datagram that is fragmented on the way to the backend
    /// then carries the client's identification, not one constant for all (RFC 6864).
    pub id_df: u32,
}

/// The ingress device's ifindex if the frame's destination MAC is that device's own
/// (`LOCAL_MACS`); None for broadcast and multicast frames, frames flooded to us for another
/// host, and devices the daemon did not register. One inlined array lookup and two compares.
/// The caller keeps the ifindex for the route (in XDP its read is three dependent loads).
#[inline(always)]
pub fn local_ingress(ctx: &XdpContext) -> Option<u32> {
    let ifindex = ctx.ingress_ifindex() as u32;
    let (Some(local), Some(eth)) = (LOCAL_MACS.get(local_mac_slot(ifindex)), ptr_at::<[u16; 3]>(ctx, 0)) else {
        return None;
    };
    let m = local.mac.as_ptr();
    let p = eth as *const u8;
    // Words as they lie in the frame and in the map (the MAC sits at offset 4 of the value).
    let (want_lo, want_hi) = unsafe { (core::ptr::read(m as *const u32), core::ptr::read(m.add(4) as *const u16)) };
    let (lo, hi) = unsafe { (core::ptr::read(p as *const u32), core::ptr::read(p.add(4) as *const u16)) };
    if local.ifindex == ifindex && lo == want_lo && hi == want_hi {
        Some(ifindex)
    } else {
        None
    }
}

/// Whether `addr` is a VIP: packets to it are ours (malformed ones are dropped).
#[inline(always)]
pub fn is_vip(addr: [u32; 4], family: u8) -> bool {
    let key = [addr[0], addr[1], addr[2], addr[3], family as u32];
    unsafe { VIPS.get(as_key::<AddrKey, 5>(&key)).is_some() }
}

/// Whether `addr` is the address of a backend of `service` (`BACKEND_SOURCES`).
#[inline(always)]
pub fn is_backend_of(service: u32, addr: [u32; 4], family: u8) -> bool {
    let key = [addr[0], addr[1], addr[2], addr[3], service, family as u32];
    unsafe { BACKEND_SOURCES.get(as_key::<SourceKey, 6>(&key)).is_some() }
}

/// The common IPv4 packet with one bounds check and constant offsets: untagged, no IP options,
/// not a fragment, TCP or UDP with consistent lengths. None for anything else, which then goes
/// through `parse_eth` and `parse_v4` (they decide the verdict of unusual or malformed packets;
/// for what this accepts they give the same `Packet`).
#[inline(always)]
pub fn parse_v4_fast(ctx: &XdpContext) -> Option<Packet> {
    // Ethernet 14 + IPv4 20 + TCP 20. A shorter UDP frame takes the full parser.
    const MIN: usize = ETH_LEN + 20 + 20;
    let start = ctx.data();
    if start + MIN > ctx.data_end() {
        return None;
    }
    let frame = start as *const u32;
    // Bytes 12..16: ethertype, then the IP header's version/IHL and TOS.
    let w3 = word(frame, 3);
    if w3 & 0x00ff_ffff != 0x0045_0008 {
        return None;
    }
    let ip = (start + ETH_LEN) as *const u32;
    let (w0, w1, w2, src, dst) = (word(ip, 0), word(ip, 1), word(ip, 2), word(ip, 3), word(ip, 4));
    let tot_len = u16::from_be((w0 >> 16) as u16) as usize;
    let proto = (w2 >> 8) as u8;
    // Fragment offset or more-fragments set: the full parser (3-tuple hashing).
    if u16::from_be((w1 >> 16) as u16) & 0x3fff != 0 || start + ETH_LEN + tot_len > ctx.data_end() {
        return None;
    }
    let (ports, is_syn) = fast_l4((start + ETH_LEN + 20) as *const u32, proto, tot_len.saturating_sub(20))?;
    Some(Packet {
        family: FAMILY_V4,
        l3_off: ETH_LEN,
        l3_len: tot_len,
        tuple: fast_tuple([src, 0, 0, 0], [dst, 0, 0, 0], ports, proto),
        ports_valid: true,
        is_syn,
        quoted: false,
        tclass: (w0 >> 8) as u8,
        id_df: w1 & ID_DF,
    })
}

/// The common IPv6 packet with one bounds check and constant offsets: untagged, no extension
/// headers, TCP or UDP with consistent lengths. None for anything else, which then goes through
/// `parse_eth` and `parse_v6` (they decide the verdict of unusual or malformed packets; for what
/// this accepts they give the same `Packet`).
#[inline(always)]
pub fn parse_v6_fast(ctx: &XdpContext) -> Option<Packet> {
    // Ethernet 14 + IPv6 40 + TCP 20. A shorter UDP frame takes the full parser.
    const MIN: usize = ETH_LEN + IPV6_HDR_LEN + 20;
    let start = ctx.data();
    if start + MIN > ctx.data_end() {
        return None;
    }
    let frame = start as *const u32;
    // Bytes 12..16: ethertype 0x86dd, then the IP header's version nibble.
    if word(frame, 3) & 0x00f0_ffff != 0x0060_dd86 {
        return None;
    }
    let ip = (start + ETH_LEN) as *const u32;
    let (w0, w1) = (word(ip, 0), word(ip, 1));
    let payload_len = u16::from_be(w1 as u16) as usize;
    let proto = (w1 >> 16) as u8;
    // Payload length 0 is a jumbogram: the full parser calls it malformed.
    if payload_len == 0 || start + ETH_LEN + IPV6_HDR_LEN + payload_len > ctx.data_end() {
        return None;
    }
    let (ports, is_syn) = fast_l4((start + ETH_LEN + IPV6_HDR_LEN) as *const u32, proto, payload_len)?;
    Some(Packet {
        family: FAMILY_V6,
        l3_off: ETH_LEN,
        l3_len: IPV6_HDR_LEN + payload_len,
        tuple: fast_tuple(
            [word(ip, 2), word(ip, 3), word(ip, 4), word(ip, 5)],
            [word(ip, 6), word(ip, 7), word(ip, 8), word(ip, 9)],
            ports,
            proto,
        ),
        ports_valid: true,
        is_syn,
        quoted: false,
        // Version (4 bits), traffic class (8), flow label (20), big-endian.
        tclass: (u32::from_be(w0) >> 20) as u8,
        id_df: 0,
    })
}

/// The ports word and SYN bit of the fast parsers' TCP or UDP header at `l4`, whose first 16
/// bytes their bounds check covered, in `l4_len` bytes of datagram; None for another protocol
/// or a length the full parser (`parse_l4`) would refuse.
#[inline(always)]
fn fast_l4(l4: *const u32, proto: u8, l4_len: usize) -> Option<(u32, bool)> {
    let ports = word(l4, 0);
    if proto == PROTO_TCP {
        let (data_off, is_syn) = tcp_offset_and_syn(word(l4, 3));
        if data_off < 20 || data_off > l4_len {
            return None;
        }
        Some((ports, is_syn))
    } else if proto == PROTO_UDP && l4_len >= 8 {
        Some((ports, false))
    } else {
        None
    }
}

/// A TCP header's data offset in bytes and whether it is a SYN without ACK, from its fourth
/// word as loaded (little-endian: the data offset in byte 12's high nibble, the flags in byte 13).
#[inline(always)]
fn tcp_offset_and_syn(w3: u32) -> (usize, bool) {
    ((((w3 as u8) >> 4) as usize) * 4, (w3 >> 8) as u8 & 0x12 == 0x02)
}

/// The fast parsers' tuple: addresses, the L4 header's first word (source port in the low half,
/// destination port in the high half, network order each) and protocol.
#[inline(always)]
fn fast_tuple(src: [u32; 4], dst: [u32; 4], ports: u32, proto: u8) -> FlowTuple {
    FlowTuple { src, dst, sport: ports as u16, dport: (ports >> 16) as u16, proto, _pad: [0; 3] }
}

/// An IPv4 packet whose IP header starts at `l3_off` (the caller dispatches on the ethertype,
/// so that each family's path is compiled on its own).
#[inline(always)]
pub fn parse_v4(ctx: &XdpContext, l3_off: usize) -> Result<Packet, Verdict> {
    let hdr = ptr_at::<[u32; 5]>(ctx, l3_off).ok_or(Verdict::Drop(stat::DROP_TRUNCATED_IP))? as *const u32;
    // Little-endian words: byte i of the header is bits 8*(i%4).. of word i/4.
    let (w0, w1, w2, src, dst) = (word(hdr, 0), word(hdr, 1), word(hdr, 2), word(hdr, 3), word(hdr, 4));
    // From here on a malformed packet is dropped if it is addressed to a VIP, else passed;
    // the VIP check is left to the caller (usually a service hit answers it).
    let vip_err = |reason| Verdict::DropIfVip(reason, [dst, 0, 0, 0], FAMILY_V4);
    let ver_ihl = w0 as u8;
    let ihl = ((ver_ihl & 0x0f) as usize) * 4;
    let tot_len = u16::from_be((w0 >> 16) as u16) as usize;
    if ver_ihl >> 4 != 4 || ihl < 20 || tot_len < ihl {
        return Err(vip_err(stat::DROP_BAD_IP_HEADER));
    }
    if ctx.data() + l3_off + tot_len > ctx.data_end() {
        return Err(vip_err(stat::DROP_TRUNCATED_IP));
    }
    let frag = u16::from_be((w1 >> 16) as u16);
    // More-fragments flag or a non-zero offset: any piece of a fragmented datagram.
    let is_fragment = frag & 0x3fff != 0;
    let proto = (w2 >> 8) as u8;
    let mut pkt = Packet {
        family: FAMILY_V4,
        l3_off,
        l3_len: tot_len,
        tuple: FlowTuple { src: [src, 0, 0, 0], dst: [dst, 0, 0, 0], sport: 0, dport: 0, proto, _pad: [0; 3] },
        ports_valid: false,
        is_syn: false,
        quoted: false,
        tclass: (w0 >> 8) as u8,
        id_df: w1 & ID_DF,
    };
    if !is_fragment {
        parse_l4(ctx, &mut pkt, l3_off + ihl, l3_off + tot_len).map_err(vip_err)?;
    }
    Ok(pkt)
}

/// An IPv6 packet whose IP header starts at `l3_off`.
#[inline(always)]
pub fn parse_v6(ctx: &XdpContext, l3_off: usize) -> Result<Packet, Verdict> {
    let p = ptr_at::<[u32; 10]>(ctx, l3_off).ok_or(Verdict::Drop(stat::DROP_TRUNCATED_IP))? as *const u32;
    let dst = [word(p, 6), word(p, 7), word(p, 8), word(p, 9)];
    let vip_err = |reason| Verdict::DropIfVip(reason, dst, FAMILY_V6);
    let (w0, w1) = (word(p, 0), word(p, 1));
    let first = w0.to_ne_bytes();
    let second = w1.to_ne_bytes();
    let payload_len = u16::from_be_bytes([second[0], second[1]]) as usize;
    // Payload length 0 is a jumbogram (hop-by-hop option): not supported, malformed for us.
    if first[0] >> 4 != 6 || payload_len == 0 {
        return Err(vip_err(stat::DROP_BAD_IP_HEADER));
    }
    let l3_len = IPV6_HDR_LEN + payload_len;
    let l3_end = l3_off + l3_len;
    if ctx.data() + l3_end > ctx.data_end() {
        return Err(vip_err(stat::DROP_TRUNCATED_IP));
    }
    let mut next = second[2];
    let mut off = l3_off + IPV6_HDR_LEN;
    let mut is_fragment = false;
    for _ in 0..MAX_EXT_HEADERS {
        match next {
            // Hop-by-hop, routing, destination options: length in 8-octet units, minus one.
            0 | 43 | 60 => {
                if off + 2 > l3_end {
                    return Err(vip_err(stat::DROP_TRUNCATED_IP));
                }
                let ext: [u8; 2] = read(ctx, off).ok_or(vip_err(stat::DROP_TRUNCATED_IP))?;
                next = ext[0];
                off += (ext[1] as usize + 1) * 8;
            }
            // Fragment header: 8 octets.
            44 => {
                if off + 8 > l3_end {
                    return Err(vip_err(stat::DROP_TRUNCATED_IP));
                }
                let ext: [u8; 4] = read(ctx, off).ok_or(vip_err(stat::DROP_TRUNCATED_IP))?;
                next = ext[0];
                off += 8;
                // Offset or M flag set (an atomic fragment, both clear, is a whole datagram):
                // the protocol of every piece is this header's next header. What follows is
                // fragment data, headers only in the first piece, so no piece reads further
                // and all pieces of a datagram agree (spec §1.3: one backend for all of them).
                if u16::from_be_bytes([ext[2], ext[3]]) & 0xfff9 != 0 {
                    is_fragment = true;
                    break;
                }
            }
            _ => break,
        }
    }
    if !is_fragment && matches!(next, 0 | 43 | 44 | 60) {
        return Err(vip_err(stat::DROP_BAD_IP_HEADER));
    }
    if off > l3_end {
        return Err(vip_err(stat::DROP_TRUNCATED_IP));
    }
    let mut pkt = Packet {
        family: FAMILY_V6,
        l3_off,
        l3_len,
        tuple: FlowTuple {
            src: [word(p, 2), word(p, 3), word(p, 4), word(p, 5)],
            dst,
            sport: 0,
            dport: 0,
            proto: next,
            _pad: [0; 3],
        },
        ports_valid: false,
        is_syn: false,
        quoted: false,
        // Version (4 bits), traffic class (8), flow label (20), big-endian.
        tclass: (u32::from_be(w0) >> 20) as u8,
        id_df: 0,
    };
    if !is_fragment {
        parse_l4(ctx, &mut pkt, off, l3_end).map_err(vip_err)?;
    }
    Ok(pkt)
}

/// Ports and SYN of an unfragmented TCP/UDP packet whose L4 header starts at `l4_off` and whose
/// datagram ends at `l3_end`. Other protocols carry no ports.
#[inline(always)]
fn parse_l4(ctx: &XdpContext, pkt: &mut Packet, l4_off: usize, l3_end: usize) -> Result<(), u32> {
    let proto = pkt.tuple.proto;
    if proto == PROTO_TCP {
        if l4_off + 20 > l3_end {
            return Err(stat::DROP_TRUNCATED_L4);
        }
        // 16 bytes are there: the 20 just checked lie within the datagram, which is in the frame.
        let tcp = ptr_at::<[u32; 4]>(ctx, l4_off).ok_or(stat::DROP_TRUNCATED_L4)? as *const u32;
        let (ports, w3) = (word(tcp, 0), word(tcp, 3));
        let (data_off, is_syn) = tcp_offset_and_syn(w3);
        if data_off < 20 || l4_off + data_off > l3_end {
            return Err(stat::DROP_TRUNCATED_L4);
        }
        pkt.tuple.sport = ports as u16;
        pkt.tuple.dport = (ports >> 16) as u16;
        pkt.is_syn = is_syn;
        pkt.ports_valid = true;
    } else if proto == PROTO_UDP {
        if l4_off + 8 > l3_end {
            return Err(stat::DROP_TRUNCATED_L4);
        }
        let udp = ptr_at::<u32>(ctx, l4_off).ok_or(stat::DROP_TRUNCATED_L4)?;
        let ports = word(udp, 0);
        pkt.tuple.sport = ports as u16;
        pkt.tuple.dport = (ports >> 16) as u16;
        pkt.ports_valid = true;
    } else if proto == PROTO_ICMP || proto == PROTO_ICMPV6 {
        quoted_flow(ctx, pkt, l4_off, l3_end);
    }
    Ok(())
}

/// An ICMP error addressed to a VIP (IPv4 destination unreachable, fragmentation needed
/// included, or time exceeded; ICMPv6 destination unreachable, packet too big or time exceeded)
/// is about a packet a backend sent from the VIP: it belongs to that flow's backend (path MTU
/// discovery of the backends' replies needs it). When the quoted header is such a packet (source
/// the VIP, TCP or UDP, not a later fragment, its ports quoted), the packet takes the quoted
/// flow's tuple turned around (client to VIP), so it is looked up and hashed exactly as the
/// flow's own packets and follows them. Anything else stays a plain ICMP packet to the VIP.
#[inline(always)]
fn quoted_flow(ctx: &XdpContext, pkt: &mut Packet, l4_off: usize, l3_end: usize) {
    let v4 = pkt.family == FAMILY_V4;
    let icmp_type = match read::<u8>(ctx, l4_off) {
        Some(t) => t,
        None => return,
    };
    let error = if v4 {
        pkt.tuple.proto == PROTO_ICMP && (icmp_type == 3 || icmp_type == 11)
    } else {
        pkt.tuple.proto == PROTO_ICMPV6 && (1..=3).contains(&icmp_type)
    };
    if !error {
        return;
    }
    let q = l4_off + 8;
    let hdr_len = if v4 { 20 } else { IPV6_HDR_LEN };
    if q + hdr_len + 4 > l3_end {
        return;
    }
    let (client, proto, ports_off) = if v4 {
        let h = match ptr_at::<[u32; 5]>(ctx, q) {
            Some(h) => h as *const u32,
            None => return,
        };
        let (w0, w1, w2, src, dst) = (word(h, 0), word(h, 1), word(h, 2), word(h, 3), word(h, 4));
        let ihl = ((w0 as u8 & 0x0f) as usize) * 4;
        // A later fragment quotes no ports.
        if ihl < 20 || u16::from_be((w1 >> 16) as u16) & 0x1fff != 0 || src != pkt.tuple.dst[0] {
            return;
        }
        ([dst, 0, 0, 0], (w2 >> 8) as u8, q + ihl)
    } else {
        let h = match ptr_at::<[u32; 10]>(ctx, q) {
            Some(h) => h as *const u32,
            None => return,
        };
        let src = [word(h, 2), word(h, 3), word(h, 4), word(h, 5)];
        if src != pkt.tuple.dst {
            return;
        }
        ([word(h, 6), word(h, 7), word(h, 8), word(h, 9)], (word(h, 1) >> 16) as u8, q + IPV6_HDR_LEN)
    };
    if !(proto == PROTO_TCP || proto == PROTO_UDP) || ports_off + 4 > l3_end {
        return;
    }
    let ports = match ptr_at::<u32>(ctx, ports_off) {
        Some(p) => word(p, 0),
        None => return,
    };
    // Quoted: VIP port, client port. The flow's own packets: client port, VIP port.
    pkt.tuple.src = client;
    pkt.tuple.sport = (ports >> 16) as u16;
    pkt.tuple.dport = ports as u16;
    pkt.tuple.proto = proto;
    pkt.ports_valid = true;
    pkt.quoted = true;
}
