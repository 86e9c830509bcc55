//! Packet tracing (`lb trace`): the filter userspace writes into `TRACE_FILTER` and the event the
//! traced program sends into `TRACE_EVENTS` for each matching packet. The traced program
//! (`lb_traced`) is the balancer compiled with tracing; the daemon attaches it in place of `lb`
//! only while a trace runs, so the balancer's own program carries no tracing code at all.

use crate::maps::{stat, FlowTuple, FAMILY_V4, FAMILY_V6};

/// Value of `TRACE_FILTER[0]`. Zero fields match everything.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceFilter {
    /// Client (source) prefix, address words as the maps hold them (IPv4 in the first word).
    pub client: [u32; 4],
    /// Its length in bits; with `client_family` 0 any client matches.
    pub client_len: u32,
    /// The VIP (destination) address.
    pub vip: [u32; 4],
    /// Destination port, network byte order; 0 = any.
    pub port: u16,
    /// `FAMILY_V4`, `FAMILY_V6`, or 0 = any client.
    pub client_family: u8,
    /// `FAMILY_V4`, `FAMILY_V6`, or 0 = any VIP.
    pub vip_family: u8,
    /// IP protocol; 0 = any.
    pub proto: u8,
    pub _pad: [u8; 3],
    /// Events per second and CPU at most (a token bucket per CPU, `TRACE_RATE`).
    pub rate_per_sec: u32,
}

impl TraceFilter {
    /// Whether the filter constrains the packet's addresses, port or protocol: a packet the
    /// parser could not read into a tuple matches only a filter that does not.
    #[inline(always)]
    pub fn constrains(&self) -> bool {
        self.client_family != 0 || self.vip_family != 0 || self.port != 0 || self.proto != 0
    }

    /// Whether a packet of `family` with the tuple `t` (as parsed, ports in network order)
    /// matches.
    #[inline(always)]
    pub fn matches(&self, family: u8, t: &FlowTuple) -> bool {
        if self.proto != 0 && t.proto != self.proto {
            return false;
        }
        if self.port != 0 && t.dport != self.port {
            return false;
        }
        if self.vip_family != 0 && (self.vip_family != family || !prefix_match(&t.dst, &self.vip, family_bits(family)))
        {
            return false;
        }
        if self.client_family != 0
            && (self.client_family != family || !prefix_match(&t.src, &self.client, self.client_len))
        {
            return false;
        }
        true
    }
}

#[inline(always)]
fn family_bits(family: u8) -> u32 {
    if family == FAMILY_V6 {
        128
    } else {
        32
    }
}

/// Whether the first `len` bits of `a` and `p` (address words in network byte order) agree.
#[inline(always)]
fn prefix_match(a: &[u32; 4], p: &[u32; 4], len: u32) -> bool {
    let mut i = 0;
    while i < 4 {
        let start = i as u32 * 32;
        if len > start {
            let bits = if len - start >= 32 { 32 } else { len - start };
            // Words hold network-order bytes: compare in host order, high bits first.
            let mask = if bits == 32 { u32::MAX } else { !(u32::MAX >> bits) };
            if (u32::from_be(a[i]) ^ u32::from_be(p[i])) & mask != 0 {
                return false;
            }
        }
        i += 1;
    }
    true
}

/// `TraceEvent::flags`: the parser read the packet's tuple.
pub const TRACE_PARSED: u8 = 1 << 0;
/// `TraceEvent::flags`: a connection-table entry decided the backend.
pub const TRACE_CT_HIT: u8 = 1 << 1;
/// `TraceEvent::flags`: the packet chose a backend from a Maglev table (a new flow).
pub const TRACE_NEW_FLOW: u8 = 1 << 2;
/// `TraceEvent::backend` and `service` when there is none.
pub const TRACE_NONE: u32 = u32::MAX;
/// `TraceEvent::reason` when no drop or pass counter moved (a forwarded packet).
pub const TRACE_NO_REASON: u16 = u16::MAX;

/// One traced packet (an entry of the `TRACE_EVENTS` ring buffer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// The data-plane clock (see lb-ebpf `clock`).
    pub time_ns: u64,
    /// The packet's tuple as parsed (valid with `TRACE_PARSED`).
    pub tuple: FlowTuple,
    /// The service's id, or `TRACE_NONE`.
    pub service: u32,
    /// The backend's id, or `TRACE_NONE`.
    pub backend: u32,
    /// The client class the backend was chosen in (or the tracked entry's).
    pub class: u32,
    /// The ingress interface.
    pub ifindex: u32,
    /// The `stat` index of the drop or pass counter that decided the packet, or
    /// `TRACE_NO_REASON`.
    pub reason: u16,
    /// The XDP action returned.
    pub action: u8,
    /// `TRACE_PARSED`, `TRACE_CT_HIT`, `TRACE_NEW_FLOW`.
    pub flags: u8,
    /// `FAMILY_V4` or `FAMILY_V6` (with `TRACE_PARSED`).
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Which global counters decide a packet's fate (the `drop_*` and `pass_*` ones): the traced
/// program names the last of them that moved (the most specific: `drop_no_neigh` comes after
/// `drop_fib`, which counts it too).
pub const VERDICT_COUNTERS: u64 = verdict_counters();

const fn verdict_counters() -> u64 {
    let mut mask = 0u64;
    let mut i = 0;
    while i < stat::NAMES.len() {
        let n = stat::NAMES[i].as_bytes();
        let drop = n.len() > 5 && n[0] == b'd' && n[1] == b'r' && n[2] == b'o' && n[3] == b'p' && n[4] == b'_';
        let pass = n.len() > 5 && n[0] == b'p' && n[1] == b'a' && n[2] == b's' && n[3] == b's' && n[4] == b'_';
        if drop || pass {
            mask |= 1 << i;
        }
        i += 1;
    }
    mask
}
const _: () = assert!(stat::GLOBAL_COUNT <= 64);

/// A family's address width, for userspace.
pub const fn family_len(family: u8) -> u32 {
    if family == FAMILY_V4 {
        32
    } else {
        128
    }
}

#[cfg(feature = "user")]
crate::pod!(TraceFilter, TraceEvent);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::addr_words;

    fn tuple(src: &str, dst: &str, dport: u16, proto: u8) -> (u8, FlowTuple) {
        let (s, family) = addr_words(src.parse().unwrap());
        let (d, _) = addr_words(dst.parse().unwrap());
        (family, FlowTuple { src: s, dst: d, sport: 4000u16.to_be(), dport: dport.to_be(), proto, _pad: [0; 3] })
    }

    #[test]
    fn filters_match_by_prefix_vip_port_and_protocol() {
        let (f4, t4) = tuple("198.18.1.77", "198.18.0.100", 80, 6);
        let (f6, t6) = tuple("2001:db8:1::5", "2001:db8::100", 53, 17);
        assert!(TraceFilter::default().matches(f4, &t4) && !TraceFilter::default().constrains());
        let (client, _) = addr_words("198.18.1.0".parse().unwrap());
        let by_client = TraceFilter { client, client_len: 24, client_family: FAMILY_V4, ..Default::default() };
        assert!(by_client.matches(f4, &t4) && !by_client.matches(f6, &t6));
        let other = TraceFilter { client_len: 25, client: addr_words("198.18.1.128".parse().unwrap()).0, ..by_client };
        assert!(!other.matches(f4, &t4));
        let (vip, _) = addr_words("2001:db8::100".parse().unwrap());
        let by_vip = TraceFilter { vip, vip_family: FAMILY_V6, ..Default::default() };
        assert!(by_vip.matches(f6, &t6) && !by_vip.matches(f4, &t4));
        let by_port = TraceFilter { port: 53u16.to_be(), proto: 17, ..Default::default() };
        assert!(by_port.matches(f6, &t6) && !by_port.matches(f4, &t4));
        let (c6, _) = addr_words("2001:db8:1::".parse().unwrap());
        let by_prefix6 = TraceFilter { client: c6, client_len: 48, client_family: FAMILY_V6, ..Default::default() };
        assert!(by_prefix6.matches(f6, &t6));
        assert!(by_prefix6.constrains());
    }

    #[test]
    fn verdict_counters_are_the_drop_and_pass_ones() {
        for (i, name) in stat::NAMES.iter().enumerate() {
            let decides = name.starts_with("drop_") || name.starts_with("pass_");
            assert_eq!(VERDICT_COUNTERS & (1 << i) != 0, decides, "{name}");
        }
    }
}
