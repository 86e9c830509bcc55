//! IPv4 IPIP and IPv6 IP6IP6 forwarding fixtures through BPF_PROG_TEST_RUN: exact output bytes
//! (outer header, checksum, TTL/hop limit, next-hop MACs from bpf_fib_lookup), XDP_TX versus
//! XDP_REDIRECT, hash-varied outer source, VLAN input, and counters.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::maps::{affinity, forwarding, stat, tracking, PROTO_TCP, PROTO_UDP};
use lb_tests::fixture::{self, backend, predicted_hash, service_info, service_key, uniform};
use lb_tests::fixture_net::{in_netns, GW2_MAC, GW_MAC, LB2_MAC, LB_MAC};
use lb_tests::packet::*;
use lb_user::dataplane::{addr_words, Dataplane, Program, XDP_REDIRECT, XDP_TX};

const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const VIP4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const ENCAP_SRC4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const NEAR4: Ipv4Addr = Ipv4Addr::new(198, 19, 10, 3);
const FAR4: Ipv4Addr = Ipv4Addr::new(198, 19, 20, 7);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
const ENCAP_SRC6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const NEAR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 3);
const FAR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 7);

const SVC: u32 = 1;
const B_NEAR: u32 = 3;
const B_FAR: u32 = 7;

/// Services: VIP4:80/TCP, VIP4:53/UDP (backend NEAR4), VIP4:8080/TCP (backend FAR4), and the
/// same on VIP6, all IPIP with a fixed outer source.
fn setup(dp: &mut Dataplane, encap_mask: u32) {
    let mut info = service_info(SVC, affinity::NONE, tracking::PER_CONNECTION, forwarding::IPIP);
    info.encap_src = addr_words(IpAddr::V4(ENCAP_SRC4)).0;
    info.encap_src_hash_mask = encap_mask;
    let mut far = info;
    far.id = 2;
    dp.set_service(&[service_key(VIP4.into(), 80, PROTO_TCP), service_key(VIP4.into(), 53, PROTO_UDP)], info).unwrap();
    dp.set_service(&[service_key(VIP4.into(), 8080, PROTO_TCP)], far).unwrap();
    let mut info6 = info;
    info6.id = 3;
    info6.encap_src = addr_words(IpAddr::V6(ENCAP_SRC6)).0;
    let mut far6 = info6;
    far6.id = 4;
    dp.set_service(&[service_key(VIP6.into(), 80, PROTO_TCP), service_key(VIP6.into(), 53, PROTO_UDP)], info6).unwrap();
    dp.set_service(&[service_key(VIP6.into(), 8080, PROTO_TCP)], far6).unwrap();
    dp.set_backend(B_NEAR, backend(NEAR4.into(), [0; 6], 0)).unwrap();
    dp.set_backend(B_FAR, backend(FAR4.into(), [0; 6], 0)).unwrap();
    dp.set_backend(13, backend(NEAR6.into(), [0; 6], 0)).unwrap();
    dp.set_backend(17, backend(FAR6.into(), [0; 6], 0)).unwrap();
    dp.write_table(SVC, 0, 0, &uniform(B_NEAR)).unwrap();
    dp.write_table(2, 0, 0, &uniform(B_FAR)).unwrap();
    dp.write_table(3, 0, 0, &uniform(13)).unwrap();
    dp.write_table(4, 0, 0, &uniform(17)).unwrap();
}

fn client_tcp4(dport: u16, flags: u8, tos: u8) -> (Vec<u8>, Vec<u8>) {
    let mut ip = V4::new(CLIENT4, VIP4, PROTO_TCP);
    ip.tos = tos;
    let inner = ip.build(&tcp4(CLIENT4, VIP4, 40000, dport, flags, b"hello"));
    (ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &inner), inner)
}

#[test]
fn ipv4_tcp_syn_to_vip_is_ipip_encapsulated_and_sent_back_out() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let (frame, inner) = client_tcp4(80, TCP_SYN, 0xb8);
        let out = dp.run_test(Program::Lb, &frame, topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_TX);
        let want = expected_ipip(GW_MAC, LB_MAC, ENCAP_SRC4, NEAR4, &inner);
        assert_eq!(out.data, want);
        assert!(ipv4_checksum_ok(&out.data[14..]));
        assert_eq!(out.data[14 + 8], 64, "outer TTL");
        assert_eq!(out.data[14 + 20 + 8], 64, "inner TTL untouched");
        let s = dp.stats().unwrap();
        assert_eq!(s.get(stat::TX), 1);
        assert_eq!(s.get(stat::NEW_FLOW), 1);
        let c = s.class(SVC, 0);
        assert_eq!((c.packets, c.bytes, c.new_flows), (1, frame.len() as u64, 1));
    });
}

#[test]
fn ipv4_udp_to_vip_is_ipip_encapsulated() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let inner = V4::new(CLIENT4, VIP4, PROTO_UDP).build(&udp4(CLIENT4, VIP4, 5353, 53, b"query"));
        let frame = ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &inner);
        let out = dp.run_test(Program::Lb, &frame, topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_TX);
        assert_eq!(out.data, expected_ipip(GW_MAC, LB_MAC, ENCAP_SRC4, NEAR4, &inner));
        assert!(ipv4_checksum_ok(&out.data[14..]));
        // DF clear: the outer datagram may be fragmented on the way, and carries the client's
        // identification (each datagram its own), not a constant.
        let mut ip = V4::new(CLIENT4, VIP4, PROTO_UDP);
        (ip.frag, ip.id) = (0, 0xbeef);
        let inner = ip.build(&udp4(CLIENT4, VIP4, 5353, 53, b"query"));
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &inner), topo.lbv0).unwrap();
        assert_eq!(out.data, expected_ipip(GW_MAC, LB_MAC, ENCAP_SRC4, NEAR4, &inner));
        assert_eq!((&out.data[14 + 4..14 + 8], ipv4_checksum_ok(&out.data[14..])), (&[0xbe, 0xef, 0, 0][..], true));
    });
}

#[test]
fn ipv4_route_via_other_device_is_redirected() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let (frame, inner) = client_tcp4(8080, TCP_ACK, 0);
        let out = dp.run_test(Program::Lb, &frame, topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_REDIRECT);
        assert_eq!(out.data, expected_ipip(GW2_MAC, LB2_MAC, ENCAP_SRC4, FAR4, &inner));
        assert_eq!(dp.stats().unwrap().get(stat::REDIRECT), 1);
    });
}

#[test]
fn ipv4_outer_source_varies_by_flow_hash_within_prefix() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0xff);
        let mut seen = std::collections::HashSet::new();
        for sport in 40000..40016u16 {
            let inner = V4::new(CLIENT4, VIP4, PROTO_TCP).build(&tcp4(CLIENT4, VIP4, sport, 80, TCP_SYN, b""));
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &inner), topo.lbv0).unwrap();
            let h = predicted_hash(affinity::NONE, CLIENT4.into(), VIP4.into(), sport, 80, PROTO_TCP, true);
            let src = Ipv4Addr::new(198, 18, 0, (h & 0xff) as u8);
            assert_eq!(out.data, expected_ipip(GW_MAC, LB_MAC, src, NEAR4, &inner));
            seen.insert(src);
            // The next packet hits the entry, which carries the flow hash: same outer source.
            let ack = V4::new(CLIENT4, VIP4, PROTO_TCP).build(&tcp4(CLIENT4, VIP4, sport, 80, TCP_ACK, b"a"));
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ack), topo.lbv0).unwrap();
            assert_eq!(out.data, expected_ipip(GW_MAC, LB_MAC, src, NEAR4, &ack));
        }
        assert!(seen.len() > 1, "outer sources should spread over the prefix");
    });
}

#[test]
fn ipv4_vlan_tagged_input_is_encapsulated_untagged() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let inner = V4::new(CLIENT4, VIP4, PROTO_TCP).build(&tcp4(CLIENT4, VIP4, 40000, 80, TCP_SYN, b"x"));
        let frame = ethernet_vlan(LB_MAC, CLIENT_MAC, 42, ETH_P_IP, &inner);
        let out = dp.run_test(Program::Lb, &frame, topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_TX);
        assert_eq!(out.data, expected_ipip(GW_MAC, LB_MAC, ENCAP_SRC4, NEAR4, &inner));
    });
}

#[test]
fn ipv4_with_options_is_forwarded_with_options_intact() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let mut ip = V4::new(CLIENT4, VIP4, PROTO_TCP);
        // Router alert (4 bytes) + NOP, NOP, NOP, EOL: IHL 7.
        ip.options = vec![0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00];
        let inner = ip.build(&tcp4(CLIENT4, VIP4, 40000, 80, TCP_SYN, b"opt"));
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &inner), topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_TX);
        assert_eq!(out.data, expected_ipip(GW_MAC, LB_MAC, ENCAP_SRC4, NEAR4, &inner));
    });
}

fn expected_ip6ip6(dmac: [u8; 6], smac: [u8; 6], dst: Ipv6Addr, inner: &[u8], hash: u32) -> Vec<u8> {
    let tclass = ((inner[0] & 0x0f) << 4) | (inner[1] >> 4);
    let mut outer = ipv6(ENCAP_SRC6, dst, 41, 64, tclass, inner);
    let flow = hash & 0xf_ffff;
    outer[1] |= (flow >> 16) as u8;
    outer[2] = (flow >> 8) as u8;
    outer[3] = flow as u8;
    ethernet(dmac, smac, ETH_P_IPV6, &outer)
}

#[test]
fn ipv6_tcp_to_vip_is_ip6ip6_encapsulated() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let inner = ipv6(CLIENT6, VIP6, PROTO_TCP, 1, 0x28, &tcp6(CLIENT6, VIP6, 40000, 80, TCP_SYN, b"hello6"));
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, &inner), topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_TX);
        let h = predicted_hash(affinity::NONE, CLIENT6.into(), VIP6.into(), 40000, 80, PROTO_TCP, true);
        assert_eq!(out.data, expected_ip6ip6(GW_MAC, LB_MAC, NEAR6, &inner, h));
        assert_eq!(out.data[14 + 7], 64, "outer hop limit");
        assert_eq!(out.data[14 + 40 + 7], 1, "inner hop limit untouched");
        // A conntrack hit takes the flow label from the entry's stored hash: the same label.
        let ack = ipv6(CLIENT6, VIP6, PROTO_TCP, 1, 0x28, &tcp6(CLIENT6, VIP6, 40000, 80, TCP_ACK, b"more"));
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, &ack), topo.lbv0).unwrap();
        assert_eq!(out.data, expected_ip6ip6(GW_MAC, LB_MAC, NEAR6, &ack, h));
        assert_eq!(dp.stats().unwrap().get(stat::CT_HIT), 1);
    });
}

/// An untagged IPv6 TCP or UDP frame of 74 bytes or more takes the data plane's fast IPv6
/// parser, a tagged one its full parser: both must make the same packet of it (tuple, SYN bit,
/// traffic class, length), so the same encapsulation comes out. The SYN bit is told apart by a
/// backend gone unhealthy: a SYN then selects again (a new flow), any other packet of the flow
/// would be rerouted (`ct_rerouted_unhealthy`) or kept (a hit).
#[test]
fn ipv6_vlan_tagged_input_is_encapsulated_as_untagged_input() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let tcp = ipv6(CLIENT6, VIP6, PROTO_TCP, 9, 0x28, &tcp6(CLIENT6, VIP6, 40001, 80, TCP_SYN, b"tagged"));
        // 16 bytes of payload: 78 bytes in all, long enough for the fast parser.
        let udp = ipv6(CLIENT6, VIP6, PROTO_UDP, 9, 0xb8, &udp6(CLIENT6, VIP6, 40002, 53, &[7; 16]));
        let tagged = |inner: &[u8]| ethernet_vlan(LB_MAC, CLIENT_MAC, 42, ETH_P_IPV6, inner);
        let untagged = |inner: &[u8]| ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, inner);
        let want = |inner: &[u8], sport, dport, proto| {
            let h = predicted_hash(affinity::NONE, CLIENT6.into(), VIP6.into(), sport, dport, proto, true);
            expected_ip6ip6(GW_MAC, LB_MAC, NEAR6, inner, h)
        };
        let send = |dp: &Dataplane, frame: &[u8], want: &[u8], what: &str| {
            let out = dp.run_test(Program::Lb, frame, topo.lbv0).unwrap();
            assert_eq!(out.action, XDP_TX, "{what}");
            assert_eq!(out.data, want, "{what}");
        };
        let (want_tcp, want_udp) = (want(&tcp, 40001, 80, PROTO_TCP), want(&udp, 40002, 53, PROTO_UDP));
        // UDP: the first datagram makes the entry, the second hits it.
        send(&dp, &tagged(&udp), &want_udp, "tagged UDP");
        send(&dp, &untagged(&udp), &want_udp, "untagged UDP");
        // TCP: the SYN makes the entry; a second SYN keeps it (its backend is healthy).
        send(&dp, &tagged(&tcp), &want_tcp, "tagged SYN");
        send(&dp, &untagged(&tcp), &want_tcp, "untagged SYN, healthy backend");
        let stats = dp.stats().unwrap();
        assert_eq!((stats.get(stat::NEW_FLOW), stats.get(stat::CT_HIT)), (2, 2));
        // Unhealthy: each parser's SYN selects again (the table still names the one backend).
        dp.set_backend_state(13, 0, 0).unwrap();
        send(&dp, &untagged(&tcp), &want_tcp, "untagged SYN, unhealthy backend");
        send(&dp, &tagged(&tcp), &want_tcp, "tagged SYN, unhealthy backend");
        let stats = dp.stats().unwrap();
        assert_eq!((stats.get(stat::NEW_FLOW), stats.get(stat::CT_HIT)), (4, 2));
        assert_eq!(stats.get(stat::CT_REROUTED_UNHEALTHY), 0);
    });
}

#[test]
fn ipv6_udp_to_vip_is_ip6ip6_encapsulated() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let inner = ipv6(CLIENT6, VIP6, PROTO_UDP, 64, 0, &udp6(CLIENT6, VIP6, 5353, 53, b"q6"));
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, &inner), topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_TX);
        let h = predicted_hash(affinity::NONE, CLIENT6.into(), VIP6.into(), 5353, 53, PROTO_UDP, true);
        assert_eq!(out.data, expected_ip6ip6(GW_MAC, LB_MAC, NEAR6, &inner, h));
    });
}

#[test]
fn ipv6_with_extension_headers_is_forwarded_and_redirected() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        // Hop-by-hop -> destination options -> routing -> TCP to port 8080 (backend FAR6).
        let tcp = tcp6(CLIENT6, VIP6, 40000, 8080, TCP_ACK, b"ext");
        let payload = ext_header(60, 1, &ext_header(43, 2, &ext_header(PROTO_TCP, 1, &tcp)));
        let inner = ipv6(CLIENT6, VIP6, 0, 64, 0, &payload);
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, &inner), topo.lbv0).unwrap();
        assert_eq!(out.action, XDP_REDIRECT);
        let h = predicted_hash(affinity::NONE, CLIENT6.into(), VIP6.into(), 40000, 8080, PROTO_TCP, true);
        assert_eq!(out.data, expected_ip6ip6(GW2_MAC, LB2_MAC, FAR6, &inner, h));
    });
}

/// Metrics per backend: `BACKEND_STATS` counts each forwarded packet (new flow or hit) for the
/// backend it went to; the id handed to another backend starts from zero, a state change does
/// not reset it.
#[test]
fn backend_counters_count_per_backend_and_restart_when_the_id_changes_hands() {
    in_netns(|topo| {
        let mut dp = fixture::load();
        setup(&mut dp, 0);
        let (syn, _) = client_tcp4(80, TCP_SYN, 0);
        let (ack, _) = client_tcp4(80, TCP_ACK, 0);
        for frame in [&syn, &ack, &ack] {
            assert_eq!(dp.run_test(Program::Lb, frame, topo.lbv0).unwrap().action, XDP_TX);
        }
        let near = dp.backend_stats(B_NEAR).unwrap();
        assert_eq!((near.packets, near.bytes, near.new_flows), (3, (syn.len() + 2 * ack.len()) as u64, 1));
        assert_eq!(dp.backend_stats(B_FAR).unwrap(), Default::default());
        // Health and drain changes keep the counts.
        dp.set_backend_state(B_NEAR, 0, 0).unwrap();
        assert_eq!(dp.backend_stats(B_NEAR).unwrap(), near);
        // The id goes to another backend (next generation): its series starts at zero.
        let mut other = backend(FAR4.into(), [0; 6], 0);
        other.generation = 1;
        dp.set_backend(B_NEAR, other).unwrap();
        assert_eq!(dp.backend_stats(B_NEAR).unwrap(), Default::default());
    });
}
