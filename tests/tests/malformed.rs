//! Parser verdicts: non-VIP traffic passes untouched; VIP traffic that is truncated or
//! malformed is dropped and counted by reason; IPv4 options and IPv6 extension headers are
//! honoured; every fragment of a datagram reaches the backend its 3-tuple hashes to.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::hash::maglev_slot;
use lb_common::maps::{affinity, forwarding, stat, tracking, PROTO_TCP, PROTO_UDP};
use lb_tests::fixture::{self, backend, backend_mac, predicted_hash, service_info, service_key, TEST_M};
use lb_tests::packet::*;
use lb_user::dataplane::{Dataplane, Program, XDP_DROP, XDP_PASS, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// Serves only TCP port 80: fragments to it have no all-ports service.
const VIP_TCP80: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);

/// Table entry i -> backend 1 + i % 4, so that the hashed fields matter.
fn spread_table() -> Vec<u32> {
    (0..TEST_M).map(|i| 1 + i % 4).collect()
}

/// DSR services: VIP and VIP6 for TCP:80 and all UDP ports; VIP_TCP80 for TCP:80 only.
fn setup() -> Dataplane {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = fixture::load();
    let info = service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(
        &[
            service_key(VIP.into(), 80, PROTO_TCP),
            service_key(VIP.into(), 0, PROTO_UDP),
            service_key(VIP6.into(), 80, PROTO_TCP),
            service_key(VIP6.into(), 0, PROTO_UDP),
            service_key(VIP_TCP80.into(), 80, PROTO_TCP),
        ],
        info,
    )
    .unwrap();
    for id in 1..=4 {
        dp.set_backend(id, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, id as u8)), backend_mac(id), 0)).unwrap();
    }
    dp.write_table(1, 0, 0, &spread_table()).unwrap();
    dp
}

/// Asserts a drop counted under `reason` (and only there).
fn assert_dropped(dp: &Dataplane, frame: &[u8], reason: u32) {
    let before = dp.stats().unwrap();
    let out = dp.run_test(Program::Lb, frame, 0).unwrap();
    assert_eq!(out.action, XDP_DROP, "expected a drop counted as {}", stat::NAMES[reason as usize]);
    let after = dp.stats().unwrap();
    for i in stat::DROP_TRUNCATED_ETH..=stat::DROP_UNROUTABLE {
        let want = u64::from(i == reason);
        assert_eq!(after.get(i) - before.get(i), want, "counter {}", stat::NAMES[i as usize]);
    }
}

fn assert_passed(dp: &Dataplane, frame: &[u8]) {
    let before = dp.stats().unwrap().get(stat::PASS_NOT_VIP);
    let out = dp.run_test(Program::Lb, frame, 0).unwrap();
    assert_eq!(out.action, XDP_PASS);
    assert_eq!(out.data, frame, "passed packets are untouched");
    assert_eq!(dp.stats().unwrap().get(stat::PASS_NOT_VIP), before + 1);
}

fn eth4(ip: &[u8]) -> Vec<u8> {
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, ip)
}

fn eth6(ip: &[u8]) -> Vec<u8> {
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, ip)
}

fn forwarded_to(dp: &Dataplane, frame: &[u8]) -> u32 {
    let out = dp.run_test(Program::Lb, frame, 0).unwrap();
    assert_eq!(out.action, XDP_TX);
    u32::from(out.data[5])
}

fn tcp_syn4(dst: Ipv4Addr) -> Vec<u8> {
    V4::new(CLIENT, dst, PROTO_TCP).build(&tcp4(CLIENT, dst, 40000, 80, TCP_SYN, b"payload"))
}

#[test]
fn non_vip_traffic_passes_untouched() {
    let dp = setup();
    let other = Ipv4Addr::new(198, 18, 0, 200);
    assert_passed(&dp, &eth4(&tcp_syn4(other)));
    let other6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x200);
    assert_passed(&dp, &eth6(&ipv6(CLIENT6, other6, PROTO_TCP, 64, 0, &tcp6(CLIENT6, other6, 1, 80, TCP_SYN, b""))));
    // ARP.
    assert_passed(&dp, &ethernet([0xff; 6], CLIENT_MAC, 0x0806, &[0u8; 28]));
    // A VIP address, but a port no service listens on.
    let ip = V4::new(CLIENT, VIP, PROTO_TCP).build(&tcp4(CLIENT, VIP, 40000, 22, TCP_SYN, b""));
    assert_passed(&dp, &eth4(&ip));
    // Malformed, but not for us: still the stack's business.
    let mut bad = tcp_syn4(other);
    bad[0] = 0x44;
    assert_passed(&dp, &eth4(&bad));
}

#[test]
fn truncated_ethernet_is_dropped() {
    let dp = setup();
    // BPF_PROG_TEST_RUN refuses frames shorter than an Ethernet header (EINVAL), as no NIC
    // delivers them; the shortest truncation it can feed is a cut 802.1Q tag.
    assert!(dp.run_test(Program::Lb, &eth4(&[])[..10], 0).is_err());
    let tagged = ethernet_vlan(LB_MAC, CLIENT_MAC, 5, ETH_P_IP, &tcp_syn4(VIP));
    assert_dropped(&dp, &tagged[..16], stat::DROP_TRUNCATED_ETH);
}

#[test]
fn truncated_ipv4_is_dropped() {
    let dp = setup();
    let frame = eth4(&tcp_syn4(VIP));
    assert_dropped(&dp, &frame[..14 + 12], stat::DROP_TRUNCATED_IP);
    // Header complete, datagram shorter than its total length.
    assert_dropped(&dp, &frame[..frame.len() - 3], stat::DROP_TRUNCATED_IP);
}

#[test]
fn bad_ihl_and_version_are_dropped() {
    let dp = setup();
    let ip = tcp_syn4(VIP);
    for first in [0x44u8, 0x40, 0x4f, 0x55] {
        let mut bad = ip.clone();
        bad[0] = first; // IHL 4 / 0 < 5; IHL 15 > total length 47; version 5
        if first == 0x4f {
            bad[2..4].copy_from_slice(&40u16.to_be_bytes());
        }
        assert_dropped(&dp, &eth4(&bad), stat::DROP_BAD_IP_HEADER);
    }
}

#[test]
fn truncated_l4_is_dropped() {
    let dp = setup();
    // TCP header of 10 bytes (datagram length says so too).
    let tcp = tcp4(CLIENT, VIP, 40000, 80, TCP_SYN, b"");
    assert_dropped(&dp, &eth4(&V4::new(CLIENT, VIP, PROTO_TCP).build(&tcp[..10])), stat::DROP_TRUNCATED_L4);
    // TCP data offset beyond the datagram.
    let mut long_doff = tcp.clone();
    long_doff[12] = 15 << 4;
    assert_dropped(&dp, &eth4(&V4::new(CLIENT, VIP, PROTO_TCP).build(&long_doff)), stat::DROP_TRUNCATED_L4);
    // UDP header of 4 bytes.
    let udp = udp4(CLIENT, VIP, 1, 53, b"");
    assert_dropped(&dp, &eth4(&V4::new(CLIENT, VIP, PROTO_UDP).build(&udp[..4])), stat::DROP_TRUNCATED_L4);
    // IPv6 TCP of 12 bytes.
    let t6 = tcp6(CLIENT6, VIP6, 40000, 80, TCP_SYN, b"");
    assert_dropped(&dp, &eth6(&ipv6(CLIENT6, VIP6, PROTO_TCP, 64, 0, &t6[..12])), stat::DROP_TRUNCATED_L4);
}

#[test]
fn ipv4_options_are_honoured() {
    let dp = setup();
    let mut ip = V4::new(CLIENT, VIP, PROTO_TCP);
    ip.options = vec![0x01; 36]; // NOPs to the maximum IHL of 15
    let pkt = ip.build(&tcp4(CLIENT, VIP, 40000, 80, TCP_SYN, b"opts"));
    let h = predicted_hash(affinity::NONE, CLIENT.into(), VIP.into(), 40000, 80, PROTO_TCP, true);
    assert_eq!(forwarded_to(&dp, &eth4(&pkt)), spread_table()[maglev_slot(h, TEST_M) as usize]);
}

#[test]
fn ipv4_fragments_all_reach_the_three_tuple_backend() {
    let dp = setup();
    let want = spread_table()[maglev_slot(
        predicted_hash(affinity::NONE, CLIENT.into(), VIP.into(), 0, 0, PROTO_UDP, false),
        TEST_M,
    ) as usize];
    let udp = udp4(CLIENT, VIP, 5000, 53, &[7u8; 40]);
    let mut first = V4::new(CLIENT, VIP, PROTO_UDP);
    first.frag = 0x2000; // MF, offset 0
    let mut last = V4::new(CLIENT, VIP, PROTO_UDP);
    last.frag = 3; // offset 24 bytes, no MF
    assert_eq!(forwarded_to(&dp, &eth4(&first.build(&udp[..24]))), want);
    assert_eq!(forwarded_to(&dp, &eth4(&last.build(&udp[24..]))), want);
    // Later fragments carry no ports: a TCP:80-only VIP has no service for them. They pass,
    // untouched, counted as fragments.
    let mut frag = V4::new(CLIENT, VIP_TCP80, PROTO_TCP);
    frag.frag = 10;
    let frame = eth4(&frag.build(&[0u8; 16]));
    let before = dp.stats().unwrap().get(stat::PASS_FRAGMENT);
    let out = dp.run_test(Program::Lb, &frame, 0).unwrap();
    assert_eq!((out.action, out.data), (XDP_PASS, frame));
    assert_eq!(dp.stats().unwrap().get(stat::PASS_FRAGMENT), before + 1);
}

#[test]
fn truncated_and_malformed_ipv6_is_dropped() {
    let dp = setup();
    let pkt = ipv6(CLIENT6, VIP6, PROTO_TCP, 64, 0, &tcp6(CLIENT6, VIP6, 40000, 80, TCP_SYN, b"v6"));
    let frame = eth6(&pkt);
    assert_dropped(&dp, &frame[..14 + 30], stat::DROP_TRUNCATED_IP);
    assert_dropped(&dp, &frame[..frame.len() - 1], stat::DROP_TRUNCATED_IP);
    // Payload length 0 (jumbogram) and a wrong version.
    let mut jumbo = pkt.clone();
    jumbo[4..6].copy_from_slice(&[0, 0]);
    assert_dropped(&dp, &eth6(&jumbo), stat::DROP_BAD_IP_HEADER);
    let mut v5 = pkt.clone();
    v5[0] = 0x50;
    assert_dropped(&dp, &eth6(&v5), stat::DROP_BAD_IP_HEADER);
    // An extension header longer than the payload.
    let ext = ext_header(PROTO_TCP, 1, &[]);
    let mut long_ext = ext.clone();
    long_ext[1] = 5;
    assert_dropped(&dp, &eth6(&ipv6(CLIENT6, VIP6, 60, 64, 0, &long_ext)), stat::DROP_TRUNCATED_IP);
    // Seven destination-options headers: more than the parser walks.
    let mut chain = tcp6(CLIENT6, VIP6, 40000, 80, TCP_SYN, b"");
    chain = ext_header(PROTO_TCP, 1, &chain);
    for _ in 0..6 {
        chain = ext_header(60, 1, &chain);
    }
    assert_dropped(&dp, &eth6(&ipv6(CLIENT6, VIP6, 60, 64, 0, &chain)), stat::DROP_BAD_IP_HEADER);
}

/// Extension headers after the fragment header are in the first piece only; later pieces
/// carry data there. Every piece takes the fragment header's next header as its protocol
/// (here 60, destination options), so both reach the same backend of an L3_DEFAULT service.
#[test]
fn ipv6_fragments_with_a_header_after_the_fragment_header_stay_together() {
    let mut dp = setup();
    let vip = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x101);
    let info = service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&[service_key(vip.into(), 0, lb_common::maps::PROTO_ANY)], info).unwrap();
    let want = spread_table()
        [maglev_slot(predicted_hash(affinity::NONE, CLIENT6.into(), vip.into(), 0, 0, 60, false), TEST_M) as usize];
    // Fragmentable part: destination options, then UDP (8 + 8 + 40 bytes), cut at 32.
    let part = ext_header(PROTO_UDP, 1, &udp6(CLIENT6, vip, 5000, 53, &[9u8; 40]));
    let first = ipv6(CLIENT6, vip, 44, 64, 0, &frag_header(60, 0, true, 78, &part[..32]));
    let last = ipv6(CLIENT6, vip, 44, 64, 0, &frag_header(60, 4, false, 78, &part[32..]));
    assert_eq!(forwarded_to(&dp, &eth6(&first)), want);
    assert_eq!(forwarded_to(&dp, &eth6(&last)), want);
}

#[test]
fn ipv6_fragments_all_reach_the_three_tuple_backend() {
    let dp = setup();
    let want = spread_table()[maglev_slot(
        predicted_hash(affinity::NONE, CLIENT6.into(), VIP6.into(), 0, 0, PROTO_UDP, false),
        TEST_M,
    ) as usize];
    let udp = udp6(CLIENT6, VIP6, 5000, 53, &[9u8; 40]);
    let first = ipv6(CLIENT6, VIP6, 0, 64, 0, &ext_header(44, 1, &frag_header(PROTO_UDP, 0, true, 77, &udp[..24])));
    let last = ipv6(CLIENT6, VIP6, 44, 64, 0, &frag_header(PROTO_UDP, 3, false, 77, &udp[24..]));
    assert_eq!(forwarded_to(&dp, &eth6(&first)), want);
    assert_eq!(forwarded_to(&dp, &eth6(&last)), want);
    // An unfragmented datagram of the same flow hashes its 5-tuple.
    let whole = ipv6(CLIENT6, VIP6, PROTO_UDP, 64, 0, &udp);
    let h5 = predicted_hash(affinity::NONE, CLIENT6.into(), VIP6.into(), 5000, 53, PROTO_UDP, true);
    assert_eq!(forwarded_to(&dp, &eth6(&whole)), spread_table()[maglev_slot(h5, TEST_M) as usize]);
}
