//! L2 DSR fixtures: only the MACs change (destination = backend, source = the balancer's).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::{affinity, forwarding, tracking, PROTO_TCP, PROTO_UDP};
use lb_tests::fixture::{self, backend, service_info, service_key, uniform};
use lb_tests::packet::*;
use lb_user::dataplane::{Program, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const BACKEND_MAC: [u8; 6] = [0x02, 0xbe, 0xef, 0, 0, 0x09];

#[test]
fn l2_dsr_rewrites_destination_mac_ipv4_and_ipv6() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = fixture::load();
    let vip4 = Ipv4Addr::new(198, 18, 0, 100);
    let vip6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
    let info = service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&[service_key(vip4.into(), 0, PROTO_UDP), service_key(vip6.into(), 443, PROTO_TCP)], info).unwrap();
    dp.set_backend(9, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, 9)), BACKEND_MAC, 0)).unwrap();
    dp.write_table(1, 0, 0, &uniform(9)).unwrap();

    let c4 = Ipv4Addr::new(198, 18, 1, 5);
    let ip4 = V4::new(c4, vip4, PROTO_UDP).build(&udp4(c4, vip4, 1234, 9999, b"dsr"));
    let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip4), 0).unwrap();
    assert_eq!(out.action, XDP_TX);
    assert_eq!(out.data, ethernet(BACKEND_MAC, LB_MAC, ETH_P_IP, &ip4), "all-ports service, MACs rewritten only");

    let c6 = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
    let ip6 = ipv6(c6, vip6, PROTO_TCP, 64, 0, &tcp6(c6, vip6, 40000, 443, TCP_SYN, b"dsr6"));
    let out = dp.run_test(Program::Lb, &ethernet_vlan(LB_MAC, CLIENT_MAC, 7, ETH_P_IPV6, &ip6), 0).unwrap();
    assert_eq!(out.action, XDP_TX);
    assert_eq!(out.data, ethernet_vlan(BACKEND_MAC, LB_MAC, 7, ETH_P_IPV6, &ip6), "VLAN tag kept on the same segment");
}

/// The route to the backend decides the device: a backend on the ingress segment gets the
/// frame back out of the ingress device (XDP_TX, source = the MAC the frame was sent to, VLAN
/// tag kept); a backend on another device's segment gets it redirected there, with that
/// device's MAC as source and no VLAN tag; a backend without a route is dropped and counted.
#[test]
fn l2_dsr_sends_out_of_the_device_the_route_to_the_backend_uses() {
    use lb_common::stat;
    use lb_tests::fixture_net::{add_neighbour, in_netns, LB2_MAC};
    use lb_user::dataplane::{XDP_DROP, XDP_REDIRECT};
    in_netns(|topo| {
        let mut dp = fixture::load();
        let vip4 = Ipv4Addr::new(198, 18, 0, 100);
        let vip6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
        let info = |id| service_info(id, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
        // Service 1 (IPv4 VIP) and 2 (IPv6 VIP), each with one backend; the test moves it.
        dp.set_service(&[service_key(vip4.into(), 80, PROTO_TCP)], info(1)).unwrap();
        dp.set_service(&[service_key(vip6.into(), 80, PROTO_TCP)], info(2)).unwrap();
        dp.write_table(1, 0, 0, &uniform(1)).unwrap();
        dp.write_table(2, 0, 0, &uniform(2)).unwrap();
        let c4 = Ipv4Addr::new(198, 18, 1, 5);
        let c6 = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
        let ip4 = V4::new(c4, vip4, PROTO_TCP).build(&tcp4(c4, vip4, 40000, 80, TCP_SYN, b"l2"));
        let ip6 = ipv6(c6, vip6, PROTO_TCP, 64, 0, &tcp6(c6, vip6, 40000, 80, TCP_SYN, b"l2"));
        let cases: [(u32, IpAddr, &[u8], u16); 2] = [
            (1, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 9)), &ip4, ETH_P_IP),
            (2, IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9)), &ip6, ETH_P_IPV6),
        ];
        for (id, on_ingress, ip, ethertype) in cases {
            // On lbv0's segment (the ingress): XDP_TX, tag kept.
            dp.set_backend(id, backend(on_ingress, BACKEND_MAC, 0)).unwrap();
            let out = dp.run_test(Program::Lb, &ethernet_vlan(LB_MAC, CLIENT_MAC, 7, ethertype, ip), topo.lbv0).unwrap();
            assert_eq!(out.action, XDP_TX, "backend {on_ingress} on the ingress segment");
            assert_eq!(out.data, ethernet_vlan(BACKEND_MAC, LB_MAC, 7, ethertype, ip));

            // On lbv2's segment: redirected to lbv2, source lbv2's MAC, untagged.
            let other = match on_ingress {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(198, 18, 2, 9)),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 9)),
            };
            dp.set_backend(id, backend(other, BACKEND_MAC, 0)).unwrap();
            // The host knows no neighbour entry for it yet, so not lbv2's MAC either: dropped.
            let before = dp.stats().unwrap().get(stat::DROP_FIB);
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ethertype, ip), topo.lbv0).unwrap();
            assert_eq!(out.action, XDP_DROP, "backend {other} behind lbv2, no neighbour entry");
            assert_eq!(dp.stats().unwrap().get(stat::DROP_FIB), before + 1);
            // Such a failed lookup is not cached: forwarded as soon as the host has the entry
            // (on a real host the health checks' traffic makes it).
            add_neighbour(other, BACKEND_MAC, "lbv2");
            let before = dp.stats().unwrap().get(stat::REDIRECT);
            for frame in [ethernet(LB_MAC, CLIENT_MAC, ethertype, ip), ethernet_vlan(LB_MAC, CLIENT_MAC, 7, ethertype, ip)] {
                let out = dp.run_test(Program::Lb, &frame, topo.lbv0).unwrap();
                assert_eq!(out.action, XDP_REDIRECT, "backend {other} behind lbv2");
                assert_eq!(out.data, ethernet(BACKEND_MAC, LB2_MAC, ethertype, ip));
            }
            assert_eq!(dp.stats().unwrap().get(stat::REDIRECT), before + 2);

            // No route to the backend: dropped, counted.
            let nowhere = match on_ingress {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(198, 18, 7, 9)),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 7, 0, 0, 0, 0, 9)),
            };
            dp.set_backend(id, backend(nowhere, BACKEND_MAC, 0)).unwrap();
            let before = dp.stats().unwrap().get(stat::DROP_UNROUTABLE);
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ethertype, ip), topo.lbv0).unwrap();
            assert_eq!(out.action, XDP_DROP, "backend {nowhere} without a route");
            assert_eq!(dp.stats().unwrap().get(stat::DROP_UNROUTABLE), before + 1);
        }
    });
}
