//! Hostile frames for the fuzz test of `lb` (tests/fuzz_packets.rs): a seeded generator of
//! well-formed, malformed and mutated frames (truncations at every length, bad IHL, IPv4
//! options, fragments in every order and overlapping, IPv6 extension header chains, VLAN tags,
//! bad checksums, every TCP flag combination, ICMP errors with truncated quotes, unconfigured
//! ports and protocols), and the check that what the program forwards is well formed.

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_user::rng::{Rng, SplitMix64};

use crate::packet::*;

/// Seed of the CI run unless `LB_FUZZ_SEED` says otherwise (decimal or 0x-hex).
pub const DEFAULT_SEED: u64 = 0x1b_f0_22_5e_ed;

/// `LB_FUZZ_SEED`, else `default`.
pub fn seed_from_env(default: u64) -> u64 {
    match std::env::var("LB_FUZZ_SEED") {
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|e| panic!("LB_FUZZ_SEED={s}: {e}"))
        }
        Err(_) => default,
    }
}

/// `LB_FUZZ_FRAMES`, else `default`.
pub fn frames_from_env(default: u64) -> u64 {
    std::env::var("LB_FUZZ_FRAMES")
        .map(|s| s.trim().parse().unwrap_or_else(|e| panic!("LB_FUZZ_FRAMES={s}: {e}")))
        .unwrap_or(default)
}

const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMP: u8 = 1;
const PROTO_ICMPV6: u8 = 58;

/// The addresses and MACs the generator aims at (the test configures services on them).
#[derive(Clone, Debug)]
pub struct Targets {
    /// The MAC of the ingress device (frames to any other are not balanced).
    pub local_mac: [u8; 6],
    pub client_mac: [u8; 6],
    pub client4: Ipv4Addr,
    pub client6: Ipv6Addr,
    pub vips4: Vec<Ipv4Addr>,
    pub vips6: Vec<Ipv6Addr>,
    /// Ports the services listen on (the generator also picks others).
    pub ports: Vec<u16>,
}

/// One generated frame; fragments of one datagram share a `group`.
#[derive(Clone, Debug)]
pub struct Frame {
    pub bytes: Vec<u8>,
    pub group: Option<u64>,
    /// What was generated, for failure messages.
    pub what: &'static str,
}

/// The generator: a queue of frames (a truncation sweep or a datagram's fragments come out one
/// by one), refilled from the seeded generator.
pub struct Gen {
    rng: SplitMix64,
    t: Targets,
    queue: VecDeque<Frame>,
    groups: u64,
}

impl Gen {
    pub fn new(seed: u64, targets: Targets) -> Self {
        Gen { rng: SplitMix64(seed), t: targets, queue: VecDeque::new(), groups: 0 }
    }

    pub fn next_frame(&mut self) -> Frame {
        while self.queue.is_empty() {
            self.refill();
        }
        self.queue.pop_front().expect("refilled")
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len() as u64) as usize]
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.rng.next_u64() as u8).collect()
    }

    fn refill(&mut self) {
        match self.below(100) {
            // One frame truncated at every length within its headers (the first 160 bytes),
            // and at a few lengths beyond.
            0 | 1 => {
                let f = self.frame();
                let full = f.bytes.len();
                let mut lens: Vec<usize> = (14..full.min(160)).collect();
                if full > 160 {
                    lens.extend((0..8).map(|_| 160 + self.below((full - 160) as u64) as usize));
                }
                for len in lens {
                    self.queue.push_back(Frame { bytes: f.bytes[..len].to_vec(), group: None, what: "truncated" });
                }
            }
            // The fragments of one datagram, overlapping, duplicated, in any order.
            2..=11 => self.fragments(),
            // Mutated frames.
            20..=59 => {
                let mut f = self.frame();
                for _ in 0..1 + self.below(3) {
                    self.mutate(&mut f.bytes);
                }
                f.what = "mutated";
                self.queue.push_back(f);
            }
            _ => {
                let f = self.frame();
                self.queue.push_back(f);
            }
        }
    }

    fn dst4(&mut self) -> Ipv4Addr {
        match self.below(10) {
            0 => Ipv4Addr::new(198, 18, 0, 200),
            1 => Ipv4Addr::from(self.rng.next_u64() as u32),
            _ => {
                let v = self.t.vips4.clone();
                self.pick(&v)
            }
        }
    }

    fn dst6(&mut self) -> Ipv6Addr {
        match self.below(10) {
            0 => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x200),
            1 => Ipv6Addr::from(((self.rng.next_u64() as u128) << 64) | self.rng.next_u64() as u128),
            _ => {
                let v = self.t.vips6.clone();
                self.pick(&v)
            }
        }
    }

    /// A client address of the test prefix: many flows, few enough to hit tracked ones again.
    fn src4(&mut self) -> Ipv4Addr {
        let o = self.t.client4.octets();
        Ipv4Addr::new(o[0], o[1], o[2], self.below(64) as u8)
    }

    fn src6(&mut self) -> Ipv6Addr {
        let mut o = self.t.client6.octets();
        o[15] = self.below(64) as u8;
        Ipv6Addr::from(o)
    }

    fn port(&mut self) -> u16 {
        if self.chance(80) {
            let p = self.t.ports.clone();
            self.pick(&p)
        } else {
            self.rng.next_u64() as u16
        }
    }

    /// Payload: mostly short, sometimes long enough to exceed the egress MTU once encapsulated.
    fn payload(&mut self) -> Vec<u8> {
        let n = match self.below(20) {
            0 => 1400 + self.below(160) as usize,
            1 => 0,
            _ => self.below(64) as usize,
        };
        self.bytes(n)
    }

    /// A transport segment of `proto` between the addresses; ICMP errors quote a packet from
    /// the VIP (truncated anywhere).
    fn l4(&mut self, src: IpAddr, dst: IpAddr, proto: u8) -> Vec<u8> {
        let (sport, dport, payload) = (self.rng.next_u64() as u16, self.port(), self.payload());
        match (proto, src, dst) {
            (PROTO_TCP, IpAddr::V4(s), IpAddr::V4(d)) => {
                let flags = self.rng.next_u64() as u8;
                let mut t = tcp4(s, d, sport, dport, flags, &payload);
                self.tcp_options(&mut t);
                t
            }
            (PROTO_TCP, IpAddr::V6(s), IpAddr::V6(d)) => {
                let flags = self.rng.next_u64() as u8;
                let mut t = tcp6(s, d, sport, dport, flags, &payload);
                self.tcp_options(&mut t);
                t
            }
            (PROTO_UDP, IpAddr::V4(s), IpAddr::V4(d)) => udp4(s, d, sport, dport, &payload),
            (PROTO_UDP, IpAddr::V6(s), IpAddr::V6(d)) => udp6(s, d, sport, dport, &payload),
            (PROTO_ICMP, IpAddr::V4(s), IpAddr::V4(d)) => {
                let ty = self.pick(&[3u8, 11, 8, 0, 5, 12]);
                let qproto = self.pick(&[PROTO_TCP, PROTO_UDP, PROTO_ICMP]);
                let mut quoted = V4::new(d, s, qproto);
                if self.chance(10) {
                    quoted.frag = self.rng.next_u64() as u16;
                }
                let inner = quoted.build(&self.l4_plain(d.into(), s.into(), qproto));
                self.icmp(ty, &inner, None)
            }
            (PROTO_ICMPV6, IpAddr::V6(s), IpAddr::V6(d)) => {
                let ty = self.pick(&[1u8, 2, 3, 4, 128, 135]);
                let qproto = self.pick(&[PROTO_TCP, PROTO_UDP, PROTO_ICMPV6]);
                let seg = self.l4_plain(d.into(), s.into(), qproto);
                let inner = ipv6(d, s, qproto, 64, 0, &seg);
                self.icmp(ty, &inner, Some((s, d)))
            }
            _ => self.payload(),
        }
    }

    /// A quoted segment: ports first, as the balancer reads them.
    fn l4_plain(&mut self, src: IpAddr, dst: IpAddr, proto: u8) -> Vec<u8> {
        let (sport, dport) = (self.port(), self.rng.next_u64() as u16);
        match (src, dst) {
            (IpAddr::V4(s), IpAddr::V4(d)) if proto == PROTO_UDP => udp4(s, d, sport, dport, b"q"),
            (IpAddr::V4(s), IpAddr::V4(d)) => tcp4(s, d, sport, dport, TCP_ACK, b""),
            (IpAddr::V6(s), IpAddr::V6(d)) if proto == PROTO_UDP => udp6(s, d, sport, dport, b"q"),
            (IpAddr::V6(s), IpAddr::V6(d)) => tcp6(s, d, sport, dport, TCP_ACK, b""),
            _ => unreachable!("one family"),
        }
    }

    /// An ICMP(v6) message of `ty` quoting `inner`, cut anywhere; checksum valid for ICMP (v6
    /// pseudo-header given as (src, dst)), sometimes wrong.
    fn icmp(&mut self, ty: u8, inner: &[u8], v6: Option<(Ipv6Addr, Ipv6Addr)>) -> Vec<u8> {
        let cut = if self.chance(50) { inner.len() } else { self.below(inner.len() as u64 + 1) as usize };
        let mut m = vec![ty, self.below(5) as u8, 0, 0, 0, 0, 0x05, 0xdc];
        m.extend_from_slice(&inner[..cut]);
        let mut sum = Vec::new();
        if let Some((s, d)) = v6 {
            sum.extend_from_slice(&s.octets());
            sum.extend_from_slice(&d.octets());
            sum.extend_from_slice(&(m.len() as u32).to_be_bytes());
            sum.extend_from_slice(&[0, 0, 0, PROTO_ICMPV6]);
        }
        sum.extend_from_slice(&m);
        let c = checksum(&sum) ^ if self.chance(5) { 0x0101 } else { 0 };
        m[2..4].copy_from_slice(&c.to_be_bytes());
        m
    }

    /// Sometimes TCP options (data offset > 5): NOPs, MSS, or garbage.
    fn tcp_options(&mut self, t: &mut Vec<u8>) {
        if !self.chance(10) {
            return;
        }
        let words = 1 + self.below(10) as usize;
        let opts = if self.chance(50) { vec![1u8; 4 * words] } else { self.bytes(4 * words) };
        t.splice(20..20, opts);
        t[12] = ((5 + words) as u8) << 4;
    }

    fn v4_datagram(&mut self) -> (Vec<u8>, &'static str) {
        let (src, dst) = (self.src4(), self.dst4());
        let proto = match self.below(10) {
            0..=3 => PROTO_TCP,
            4..=6 => PROTO_UDP,
            7 | 8 => PROTO_ICMP,
            _ => self.pick(&[0u8, 4, 41, 47, 50, 132, 255]),
        };
        let mut ip = V4::new(src, dst, proto);
        ip.tos = self.rng.next_u64() as u8;
        ip.id = self.rng.next_u64() as u16;
        ip.frag = match self.below(10) {
            0 => 0,
            1 => self.rng.next_u64() as u16,
            2 => 0x2000,
            _ => 0x4000,
        };
        let mut what = "ipv4";
        if self.chance(15) {
            what = "ipv4 options";
            let words = 1 + self.below(10) as usize;
            ip.options = match self.below(3) {
                0 => vec![1u8; 4 * words],
                1 => {
                    // Record route with a length that may lie.
                    let mut o = vec![7u8, self.below(48) as u8, 4];
                    o.resize(4 * words, 0);
                    o
                }
                _ => self.bytes(4 * words),
            };
        }
        let seg = self.l4(src.into(), dst.into(), proto);
        (ip.build(&seg), what)
    }

    fn v6_datagram(&mut self) -> (Vec<u8>, &'static str) {
        let (src, dst) = (self.src6(), self.dst6());
        let proto = match self.below(10) {
            0..=3 => PROTO_TCP,
            4..=6 => PROTO_UDP,
            7 | 8 => PROTO_ICMPV6,
            _ => self.pick(&[0u8, 4, 41, 47, 59, 132, 255]),
        };
        let mut body = self.l4(src.into(), dst.into(), proto);
        let mut next = proto;
        let mut what = "ipv6";
        if self.chance(30) {
            what = "ipv6 extension headers";
            // Up to 9 headers, innermost first: known, fragment, or unknown types.
            for _ in 0..self.below(10) {
                let ty = self.pick(&[0u8, 43, 60, 60, 44, 135, 139, 140, 253]);
                body = if ty == 44 {
                    let offset = if self.chance(70) { 0 } else { self.below(0x2000) as u16 };
                    frag_header(next, offset, self.chance(30), self.rng.next_u64() as u32, &body)
                } else {
                    ext_header(next, 1 + self.below(3) as u8, &body)
                };
                next = ty;
            }
        }
        (ipv6(src, dst, next, self.rng.next_u64() as u8, self.rng.next_u64() as u8, &body), what)
    }

    /// A frame: Ethernet (to us mostly), zero, one or two VLAN tags, an IPv4 or IPv6 datagram
    /// (or something else), sometimes with padding after it.
    fn frame(&mut self) -> Frame {
        let (ip, ethertype, what) = match self.below(20) {
            0 => {
                let n = self.below(80) as usize;
                (self.bytes(n), self.pick(&[0x0806u16, 0x88cc, 0x8847, 0]), "other ethertype")
            }
            1..=10 => {
                let (d, w) = self.v4_datagram();
                (d, ETH_P_IP, w)
            }
            _ => {
                let (d, w) = self.v6_datagram();
                (d, ETH_P_IPV6, w)
            }
        };
        // The wrong ethertype for the datagram now and then.
        let ethertype = if self.chance(2) { ethertype ^ (ETH_P_IP ^ ETH_P_IPV6) } else { ethertype };
        let dmac = match self.below(20) {
            0 => [0xff; 6],
            1 => [0x33, 0x33, 0, 0, 0, 1],
            2 => [0x02, 0xaa, 0, 0, 0, 9],
            _ => self.t.local_mac,
        };
        let mut payload = ip;
        if self.chance(5) {
            let pad = self.below(40) as usize;
            payload.extend(self.bytes(pad));
        }
        let bytes = match self.below(10) {
            0 | 1 => ethernet_vlan(dmac, self.t.client_mac, self.below(4096) as u16, ethertype, &payload),
            2 => {
                let outer = self.pick(&[ETH_P_8021Q, ETH_P_8021AD]);
                let mut inner = Vec::with_capacity(4 + payload.len());
                inner.extend_from_slice(&(self.below(4096) as u16).to_be_bytes());
                inner.extend_from_slice(&ethertype.to_be_bytes());
                inner.extend_from_slice(&payload);
                let mut f = ethernet_vlan(dmac, self.t.client_mac, self.below(4096) as u16, ETH_P_8021Q, &inner);
                f[12..14].copy_from_slice(&outer.to_be_bytes());
                f
            }
            _ => ethernet(dmac, self.t.client_mac, ethertype, &payload),
        };
        Frame { bytes, group: None, what }
    }

    /// One datagram (TCP or UDP, v4 or v6) cut into fragments at 8-octet boundaries; pieces may
    /// overlap, repeat, and come in any order.
    fn fragments(&mut self) {
        self.groups += 1;
        let group = Some(self.groups);
        let v6 = self.chance(50);
        let proto = self.pick(&[PROTO_TCP, PROTO_UDP]);
        let data_len = 16 + 8 * self.below(24) as usize;
        let data = self.bytes(data_len);
        let id = self.rng.next_u64() as u32;
        let (src4, dst4, src6, dst6) = (self.src4(), self.dst4(), self.src6(), self.dst6());
        let dport = self.port();
        let seg = match (v6, proto) {
            (false, PROTO_TCP) => tcp4(src4, dst4, 40000, dport, TCP_ACK, &data),
            (false, _) => udp4(src4, dst4, 40000, dport, &data),
            (true, PROTO_TCP) => tcp6(src6, dst6, 40000, dport, TCP_ACK, &data),
            (true, _) => udp6(src6, dst6, 40000, dport, &data),
        };
        // Pieces [start, end) in 8-octet units; each starts at or before the previous end.
        let units = seg.len().div_ceil(8);
        let mut pieces = Vec::new();
        let mut start = 0;
        while start < units {
            let mut end = (start + 1 + self.below(6) as usize).min(units);
            // A piece from offset 0 without "more fragments" is a whole datagram, not a fragment.
            if start == 0 && end == units {
                end -= 1;
            }
            pieces.push((start, end));
            start = end.saturating_sub(if self.chance(30) { self.below(2) as usize + 1 } else { 0 }).max(start + 1);
        }
        if self.chance(30) {
            let dup = pieces[self.below(pieces.len() as u64) as usize];
            pieces.push(dup);
        }
        // Fisher-Yates.
        for i in (1..pieces.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            pieces.swap(i, j);
        }
        for (s, e) in pieces {
            let more = e < units;
            let chunk = &seg[8 * s..(8 * e).min(seg.len())];
            let bytes = if v6 {
                let ip = ipv6(src6, dst6, 44, 64, 0, &frag_header(proto, s as u16, more, id, chunk));
                ethernet(self.t.local_mac, self.t.client_mac, ETH_P_IPV6, &ip)
            } else {
                let mut ip = V4::new(src4, dst4, proto);
                ip.id = id as u16;
                ip.frag = (s as u16) | if more { 0x2000 } else { 0 };
                ethernet(self.t.local_mac, self.t.client_mac, ETH_P_IP, &ip.build(chunk))
            };
            self.queue.push_back(Frame { bytes, group, what: "fragment" });
        }
    }

    /// One mutation of a frame: a bit flip or a byte set in the headers, a header field set to
    /// an edge value (IHL, lengths), a checksum broken, a cut, or bytes appended.
    fn mutate(&mut self, f: &mut Vec<u8>) {
        let l3 = if f.len() >= 18 && f[12..14] == ETH_P_8021Q.to_be_bytes() { 18 } else { 14 };
        let hdr = f.len().min(l3 + 80);
        match self.below(9) {
            0 if hdr > 0 => {
                let i = self.below(hdr as u64) as usize;
                f[i] ^= 1 << self.below(8);
            }
            1 if hdr > 0 => {
                let i = self.below(hdr as u64) as usize;
                let r = self.rng.next_u64() as u8;
                f[i] = self.pick(&[0, 0xff, 0x80, 0x7f, r]);
            }
            // Version and IHL.
            2 if f.len() > l3 => f[l3] = self.rng.next_u64() as u8,
            // IPv4 total length / IPv6 payload length.
            3 if f.len() > l3 + 5 => {
                let r = self.rng.next_u64() as u16;
                let v = self.pick(&[0u16, 1, 19, 20, 39, 40, 0xffff, r]);
                let at = if f[l3] >> 4 == 6 { l3 + 4 } else { l3 + 2 };
                f[at..at + 2].copy_from_slice(&v.to_be_bytes());
            }
            // IPv4 header checksum.
            4 if f.len() > l3 + 12 => f[l3 + 10] ^= 0x5a,
            // Transport checksum (TCP, UDP or ICMP: somewhere behind the IP header).
            5 if f.len() > l3 + 60 => {
                let i = l3 + 20 + self.below(40) as usize;
                f[i] ^= 0xa5;
            }
            6 if f.len() > 14 => {
                let len = 14 + self.below((f.len() - 14) as u64) as usize;
                f.truncate(len);
            }
            7 => {
                let n = self.below(32) as usize;
                f.extend(self.bytes(n));
            }
            _ => {
                // A byte in the transport header or payload.
                if f.len() > hdr {
                    let i = hdr + self.below((f.len() - hdr) as u64) as usize;
                    f[i] = self.rng.next_u64() as u8;
                }
            }
        }
    }
}

/// How the program forwarded a frame, as the checker recognised it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Forwarded {
    /// IPIP / IP6IP6 to the backend at this address.
    Encap(IpAddr),
    /// L2 DSR to the backend with this MAC.
    Dsr([u8; 6]),
    /// ICMP "fragmentation needed" / "packet too big" back to the client.
    TooBig,
}

/// What the checker may accept for a forwarded frame.
#[derive(Clone, Debug)]
pub struct Expect {
    /// (destination MAC, source MAC) of an encapsulation sent with XDP_TX, and with
    /// XDP_REDIRECT.
    pub tx_macs: ([u8; 6], [u8; 6]),
    pub redirect_macs: ([u8; 6], [u8; 6]),
    pub encap_src4: Ipv4Addr,
    pub encap_src6: Ipv6Addr,
    /// Backend addresses of IPIP services; MACs of L2 DSR backends.
    pub backends: Vec<IpAddr>,
    pub dsr_macs: Vec<[u8; 6]>,
    /// The ingress device's MAC (source of an L2 DSR frame sent back out of it).
    pub local_mac: [u8; 6],
}

/// Offset of the IP header behind at most one 802.1Q tag, and the ethertype there.
fn l3_of(f: &[u8]) -> (usize, u16) {
    let et = u16::from_be_bytes([f[12], f[13]]);
    if et == ETH_P_8021Q && f.len() >= 18 {
        (18, u16::from_be_bytes([f[16], f[17]]))
    } else {
        (14, et)
    }
}

/// The length of the well-formed IP datagram at `ip` (and within it), or why it is not one.
fn datagram_len(ip: &[u8], v6: bool) -> Result<usize, String> {
    if v6 {
        if ip.len() < 40 || ip[0] >> 4 != 6 {
            return Err("inner is not an IPv6 header".into());
        }
        let len = 40 + u16::from_be_bytes([ip[4], ip[5]]) as usize;
        if len == 40 || len > ip.len() {
            return Err(format!("inner IPv6 payload length {} beyond the frame", len - 40));
        }
        Ok(len)
    } else {
        if ip.len() < 20 || ip[0] >> 4 != 4 {
            return Err("inner is not an IPv4 header".into());
        }
        let (ihl, len) = ((ip[0] & 0x0f) as usize * 4, u16::from_be_bytes([ip[2], ip[3]]) as usize);
        if ihl < 20 || len < ihl || len > ip.len() {
            return Err(format!("inner IPv4 IHL {ihl} / total length {len} malformed"));
        }
        Ok(len)
    }
}

/// Checks a frame the program sent (`redirect`: XDP_REDIRECT, else XDP_TX) for `input`:
/// an IPIP / IP6IP6 encapsulation of the input's datagram (outer header valid, inner bytes
/// and any padding after them unchanged), the input with only its MACs rewritten (L2 DSR), or
/// an ICMP "too big" from the input's destination to its source quoting it (XDP_TX only).
pub fn check_forwarded(e: &Expect, input: &[u8], out: &[u8], redirect: bool) -> Result<Forwarded, String> {
    if out.len() < 14 {
        return Err("output shorter than Ethernet".into());
    }
    let (l3, et) = l3_of(input);
    // L2 DSR: same length, everything from the ethertype on unchanged.
    if out.len() == input.len() && out[12..] == input[12..] {
        let smac = if redirect { e.redirect_macs.1 } else { e.local_mac };
        if out[6..12] != smac {
            return Err(format!("L2 DSR frame with source MAC {:02x?} (redirect {redirect})", &out[6..12]));
        }
        let dmac: [u8; 6] = out[..6].try_into().expect("6 bytes");
        if !e.dsr_macs.contains(&dmac) {
            return Err(format!("L2 DSR frame to {dmac:02x?}, not a backend's MAC"));
        }
        datagram_len(&input[l3..], et == ETH_P_IPV6)?;
        return Ok(Forwarded::Dsr(dmac));
    }
    let out_et = u16::from_be_bytes([out[12], out[13]]);
    let macs = if redirect { e.redirect_macs } else { e.tx_macs };
    let ip = &out[14..];
    let v6 = match out_et {
        ETH_P_IP if ip.len() >= 20 && ip[9] == 4 => false,
        ETH_P_IPV6 if ip.len() >= 40 && ip[6] == 41 => true,
        ETH_P_IP | ETH_P_IPV6 if !redirect => return check_too_big(input, out).map(|_| Forwarded::TooBig),
        _ => return Err(format!("unrecognised output (ethertype {out_et:#06x})")),
    };
    if et != if v6 { ETH_P_IPV6 } else { ETH_P_IP } {
        return Err(format!("encapsulation (IPv6 outer: {v6}) of a frame of ethertype {et:#06x}"));
    }
    if out[..6] != macs.0 || out[6..12] != macs.1 {
        return Err(format!("encapsulation with MACs {:02x?}", &out[..12]));
    }
    let inner = &input[l3..];
    let len = datagram_len(inner, v6)?;
    let (hdr_len, dst) = if v6 { outer6(e, ip, inner, len)? } else { outer4(e, ip, inner, len)? };
    if ip[hdr_len..] != *inner {
        return Err("inner datagram changed".into());
    }
    if !e.backends.contains(&dst) {
        return Err(format!("encapsulated to {dst}, not a backend"));
    }
    Ok(Forwarded::Encap(dst))
}

/// The outer IPv4 header of an IPIP packet carrying `inner` (`len` bytes): source, TTL 64,
/// TOS, identification and DF from the inner header, length and checksum. Returns its length
/// and destination.
fn outer4(e: &Expect, ip: &[u8], inner: &[u8], len: usize) -> Result<(usize, IpAddr), String> {
    let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
    let mut want = V4::new(e.encap_src4, dst, 4);
    want.id = u16::from_be_bytes([inner[4], inner[5]]);
    want.tos = inner[1];
    want.frag = u16::from_be_bytes([inner[6], inner[7]]) & 0x4000;
    let mut want = want.build(&[]);
    let mut got = ip[..20].to_vec();
    got[2..4].copy_from_slice(&[0, 20]);
    for h in [&mut got, &mut want] {
        h[10..12].copy_from_slice(&[0, 0]);
    }
    if got != want || !ipv4_checksum_ok(ip) || u16::from_be_bytes([ip[2], ip[3]]) as usize != 20 + len {
        return Err(format!("outer IPv4 header {:02x?} wrong (inner length {len})", &ip[..20]));
    }
    Ok((20, dst.into()))
}

/// The outer IPv6 header of an IP6IP6 packet carrying `inner` (`len` bytes): source, hop limit
/// 64, the inner traffic class, payload length.
fn outer6(e: &Expect, ip: &[u8], inner: &[u8], len: usize) -> Result<(usize, IpAddr), String> {
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).expect("16 bytes"));
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[24..40]).expect("16 bytes"));
    let tclass = |h: &[u8]| ((u16::from_be_bytes([h[0], h[1]]) >> 4) & 0xff) as u8;
    if ip[0] >> 4 != 6
        || tclass(ip) != tclass(inner)
        || u16::from_be_bytes([ip[4], ip[5]]) as usize != len
        || ip[7] != 64
        || src != e.encap_src6
    {
        return Err(format!("outer IPv6 header {:02x?} wrong (inner length {len})", &ip[..40]));
    }
    Ok((40, dst.into()))
}

/// An ICMP "fragmentation needed" / ICMPv6 "packet too big" for the untagged `input`: MACs
/// swapped, from its destination to its source, checksums valid, quoting its first bytes.
fn check_too_big(input: &[u8], out: &[u8]) -> Result<(), String> {
    if input[12..14] != out[12..14] || out[..6] != input[6..12] || out[6..12] != input[..6] {
        return Err(format!("ICMP reply with Ethernet header {:02x?}", &out[..14]));
    }
    let (ip, inp) = (&out[14..], &input[14..]);
    if out[12..14] == ETH_P_IP.to_be_bytes() {
        let quote = 68;
        if ip.len() != 28 + quote
            || ip[0] != 0x45
            || ip[9] != PROTO_ICMP
            || !ipv4_checksum_ok(ip)
            || u16::from_be_bytes([ip[2], ip[3]]) as usize != ip.len()
            || ip[12..16] != inp[16..20]
            || ip[16..20] != inp[12..16]
            || ip[20..22] != [3, 4]
            || checksum(&ip[20..]) != 0
            || ip[28..] != inp[..quote]
        {
            return Err(format!("ICMP fragmentation needed malformed: {:02x?}", &ip[..48.min(ip.len())]));
        }
    } else {
        let quote = 1280 - 48;
        let mut sum = Vec::new();
        sum.extend_from_slice(&ip[8..40]);
        sum.extend_from_slice(&((ip.len() - 40) as u32).to_be_bytes());
        sum.extend_from_slice(&[0, 0, 0, PROTO_ICMPV6]);
        sum.extend_from_slice(&ip[40..]);
        if ip.len() != 48 + quote
            || ip[0] >> 4 != 6
            || ip[6] != PROTO_ICMPV6
            || u16::from_be_bytes([ip[4], ip[5]]) as usize != ip.len() - 40
            || ip[8..24] != inp[24..40]
            || ip[24..40] != inp[8..24]
            || ip[40..42] != [2, 0]
            || checksum(&sum) != 0
            || ip[48..] != inp[..quote]
        {
            return Err(format!("ICMPv6 packet too big malformed: {:02x?}", &ip[..48.min(ip.len())]));
        }
    }
    Ok(())
}
