//! Per-packet decisions shared by the XDP program and the controller: which fields are hashed
//! (spec §1.3 table S), which fields key the connection table (table T), when a TCP SYN starts
//! a new flow (§1.1), whether a tracked flow persists on an unhealthy backend (§1.4) and whether
//! a connection-table entry is still valid. Pure functions, no maps: the kernel calls them with
//! what it read from its maps, userspace calls them to predict the kernel.

use crate::maps::{
    affinity, backend_flags, persistence, service_flags, tracking, Backend, CtEntry, FlowTuple, ServiceInfo, PROTO_TCP,
};

/// SCTP: persists like TCP under DEFAULT_FOR_PROTOCOL (spec §1.4), hashed like "other" (§1.3).
pub const PROTO_SCTP: u8 = 132;

#[inline(always)]
fn five_tuple(t: &FlowTuple) -> FlowTuple {
    FlowTuple { src: t.src, dst: t.dst, sport: t.sport, dport: t.dport, proto: t.proto, _pad: [0; 3] }
}

#[inline(always)]
fn three_tuple(t: &FlowTuple) -> FlowTuple {
    FlowTuple { src: t.src, dst: t.dst, sport: 0, dport: 0, proto: t.proto, _pad: [0; 3] }
}

#[inline(always)]
fn two_tuple(t: &FlowTuple) -> FlowTuple {
    FlowTuple { src: t.src, dst: t.dst, sport: 0, dport: 0, proto: 0, _pad: [0; 3] }
}

#[inline(always)]
fn one_tuple(t: &FlowTuple) -> FlowTuple {
    FlowTuple { src: t.src, dst: [0; 4], sport: 0, dport: 0, proto: 0, _pad: [0; 3] }
}

/// The 5-tuple or the 3-tuple, by whether the packet's ports may be used: TCP and unfragmented
/// UDP have ports; fragments (first or later, spec §1.3 [AMBIG]) and other protocols do not.
#[inline(always)]
fn connection_tuple(full: &FlowTuple, l4_ports_valid: bool) -> FlowTuple {
    if l4_ports_valid {
        five_tuple(full)
    } else {
        three_tuple(full)
    }
}

/// Fields hashed to pick a backend for a new flow (spec §1.3 table S).
/// `full` is the packet's 5-tuple (ports zero when absent).
#[inline(always)]
pub fn hash_tuple(session_affinity: u8, full: &FlowTuple, l4_ports_valid: bool) -> FlowTuple {
    match session_affinity {
        affinity::CLIENT_IP_PROTO => three_tuple(full),
        affinity::CLIENT_IP => two_tuple(full),
        affinity::CLIENT_IP_NO_DESTINATION => one_tuple(full),
        // NONE, CLIENT_IP_PORT_PROTO (and unknown values, treated as NONE).
        _ => connection_tuple(full, l4_ports_valid),
    }
}

/// Makes a hash or tracking tuple direction-free (`service_flags::SYMMETRIC`): of its two ends
/// (address, port), the smaller comes first, so a flow and its reverse give the same tuple.
/// The order is any fixed total order (the address words as stored, then the port): both
/// directions, and every balancer, only need to agree on it.
#[inline(always)]
pub fn directionless(t: &mut FlowTuple) {
    if (t.src, t.sport) > (t.dst, t.dport) {
        core::mem::swap(&mut t.src, &mut t.dst);
        core::mem::swap(&mut t.sport, &mut t.dport);
    }
}

/// Connection-tracking key fields (spec §1.3 table T).
#[inline(always)]
pub fn track_tuple(session_affinity: u8, tracking_mode: u8, full: &FlowTuple, l4_ports_valid: bool) -> FlowTuple {
    if tracking_mode != tracking::PER_SESSION {
        return connection_tuple(full, l4_ports_valid);
    }
    match session_affinity {
        affinity::CLIENT_IP_PROTO => three_tuple(full),
        affinity::CLIENT_IP => two_tuple(full),
        affinity::CLIENT_IP_NO_DESTINATION => one_tuple(full),
        _ => connection_tuple(full, l4_ports_valid),
    }
}

/// Whether a packet starts a new flow regardless of the connection table (spec §1.1): a TCP SYN
/// when tracking per connection or when the affinity is a 5-tuple one. `is_tcp_syn` means SYN
/// set and ACK clear on an unfragmented TCP packet.
#[inline(always)]
pub fn is_new_flow(is_tcp_syn: bool, tracking_mode: u8, session_affinity: u8) -> bool {
    is_tcp_syn
        && (tracking_mode == tracking::PER_CONNECTION
            || session_affinity == affinity::NONE
            || session_affinity == affinity::CLIENT_IP_PORT_PROTO)
}

/// Whether a SYN that is new by rule ([`is_new_flow`]) keeps the entry its tracking key already
/// has instead of re-selecting: it does when that entry's backend would still be chosen for a
/// NEW connection, so a SYN for an established flow (a retransmission, a client reusing its
/// port, or a spoofed SYN with the victim's tuple) never moves it (Google Cloud keeps
/// established connections on their backend). Kept when all of these hold:
/// * the entry is not idle-expired (an `idle_timeout_ns` of 0: never);
/// * it was made under the service's current pool generation (`pool_gen`);
/// * its backend is present, with the same generation (the id was not given to another);
/// * that backend is not REMOVED (neither gone nor draining) and is HEALTHY.
///
/// It re-selects (and the insert overwrites the entry) when any of these fails: idle
/// timeout passed, the active pool changed since (failover or failback, whatever
/// FLUSH_ON_POOL_CHANGE says), backend removed, draining, reused or unhealthy (also when the
/// flow itself would persist on it), and of course when the key has no entry: under
/// PER_CONNECTION a SYN from another source port has another 5-tuple key (spec S7). A table
/// change alone (a reload adding backends) does not make it re-select.
#[inline(always)]
pub fn syn_keeps_entry(entry: &CtEntry, backend: Option<&Backend>, service: &ServiceInfo, now_ns: u64) -> bool {
    let fresh = service.idle_timeout_ns == 0 || now_ns.saturating_sub(entry.last_seen_ns) <= service.idle_timeout_ns;
    let usable = match backend {
        Some(b) => b.generation == entry.backend_gen && takes_new_flows(b),
        None => false,
    };
    fresh && entry.pool_gen == service.pool_gen && usable
}

/// Whether a backend takes new connections: present, not REMOVED (neither gone nor draining)
/// and HEALTHY.
#[inline(always)]
pub fn takes_new_flows(b: &Backend) -> bool {
    b.family != 0 && b.flags & (backend_flags::REMOVED | backend_flags::HEALTHY) == backend_flags::HEALTHY
}

/// [`ServiceInfo::flags`] persistence bits from the persistence option, tracking mode and
/// affinity (spec §1.4 table). `None` = invalid configuration (ALWAYS_PERSIST + PER_SESSION).
pub fn persistence_flags(option: u8, tracking_mode: u8, session_affinity: u8) -> Option<u8> {
    let five_tuple_affinity = session_affinity == affinity::NONE || session_affinity == affinity::CLIENT_IP_PORT_PROTO;
    match (option, tracking_mode) {
        // "TCP (and SCTP): persist, any affinity".
        (persistence::DEFAULT_FOR_PROTOCOL, tracking::PER_CONNECTION) => {
            Some(service_flags::PERSIST_TCP | service_flags::PERSIST_SCTP)
        }
        // Per session only TCP is named; SCTP is among "UDP and others: never".
        (persistence::DEFAULT_FOR_PROTOCOL, _) => {
            Some(if five_tuple_affinity { service_flags::PERSIST_TCP } else { 0 })
        }
        (persistence::NEVER_PERSIST, _) => Some(0),
        (persistence::ALWAYS_PERSIST, tracking::PER_CONNECTION) => {
            Some(service_flags::PERSIST_TCP | service_flags::PERSIST_SCTP | service_flags::PERSIST_OTHER)
        }
        _ => None,
    }
}

/// Whether a tracked flow of protocol `proto` stays on its backend once that backend is
/// unhealthy, from the precomputed service flags.
#[inline(always)]
pub fn persists_on_unhealthy(service_flags_bits: u8, proto: u8) -> bool {
    let bit = match proto {
        PROTO_TCP => service_flags::PERSIST_TCP,
        PROTO_SCTP => service_flags::PERSIST_SCTP,
        _ => service_flags::PERSIST_OTHER,
    };
    service_flags_bits & bit != 0
}

/// Outcome of checking a connection-table entry against the current state (spec §1.4
/// `entry_still_valid`). Every variant except `Valid` means: delete, treat the packet as new.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CtVerdict {
    Valid,
    /// No packet for longer than the service's idle timeout.
    IdleExpired,
    /// Made under another active pool while FLUSH_ON_POOL_CHANGE is set, or once the
    /// 10-minute drain after the pool change is over (POOL_DRAIN_OVER).
    PoolFlushed,
    /// Backend removed (and its drain window is over) or never configured.
    BackendGone,
    /// Backend unhealthy, no persistence for this protocol, and a healthy target exists.
    Unhealthy,
}

/// Checks an entry. `backend` is the tracked backend's map slot (None if unreadable);
/// `class_has_no_healthy` is asked only when needed: whether the flow's class table says the
/// eligible set holds no healthy backend (spec §1.4 [AMBIG]: then even "never persist" keeps it).
/// An `idle_timeout_ns` of 0 means entries never idle out.
#[inline(always)]
pub fn ct_verdict(
    entry: &CtEntry,
    backend: Option<&Backend>,
    service: &ServiceInfo,
    proto: u8,
    now_ns: u64,
    class_has_no_healthy: impl FnOnce() -> bool,
) -> CtVerdict {
    // Saturating: another CPU may have stamped the entry with a tick later than this packet's
    // `now` (read at its start); that entry is fresh, not 2^64 ns old.
    if service.idle_timeout_ns != 0 && now_ns.saturating_sub(entry.last_seen_ns) > service.idle_timeout_ns {
        return CtVerdict::IdleExpired;
    }
    if service.flags & (service_flags::FLUSH_ON_POOL_CHANGE | service_flags::POOL_DRAIN_OVER) != 0
        && entry.pool_gen != service.pool_gen
    {
        return CtVerdict::PoolFlushed;
    }
    let b = match backend {
        // Another backend has the id since (its drain deadline passed, the id was reused).
        Some(b) if b.family != 0 && b.generation == entry.backend_gen => b,
        _ => return CtVerdict::BackendGone,
    };
    if b.flags & backend_flags::REMOVED != 0 && now_ns >= b.drain_deadline_ns {
        return CtVerdict::BackendGone;
    }
    if b.flags & backend_flags::HEALTHY == 0 && !persists_on_unhealthy(service.flags, proto) && !class_has_no_healthy()
    {
        return CtVerdict::Unhealthy;
    }
    CtVerdict::Valid
}

/// Outer source address word of an encapsulated packet: the configured address with the host
/// bits in `hash_mask` (host byte order) taken from the flow hash. `base_be` is network order.
#[inline(always)]
pub fn encap_source_word(base_be: u32, hash_mask: u32, hash: u32) -> u32 {
    let base = u32::from_be(base_be);
    ((base & !hash_mask) | (hash & hash_mask)).to_be()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::maps::PROTO_UDP;

    const CLIENT: [u32; 4] = [u32::from_ne_bytes([10, 0, 0, 5]), 0, 0, 0];
    const VIP: [u32; 4] = [u32::from_ne_bytes([10, 0, 0, 100]), 0, 0, 0];

    /// Symmetric hashing: a flow and its reverse give one hash and one tracking key under every
    /// affinity that keeps both ends (all but CLIENT_IP_NO_DESTINATION, which validation
    /// refuses with `symmetric`), and the tuple is otherwise left as it was.
    #[test]
    fn directionless_tuples_of_a_flow_and_its_reverse_are_equal() {
        let fwd = pkt(PROTO_TCP, 40000, 443);
        let rev = FlowTuple { src: fwd.dst, dst: fwd.src, sport: fwd.dport, dport: fwd.sport, ..fwd };
        for aff in [affinity::NONE, affinity::CLIENT_IP_PORT_PROTO, affinity::CLIENT_IP_PROTO, affinity::CLIENT_IP] {
            for mode in [tracking::PER_CONNECTION, tracking::PER_SESSION] {
                let (mut a, mut b) = (hash_tuple(aff, &fwd, true), hash_tuple(aff, &rev, true));
                directionless(&mut a);
                directionless(&mut b);
                assert_eq!(crate::hash::flow_hash(&a), crate::hash::flow_hash(&b), "affinity {aff}");
                let (mut a, mut b) = (track_tuple(aff, mode, &fwd, true), track_tuple(aff, mode, &rev, true));
                directionless(&mut a);
                directionless(&mut b);
                assert_eq!(a, b, "affinity {aff}, tracking {mode}");
            }
        }
        // The two directions differ without it; with it, one of them is kept as it is.
        assert_ne!(crate::hash::flow_hash(&fwd), crate::hash::flow_hash(&rev));
        let (mut a, mut b) = (fwd, rev);
        directionless(&mut a);
        directionless(&mut b);
        assert!(a == fwd || a == rev);
        assert_eq!(a, b);
    }

    fn pkt(proto: u8, sport: u16, dport: u16) -> FlowTuple {
        FlowTuple { src: CLIENT, dst: VIP, sport: sport.to_be(), dport: dport.to_be(), proto, _pad: [0; 3] }
    }
    fn t5(p: &FlowTuple) -> FlowTuple {
        *p
    }
    fn t3(p: &FlowTuple) -> FlowTuple {
        FlowTuple { sport: 0, dport: 0, ..*p }
    }
    fn t2(p: &FlowTuple) -> FlowTuple {
        FlowTuple { sport: 0, dport: 0, proto: 0, ..*p }
    }
    fn t1(p: &FlowTuple) -> FlowTuple {
        FlowTuple { dst: [0; 4], sport: 0, dport: 0, proto: 0, ..*p }
    }

    #[test]
    fn s1_none_per_connection_tcp_five_tuple() {
        let p = pkt(PROTO_TCP, 40000, 80);
        assert_eq!(hash_tuple(affinity::NONE, &p, true), t5(&p));
        assert_eq!(track_tuple(affinity::NONE, tracking::PER_CONNECTION, &p, true), t5(&p));
    }

    #[test]
    fn s2_none_udp_fragment_three_tuple() {
        // A non-first fragment carries no ports: the parser leaves them zero, ports invalid.
        let p = pkt(PROTO_UDP, 0, 0);
        for mode in [tracking::PER_CONNECTION, tracking::PER_SESSION] {
            assert_eq!(hash_tuple(affinity::NONE, &p, false), t3(&p));
            assert_eq!(track_tuple(affinity::NONE, mode, &p, false), t3(&p));
        }
        // A first fragment has ports in the packet, but all pieces must hash alike.
        let first = pkt(PROTO_UDP, 5000, 53);
        assert_eq!(hash_tuple(affinity::NONE, &first, false), hash_tuple(affinity::NONE, &p, false));
    }

    #[test]
    fn s3_none_icmp_three_tuple() {
        let p = pkt(1, 0, 0);
        for mode in [tracking::PER_CONNECTION, tracking::PER_SESSION] {
            assert_eq!(hash_tuple(affinity::NONE, &p, false), t3(&p));
            assert_eq!(track_tuple(affinity::NONE, mode, &p, false), t3(&p));
        }
    }

    #[test]
    fn s4_client_ip_proto_per_connection() {
        let a = pkt(PROTO_TCP, 40000, 80);
        let b = pkt(PROTO_TCP, 40001, 80);
        let aff = affinity::CLIENT_IP_PROTO;
        assert_eq!(hash_tuple(aff, &a, true), t3(&a));
        assert_eq!(hash_tuple(aff, &a, true), hash_tuple(aff, &b, true));
        let (ka, kb) = (
            track_tuple(aff, tracking::PER_CONNECTION, &a, true),
            track_tuple(aff, tracking::PER_CONNECTION, &b, true),
        );
        assert_eq!((ka, kb), (t5(&a), t5(&b)));
        assert_ne!(ka, kb);
    }

    #[test]
    fn s5_client_ip_per_session_tcp_then_udp() {
        let tcp = pkt(PROTO_TCP, 40000, 80);
        let udp = pkt(PROTO_UDP, 40000, 53);
        let aff = affinity::CLIENT_IP;
        assert_eq!(hash_tuple(aff, &tcp, true), t2(&tcp));
        assert_eq!(hash_tuple(aff, &tcp, true), hash_tuple(aff, &udp, true));
        assert_eq!(
            track_tuple(aff, tracking::PER_SESSION, &tcp, true),
            track_tuple(aff, tracking::PER_SESSION, &udp, true)
        );
        assert_eq!(track_tuple(aff, tracking::PER_SESSION, &tcp, true), t2(&tcp));
    }

    #[test]
    fn s6_client_ip_no_destination_per_session() {
        let v1 = pkt(PROTO_TCP, 40000, 80);
        let v2 = FlowTuple { dst: [u32::from_ne_bytes([10, 0, 0, 101]), 0, 0, 0], ..v1 };
        let aff = affinity::CLIENT_IP_NO_DESTINATION;
        assert_eq!(hash_tuple(aff, &v1, true), t1(&v1));
        assert_eq!(hash_tuple(aff, &v1, true), hash_tuple(aff, &v2, true));
        assert_eq!(
            track_tuple(aff, tracking::PER_SESSION, &v1, true),
            track_tuple(aff, tracking::PER_SESSION, &v2, true)
        );
    }

    #[test]
    fn s7_client_ip_per_connection_second_syn_rehashes() {
        let p = pkt(PROTO_TCP, 40001, 80);
        assert!(is_new_flow(true, tracking::PER_CONNECTION, affinity::CLIENT_IP));
        assert_eq!(track_tuple(affinity::CLIENT_IP, tracking::PER_CONNECTION, &p, true), t5(&p));
        assert_eq!(hash_tuple(affinity::CLIENT_IP, &p, true), t2(&p));
    }

    #[test]
    fn s8_client_ip_per_session_syn_follows_entry() {
        let p = pkt(PROTO_TCP, 40002, 80);
        assert!(!is_new_flow(true, tracking::PER_SESSION, affinity::CLIENT_IP));
        assert_eq!(track_tuple(affinity::CLIENT_IP, tracking::PER_SESSION, &p, true), t2(&p));
        // 5-tuple affinities still treat every SYN as new in PER_SESSION.
        assert!(is_new_flow(true, tracking::PER_SESSION, affinity::NONE));
        assert!(is_new_flow(true, tracking::PER_SESSION, affinity::CLIENT_IP_PORT_PROTO));
        assert!(!is_new_flow(false, tracking::PER_CONNECTION, affinity::NONE));
    }

    fn svc(flags: u8) -> ServiceInfo {
        ServiceInfo { flags, idle_timeout_ns: 600_000_000_000, ..Default::default() }
    }
    fn b1(flags: u8) -> Backend {
        Backend { family: 4, flags, ..Default::default() }
    }
    const NOW: u64 = 1_000_000_000_000;
    fn entry() -> CtEntry {
        CtEntry { backend: 1, last_seen_ns: NOW - 1, ..Default::default() }
    }

    #[test]
    fn syn_keeps_a_usable_entry_and_re_selects_otherwise() {
        let s = ServiceInfo { pool_gen: 3, ..svc(0) };
        let e = CtEntry { pool_gen: 3, backend_gen: 2, ..entry() };
        let b = Backend { generation: 2, ..b1(backend_flags::HEALTHY) };
        assert!(syn_keeps_entry(&e, Some(&b), &s, NOW), "usable backend: the flow stays");
        // Each re-select case.
        assert!(!syn_keeps_entry(&e, None, &s, NOW), "backend unreadable");
        assert!(!syn_keeps_entry(&e, Some(&Backend { family: 0, ..b }), &s, NOW), "backend gone");
        assert!(!syn_keeps_entry(&e, Some(&Backend { generation: 3, ..b }), &s, NOW), "id reused");
        let removed =
            Backend { flags: backend_flags::HEALTHY | backend_flags::REMOVED, drain_deadline_ns: NOW + 1, ..b };
        assert!(!syn_keeps_entry(&e, Some(&removed), &s, NOW), "draining");
        assert!(!syn_keeps_entry(&e, Some(&Backend { flags: 0, ..b }), &s, NOW), "unhealthy");
        assert!(!syn_keeps_entry(&CtEntry { pool_gen: 2, ..e }, Some(&b), &s, NOW), "pool changed");
        let idle = CtEntry { last_seen_ns: NOW - s.idle_timeout_ns - 1, ..e };
        assert!(!syn_keeps_entry(&idle, Some(&b), &s, NOW), "idle expired");
        // No idle timeout: never expires; a stamp later than `now` (another CPU) is fresh.
        assert!(syn_keeps_entry(&idle, Some(&b), &ServiceInfo { idle_timeout_ns: 0, ..s }, NOW));
        assert!(syn_keeps_entry(&CtEntry { last_seen_ns: NOW + 4, ..e }, Some(&b), &s, NOW));
    }

    /// Established flow on b1, b1 unhealthy, b2 healthy (`no_healthy` false unless P8).
    fn verdict(option: u8, mode: u8, aff: u8, proto: u8, no_healthy: bool) -> CtVerdict {
        let flags = persistence_flags(option, mode, aff).expect("valid config");
        ct_verdict(&entry(), Some(&b1(0)), &svc(flags), proto, NOW, || no_healthy)
    }

    #[test]
    fn p1_default_per_connection_client_ip_tcp_stays() {
        assert_eq!(
            verdict(persistence::DEFAULT_FOR_PROTOCOL, tracking::PER_CONNECTION, affinity::CLIENT_IP, PROTO_TCP, false),
            CtVerdict::Valid
        );
    }
    #[test]
    fn p2_default_per_connection_none_udp_rerouted() {
        assert_eq!(
            verdict(persistence::DEFAULT_FOR_PROTOCOL, tracking::PER_CONNECTION, affinity::NONE, PROTO_UDP, false),
            CtVerdict::Unhealthy
        );
    }
    #[test]
    fn p3_default_per_session_client_ip_tcp_rerouted() {
        assert_eq!(
            verdict(persistence::DEFAULT_FOR_PROTOCOL, tracking::PER_SESSION, affinity::CLIENT_IP, PROTO_TCP, false),
            CtVerdict::Unhealthy
        );
    }
    #[test]
    fn p4_default_per_session_client_ip_port_proto_tcp_stays() {
        assert_eq!(
            verdict(
                persistence::DEFAULT_FOR_PROTOCOL,
                tracking::PER_SESSION,
                affinity::CLIENT_IP_PORT_PROTO,
                PROTO_TCP,
                false
            ),
            CtVerdict::Valid
        );
    }
    #[test]
    fn p5_never_per_connection_none_tcp_rerouted() {
        assert_eq!(
            verdict(persistence::NEVER_PERSIST, tracking::PER_CONNECTION, affinity::NONE, PROTO_TCP, false),
            CtVerdict::Unhealthy
        );
    }
    #[test]
    fn p6_always_per_connection_none_udp_stays() {
        assert_eq!(
            verdict(persistence::ALWAYS_PERSIST, tracking::PER_CONNECTION, affinity::NONE, PROTO_UDP, false),
            CtVerdict::Valid
        );
    }
    #[test]
    fn p7_always_per_session_rejected() {
        for aff in 0..=4 {
            assert_eq!(persistence_flags(persistence::ALWAYS_PERSIST, tracking::PER_SESSION, aff), None);
        }
    }
    #[test]
    fn p8_never_per_connection_tcp_no_healthy_target_stays() {
        assert_eq!(
            verdict(persistence::NEVER_PERSIST, tracking::PER_CONNECTION, affinity::NONE, PROTO_TCP, true),
            CtVerdict::Valid
        );
    }

    #[test]
    fn sctp_persists_like_tcp_per_connection_and_never_per_session() {
        let f = persistence_flags(persistence::DEFAULT_FOR_PROTOCOL, tracking::PER_CONNECTION, affinity::NONE).unwrap();
        assert!(persists_on_unhealthy(f, PROTO_SCTP));
        assert!(!persists_on_unhealthy(f, 1));
        // Per session the table names TCP only; SCTP is among "UDP and others: never".
        for a in [affinity::NONE, affinity::CLIENT_IP_PORT_PROTO] {
            let f = persistence_flags(persistence::DEFAULT_FOR_PROTOCOL, tracking::PER_SESSION, a).unwrap();
            assert!(persists_on_unhealthy(f, PROTO_TCP));
            assert!(!persists_on_unhealthy(f, PROTO_SCTP));
        }
        let f = persistence_flags(persistence::ALWAYS_PERSIST, tracking::PER_CONNECTION, affinity::NONE).unwrap();
        assert!(persists_on_unhealthy(f, PROTO_SCTP) && persists_on_unhealthy(f, 17));
    }

    #[test]
    fn idle_drain_and_flush_verdicts() {
        let s = svc(0);
        let healthy = b1(backend_flags::HEALTHY);
        let old = CtEntry { last_seen_ns: NOW - s.idle_timeout_ns - 1, ..entry() };
        assert_eq!(ct_verdict(&old, Some(&healthy), &s, PROTO_TCP, NOW, || false), CtVerdict::IdleExpired);
        let at_limit = CtEntry { last_seen_ns: NOW - s.idle_timeout_ns, ..entry() };
        assert_eq!(ct_verdict(&at_limit, Some(&healthy), &s, PROTO_TCP, NOW, || false), CtVerdict::Valid);
        // Stamped by another CPU a tick after this packet's clock reading: fresh, not expired.
        let ahead = CtEntry { last_seen_ns: NOW + 4_000_000, ..entry() };
        assert_eq!(ct_verdict(&ahead, Some(&healthy), &s, PROTO_TCP, NOW, || false), CtVerdict::Valid);
        let draining =
            Backend { flags: backend_flags::HEALTHY | backend_flags::REMOVED, drain_deadline_ns: NOW + 1, ..healthy };
        assert_eq!(ct_verdict(&entry(), Some(&draining), &s, PROTO_TCP, NOW, || false), CtVerdict::Valid);
        let drained = Backend { drain_deadline_ns: NOW, ..draining };
        assert_eq!(ct_verdict(&entry(), Some(&drained), &s, PROTO_TCP, NOW, || false), CtVerdict::BackendGone);
        assert_eq!(
            ct_verdict(&entry(), Some(&Backend::default()), &s, PROTO_TCP, NOW, || false),
            CtVerdict::BackendGone
        );
        let flush = ServiceInfo { flags: service_flags::FLUSH_ON_POOL_CHANGE, pool_gen: 2, ..s };
        assert_eq!(ct_verdict(&entry(), Some(&healthy), &flush, PROTO_TCP, NOW, || false), CtVerdict::PoolFlushed);
        let same_gen = CtEntry { pool_gen: 2, ..entry() };
        assert_eq!(ct_verdict(&same_gen, Some(&healthy), &flush, PROTO_TCP, NOW, || false), CtVerdict::Valid);
        // Without the flush: another generation's entry lives through the 10-minute drain
        // (POOL_DRAIN_OVER clear) and is void after it.
        let draining = ServiceInfo { pool_gen: 2, ..s };
        assert_eq!(ct_verdict(&entry(), Some(&healthy), &draining, PROTO_TCP, NOW, || false), CtVerdict::Valid);
        let drained = ServiceInfo { flags: service_flags::POOL_DRAIN_OVER, ..draining };
        assert_eq!(ct_verdict(&entry(), Some(&healthy), &drained, PROTO_TCP, NOW, || false), CtVerdict::PoolFlushed);
        assert_eq!(ct_verdict(&same_gen, Some(&healthy), &drained, PROTO_TCP, NOW, || false), CtVerdict::Valid);
        // The id now belongs to another backend (a later generation): the entry is not its.
        let reused = Backend { generation: 1, ..healthy };
        assert_eq!(ct_verdict(&entry(), Some(&reused), &s, PROTO_TCP, NOW, || false), CtVerdict::BackendGone);
        let made_for_it = CtEntry { backend_gen: 1, ..entry() };
        assert_eq!(ct_verdict(&made_for_it, Some(&reused), &s, PROTO_TCP, NOW, || false), CtVerdict::Valid);
    }

    #[test]
    fn encap_source_takes_host_bits_from_hash() {
        let base = u32::from_be_bytes([198, 18, 5, 0]).to_be();
        let w = encap_source_word(base, 0xff, 0x1234_5678);
        assert_eq!(u32::from_be(w).to_be_bytes(), [198, 18, 5, 0x78]);
        assert_eq!(encap_source_word(base, 0, 0xffff_ffff), base);
    }
}
