//! The data plane as a route's next hop (issue 29), through `BPF_PROG_TEST_RUN`: packets to a
//! routed destination prefix (`NEXT_HOP_ROUTES`) that no VIP service takes go, unchanged, to
//! an appliance chosen like a VIP service's backend (L2 rewrite: the destination MAC names the
//! appliance); with `SYMMETRIC`, a flow and its reverse cross the same appliance and share one
//! tracking entry. VIP services win over prefixes, exempted and unrouted destinations pass, and
//! a packet an appliance routes back is dropped as a loop.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use lb_common::maps::{
    affinity, forwarding, service_flags, stat, tracking, ServiceInfo, ServiceKey, FAMILY_NEXT_HOP, NEXT_HOP_UNTOUCHED,
    PROTO_ANY, PROTO_TCP, PROTO_UDP,
};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, uniform, TEST_M};
use lb_tests::packet::*;
use lb_user::dataplane::{Dataplane, Program, XDP_DROP, XDP_PASS, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const ROUTER_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
/// The next-hop service and its route (the address word of its key).
const SVC: u32 = 1;
const ROUTE: u32 = 7;
/// Three appliances, backend ids 1..=3.
const APPLIANCES: [u32; 3] = [1, 2, 3];
/// A VIP service on VIP:80/TCP, inside the routed 0.0.0.0/0, with its own backend.
const VIP_SVC: u32 = 2;
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const VIP_BACKEND: u32 = 9;
/// An address exempted inside the routed prefix (the balancer's own).
const OWN: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);

fn next_hop_key(proto: u8) -> ServiceKey {
    ServiceKey { addr: [ROUTE, 0, 0, 0], port: 0, proto, family: FAMILY_NEXT_HOP }
}

fn next_hop_info(symmetric: bool) -> ServiceInfo {
    let mut info = service_info(SVC, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    info.flags |= service_flags::NEXT_HOP;
    if symmetric {
        info.flags |= service_flags::SYMMETRIC;
    }
    info
}

/// A table spreading flows over the three appliances.
fn spread() -> Vec<u32> {
    (0..TEST_M).map(|i| APPLIANCES[i as usize % APPLIANCES.len()]).collect()
}

/// The next-hop service (L3_DEFAULT: every protocol) on 0.0.0.0/0 and ::/0 with `OWN` exempted,
/// and the VIP service.
fn setup(symmetric: bool) -> Dataplane {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = fixture::register_interfaces(fixture::load());
    dp.set_service(&[next_hop_key(PROTO_ANY)], next_hop_info(symmetric)).unwrap();
    for id in APPLIANCES {
        dp.set_backend(id, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, id as u8)), backend_mac(id), 0)).unwrap();
    }
    dp.write_table(SVC, 0, 0, &spread()).unwrap();
    for prefix in ["0.0.0.0/0", "::/0"] {
        dp.set_next_hop_route(prefix.parse().unwrap(), ROUTE).unwrap();
    }
    dp.set_next_hop_route(IpNet::from(IpAddr::V4(OWN)), NEXT_HOP_UNTOUCHED).unwrap();
    let vip = service_info(VIP_SVC, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&[service_key(VIP.into(), 80, PROTO_TCP)], vip).unwrap();
    dp.set_backend(VIP_BACKEND, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, 9)), backend_mac(VIP_BACKEND), 0))
        .unwrap();
    dp.write_table(VIP_SVC, 0, 0, &uniform(VIP_BACKEND)).unwrap();
    dp
}

/// Client network A and server network B.
fn a(i: u32) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10 + (i / 250) as u8, 1 + (i % 250) as u8)
}
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 20, 5);

fn tcp_frame(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16, flags: u8, from: [u8; 6]) -> Vec<u8> {
    let ip = V4::new(src, dst, PROTO_TCP).build(&tcp4(src, dst, sport, dport, flags, b"data"));
    ethernet(LB_MAC, from, ETH_P_IP, &ip)
}

/// Runs a frame and returns the appliance its destination MAC names; the frame must leave
/// unchanged but for the MACs.
fn appliance_of(dp: &Dataplane, frame: &[u8]) -> u32 {
    let out = dp.run_test(Program::Lb, frame, 0).unwrap();
    assert_eq!(out.action, XDP_TX, "expected the packet to be forwarded");
    assert_eq!(&out.data[6..12], &LB_MAC, "source MAC is the balancer's");
    assert_eq!(&out.data[12..], &frame[12..], "the packet itself is unchanged");
    let id = u32::from(out.data[4]) << 8 | u32::from(out.data[5]);
    assert_eq!(backend_mac(id), out.data[0..6], "unknown destination MAC");
    id
}

/// (forward SYN, reverse SYN-ACK) appliances of flow `i` from A to B:443.
fn both_directions(dp: &Dataplane, i: u32) -> (u32, u32) {
    let port = 20000 + i as u16;
    let there = appliance_of(dp, &tcp_frame(a(i), B, port, 443, TCP_SYN, ROUTER_MAC));
    let back = appliance_of(dp, &tcp_frame(B, a(i), 443, port, TCP_SYN | TCP_ACK, ROUTER_MAC));
    (there, back)
}

#[test]
fn both_directions_of_every_flow_cross_one_appliance_with_symmetric_hashing() {
    let dp = setup(true);
    let mut per_appliance = [0u32; 4];
    for i in 0..300 {
        let (there, back) = both_directions(&dp, i);
        assert_eq!(there, back, "flow {i}: the reply must cross the appliance that saw the SYN");
        per_appliance[there as usize] += 1;
    }
    assert!(per_appliance[1..].iter().all(|&n| n > 50), "flows spread over the appliances: {per_appliance:?}");
    // One entry per flow, shared by both directions: the reply was a hit.
    let s = dp.stats().unwrap();
    assert_eq!((s.get(stat::NEW_FLOW), s.get(stat::CT_HIT)), (300, 300));
}

/// The reverse direction's first packet, on a balancer that never saw the forward one (two
/// balancers, one per direction, with the same appliance set), picks the same appliance: the
/// hash is direction-free, not only the tracking entry.
#[test]
fn a_reply_seen_first_picks_the_appliance_of_the_forward_direction() {
    let dp = setup(true);
    let replies: Vec<u32> = (0..100)
        .map(|i| appliance_of(&dp, &tcp_frame(B, a(i), 443, 20000 + i as u16, TCP_SYN | TCP_ACK, ROUTER_MAC)))
        .collect();
    drop(dp);
    let other = setup(true);
    for (i, reply) in replies.into_iter().enumerate() {
        let i = i as u32;
        let syn = appliance_of(&other, &tcp_frame(a(i), B, 20000 + i as u16, 443, TCP_SYN, ROUTER_MAC));
        assert_eq!(syn, reply, "flow {i}");
    }
}

/// The control: without symmetric hashing the two directions of most flows are hashed apart
/// (with three appliances, about two in three), which is what breaks a stateful appliance.
#[test]
fn without_symmetric_hashing_directions_part() {
    let dp = setup(false);
    let parted = (0..300).filter(|&i| {
        let (there, back) = both_directions(&dp, i);
        there != back
    });
    let parted = parted.count();
    println!("without symmetric hashing, {parted} of 300 flows crossed two appliances");
    assert!(parted > 100, "{parted} of 300");
}

/// The reply keeps the appliance of the flow's entry after the appliance set changes: both
/// directions share one entry.
#[test]
fn the_reverse_direction_keeps_its_appliance_when_the_set_changes() {
    let mut dp = setup(true);
    let first = appliance_of(&dp, &tcp_frame(a(1), B, 30000, 443, TCP_SYN, ROUTER_MAC));
    let other = APPLIANCES.into_iter().find(|&id| id != first).unwrap();
    dp.write_table(SVC, 0, 0, &uniform(other)).unwrap();
    assert_eq!(appliance_of(&dp, &tcp_frame(B, a(1), 443, 30000, TCP_SYN | TCP_ACK, ROUTER_MAC)), first);
    assert_eq!(appliance_of(&dp, &tcp_frame(a(1), B, 30000, 443, TCP_ACK, ROUTER_MAC)), first);
    assert_eq!(appliance_of(&dp, &tcp_frame(a(2), B, 30001, 443, TCP_SYN, ROUTER_MAC)), other, "new flows move");
}

#[test]
fn udp_and_ipv6_are_routed_too() {
    let dp = setup(true);
    let ip = V4::new(a(3), B, PROTO_UDP).build(&udp4(a(3), B, 5353, 53, b"q"));
    let there = appliance_of(&dp, &ethernet(LB_MAC, ROUTER_MAC, ETH_P_IP, &ip));
    let ip = V4::new(B, a(3), PROTO_UDP).build(&udp4(B, a(3), 53, 5353, b"r"));
    assert_eq!(appliance_of(&dp, &ethernet(LB_MAC, ROUTER_MAC, ETH_P_IP, &ip)), there);

    let (c, s) = (Ipv6Addr::new(0x2001, 0xdb8, 10, 0, 0, 0, 0, 5), Ipv6Addr::new(0x2001, 0xdb8, 20, 0, 0, 0, 0, 5));
    let syn = ipv6(c, s, PROTO_TCP, 64, 0, &tcp6(c, s, 40000, 443, TCP_SYN, b"x"));
    let there = appliance_of(&dp, &ethernet(LB_MAC, ROUTER_MAC, ETH_P_IPV6, &syn));
    let reply = ipv6(s, c, PROTO_TCP, 64, 0, &tcp6(s, c, 443, 40000, TCP_SYN | TCP_ACK, b"x"));
    assert_eq!(appliance_of(&dp, &ethernet(LB_MAC, ROUTER_MAC, ETH_P_IPV6, &reply)), there);
}

/// A VIP service wins over a routed prefix that holds its VIP; an exempted address, and a
/// destination outside every routed prefix, pass to the host untouched (each counted).
#[test]
fn vips_win_and_exempted_or_unrouted_destinations_pass() {
    let mut dp = setup(true);
    assert_eq!(appliance_of(&dp, &tcp_frame(a(1), VIP, 40000, 80, TCP_SYN, ROUTER_MAC)), VIP_BACKEND);

    let own = tcp_frame(a(1), OWN, 40000, 179, TCP_SYN, ROUTER_MAC);
    assert_eq!(dp.run_test(Program::Lb, &own, 0).unwrap().action, XDP_PASS);
    assert_eq!(dp.stats().unwrap().get(stat::PASS_NEXT_HOP_NO_SERVICE), 1);

    dp.remove_next_hop_route("0.0.0.0/0".parse().unwrap()).unwrap();
    let routes: Vec<String> = dp.next_hop_routes().unwrap().iter().map(|(p, r)| format!("{p}={r}")).collect();
    assert_eq!(routes, ["198.18.0.1/32=0", "::/0=7"], "{routes:?}");
    let unrouted = tcp_frame(a(1), B, 40001, 443, TCP_SYN, ROUTER_MAC);
    assert_eq!(dp.run_test(Program::Lb, &unrouted, 0).unwrap().action, XDP_PASS);
    assert_eq!(dp.stats().unwrap().get(stat::PASS_NOT_VIP), 1);
}

/// An appliance whose route to B points back at the balancer sends the packet back: it arrives
/// from the MAC the balancer would send it to, and is dropped and counted instead of returned
/// to the appliance again and again.
#[test]
fn a_packet_an_appliance_routes_back_is_dropped_as_a_loop() {
    let dp = setup(true);
    let syn = tcp_frame(a(1), B, 40000, 443, TCP_SYN, ROUTER_MAC);
    let appliance = appliance_of(&dp, &syn);
    let back = tcp_frame(a(1), B, 40000, 443, TCP_SYN, backend_mac(appliance));
    assert_eq!(dp.run_test(Program::Lb, &back, 0).unwrap().action, XDP_DROP);
    assert_eq!(dp.stats().unwrap().get(stat::DROP_LOOP), 1);
    // The router's next packet of the flow still goes through.
    assert_eq!(appliance_of(&dp, &tcp_frame(a(1), B, 40000, 443, TCP_ACK, ROUTER_MAC)), appliance);
}

/// A next-hop service limited to interfaces (`ForwardParams::ingress`) takes packets from those
/// only; from another, the packet passes to the host (counted).
#[test]
fn a_service_limited_to_interfaces_takes_only_their_packets() {
    let mut dp = setup(true);
    // The test runs arrive on `lo` (ifindex 1), where the fixture registered the balancer's MAC.
    for (ingress, taken) in [([1, 0, 0, 0], true), ([7, 1, 0, 0], true), ([u32::MAX, 0, 0, 0], false)] {
        let mut info = next_hop_info(true);
        info.forward_params.ingress = ingress;
        dp.set_service(&[next_hop_key(PROTO_ANY)], info).unwrap();
        let syn = tcp_frame(a(1), B, 40000, 443, TCP_SYN, ROUTER_MAC);
        let before = dp.stats().unwrap().get(stat::PASS_NEXT_HOP_NO_SERVICE);
        let out = dp.run_test(Program::Lb, &syn, 0).unwrap();
        assert_eq!(out.action == XDP_TX, taken, "ingress {ingress:?}");
        let passed = dp.stats().unwrap().get(stat::PASS_NEXT_HOP_NO_SERVICE) - before;
        assert_eq!(passed, u64::from(!taken), "ingress {ingress:?}");
    }
}
