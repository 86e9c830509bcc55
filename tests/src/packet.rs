//! Packet builders (Ethernet, 802.1Q, IPv4 with options, IPv6 with extension headers, TCP,
//! UDP) and checksum checks. Everything is built byte by byte so the fixtures are explicit.

use std::net::{Ipv4Addr, Ipv6Addr};

pub const ETH_P_IP: u16 = 0x0800;
pub const ETH_P_IPV6: u16 = 0x86dd;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_ACK: u8 = 0x10;
pub const TCP_PSH: u8 = 0x08;

/// Internet checksum (RFC 1071) of `data`, folded, complemented.
pub fn checksum(data: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for c in data.chunks(2) {
        let w = if c.len() == 2 { u16::from_be_bytes([c[0], c[1]]) } else { u16::from_be_bytes([c[0], 0]) };
        sum += w as u32;
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

pub fn ethernet(dst: [u8; 6], src: [u8; 6], ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(14 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// Ethernet with one 802.1Q tag.
pub fn ethernet_vlan(dst: [u8; 6], src: [u8; 6], vid: u16, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(18 + payload.len());
    f.extend_from_slice(&dst);
    f.extend_from_slice(&src);
    f.extend_from_slice(&0x8100u16.to_be_bytes());
    f.extend_from_slice(&vid.to_be_bytes());
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// IPv4 header fields a test may vary.
#[derive(Clone, Debug)]
pub struct V4 {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub proto: u8,
    pub ttl: u8,
    pub tos: u8,
    pub id: u16,
    /// Flags and fragment offset field (DF = 0x4000, MF = 0x2000, offset in 8-octet units).
    pub frag: u16,
    /// Options, padded by the caller to a multiple of 4.
    pub options: Vec<u8>,
}

impl V4 {
    pub fn new(src: Ipv4Addr, dst: Ipv4Addr, proto: u8) -> Self {
        V4 { src, dst, proto, ttl: 64, tos: 0, id: 0x1234, frag: 0x4000, options: Vec::new() }
    }

    /// The datagram with a valid header checksum.
    pub fn build(&self, payload: &[u8]) -> Vec<u8> {
        assert!(self.options.len().is_multiple_of(4) && self.options.len() <= 40);
        let hl = 20 + self.options.len();
        let mut h = vec![0u8; hl];
        h[0] = 0x40 | (hl / 4) as u8;
        h[1] = self.tos;
        h[2..4].copy_from_slice(&((hl + payload.len()) as u16).to_be_bytes());
        h[4..6].copy_from_slice(&self.id.to_be_bytes());
        h[6..8].copy_from_slice(&self.frag.to_be_bytes());
        h[8] = self.ttl;
        h[9] = self.proto;
        h[12..16].copy_from_slice(&self.src.octets());
        h[16..20].copy_from_slice(&self.dst.octets());
        h[20..].copy_from_slice(&self.options);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        h.extend_from_slice(payload);
        h
    }
}

fn pseudo_v4(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, len: usize) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&[0, proto]);
    p.extend_from_slice(&(len as u16).to_be_bytes());
    p
}

fn pseudo_v6(src: Ipv6Addr, dst: Ipv6Addr, proto: u8, len: usize) -> Vec<u8> {
    let mut p = Vec::new();
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&(len as u32).to_be_bytes());
    p.extend_from_slice(&[0, 0, 0, proto]);
    p
}

/// A TCP segment (no options) with its checksum over `pseudo`.
fn tcp_with(pseudo: Vec<u8>, sport: u16, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&sport.to_be_bytes());
    t[2..4].copy_from_slice(&dport.to_be_bytes());
    t[4..8].copy_from_slice(&1000u32.to_be_bytes());
    if flags & TCP_ACK != 0 {
        t[8..12].copy_from_slice(&2000u32.to_be_bytes());
    }
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&64240u16.to_be_bytes());
    t.extend_from_slice(payload);
    let mut sum_input = pseudo;
    sum_input.extend_from_slice(&t);
    let c = checksum(&sum_input);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    t
}

fn udp_with(pseudo: Vec<u8>, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; 8];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&dport.to_be_bytes());
    u[4..6].copy_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    u.extend_from_slice(payload);
    let mut sum_input = pseudo;
    sum_input.extend_from_slice(&u);
    let c = match checksum(&sum_input) {
        0 => 0xffff,
        c => c,
    };
    u[6..8].copy_from_slice(&c.to_be_bytes());
    u
}

pub fn tcp4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    tcp_with(pseudo_v4(src, dst, 6, 20 + payload.len()), sport, dport, flags, payload)
}

pub fn udp4(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    udp_with(pseudo_v4(src, dst, 17, 8 + payload.len()), sport, dport, payload)
}

pub fn tcp6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, flags: u8, payload: &[u8]) -> Vec<u8> {
    tcp_with(pseudo_v6(src, dst, 6, 20 + payload.len()), sport, dport, flags, payload)
}

pub fn udp6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    udp_with(pseudo_v6(src, dst, 17, 8 + payload.len()), sport, dport, payload)
}

/// An IPv6 header (flow label 0, traffic class `tclass`) in front of `payload`, whose first
/// header is `next`.
pub fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next: u8, hop_limit: u8, tclass: u8, payload: &[u8]) -> Vec<u8> {
    let mut h = vec![0u8; 40];
    let w = (6u32 << 28) | ((tclass as u32) << 20);
    h[0..4].copy_from_slice(&w.to_be_bytes());
    h[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    h[6] = next;
    h[7] = hop_limit;
    h[8..24].copy_from_slice(&src.octets());
    h[24..40].copy_from_slice(&dst.octets());
    h.extend_from_slice(payload);
    h
}

/// A generic extension header (hop-by-hop 0, routing 43, destination options 60) of
/// `8 * units` octets carrying PadN, followed by `rest`.
pub fn ext_header(next: u8, units: u8, rest: &[u8]) -> Vec<u8> {
    let len = 8 * units as usize;
    let mut e = vec![0u8; len];
    e[0] = next;
    e[1] = units - 1;
    // PadN option filling the rest.
    e[2] = 1;
    e[3] = (len - 4) as u8;
    e.extend_from_slice(rest);
    e
}

/// A fragment header: `offset` in 8-octet units, `more` = M flag.
pub fn frag_header(next: u8, offset: u16, more: bool, id: u32, rest: &[u8]) -> Vec<u8> {
    let mut e = vec![next, 0];
    e.extend_from_slice(&((offset << 3) | more as u16).to_be_bytes());
    e.extend_from_slice(&id.to_be_bytes());
    e.extend_from_slice(rest);
    e
}

/// True if the IPv4 header at the start of `ip` has a valid checksum.
pub fn ipv4_checksum_ok(ip: &[u8]) -> bool {
    let hl = (ip[0] & 0x0f) as usize * 4;
    checksum(&ip[..hl]) == 0
}

/// The IPIP frame the balancer sends for the IPv4 datagram `inner`, built independently of
/// it: outer TTL 64, TOS, identification and DF copied from the inner header.
pub fn expected_ipip(dmac: [u8; 6], smac: [u8; 6], src: Ipv4Addr, dst: Ipv4Addr, inner: &[u8]) -> Vec<u8> {
    let mut outer = V4::new(src, dst, 4);
    outer.id = u16::from_be_bytes([inner[4], inner[5]]);
    outer.ttl = 64;
    outer.tos = inner[1];
    outer.frag = u16::from_be_bytes([inner[6], inner[7]]) & 0x4000;
    ethernet(dmac, smac, ETH_P_IP, &outer.build(inner))
}

/// An ICMP "fragmentation needed" (MTU 1500) from `client` to `vip`, quoting the TCP ACK that
/// `vip`:80 sent to `client`:`sport` (header and 8 bytes): the error follows that flow.
pub fn icmp4_frag_needed_quoting(client: Ipv4Addr, vip: Ipv4Addr, sport: u16) -> Vec<u8> {
    let quoted = V4::new(vip, client, 6).build(&tcp4(vip, client, 80, sport, TCP_ACK, b""));
    let mut icmp = vec![3, 4, 0, 0, 0, 0, 0x05, 0xdc];
    icmp.extend_from_slice(&quoted[..28]);
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    V4::new(client, vip, 1).build(&icmp)
}
