//! Connection tracking through BPF_PROG_TEST_RUN, observed via L2 DSR (the destination MAC
//! names the backend): stickiness across table swaps, the SYN rule (§1.1, S5/S7/S8),
//! persistence vectors P1-P8 (§1.6), idle expiry, draining (P9), pool flush, reserved id.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::decide::{persistence_flags, track_tuple};
use lb_common::maps::{
    affinity, backend_flags, forwarding, persistence, service_flags, stat, table_flags, tracking, CtKey, FlowTuple,
    ServiceInfo, BACKEND_DROP, FAMILY_V4, FAMILY_V6, PROTO_TCP, PROTO_UDP,
};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, uniform};
use lb_tests::packet::*;
use lb_user::dataplane::{addr_words, Dataplane, DataplaneSizes, Program, XDP_DROP, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const SVC: u32 = 1;
const B1: u32 = 1;
const B2: u32 = 2;
const IDLE_NS: u64 = 600_000_000_000;

/// A DSR service on VIP:80/TCP and VIP:53/UDP with backends b1, b2, every flow hashed to b1.
fn setup(info: ServiceInfo) -> Dataplane {
    lb_tests::fixture_net::enter_lo_routed_netns();
    install(fixture::load(), info)
}

fn install(mut dp: Dataplane, info: ServiceInfo) -> Dataplane {
    // Table changes at once (the handshake window has tests of its own).
    dp.set_handshake_window(0);
    let mut dp = fixture::register_interfaces(dp);
    dp.set_service(&[service_key(VIP.into(), 80, PROTO_TCP), service_key(VIP.into(), 53, PROTO_UDP)], info).unwrap();
    for id in [B1, B2] {
        let addr = IpAddr::V4(Ipv4Addr::new(198, 18, 3, id as u8));
        dp.set_backend(id, backend(addr, backend_mac(id), 0)).unwrap();
    }
    dp.write_table(SVC, 0, 0, &uniform(B1)).unwrap();
    dp
}

fn dsr(aff: u8, mode: u8) -> ServiceInfo {
    service_info(SVC, aff, mode, forwarding::L2_DSR)
}

fn tcp(sport: u16, flags: u8) -> Vec<u8> {
    let ip = V4::new(CLIENT, VIP, PROTO_TCP).build(&tcp4(CLIENT, VIP, sport, 80, flags, b"data"));
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip)
}

/// A SYN with the flow's tuple and a bad TCP checksum, as a spoofer from another host sends.
fn spoofed_syn(sport: u16) -> Vec<u8> {
    let mut seg = tcp4(CLIENT, VIP, sport, 80, TCP_SYN, b"");
    seg[16] ^= 0x5a;
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &V4::new(CLIENT, VIP, PROTO_TCP).build(&seg))
}

fn udp(sport: u16) -> Vec<u8> {
    let ip = V4::new(CLIENT, VIP, PROTO_UDP).build(&udp4(CLIENT, VIP, sport, 53, b"data"));
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip)
}

/// Runs a frame and returns the backend its destination MAC names.
fn backend_of(dp: &Dataplane, frame: &[u8]) -> u32 {
    let out = dp.run_test(Program::Lb, frame, 0).unwrap();
    assert_eq!(out.action, XDP_TX, "expected the packet to be forwarded");
    assert_eq!(&out.data[6..12], &LB_MAC, "DSR source MAC is the balancer's");
    assert_eq!(&out.data[12..], &frame[12..], "DSR leaves everything after the MACs untouched");
    let id = u32::from(out.data[4]) << 8 | u32::from(out.data[5]);
    assert_eq!(backend_mac(id), out.data[0..6], "unknown destination MAC");
    id
}

fn ct_key(info: &ServiceInfo, proto: u8, sport: u16, dport: u16) -> CtKey {
    key_of(info, CLIENT.into(), VIP.into(), proto, sport, dport)
}

/// The tracking key of a flow with ports from `src` to `dst`.
fn key_of(info: &ServiceInfo, src: IpAddr, dst: IpAddr, proto: u8, sport: u16, dport: u16) -> CtKey {
    let full = FlowTuple {
        src: addr_words(src).0,
        dst: addr_words(dst).0,
        sport: sport.to_be(),
        dport: dport.to_be(),
        proto,
        _pad: [0; 3],
    };
    CtKey { tuple: track_tuple(info.affinity, info.tracking, &full, true), service: info.id }
}

const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);

fn tcp6_frame(sport: u16, flags: u8) -> Vec<u8> {
    let ip = ipv6(CLIENT6, VIP6, PROTO_TCP, 64, 0, &tcp6(CLIENT6, VIP6, sport, 80, flags, b"data"));
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, &ip)
}

fn move_table_to_b2(dp: &mut Dataplane) {
    dp.write_table(SVC, 0, 0, &uniform(B2)).unwrap();
}

#[test]
fn established_flow_keeps_backend_across_table_swap() {
    let mut dp = setup(dsr(affinity::NONE, tracking::PER_CONNECTION));
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "established flow stays");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK | TCP_PSH)), B1);
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), B2, "new flow follows the new table");
    let s = dp.stats().unwrap();
    assert_eq!(s.get(stat::CT_HIT), 2);
    assert_eq!(s.get(stat::NEW_FLOW), 2);
}

#[test]
fn syn_on_tracked_five_tuple_starts_a_new_flow_once_its_backend_drains() {
    // §1.1: with PER_CONNECTION a SYN is new and overwrites the entry (FIN/RST remove nothing)
    // when the entry's backend no longer takes new connections (`syn_keeps_entry`): here b1
    // drains (removed, deadline ahead), so tracked non-SYN packets would still reach it.
    let mut dp = setup(dsr(affinity::NONE, tracking::PER_CONNECTION));
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    move_table_to_b2(&mut dp);
    let deadline = dp.now_ns().unwrap() + 300_000_000_000;
    dp.set_backend_state(B1, backend_flags::HEALTHY | backend_flags::REMOVED, deadline).unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B2);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2, "the entry was overwritten");
}

#[test]
fn s7_client_ip_per_connection_second_syn_rehashes() {
    let info = dsr(affinity::CLIENT_IP, tracking::PER_CONNECTION);
    let dp = flow_on_b1_table_on_b2(info);
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), B2, "second SYN re-hashed");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "first connection keeps its entry");
    assert!(dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).is_some());
    assert!(dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40001, 80)).is_some(), "a new 5-tuple entry");
}

#[test]
fn s8_client_ip_per_session_syn_follows_existing_entry() {
    let info = dsr(affinity::CLIENT_IP, tracking::PER_SESSION);
    let dp = flow_on_b1_table_on_b2(info);
    assert_eq!(backend_of(&dp, &tcp(40002, TCP_SYN)), B1, "SYN is not new: follows the 2-tuple entry");
    // S5: the UDP flow of the same client shares the one 2-tuple entry.
    assert_eq!(backend_of(&dp, &udp(5000)), B1);
    assert_eq!(dp.conntrack_entries().len(), 1);
}

/// Issue 20.2: spoofed SYNs with an established flow's tuple (bad checksum) after a table change
/// that hashes the tuple elsewhere do not move the flow: its backend is still usable.
#[test]
fn spoofed_syn_keeps_an_established_flow_on_its_usable_backend() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let dp = flow_on_b1_table_on_b2(info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1);
    assert_eq!(backend_of(&dp, &spoofed_syn(40000)), B1, "the SYN follows the entry");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1, "so does a genuine retransmitted SYN");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "the flow stays");
    assert_eq!(dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).unwrap().backend, B1);
    let s = dp.stats().unwrap();
    assert_eq!((s.get(stat::NEW_FLOW), s.get(stat::CT_HIT)), (1, 4));
    // A SYN of another tuple is a new flow on the new table.
    assert_eq!(backend_of(&dp, &spoofed_syn(40001)), B2);
}

/// Each case in which a SYN on a tracked tuple re-selects (`lb_common::decide::syn_keeps_entry`): the
/// established flow on b1 moves to b2, where the table now hashes it, and stays there.
#[test]
fn syn_re_selects_when_the_tracked_backend_takes_no_new_connections() {
    type Case = fn(&mut Dataplane, ServiceInfo);
    let cases: [(&str, Case); 5] = [
        ("unhealthy", |dp, _| dp.set_backend_state(B1, 0, 0).unwrap()),
        ("draining", |dp, _| {
            let deadline = dp.now_ns().unwrap() + 300_000_000_000;
            dp.set_backend_state(B1, backend_flags::HEALTHY | backend_flags::REMOVED, deadline).unwrap()
        }),
        ("id given to another backend", |dp, _| {
            let other = backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, 9)), backend_mac(B1), 0);
            dp.set_backend(B1, lb_common::maps::Backend { generation: 1, ..other }).unwrap()
        }),
        ("active pool changed", |dp, info| republish(dp, ServiceInfo { pool_gen: 1, ..info })),
        ("idle timeout passed", |dp, info| {
            let key = ct_key(&info, PROTO_TCP, 40000, 80);
            let e = dp.conntrack_get(FAMILY_V4, &key).unwrap();
            dp.conntrack_set(
                FAMILY_V4,
                &key,
                lb_common::maps::CtEntry { last_seen_ns: e.last_seen_ns - IDLE_NS - 60_000_000_000, ..e },
            )
            .unwrap()
        }),
    ];
    for (case, apply) in cases {
        let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
        let mut dp = flow_on_b1_table_on_b2(info);
        apply(&mut dp, info);
        assert_eq!(backend_of(&dp, &spoofed_syn(40000)), B2, "{case}: the SYN re-selects");
        assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2, "{case}: the entry was overwritten");
        assert_eq!(dp.stats().unwrap().get(stat::NEW_FLOW), 2, "{case}");
    }
}

/// P-vector harness: flow established on b1; b1 turns unhealthy; the table moves to b2
/// (healthy unless `b2_unhealthy`); returns where the next packet goes.
fn persistence_case(option: u8, mode: u8, aff: u8, proto: u8, b2_unhealthy: bool) -> u32 {
    let mut info = dsr(aff, mode);
    info.flags = persistence_flags(option, mode, aff).expect("valid configuration");
    let mut dp = setup(info);
    let (first, next) =
        if proto == PROTO_TCP { (tcp(40000, TCP_SYN), tcp(40000, TCP_ACK)) } else { (udp(5000), udp(5000)) };
    assert_eq!(backend_of(&dp, &first), B1);
    dp.set_backend_state(B1, 0, 0).unwrap();
    if b2_unhealthy {
        // No healthy backend anywhere (E-2): the table keeps all backends, flagged NO_HEALTHY.
        dp.set_backend_state(B2, 0, 0).unwrap();
        dp.write_table(SVC, 0, table_flags::NO_HEALTHY, &uniform(B2)).unwrap();
    } else {
        move_table_to_b2(&mut dp);
    }
    let got = backend_of(&dp, &next);
    let rerouted = dp.stats().unwrap().get(stat::CT_REROUTED_UNHEALTHY);
    assert_eq!(rerouted, u64::from(got == B2 && !b2_unhealthy), "reroutes are counted");
    got
}

#[test]
fn p1_default_per_connection_client_ip_tcp_stays() {
    assert_eq!(
        persistence_case(
            persistence::DEFAULT_FOR_PROTOCOL,
            tracking::PER_CONNECTION,
            affinity::CLIENT_IP,
            PROTO_TCP,
            false
        ),
        B1
    );
}

#[test]
fn p2_default_per_connection_none_udp_rerouted() {
    assert_eq!(
        persistence_case(persistence::DEFAULT_FOR_PROTOCOL, tracking::PER_CONNECTION, affinity::NONE, PROTO_UDP, false),
        B2
    );
}

#[test]
fn p3_default_per_session_client_ip_tcp_rerouted() {
    assert_eq!(
        persistence_case(
            persistence::DEFAULT_FOR_PROTOCOL,
            tracking::PER_SESSION,
            affinity::CLIENT_IP,
            PROTO_TCP,
            false
        ),
        B2
    );
}

#[test]
fn p4_default_per_session_client_ip_port_proto_tcp_stays() {
    assert_eq!(
        persistence_case(
            persistence::DEFAULT_FOR_PROTOCOL,
            tracking::PER_SESSION,
            affinity::CLIENT_IP_PORT_PROTO,
            PROTO_TCP,
            false
        ),
        B1
    );
}

#[test]
fn p5_never_per_connection_none_tcp_rerouted() {
    assert_eq!(
        persistence_case(persistence::NEVER_PERSIST, tracking::PER_CONNECTION, affinity::NONE, PROTO_TCP, false),
        B2
    );
}

#[test]
fn p6_always_per_connection_none_udp_stays() {
    assert_eq!(
        persistence_case(persistence::ALWAYS_PERSIST, tracking::PER_CONNECTION, affinity::NONE, PROTO_UDP, false),
        B1
    );
}

#[test]
fn p7_always_per_session_is_rejected() {
    for aff in [
        affinity::NONE,
        affinity::CLIENT_IP_PORT_PROTO,
        affinity::CLIENT_IP_PROTO,
        affinity::CLIENT_IP,
        affinity::CLIENT_IP_NO_DESTINATION,
    ] {
        assert_eq!(persistence_flags(persistence::ALWAYS_PERSIST, tracking::PER_SESSION, aff), None);
    }
}

#[test]
fn p8_never_per_connection_tcp_no_healthy_target_stays() {
    assert_eq!(
        persistence_case(persistence::NEVER_PERSIST, tracking::PER_CONNECTION, affinity::NONE, PROTO_TCP, true),
        B1
    );
}

#[test]
fn idle_entry_expires_and_flow_is_rehashed() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    assert_eq!(backend_of(&dp, &udp(5000)), B1);
    move_table_to_b2(&mut dp);
    let key = ct_key(&info, PROTO_UDP, 5000, 53);
    let e = dp.conntrack_get(FAMILY_V4, &key).expect("entry made by the first packet");
    assert_eq!(e.backend, B1);
    // Aged by a minute less than the timeout (a margin no stall of this machine reaches):
    // still valid, and refreshed by the packet.
    dp.conntrack_set(
        FAMILY_V4,
        &key,
        lb_common::maps::CtEntry { last_seen_ns: e.last_seen_ns - (IDLE_NS - 60_000_000_000), ..e },
    )
    .unwrap();
    assert_eq!(backend_of(&dp, &udp(5000)), B1);
    let refreshed = dp.conntrack_get(FAMILY_V4, &key).unwrap();
    assert!(refreshed.last_seen_ns >= e.last_seen_ns, "a hit refreshes last_seen");
    // Aged past the timeout: expired, re-hashed to b2.
    dp.conntrack_set(
        FAMILY_V4,
        &key,
        lb_common::maps::CtEntry { last_seen_ns: refreshed.last_seen_ns - IDLE_NS - 1, ..refreshed },
    )
    .unwrap();
    assert_eq!(backend_of(&dp, &udp(5000)), B2);
    assert_eq!(dp.stats().unwrap().get(stat::CT_EXPIRED), 1);
    assert_eq!(dp.conntrack_get(FAMILY_V4, &key).unwrap().backend, B2);
}

#[test]
fn p9_removed_backend_drains_until_deadline() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = flow_on_b1_table_on_b2(info);
    let seen = dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).unwrap().last_seen_ns;
    // Removed with 300 s of draining left: tracked packets still reach b1.
    dp.set_backend_state(B1, backend_flags::HEALTHY | backend_flags::REMOVED, seen + 300_000_000_000).unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1);
    // Drain window over: the entry is deleted, the next non-SYN lands on a healthy backend.
    dp.set_backend_state(B1, backend_flags::HEALTHY | backend_flags::REMOVED, seen).unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2);
    assert_eq!(dp.stats().unwrap().get(stat::CT_DRAIN_EXPIRED), 1);
}

/// A backend id handed to another backend (a later generation) does not carry the flows of the
/// one that held it: an entry that saw no packet since is void, and the flow is chosen anew.
#[test]
fn entry_of_a_reused_backend_id_is_void() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    assert_eq!(dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).unwrap().backend_gen, 0);
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "same holder: the flow stays");
    let other = backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, 9)), backend_mac(B1), 0);
    dp.set_backend(B1, lb_common::maps::Backend { generation: 1, ..other }).unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2, "the id's new holder does not inherit the flow");
    assert_eq!(dp.stats().unwrap().get(stat::CT_DRAIN_EXPIRED), 1);
    let e = dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).unwrap();
    assert_eq!((e.backend, e.backend_gen), (B2, 0), "the new entry names its backend's generation");
}

/// P9 for a protocol that does not persist on unhealthy backends: the controller keeps a
/// removed backend's HEALTHY bit as last seen, so a healthy one's UDP flows drain too; one
/// that was unhealthy when removed loses them at once (the persistence table applies).
#[test]
fn p9_removed_backend_drains_udp_flows_unless_it_was_unhealthy() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    assert_eq!(backend_of(&dp, &udp(5000)), B1);
    move_table_to_b2(&mut dp);
    let seen = dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_UDP, 5000, 53)).unwrap().last_seen_ns;
    dp.set_backend_state(B1, backend_flags::HEALTHY | backend_flags::REMOVED, seen + 300_000_000_000).unwrap();
    assert_eq!(backend_of(&dp, &udp(5000)), B1, "removed but healthy: the UDP flow drains");
    dp.set_backend_state(B1, backend_flags::REMOVED, seen + 300_000_000_000).unwrap();
    assert_eq!(backend_of(&dp, &udp(5000)), B2, "removed while unhealthy: UDP does not persist (P2)");
    assert_eq!(dp.stats().unwrap().get(stat::CT_REROUTED_UNHEALTHY), 1);
}

/// Writes the service's record again (its key unchanged), as the controller does when its
/// pool generation or flags change.
fn republish(dp: &mut Dataplane, info: ServiceInfo) {
    dp.set_service(&[service_key(VIP.into(), 80, PROTO_TCP)], info).unwrap();
}

/// A TCP flow established on B1, then the table moved to B2 (a new pick would land there).
fn flow_on_b1_table_on_b2(info: ServiceInfo) -> Dataplane {
    let mut dp = setup(info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    move_table_to_b2(&mut dp);
    dp
}

#[test]
fn pool_change_flushes_entries_only_when_configured() {
    let mut info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = flow_on_b1_table_on_b2(info);
    info.pool_gen = 1;
    republish(&mut dp, info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "without the flag, entries survive a pool change");
    info.pool_gen = 2;
    info.flags |= service_flags::FLUSH_ON_POOL_CHANGE;
    republish(&mut dp, info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2);
    assert_eq!(dp.stats().unwrap().get(stat::CT_POOL_FLUSHED), 1);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2, "the new entry carries the new generation");
}

/// Without the flush, an entry of the previous pool generation lives through the 10-minute
/// drain and is void once the controller marks the drain over (POOL_DRAIN_OVER).
#[test]
fn pool_change_drain_ends_entries_of_the_previous_pool() {
    let mut info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = flow_on_b1_table_on_b2(info);
    info.pool_gen = 1;
    republish(&mut dp, info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "during the drain");
    info.flags |= service_flags::POOL_DRAIN_OVER;
    republish(&mut dp, info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2, "after the drain");
    assert_eq!(dp.stats().unwrap().get(stat::CT_POOL_FLUSHED), 1);
}

#[test]
fn reserved_backend_id_drops_new_flows_but_not_established_ones() {
    let mut dp = setup(dsr(affinity::NONE, tracking::PER_CONNECTION));
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    dp.write_table(SVC, 0, 0, &uniform(BACKEND_DROP)).unwrap();
    let out = dp.run_test(Program::Lb, &tcp(40001, TCP_SYN), 0).unwrap();
    assert_eq!(out.action, XDP_DROP);
    assert_eq!(dp.stats().unwrap().get(stat::DROP_NO_BACKEND), 1);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1);
}

#[test]
fn client_class_selects_its_table_and_counts_spills() {
    let mut dp = setup(dsr(affinity::NONE, tracking::PER_CONNECTION));
    dp.set_backend(5, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, 5)), backend_mac(5), 2)).unwrap();
    dp.set_class_prefix(SVC, "198.18.1.0/24".parse().unwrap(), 1).unwrap();
    dp.set_class_prefix(SVC, "198.18.1.5/32".parse().unwrap(), 3).unwrap();
    dp.write_table(SVC, 1, table_flags::ZONAL, &uniform(5)).unwrap();
    // Class 3 (longest prefix) has no table: falls back to class 0.
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    dp.remove_class_prefix(SVC, "198.18.1.5/32".parse().unwrap()).unwrap();
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), 5);
    let s = dp.stats().unwrap();
    let c1 = s.class(SVC, 1);
    assert_eq!((c1.new_flows, c1.spills), (1, 1), "zone-1 client sent to a zone-2 backend is a spill");
    assert_eq!(s.class(SVC, 0).new_flows, 1);
    let total = s.service(SVC);
    assert_eq!((total.packets, total.new_flows, total.spills), (2, 2, 1), "per-service sums over classes");
}

/// IPv4 flows are tracked in `CONNTRACK4` (16-byte key), IPv6 flows in `CONNTRACK`; each
/// family's established flow keeps its backend across a table swap, and the entries read back
/// under the keys userspace computes for them.
#[test]
fn each_family_tracks_its_flows_in_its_own_table() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    dp.set_service(&[service_key(VIP.into(), 80, PROTO_TCP), service_key(VIP6.into(), 80, PROTO_TCP)], info).unwrap();
    let tcp6_frame = |flags| tcp6_frame(40000, flags);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    assert_eq!(backend_of(&dp, &tcp6_frame(TCP_SYN)), B1);
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "IPv4 flow stays");
    assert_eq!(backend_of(&dp, &tcp6_frame(TCP_ACK)), B1, "IPv6 flow stays");

    let mut entries = dp.conntrack_entries();
    entries.sort_by_key(|(family, _, _)| *family);
    assert_eq!(entries.len(), 2, "{entries:?}");
    assert_eq!((entries[0].0, entries[1].0), (FAMILY_V4, FAMILY_V6));
    assert_eq!(entries[0].1, ct_key(&info, PROTO_TCP, 40000, 80));
    let key6 = key_of(&info, CLIENT6.into(), VIP6.into(), PROTO_TCP, 40000, 80);
    assert_eq!(entries[1].1, key6);
    assert_eq!(dp.conntrack_get(FAMILY_V6, &key6).map(|e| e.backend), Some(B1));
    assert!(dp.conntrack_get(FAMILY_V4, &key6).is_none(), "an IPv6 key is not in the IPv4 table");
    assert!(dp.conntrack_get(FAMILY_V6, &ct_key(&info, PROTO_TCP, 40000, 80)).is_none(), "nor the reverse");
}

/// Entries are stamped with the data-plane clock that `Dataplane::now_ns` reads (jiffies times
/// the tick length), so userspace deadlines and the kernel's stamps compare.
#[test]
fn entries_are_stamped_with_the_clock_userspace_reads() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let dp = setup(info);
    let before = dp.now_ns().unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    let after = dp.now_ns().unwrap();
    let stamp = dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).unwrap().last_seen_ns;
    assert!(before <= stamp && stamp <= after, "stamp {stamp} outside [{before}, {after}]");
    // Whole ticks, rounded down to the grain of connection-table times.
    let tick = lb_user::dataplane::ns_per_jiffy().unwrap();
    let grain = 1u64 << lb_common::ct_table::SEEN_GRAIN_SHIFT;
    assert_eq!(stamp % grain, 0, "times are whole grains of {grain} ns");
    assert!(stamp.div_ceil(tick) * tick - stamp < grain, "the clock counts whole ticks of {tick} ns");
    assert!(before > 0);
    // An IPv6 slot keeps the time in grains: the stamp reads back as written.
    let (client6, vip6) = (IpAddr::V6(CLIENT6), IpAddr::V6(VIP6));
    let mut dp = dp;
    dp.set_service(&[service_key(VIP.into(), 80, PROTO_TCP), service_key(vip6, 80, PROTO_TCP)], info).unwrap();
    let before = dp.now_ns().unwrap();
    assert_eq!(backend_of(&dp, &tcp6_frame(40000, TCP_SYN)), B1);
    let after = dp.now_ns().unwrap();
    let key6 = key_of(&info, client6, vip6, PROTO_TCP, 40000, 80);
    let stamp = dp.conntrack_get(FAMILY_V6, &key6).unwrap().last_seen_ns;
    assert!(before <= stamp && stamp <= after, "IPv6 stamp {stamp} outside [{before}, {after}]");
}

/// `setup` with room for 4 flows: a table of one bucket of 8 slots, which both of every key's
/// candidate buckets are, so that flows take its slots in the order they come.
fn one_bucket_table(info: ServiceInfo) -> Dataplane {
    assert_eq!(lb_common::ct_table::buckets_for(4), 1);
    lb_tests::fixture_net::enter_lo_routed_netns();
    install(Dataplane::load(DataplaneSizes { conntrack_entries: 4, ..fixture::sizes() }).unwrap(), info)
}

/// The connection table is set-associative (`lb_common::ct_table`): with room for 4 flows it is
/// one bucket of 8 slots, which both of every key's candidate buckets are. A ninth flow takes
/// the slot of the least recently seen unconfirmed flow (each has sent its SYN only); the other
/// eight keep their entries.
#[test]
fn a_full_table_evicts_the_least_recently_seen_unconfirmed_flow() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = one_bucket_table(info);
    let ports: Vec<u16> = (41000..41008).collect();
    for &p in &ports {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_SYN)), B1);
    }
    assert_eq!(dp.conntrack_entries().len(), 8, "eight flows fill the bucket");
    // Last seen: the flow from port 41003 longest ago, the others a second ago.
    let key = |p: u16| ct_key(&info, PROTO_TCP, p, 80);
    let now = dp.conntrack_get(FAMILY_V4, &key(ports[0])).unwrap().last_seen_ns;
    for (i, &p) in ports.iter().enumerate() {
        let e = dp.conntrack_get(FAMILY_V4, &key(p)).unwrap();
        let age = if i == 3 { 5_000_000_000 } else { 1_000_000_000 + i as u64 };
        dp.conntrack_set(FAMILY_V4, &key(p), lb_common::maps::CtEntry { last_seen_ns: now - age, ..e }).unwrap();
    }
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(41100, TCP_SYN)), B2, "a ninth flow");
    assert_eq!(dp.conntrack_entries().len(), 8);
    assert!(dp.conntrack_get(FAMILY_V4, &key(41003)).is_none(), "the least recently seen flow was evicted");
    let s = dp.stats().unwrap();
    assert_eq!((s.get(stat::CT_EVICT_UNCONFIRMED), s.get(stat::CT_EVICT_LIVE)), (1, 0), "seen 5 s ago: live");
    for &p in ports.iter().filter(|&&p| p != 41003) {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_ACK)), B1, "port {p} keeps its backend");
    }
    // The evicted flow's next packet is a new flow: it follows the table.
    assert_eq!(backend_of(&dp, &tcp(41003, TCP_ACK)), B2);
}

/// An ICMP "fragmentation needed" quoting the VIP's packet to the client's port `sport`.
fn frag_needed_quoting(sport: u16) -> Vec<u8> {
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &icmp4_frag_needed_quoting(CLIENT, VIP, sport))
}

/// A frame from client `src` (spoofed: any address) of kind `kind` (0 SYN, 1 ACK, 2 UDP, 3 an
/// ICMP echo request).
fn flood_frame(kind: u32, src: Ipv4Addr, sport: u16) -> Vec<u8> {
    let ip = match kind {
        0 => V4::new(src, VIP, PROTO_TCP).build(&tcp4(src, VIP, sport, 80, TCP_SYN, b"")),
        1 => V4::new(src, VIP, PROTO_TCP).build(&tcp4(src, VIP, sport, 80, TCP_ACK, b"x")),
        2 => V4::new(src, VIP, PROTO_UDP).build(&udp4(src, VIP, sport, 53, b"x")),
        _ => {
            let mut echo = vec![8, 0, 0, 0, (sport >> 8) as u8, sport as u8, 0, 1];
            let c = checksum(&echo);
            echo[2..4].copy_from_slice(&c.to_be_bytes());
            V4::new(src, VIP, 1).build(&echo)
        }
    };
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip)
}

/// Issue 35 item 1: a flood of single packets (SYN, ACK, UDP, ICMP echo; the service also takes
/// every other protocol on the VIP) with spoofed tuples cannot evict a flow that has sent two
/// packets. One bucket of 8 slots, held by 4 TCP connections (SYN, ACK) and 4 UDP flows (two
/// datagrams), all confirmed; the table then moves to b2. Every
/// flood packet finds 8 confirmed live flows, is forwarded by the stateless choice (b2)
/// without an entry and counted `ct_full_stateless`; every flow stays on b1.
#[test]
fn a_single_packet_flood_never_evicts_a_confirmed_flow() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = one_bucket_table(info);
    dp.set_service(&[service_key(VIP.into(), 0, lb_common::maps::PROTO_ANY)], info).unwrap();
    for p in 41000..41004 {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_SYN)), B1);
        assert_eq!(backend_of(&dp, &tcp(p, TCP_ACK)), B1);
        assert_eq!(backend_of(&dp, &udp(p)), B1);
        assert_eq!(backend_of(&dp, &udp(p)), B1);
    }
    assert_eq!(dp.conntrack_entries().len(), 8);
    move_table_to_b2(&mut dp);
    let before = dp.stats().unwrap();
    let flood = 4 * 150;
    for i in 0..flood {
        let src = Ipv4Addr::new(198, 19, (i >> 8) as u8, i as u8);
        assert_eq!(backend_of(&dp, &flood_frame(i % 4, src, 1024 + i as u16)), B2, "flood packet {i}");
    }
    for p in 41000..41004 {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_ACK)), B1, "TCP flow {p} stays");
        assert_eq!(backend_of(&dp, &udp(p)), B1, "UDP flow {p} stays");
    }
    let s = dp.stats().unwrap();
    let delta = |i: u32| s.get(i) - before.get(i);
    assert_eq!(delta(stat::CT_MISS), u64::from(flood), "every flood packet misses");
    // A TCP connection is counted at its SYN: the ACKs (a quarter) are no new flows.
    assert_eq!(delta(stat::NEW_FLOW), u64::from(flood) / 4 * 3, "every SYN, datagram and echo is a new flow");
    assert_eq!(delta(stat::CT_FULL_STATELESS), u64::from(flood), "... forwarded without an entry");
    assert_eq!(delta(stat::CT_HIT), 8);
    let none = [stat::CT_EVICT_LIVE, stat::CT_EVICT_UNCONFIRMED, stat::CT_INSERT_BUSY];
    assert_eq!(none.map(delta), [0; 3]);
    assert_eq!(dp.conntrack_entries().len(), 8);
}

/// What confirms an entry: a packet of the flow after the one that made it. Not a SYN that
/// keeps the entry (a retransmission, or a spoofer repeating a SYN), nor an ICMP error quoting
/// the flow. One bucket of 8 slots: 6 confirmed connections seen longest ago, a flow that sent
/// two SYNs and one whose SYN was followed by an ICMP error; two new flows take the two
/// unconfirmed flows' slots, the least recently seen first, and the confirmed ones stay.
#[test]
fn only_a_later_packet_of_the_flow_confirms_its_entry() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = one_bucket_table(info);
    let key = |p: u16| ct_key(&info, PROTO_TCP, p, 80);
    for p in 41000..41006 {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_SYN)), B1);
        assert_eq!(backend_of(&dp, &tcp(p, TCP_ACK)), B1);
    }
    assert_eq!(backend_of(&dp, &tcp(41006, TCP_SYN)), B1);
    assert_eq!(backend_of(&dp, &tcp(41006, TCP_SYN)), B1, "a retransmitted SYN keeps the entry");
    assert_eq!(backend_of(&dp, &tcp(41007, TCP_SYN)), B1);
    assert_eq!(backend_of(&dp, &frag_needed_quoting(41007)), B1, "the ICMP error follows the flow");
    // The confirmed flows seen 5 s ago, the flow from 41007 2 s ago, from 41006 1 s ago.
    let now = dp.conntrack_get(FAMILY_V4, &key(41000)).unwrap().last_seen_ns;
    for (p, age) in (41000..41006).map(|p| (p, 5_000_000_000)).chain([(41006, 1_000_000_000), (41007, 2_000_000_000)]) {
        let e = dp.conntrack_get(FAMILY_V4, &key(p)).unwrap();
        dp.conntrack_set(FAMILY_V4, &key(p), lb_common::maps::CtEntry { last_seen_ns: now - age, ..e }).unwrap();
    }
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(42000, TCP_SYN)), B2);
    assert!(dp.conntrack_get(FAMILY_V4, &key(41007)).is_none(), "the unconfirmed flow seen longest ago gave way");
    assert_eq!(backend_of(&dp, &tcp(42001, TCP_SYN)), B2);
    assert!(dp.conntrack_get(FAMILY_V4, &key(41006)).is_none(), "then the other");
    for p in 41000..41006 {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_ACK)), B1, "confirmed flow {p} stays");
    }
    // The bucket now holds 8 confirmed or new flows; the two new ones are unconfirmed.
    assert_eq!(backend_of(&dp, &tcp(42002, TCP_SYN)), B2);
    let s = dp.stats().unwrap();
    assert_eq!(
        (s.get(stat::CT_EVICT_UNCONFIRMED), s.get(stat::CT_FULL_STATELESS), s.get(stat::CT_EVICT_LIVE)),
        (3, 0, 0)
    );
    assert_eq!(backend_of(&dp, &tcp(42002, TCP_ACK)), B2, "a new flow keeps its entry");
}

/// Issue 17: a SYN that re-selects writes the slot its one search of the buckets found, its
/// key's own, even behind a free slot: the keep-for-SYN search chose it and the insert reuses
/// that choice. One bucket of 8 slots (room for 4 flows): the flows from ports 41000-41003 take
/// slots 0-3; the first's flow idles out (its slot is free for a new flow), and so does the
/// fourth's, which then re-selects. No second entry for its key, and the free slot is left.
#[test]
fn a_re_selecting_syn_rewrites_its_own_slot_behind_a_free_one() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = one_bucket_table(info);
    let key = |p: u16| ct_key(&info, PROTO_TCP, p, 80);
    for p in 41000..41004 {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_SYN)), B1);
    }
    for p in [41000, 41003] {
        let e = dp.conntrack_get(FAMILY_V4, &key(p)).unwrap();
        let idle = lb_common::maps::CtEntry { last_seen_ns: e.last_seen_ns - IDLE_NS - 60_000_000_000, ..e };
        dp.conntrack_set(FAMILY_V4, &key(p), idle).unwrap();
    }
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(41003, TCP_SYN)), B2, "the SYN re-selects");
    let entries = dp.conntrack_entries();
    let own: Vec<_> = entries.iter().filter(|(_, k, _)| *k == key(41003)).collect();
    assert_eq!(own.len(), 1, "one entry for the key: {entries:?}");
    assert_eq!(own[0].2.backend, B2);
    assert_eq!(entries.len(), 4, "{entries:?}");
    assert!(dp.conntrack_get(FAMILY_V4, &key(41000)).is_some(), "the free slot before it was not taken");
    let s = dp.stats().unwrap();
    assert_eq!((s.get(stat::NEW_FLOW), s.get(stat::CT_INSERT_BUSY), s.get(stat::CT_EVICT_LIVE)), (5, 0, 0));
    assert_eq!(backend_of(&dp, &tcp(41003, TCP_ACK)), B2, "the flow follows its new entry");
}

/// Issue 35, one search for find and victim: a packet that is not new by rule looks its key up,
/// and when the entry it finds is void the insert writes the slot that lookup chose, the
/// key's own, without searching again (a second search would take the first free slot). One
/// bucket of 8 slots: the UDP flows from ports 5000-5003 take slots 0-3; the first's and the
/// fourth's idle out, then the fourth sends again: it re-selects into its own slot, and the
/// first's (idle, free for a new flow, in front of it) keeps its entry.
#[test]
fn a_void_entry_is_replaced_in_the_slot_its_lookup_found() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = one_bucket_table(info);
    let key = |p: u16| ct_key(&info, PROTO_UDP, p, 53);
    for p in 5000..5004 {
        assert_eq!(backend_of(&dp, &udp(p)), B1);
    }
    for p in [5000, 5003] {
        let e = dp.conntrack_get(FAMILY_V4, &key(p)).unwrap();
        let idle = lb_common::maps::CtEntry { last_seen_ns: e.last_seen_ns - IDLE_NS - 60_000_000_000, ..e };
        dp.conntrack_set(FAMILY_V4, &key(p), idle).unwrap();
    }
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &udp(5003)), B2, "the idle entry expired: the flow re-selects");
    let entries = dp.conntrack_entries();
    let own: Vec<_> = entries.iter().filter(|(_, k, _)| *k == key(5003)).collect();
    assert_eq!(own.len(), 1, "one entry for the key: {entries:?}");
    assert_eq!(own[0].2.backend, B2);
    assert_eq!(entries.len(), 4, "{entries:?}");
    assert!(dp.conntrack_get(FAMILY_V4, &key(5000)).is_some(), "the free slot before it was not taken");
    let s = dp.stats().unwrap();
    assert_eq!((s.get(stat::CT_EXPIRED), s.get(stat::CT_INSERT_BUSY), s.get(stat::CT_EVICT_UNCONFIRMED)), (1, 0, 0));
    assert_eq!(backend_of(&dp, &udp(5003)), B2, "the flow follows its new entry");
}

/// Issue 17.1 in a busy table: closed flows stay until evicted, so a new flow finds both its
/// buckets full. It takes a slot of an idle flow (seen before the idle timeout) in the bucket
/// with fewer live flows, not the least recently seen of the 16, which would keep filling the
/// bucket with more live flows (in a long run, until a live flow is evicted).
#[test]
fn a_new_flow_replaces_an_idle_flow_of_the_bucket_with_fewer_live_flows() {
    assert_eq!(lb_common::ct_table::buckets_for(8), 2);
    lb_tests::fixture_net::enter_lo_routed_netns();
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = install(Dataplane::load(DataplaneSizes { conntrack_entries: 8, ..fixture::sizes() }).unwrap(), info);
    let key = |p: u16| ct_key(&info, PROTO_TCP, p, 80);
    let buckets = |p: u16| dp.conntrack_buckets_of(FAMILY_V4, &key(p));
    // Flows whose two candidates are both bucket 0 (or 1) fill that bucket; the new flow has
    // one candidate of each.
    let only = |b: u32| (42000..44000).filter(|&p| buckets(p) == [b, b]).take(8).collect::<Vec<u16>>();
    let (a, b) = (only(0), only(1));
    let new = (42000..44000).find(|&p| buckets(p)[0] != buckets(p)[1]).unwrap();
    assert_eq!((a.len(), b.len()), (8, 8));
    for &p in a.iter().chain(&b) {
        assert_eq!(backend_of(&dp, &tcp(p, TCP_SYN)), B1);
    }
    assert_eq!(dp.conntrack_entries().len(), 16, "both buckets full");
    // Bucket 0: one idle flow, seen longest ago of all; bucket 1: four idle flows.
    let now = dp.conntrack_get(FAMILY_V4, &key(a[0])).unwrap().last_seen_ns;
    let mut age = |p: u16, ago: u64| {
        let e = dp.conntrack_get(FAMILY_V4, &key(p)).unwrap();
        dp.conntrack_set(FAMILY_V4, &key(p), lb_common::maps::CtEntry { last_seen_ns: now - ago, ..e }).unwrap();
    };
    age(a[7], IDLE_NS + 2_000_000_000);
    for &p in &b[4..] {
        age(p, IDLE_NS + 1_000_000_000);
    }
    assert_eq!(backend_of(&dp, &tcp(new, TCP_SYN)), B1);
    let tracked = |p: u16| dp.conntrack_get(FAMILY_V4, &key(p)).is_some();
    assert!(tracked(new));
    assert!(tracked(a[7]), "the bucket with seven live flows keeps its idle one");
    assert_eq!(b[4..].iter().filter(|&&p| !tracked(p)).count(), 1, "one idle flow of the other bucket gave way");
    assert!(a[..7].iter().chain(&b[..4]).all(|&p| tracked(p)), "every live flow stays");
    let s = dp.stats().unwrap();
    assert_eq!((s.get(stat::CT_EVICT_LIVE), s.get(stat::CT_INSERT_BUSY)), (0, 0));
}

/// Issue 17.1: a table configured for 2^16 flows takes exactly that many new flows, one per
/// program run, without evicting any: every flow is read back, and no live eviction counted.
/// A power of two is the worst case of the sizing (`ct_table::buckets_for`): half the slots.
#[test]
fn the_configured_number_of_flows_fits_without_eviction() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let dp = setup(info);
    let flows = fixture::sizes().conntrack_entries;
    assert_eq!(flows, 1 << 16);
    let client = |i: u32| Ipv4Addr::new(10, (i >> 8) as u8, i as u8, 1);
    for i in 0..flows {
        let ip = V4::new(client(i), VIP, PROTO_UDP).build(&udp4(client(i), VIP, 5000, 53, b"x"));
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip), 0).unwrap();
        assert_eq!(out.action, XDP_TX, "flow {i}");
    }
    let s = dp.stats().unwrap();
    assert_eq!((s.get(stat::NEW_FLOW), s.get(stat::CT_INSERT_BUSY)), (u64::from(flows), 0));
    assert_eq!(s.get(stat::CT_EVICT_LIVE), 0, "no live flow evicted");
    let tracked: std::collections::HashSet<CtKey> = dp.conntrack_entries().into_iter().map(|(_, k, _)| k).collect();
    assert_eq!(tracked.len(), flows as usize);
    for i in 0..flows {
        assert!(
            tracked.contains(&key_of(&info, client(i).into(), VIP.into(), PROTO_UDP, 5000, 53)),
            "flow {i} was evicted"
        );
    }
}

/// A restarted daemon adopts the pinned tables and finds the flows its predecessor tracked:
/// the buckets' hash seed is pinned with them.
#[test]
fn adopted_pinned_tables_keep_their_flows() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let pins = lb_tests::fixture::PinDir::new("ct");
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    {
        let dp = install(Dataplane::load_with(fixture::sizes(), Some(pins.path())).unwrap(), info);
        assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    }
    let mut dp =
        lb_tests::fixture::register_interfaces(Dataplane::load_with(fixture::sizes(), Some(pins.path())).unwrap());
    dp.set_handshake_window(0);
    assert_eq!(dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).map(|e| e.backend), Some(B1));
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "the adopted entry still holds the flow");
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), B2);
    drop(dp);
    lb_user::dataplane::pinning::remove_map_pins(pins.path()).unwrap();
}

/// Issue 28: the service slot grew from 64 to 128 bytes (room for forwarding parameters). A
/// data plane pinned by the version before, with 64-byte slots, is not adopted (this version's
/// program would read its slots wrongly): `prepare_reuse` says why and carries the connection
/// tables over, as the daemon does on an upgrade, and in the new data plane the established
/// flow keeps its backend while new flows follow the new table.
#[test]
fn a_service_table_of_the_previous_layout_is_replaced_and_its_flows_carried() {
    use lb_user::dataplane::pinning::{prepare_reuse, PinState, BPF_F_MMAPABLE};
    lb_tests::fixture_net::enter_lo_routed_netns();
    let dir = fixture::PinDir::new("service-slot-64");
    let sizes = fixture::sizes();
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    {
        let dp = install(Dataplane::load_with(sizes, Some(dir.path())).unwrap(), info);
        assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    }
    // The previous version's SERVICE_TABLE: as many slots, of 64 bytes.
    let pin = dir.path().join("SERVICE_TABLE");
    let slots = aya::maps::MapInfo::from_pin(&pin).unwrap().max_entries();
    std::fs::remove_file(&pin).unwrap();
    let old = lb_tests::rawbpf::array_map(64, slots, BPF_F_MMAPABLE).expect("an array map (needs root)");
    lb_tests::rawbpf::pin(&old, &pin).unwrap();

    let PinState::Discarded { why, carried: Some(carried) } = prepare_reuse(dir.path(), &sizes).unwrap() else {
        panic!("a service table of 64-byte slots is not adopted, and the connection tables are carried")
    };
    assert!(why.contains("SERVICE_TABLE has another layout (values of 64 bytes"), "{why}");
    assert!(!pin.exists(), "the old table's pin is removed");
    let mut dp = Dataplane::load_with(sizes, Some(dir.path())).unwrap();
    dp.carry_backends(&carried).unwrap();
    let mut dp = install(dp, info);
    move_table_to_b2(&mut dp);
    assert_eq!(dp.carry_conntrack(&carried).unwrap(), (1, 0), "the one tracked flow is carried");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "the established flow keeps its backend");
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), B2, "a new flow follows the new table");
    assert_eq!(dp.stats().unwrap().get(stat::CT_HIT), 1);
}

/// Issue 35: slots went from 48 bytes (IPv4) and 72 (IPv6: the key in `CtKey` form) to 40 and
/// 64, the entry packed. Pinned tables of the previous layouts are not adopted: `prepare_reuse`
/// says why and carries their flows, converted, into the new tables, where the established
/// flows keep their backends.
#[test]
fn tables_of_the_previous_slot_layouts_are_replaced_and_their_flows_carried() {
    use lb_common::ct_table::state;
    use lb_common::maps::CtKey4;
    use lb_user::dataplane::pinning::{prepare_reuse, PinState, BPF_F_MMAPABLE};
    use lb_user::dataplane::{PreviousBucket, PreviousSlot, Slot48, Slot72};
    lb_tests::fixture_net::enter_lo_routed_netns();
    let dir = fixture::PinDir::new("ct-previous-slots");
    let sizes = fixture::sizes();
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let keys = [service_key(VIP.into(), 80, PROTO_TCP), service_key(VIP6.into(), 80, PROTO_TCP)];
    let key4 = ct_key(&info, PROTO_TCP, 40000, 80);
    let key6 = key_of(&info, CLIENT6.into(), VIP6.into(), PROTO_TCP, 40000, 80);
    let (entry4, entry6) = {
        let mut dp = install(Dataplane::load_with(sizes, Some(dir.path())).unwrap(), info);
        dp.set_service(&keys, info).unwrap();
        assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
        assert_eq!(backend_of(&dp, &tcp6_frame(40000, TCP_SYN)), B1);
        (dp.conntrack_get(FAMILY_V4, &key4).unwrap(), dp.conntrack_get(FAMILY_V6, &key6).unwrap())
    };
    let live = state::LIVE | state::CONFIRMED | state::VERSION;
    // Replaces a pinned table by one of the previous layout (as many buckets of `P` slots),
    // holding `flow` (live), a freed slot and one caught mid-write (neither carried).
    fn previous<P: PreviousSlot>(pin: &std::path::Path, flow: P, freed: P, writing: P)
    where
        PreviousBucket<P>: aya::Pod,
    {
        let buckets = aya::maps::MapInfo::from_pin(pin).unwrap().max_entries();
        std::fs::remove_file(pin).unwrap();
        let size = std::mem::size_of::<PreviousBucket<P>>() as u32;
        let old = lb_tests::rawbpf::array_map(size, buckets, BPF_F_MMAPABLE).expect("an array map (needs root)");
        lb_tests::rawbpf::pin(&old, pin).unwrap();
        let data = aya::maps::MapData::from_pin(pin).unwrap();
        let mut table: aya::maps::Array<_, PreviousBucket<P>> =
            aya::maps::Array::try_from(aya::maps::Map::Array(data)).unwrap();
        let mut bucket = PreviousBucket::<P>::default();
        bucket.slots[3] = flow;
        bucket.slots[4] = freed;
        bucket.slots[5] = writing;
        table.set(buckets - 1, bucket, 0).unwrap();
    }
    let other4 = ct_key(&info, PROTO_TCP, 40001, 80);
    let packed4 = |key: &lb_common::maps::CtKey| CtKey4::new(&key.tuple, key.service);
    let slot48 = |state, key| Slot48 { state, key, _pad: 0, entry: entry4 };
    previous(
        &dir.path().join("CONNTRACK4"),
        slot48(live, packed4(&key4)),
        slot48(state::VERSION, packed4(&other4)),
        slot48(live | state::WRITING, packed4(&other4)),
    );
    let other6 = key_of(&info, CLIENT6.into(), VIP6.into(), PROTO_TCP, 40001, 80);
    let slot72 = |state, key| Slot72 { state, key, entry: entry6 };
    previous(
        &dir.path().join("CONNTRACK"),
        slot72(live, key6),
        slot72(state::VERSION, other6),
        slot72(live | state::WRITING, other6),
    );

    let PinState::Discarded { why, carried: Some(carried) } = prepare_reuse(dir.path(), &sizes).unwrap() else {
        panic!("tables of the previous slot layouts are not adopted, and their flows are carried")
    };
    assert!(why.contains("has another layout (values of"), "{why}");
    let mut dp = Dataplane::load_with(sizes, Some(dir.path())).unwrap();
    dp.carry_backends(&carried).unwrap();
    let mut dp = install(dp, info);
    dp.set_service(&keys, info).unwrap();
    move_table_to_b2(&mut dp);
    assert_eq!(dp.carry_conntrack(&carried).unwrap(), (2, 0), "the IPv4 flow and the IPv6 one");
    assert_eq!(dp.conntrack_get(FAMILY_V4, &key4), Some(entry4), "the IPv4 entry as it was");
    assert_eq!(dp.conntrack_get(FAMILY_V6, &key6), Some(entry6), "the IPv6 entry as it was");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "the established IPv4 flow keeps its backend");
    assert_eq!(backend_of(&dp, &tcp6_frame(40000, TCP_ACK)), B1, "so does the IPv6 one");
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), B2, "a new flow follows the new table");
    assert_eq!(backend_of(&dp, &tcp6_frame(40001, TCP_SYN)), B2, "a new flow follows the new table");
    assert_eq!(dp.stats().unwrap().get(stat::CT_HIT), 2);
}

// Issue 35 item 2: a SYN in a clean Maglev slot (`CLEAN_SLOTS`) is forwarded without reading or
// writing the connection table; its flow is inserted at its first non-SYN packet; a table
// change keeps the replaced table for a handshake window.

fn stats_delta(dp: &Dataplane, before: &lb_user::dataplane::Stats, i: u32) -> u64 {
    dp.stats().unwrap().get(i) - before.get(i)
}

#[test]
fn a_syn_in_a_clean_slot_writes_nothing_and_its_first_ack_inserts_the_flow() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    assert!(dp.conntrack_mapped(), "the scan reads the connection tables as memory");
    let report = dp.scan_clean_slots().unwrap();
    assert_eq!((report.dirty_slots, report.slots), (0, u64::from(fixture::TEST_M)), "no entry: all clean");
    let before = dp.stats().unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1, "a retransmitted SYN: the same choice");
    assert!(dp.conntrack_entries().is_empty(), "the SYNs wrote nothing");
    assert_eq!(stats_delta(&dp, &before, stat::CT_SYN_STATELESS), 2);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1);
    let e = dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).expect("the ACK inserted the flow");
    assert_eq!(e.backend, B1);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK | TCP_PSH)), B1);
    let d = |i| stats_delta(&dp, &before, i);
    assert_eq!((d(stat::CT_MISS), d(stat::CT_HIT)), (3, 1));
    assert_eq!(d(stat::NEW_FLOW), 2, "a connection is counted at its SYN, not again at its first ACK");
}

#[test]
fn a_table_is_dirty_until_scanned_and_its_syns_insert_as_before() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    assert_eq!(dp.slot_clean(SVC, 0, 0), Some(false));
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    assert!(dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).is_some());
    assert_eq!(dp.stats().unwrap().get(stat::CT_SYN_STATELESS), 0);
    // A change of dirty slots keeps no previous table: every SYN there made an entry, and a
    // miss (a flow from another balancer, or from before a restart) follows the current table.
    dp.set_handshake_window(60_000_000_000);
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_ACK)), B2);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "the tracked flow stays");
    assert_eq!(dp.stats().unwrap().get(stat::CT_PREV_TABLE), 0);
}

#[test]
fn a_handshake_straddling_a_change_reaches_one_backend() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    dp.set_handshake_window(60_000_000_000);
    dp.scan_clean_slots().unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1, "by the stateless choice");
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), B1);
    move_table_to_b2(&mut dp);
    assert_eq!(dp.slot_clean(SVC, 0, 0), Some(false), "every slot changed: all dirty");
    let before = dp.stats().unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1, "the first ACK follows its SYN");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK | TCP_PSH)), B1, "and the entry it made holds the flow");
    // A SYN retransmitted across the change (its SYN-ACK lost) re-selects like any new
    // connection, in its now dirty slot, and makes the entry its ACK follows: one backend.
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_SYN)), B2, "new connections follow the change at once");
    assert_eq!(backend_of(&dp, &tcp(40001, TCP_ACK)), B2);
    assert_eq!(stats_delta(&dp, &before, stat::CT_PREV_TABLE), 1);
    assert_eq!(stats_delta(&dp, &before, stat::CT_HIT), 2);
    // UDP flows start at their first datagram: no previous table for them.
    assert_eq!(backend_of(&dp, &udp(5000)), B2);
    // A previous backend that takes no new connections is not used.
    dp.set_backend_state(B1, 0, 0).unwrap();
    assert_eq!(backend_of(&dp, &tcp(40002, TCP_ACK)), B2);
}

#[test]
fn after_the_window_a_flow_without_entry_follows_the_new_table() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    dp.scan_clean_slots().unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    // Window 0: as if it had passed.
    move_table_to_b2(&mut dp);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2);
    assert_eq!(dp.stats().unwrap().get(stat::CT_PREV_TABLE), 0);
}

#[test]
fn a_syn_never_moves_an_established_flow_whose_slot_the_scan_keeps_dirty() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    dp.scan_clean_slots().unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1);
    move_table_to_b2(&mut dp);
    let report = dp.scan_clean_slots().unwrap();
    assert_eq!(report.dirty_slots, 1, "the established flow's slot, only");
    let e = dp.conntrack_get(FAMILY_V4, &ct_key(&info, PROTO_TCP, 40000, 80)).unwrap();
    let slot = lb_common::hash::maglev_slot(e.hash, fixture::TEST_M);
    assert_eq!(dp.slot_clean(SVC, 0, slot), Some(false));
    // A spoofed SYN, or the client reusing its port: the entry's backend takes new connections.
    assert_eq!(backend_of(&dp, &spoofed_syn(40000)), B1);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1, "port reuse onto the old entry keeps it");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1);
    // Its backend draining: the SYN re-selects, as before.
    let deadline = dp.now_ns().unwrap() + 300_000_000_000;
    dp.set_backend_state(B1, backend_flags::HEALTHY | backend_flags::REMOVED, deadline).unwrap();
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B2);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2);
    // The flow's entry now agrees with the table: its slot is clean again.
    assert_eq!(dp.scan_clean_slots().unwrap().dirty_slots, 0);
}

#[test]
fn an_idle_entry_leaves_its_slot_clean_and_its_tuple_starts_afresh() {
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = setup(info);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B1);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B1);
    let key = ct_key(&info, PROTO_TCP, 40000, 80);
    let e = dp.conntrack_get(FAMILY_V4, &key).unwrap();
    dp.conntrack_set(FAMILY_V4, &key, lb_common::maps::CtEntry { last_seen_ns: e.last_seen_ns - IDLE_NS - 1, ..e })
        .unwrap();
    move_table_to_b2(&mut dp);
    assert_eq!(dp.scan_clean_slots().unwrap().dirty_slots, 0, "an idle entry holds no flow");
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_SYN)), B2);
    assert_eq!(backend_of(&dp, &tcp(40000, TCP_ACK)), B2, "the idle entry expires; the flow goes whole to b2");
}

/// The race: traffic on one CPU (a second data plane adopting the same pinned maps) while this
/// thread changes the table and scans. Every connection keeps the backend its entry names once
/// it has one (its second packet), for its data and for any later SYN on its tuple: no SYN
/// skips a slot that holds a disagreeing entry.
#[test]
fn scans_table_changes_and_traffic_at_once_never_move_an_established_flow() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let pins = lb_tests::fixture::PinDir::new("ct-race");
    let info = dsr(affinity::NONE, tracking::PER_CONNECTION);
    let mut dp = install(Dataplane::load_with(fixture::sizes(), Some(pins.path())).unwrap(), info);
    let traffic =
        lb_tests::fixture::register_interfaces(Dataplane::load_with(fixture::sizes(), Some(pins.path())).unwrap());
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (checked, changes) = std::thread::scope(|s| {
        let stop = &stop;
        let runner = s.spawn(move || {
            let mut x = 0x2545_f491_4f6c_dd1du64;
            // Per port: the backend its entry names, once it has one.
            let mut held: std::collections::HashMap<u16, u32> = std::collections::HashMap::new();
            let mut checked = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let port = 20000 + (x % 400) as u16;
                match held.get(&port) {
                    None => {
                        backend_of(&traffic, &tcp(port, TCP_SYN));
                        let b = backend_of(&traffic, &tcp(port, TCP_ACK));
                        held.insert(port, b);
                    }
                    Some(&b) => {
                        let flags = if x >> 32 & 3 == 0 { TCP_SYN } else { TCP_ACK };
                        assert_eq!(backend_of(&traffic, &tcp(port, flags)), b, "port {port}, flags {flags:#x}");
                        checked += 1;
                    }
                }
            }
            drop(traffic);
            checked
        });
        let mut changes = 0;
        // At least 4 s and 40 changes (a loaded machine is slow), at most a minute.
        let start = std::time::Instant::now();
        let secs = |n| std::time::Duration::from_secs(n);
        while (start.elapsed() < secs(4) || changes < 40) && start.elapsed() < secs(60) && !runner.is_finished() {
            // A table of b1 and b2 in random slots, and a scan, in random order.
            if rand() & 1 == 0 {
                let table: Vec<u32> = (0..fixture::TEST_M).map(|_| if rand() & 1 == 0 { B1 } else { B2 }).collect();
                dp.write_table(SVC, 0, 0, &table).unwrap();
                changes += 1;
            } else {
                dp.scan_clean_slots().unwrap();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (runner.join().expect("the traffic thread"), changes)
    });
    let s = dp.stats().unwrap();
    assert!(checked > 1000 && changes >= 40, "too little happened: {checked} packets checked, {changes} changes");
    assert!(s.get(stat::CT_SYN_STATELESS) > 0, "some SYNs went without an entry");
    let none = [stat::CT_EVICT_LIVE, stat::CT_EVICT_UNCONFIRMED, stat::CT_FULL_STATELESS, stat::CT_INSERT_BUSY];
    assert_eq!(none.map(|i| s.get(i)), [0; 4]);
    drop(dp);
    lb_user::dataplane::pinning::remove_map_pins(pins.path()).unwrap();
}
