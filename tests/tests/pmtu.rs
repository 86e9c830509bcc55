//! Path MTU through BPF_PROG_TEST_RUN: a packet too big for the egress MTU once
//! encapsulated is answered with ICMP "fragmentation needed" / ICMPv6 "packet too big" (exact
//! bytes, checksums, counters), an IPv4 one without DF is dropped as `drop_too_big_no_df`, the ICMP
//! replies are rate-limited per CPU, and a missing neighbour is counted as `drop_no_neigh`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;

use lb_common::maps::{affinity, forwarding, stat, tracking, PROTO_TCP};
use lb_tests::fixture::{self, backend, service_info, service_key, uniform};
use lb_tests::fixture_net::{in_netns, LB_MAC};
use lb_tests::packet::*;
use lb_user::dataplane::{addr_words, Dataplane, Program, XDP_DROP, XDP_TX};

const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const BACKEND_MAC: [u8; 6] = [0x02, 0xbe, 0, 0, 0, 0x07];
const CLIENT4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const VIP4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
/// Behind the gateway on lbv0 (MTU 1500), and behind lbv2.
const NEAR4: Ipv4Addr = Ipv4Addr::new(198, 19, 10, 3);
const NEAR6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 3);
const FAR4: Ipv4Addr = Ipv4Addr::new(198, 19, 20, 7);

/// The object, with VIP4:80 and VIP6:80 IPIP / IP6IP6 to NEAR4 / NEAR6, VIP4:81 L2 DSR to FAR4.
fn loaded() -> Dataplane {
    let mut dp = fixture::load();
    let mut info = service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::IPIP);
    info.encap_src = addr_words(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1))).0;
    dp.set_service(&[service_key(VIP4.into(), 80, PROTO_TCP)], info).unwrap();
    let mut info6 = info;
    info6.id = 2;
    info6.encap_src = addr_words(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1))).0;
    dp.set_service(&[service_key(VIP6.into(), 80, PROTO_TCP)], info6).unwrap();
    let l2 = service_info(3, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&[service_key(VIP4.into(), 81, PROTO_TCP)], l2).unwrap();
    dp.set_backend(3, backend(NEAR4.into(), [0; 6], 0)).unwrap();
    dp.set_backend(13, backend(NEAR6.into(), [0; 6], 0)).unwrap();
    dp.set_backend(7, backend(FAR4.into(), BACKEND_MAC, 0)).unwrap();
    dp.write_table(1, 0, 0, &uniform(3)).unwrap();
    dp.write_table(2, 0, 0, &uniform(13)).unwrap();
    dp.write_table(3, 0, 0, &uniform(7)).unwrap();
    dp
}

/// A TCP segment from the client to VIP4:`dport` whose datagram is `len` bytes, DF as given.
fn big4(dport: u16, len: usize, df: bool) -> Vec<u8> {
    let payload = vec![0x5a; len - 40];
    let mut ip = V4::new(CLIENT4, VIP4, PROTO_TCP);
    ip.frag = if df { 0x4000 } else { 0 };
    ip.build(&tcp4(CLIENT4, VIP4, 40000, dport, TCP_ACK, &payload))
}

fn big6(len: usize) -> Vec<u8> {
    let payload = vec![0x6b; len - 60];
    ipv6(CLIENT6, VIP6, PROTO_TCP, 64, 0, &tcp6(CLIENT6, VIP6, 40000, 80, TCP_ACK, &payload))
}

/// The ICMP "fragmentation needed" the balancer must send for `inner`, built independently:
/// from the VIP to the client, TOS 0xc0, identification 0, no DF, TTL 64, quoting 68 bytes.
fn expected_frag_needed(inner: &[u8], mtu: u16) -> Vec<u8> {
    let mut icmp = vec![3, 4, 0, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(&inner[..68]);
    let c = checksum(&icmp);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    let mut ip = V4::new(VIP4, CLIENT4, 1);
    (ip.tos, ip.id, ip.frag) = (0xc0, 0, 0);
    ethernet(CLIENT_MAC, LB_MAC, ETH_P_IP, &ip.build(&icmp))
}

/// The ICMPv6 "packet too big": from the VIP to the client, hop limit 64, quoting as much of
/// `inner` as fits in 1280 bytes.
fn expected_packet_too_big(inner: &[u8], mtu: u32) -> Vec<u8> {
    let mut icmp = vec![2, 0, 0, 0];
    icmp.extend_from_slice(&mtu.to_be_bytes());
    icmp.extend_from_slice(&inner[..1280 - 48]);
    let mut sum = Vec::new();
    sum.extend_from_slice(&VIP6.octets());
    sum.extend_from_slice(&CLIENT6.octets());
    sum.extend_from_slice(&(icmp.len() as u32).to_be_bytes());
    sum.extend_from_slice(&[0, 0, 0, 58]);
    sum.extend_from_slice(&icmp);
    let c = checksum(&sum);
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    ethernet(CLIENT_MAC, LB_MAC, ETH_P_IPV6, &ipv6(VIP6, CLIENT6, 58, 64, 0, &icmp))
}

fn send(dp: &mut Dataplane, ethertype: u16, inner: &[u8], ifindex: u32) -> lb_user::dataplane::TestOutput {
    dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ethertype, inner), ifindex).unwrap()
}

#[test]
fn ipv4_df_too_big_once_encapsulated_gets_fragmentation_needed() {
    in_netns(|topo| {
        let mut dp = loaded();
        // 1480 bytes fit in 1500 with the outer header: encapsulated as before.
        let fits = big4(80, 1480, true);
        assert_eq!(send(&mut dp, ETH_P_IP, &fits, topo.lbv0).action, XDP_TX);
        // 1481 do not: the client is told to keep to 1500 - 20.
        let inner = big4(80, 1481, true);
        let out = send(&mut dp, ETH_P_IP, &inner, topo.lbv0);
        assert_eq!((out.action, out.data), (XDP_TX, expected_frag_needed(&inner, 1480)));
        let s = dp.stats().unwrap();
        assert_eq!((s.get(stat::ICMP_TOO_BIG_SENT), s.get(stat::DROP_FIB), s.get(stat::DROP_TOO_BIG)), (1, 0, 0));
        // Without DF a router would fragment; XDP cannot: dropped, counted apart.
        let out = send(&mut dp, ETH_P_IP, &big4(80, 1500, false), topo.lbv0);
        assert_eq!(out.action, XDP_DROP);
        let s = dp.stats().unwrap();
        assert_eq!((s.get(stat::ICMP_TOO_BIG_SENT), s.get(stat::DROP_FIB), s.get(stat::DROP_TOO_BIG)), (1, 0, 1));
    });
}

/// IPv4 without DF is the one too-big case no ICMP is due for (a router would fragment), so it
/// has a counter of its own, `drop_too_big_no_df` (part of `drop_too_big`): a no-DF frame moves
/// it, a DF frame does not, whether it is answered, VLAN-tagged or over the ICMP rate limit.
#[test]
fn ipv4_without_df_too_big_is_counted_apart() {
    in_netns(|topo| {
        let mut dp = loaded();
        let counts = |dp: &Dataplane| {
            let s = dp.stats().unwrap();
            (s.get(stat::DROP_TOO_BIG_NO_DF), s.get(stat::DROP_TOO_BIG), s.get(stat::ICMP_TOO_BIG_SENT))
        };
        let (df, no_df) = (big4(80, 1500, true), big4(80, 1500, false));
        assert_eq!(send(&mut dp, ETH_P_IP, &df, topo.lbv0).action, XDP_TX, "DF: answered");
        assert_eq!(counts(&dp), (0, 0, 1));
        let tagged = |ip: &[u8]| ethernet_vlan(LB_MAC, CLIENT_MAC, 7, ETH_P_IP, ip);
        assert_eq!(dp.run_test(Program::Lb, &tagged(&df), topo.lbv0).unwrap().action, XDP_DROP, "DF, tagged");
        assert_eq!(counts(&dp), (0, 1, 1));
        assert_eq!(send(&mut dp, ETH_P_IP, &no_df, topo.lbv0).action, XDP_DROP, "no DF");
        assert_eq!(counts(&dp), (1, 2, 1));
        assert_eq!(dp.run_test(Program::Lb, &tagged(&no_df), topo.lbv0).unwrap().action, XDP_DROP, "no DF, tagged");
        assert_eq!(counts(&dp), (2, 3, 1));
        // DF frames until the rate limit drops some: none of them is a no-DF drop.
        let n = 400;
        for _ in 0..n {
            send(&mut dp, ETH_P_IP, &df, topo.lbv0);
        }
        let (no_df_drops, too_big, sent) = counts(&dp);
        assert_eq!(no_df_drops, 2);
        assert!(too_big > 3, "the rate limit dropped some ({too_big} drops, {sent} sent)");
        assert_eq!(too_big - 3 + sent - 1, n);
    });
}

#[test]
fn ipv6_too_big_once_encapsulated_gets_packet_too_big() {
    in_netns(|topo| {
        let mut dp = loaded();
        assert_eq!(send(&mut dp, ETH_P_IPV6, &big6(1460), topo.lbv0).action, XDP_TX);
        let inner = big6(1500);
        let out = send(&mut dp, ETH_P_IPV6, &inner, topo.lbv0);
        assert_eq!((out.action, out.data), (XDP_TX, expected_packet_too_big(&inner, 1460)));
        let s = dp.stats().unwrap();
        assert_eq!((s.get(stat::ICMP_TOO_BIG_SENT), s.get(stat::DROP_FIB)), (1, 0));
    });
}

#[test]
fn l2_dsr_towards_a_narrower_link_gets_fragmentation_needed() {
    in_netns(|topo| {
        let mut dp = loaded();
        let run = |args: &[&str]| assert!(Command::new("ip").args(args).status().unwrap().success(), "ip {args:?}");
        run(&["link", "set", "lbv2", "mtu", "1400"]);
        run(&["link", "set", "lbv3", "mtu", "1400"]);
        lb_tests::fixture_net::add_neighbour(FAR4.into(), BACKEND_MAC, "lbv2");
        let inner = big4(81, 1401, true);
        let out = send(&mut dp, ETH_P_IP, &inner, topo.lbv0);
        assert_eq!((out.action, out.data), (XDP_TX, expected_frag_needed(&inner, 1400)));
        assert_eq!(dp.stats().unwrap().get(stat::ICMP_TOO_BIG_SENT), 1);
    });
}

#[test]
fn icmp_replies_are_rate_limited_per_cpu() {
    in_netns(|topo| {
        let mut dp = loaded();
        let inner = big4(80, 1500, true);
        let n = 400;
        let mut sent = 0;
        for _ in 0..n {
            if send(&mut dp, ETH_P_IP, &inner, topo.lbv0).action == XDP_TX {
                sent += 1;
            }
        }
        let s = dp.stats().unwrap();
        assert_eq!((s.get(stat::ICMP_TOO_BIG_SENT), s.get(stat::DROP_TOO_BIG)), (sent, n - sent));
        // A burst of 50 per CPU, then 1000 per second: 400 back-to-back runs exceed it.
        assert!(sent >= 50 && sent < n, "{sent} of {n} answered");
    });
}

#[test]
fn missing_neighbour_is_counted_as_drop_no_neigh() {
    in_netns(|topo| {
        let mut dp = loaded();
        // On lbv0's own segment, with no neighbour entry.
        dp.set_backend(3, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 77)), [0; 6], 0)).unwrap();
        let out = send(&mut dp, ETH_P_IP, &big4(80, 100, true), topo.lbv0);
        assert_eq!(out.action, XDP_DROP);
        let s = dp.stats().unwrap();
        // Still a `drop_fib` (what it always was), and counted apart.
        assert_eq!((s.get(stat::DROP_NO_NEIGH), s.get(stat::DROP_FIB)), (1, 1));
    });
}
