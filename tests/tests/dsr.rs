//! L2 DSR fixtures: only the MACs change (destination = backend, source = the balancer's).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::maps::{affinity, forwarding, tracking, PROTO_TCP, PROTO_UDP};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, uniform};
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

/// The route to the backend decides the device for an untagged frame: a backend on the ingress
/// segment gets it back out of the ingress device (XDP_TX, source = the MAC the frame was sent
/// to); a backend on another device's segment gets it redirected there, with that device's MAC
/// as source (once the host has a neighbour entry for it); a backend without a route is dropped
/// and counted. A tagged frame goes back out of the ingress on its VLAN, and so does every frame
/// when forwarding is off on the ingress device (the kernel then does no route lookup).
#[test]
fn l2_dsr_sends_out_of_the_device_the_route_to_the_backend_uses() {
    use lb_common::maps::stat;
    use lb_tests::fixture_net::{add_neighbour, in_netns, sysctl, LB2_MAC};
    use lb_user::dataplane::{XDP_DROP, XDP_REDIRECT};
    // What the host's neighbour table says about the backends: not the configured MAC, which
    // is the one the frames must carry.
    const NEIGHBOUR_MAC: [u8; 6] = [0x02, 0x99, 0, 0, 0, 0x99];
    in_netns(|topo| {
        let mut dp = fixture::load();
        // Service 1 (IPv4 VIP) and 2 (IPv6 VIP), each with one backend; the test moves it.
        let (ip4, ip6) = two_services(&mut dp, forwarding::L2_DSR, b"l2");
        let cases: [(u32, IpAddr, &[u8], u16, &str); 2] = [
            (1, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 9)), &ip4, ETH_P_IP, "ipv4"),
            (2, IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9)), &ip6, ETH_P_IPV6, "ipv6"),
        ];
        let send =
            |dp: &mut lb_user::dataplane::Dataplane, frame: &[u8]| dp.run_test(Program::Lb, frame, topo.lbv0).unwrap();
        let count = |dp: &lb_user::dataplane::Dataplane, s| dp.stats().unwrap().get(s);
        for (id, on_ingress, ip, ethertype, family) in cases {
            let untagged = ethernet(LB_MAC, CLIENT_MAC, ethertype, ip);
            let tagged = ethernet_vlan(LB_MAC, CLIENT_MAC, 7, ethertype, ip);
            // On lbv0's segment (the ingress): XDP_TX.
            dp.set_backend(id, backend(on_ingress, BACKEND_MAC, 0)).unwrap();
            add_neighbour(on_ingress, NEIGHBOUR_MAC, "lbv0");
            let out = send(&mut dp, &untagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet(BACKEND_MAC, LB_MAC, ethertype, ip)),
                "{on_ingress}: ingress segment"
            );

            // On lbv2's segment: no neighbour entry yet, so no source MAC for lbv2: dropped,
            // counted, not cached.
            let other = test_addr(on_ingress, 2, 9);
            dp.set_backend(id, backend(other, BACKEND_MAC, 0)).unwrap();
            let drops = count(&dp, stat::DROP_FIB);
            assert_eq!(send(&mut dp, &untagged).action, XDP_DROP, "{other}: behind lbv2, no neighbour entry");
            assert_eq!(count(&dp, stat::DROP_FIB), drops + 1);
            // With the entry (on a real host the health checks' traffic makes it): redirected
            // to lbv2, source lbv2's MAC, destination the configured MAC.
            add_neighbour(other, NEIGHBOUR_MAC, "lbv2");
            let redirects = count(&dp, stat::REDIRECT);
            let out = send(&mut dp, &untagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_REDIRECT, ethernet(BACKEND_MAC, LB2_MAC, ethertype, ip)),
                "{other}: behind lbv2"
            );
            assert_eq!(count(&dp, stat::REDIRECT), redirects + 1);
            // Tagged: back out of the ingress on its VLAN, whatever the route.
            let out = send(&mut dp, &tagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet_vlan(BACKEND_MAC, LB_MAC, 7, ethertype, ip)),
                "{other}: tagged"
            );

            // Forwarding off on the ingress: the kernel looks no route up; back out of the
            // ingress. (Another address behind lbv2, so the route cached for `other` within
            // the last second is not reused.)
            sysctl(&format!("net.{family}.conf.lbv0.forwarding=0"));
            let other2 = test_addr(on_ingress, 2, 10);
            add_neighbour(other2, NEIGHBOUR_MAC, "lbv2");
            dp.set_backend(id, backend(other2, backend_mac(id), 0)).unwrap();
            let out = send(&mut dp, &untagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet(backend_mac(id), LB_MAC, ethertype, ip)),
                "{other2}: forwarding off"
            );
            sysctl(&format!("net.{family}.conf.lbv0.forwarding=1"));

            // No route to the backend: dropped, counted.
            let nowhere = test_addr(on_ingress, 7, 9);
            dp.set_backend(id, backend(nowhere, BACKEND_MAC, 0)).unwrap();
            let drops = count(&dp, stat::DROP_UNROUTABLE);
            assert_eq!(send(&mut dp, &untagged).action, XDP_DROP, "{nowhere}: no route");
            assert_eq!(count(&dp, stat::DROP_UNROUTABLE), drops + 1);
        }
    });
}

/// Issue 16.5: an L2 DSR backend record without a MAC (zero) gets the MAC the host's neighbour
/// table holds for its address, from the route lookup (as IPVS direct routing): no entry is a
/// `drop_no_neigh` (the daemon keeps one), with one the frame goes to it, out of the ingress or
/// redirected to the device of the backend's segment, and a tagged frame back out of the ingress
/// on its VLAN. A configured MAC still wins over the neighbour's.
#[test]
fn l2_dsr_without_a_mac_sends_to_the_neighbour_table_mac() {
    use lb_common::maps::stat;
    use lb_tests::fixture_net::{add_neighbour, in_netns, LB2_MAC};
    use lb_user::dataplane::{XDP_DROP, XDP_REDIRECT};
    const NEIGHBOUR_MAC: [u8; 6] = [0x02, 0x99, 0, 0, 0, 0x99];
    in_netns(|topo| {
        let mut dp = fixture::load();
        let (ip4, ip6) = two_services(&mut dp, forwarding::L2_DSR, b"neigh");
        let cases: [(u32, IpAddr, &[u8], u16); 2] = [
            (1, IpAddr::V4(Ipv4Addr::new(198, 18, 0, 9)), &ip4, ETH_P_IP),
            (2, IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 9)), &ip6, ETH_P_IPV6),
        ];
        let send =
            |dp: &mut lb_user::dataplane::Dataplane, frame: &[u8]| dp.run_test(Program::Lb, frame, topo.lbv0).unwrap();
        let count = |dp: &lb_user::dataplane::Dataplane, s| dp.stats().unwrap().get(s);
        for (id, on_ingress, ip, ethertype) in cases {
            let untagged = ethernet(LB_MAC, CLIENT_MAC, ethertype, ip);
            let tagged = ethernet_vlan(LB_MAC, CLIENT_MAC, 7, ethertype, ip);
            // On lbv0's segment, no neighbour entry yet: dropped as a missing neighbour.
            dp.set_backend(id, backend(on_ingress, [0; 6], 0)).unwrap();
            let (no_neigh, fib) = (count(&dp, stat::DROP_NO_NEIGH), count(&dp, stat::DROP_FIB));
            assert_eq!(send(&mut dp, &untagged).action, XDP_DROP, "{on_ingress}: no neighbour entry");
            assert_eq!((count(&dp, stat::DROP_NO_NEIGH), count(&dp, stat::DROP_FIB)), (no_neigh + 1, fib + 1));
            // With the entry (the failure was not cached): to the neighbour's MAC, XDP_TX.
            add_neighbour(on_ingress, NEIGHBOUR_MAC, "lbv0");
            let out = send(&mut dp, &untagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet(NEIGHBOUR_MAC, LB_MAC, ethertype, ip)),
                "{on_ingress}: ingress segment"
            );
            let out = send(&mut dp, &tagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet_vlan(NEIGHBOUR_MAC, LB_MAC, 7, ethertype, ip)),
                "{on_ingress}: tagged"
            );
            // A configured MAC is an override: the neighbour's is not used.
            dp.set_backend(id, backend(on_ingress, BACKEND_MAC, 0)).unwrap();
            let out = send(&mut dp, &untagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet(BACKEND_MAC, LB_MAC, ethertype, ip)),
                "{on_ingress}: configured MAC"
            );

            // On lbv2's segment: redirected there, source lbv2's MAC, destination the
            // neighbour's; a tagged frame still back out of the ingress.
            let other = test_addr(on_ingress, 2, 9);
            add_neighbour(other, NEIGHBOUR_MAC, "lbv2");
            dp.set_backend(id, backend(other, [0; 6], 0)).unwrap();
            let out = send(&mut dp, &untagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_REDIRECT, ethernet(NEIGHBOUR_MAC, LB2_MAC, ethertype, ip)),
                "{other}: behind lbv2"
            );
            let out = send(&mut dp, &tagged);
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet_vlan(NEIGHBOUR_MAC, LB_MAC, 7, ethertype, ip)),
                "{other}: tagged"
            );
        }
    });
}

/// Issue 20.8: only frames sent to the ingress device's own MAC are balanced, for every
/// forwarding method. Broadcast, multicast, another host's MAC (a frame flooded to us) and
/// the MAC of another of our devices pass untouched and are counted; a frame sent to us leaves
/// with the egress device's MAC as source.
#[test]
fn only_frames_to_the_ingress_device_mac_are_balanced() {
    use lb_common::maps::stat;
    use lb_tests::fixture_net::{in_netns, LB2_MAC};
    use lb_user::dataplane::XDP_PASS;
    in_netns(|topo| {
        let mut dp = fixture::load();
        // The IPv4 service by L2 DSR, the IPv6 one by IP6IP6.
        let (ip4, ip6) = two_services(&mut dp, forwarding::IPIP, b"mac");
        dp.set_backend(1, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 9)), BACKEND_MAC, 0)).unwrap();
        dp.set_backend(2, backend(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 9)), BACKEND_MAC, 0))
            .unwrap();
        let other_host = [0x02, 0x77, 0, 0, 0, 0x77];
        let not_ours: [([u8; 6], &str); 5] = [
            ([0xff; 6], "broadcast"),
            ([0x01, 0x00, 0x5e, 0, 0, 0x01], "IPv4 multicast"),
            ([0x33, 0x33, 0, 0, 0, 0x01], "IPv6 multicast"),
            (other_host, "another host"),
            (LB2_MAC, "another of our devices (lbv2), not the ingress"),
        ];
        let mut passed = 0;
        for (ethertype, ip) in [(ETH_P_IP, &ip4), (ETH_P_IPV6, &ip6)] {
            for (dst, what) in not_ours {
                for frame in
                    [ethernet(dst, CLIENT_MAC, ethertype, ip), ethernet_vlan(dst, CLIENT_MAC, 7, ethertype, ip)]
                {
                    let out = dp.run_test(Program::Lb, &frame, topo.lbv0).unwrap();
                    assert_eq!((out.action, &out.data), (XDP_PASS, &frame), "{what}: passed untouched");
                    passed += 1;
                }
            }
        }
        let st = dp.stats().unwrap();
        assert_eq!(st.get(stat::PASS_NOT_OUR_MAC), passed);
        assert_eq!((st.get(stat::NEW_FLOW), st.get(stat::CT_MISS)), (0, 0), "nothing balanced");
        // Sent to lbv0's MAC: balanced, source = the egress device's MAC (lbv0 for XDP_TX).
        let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip4), topo.lbv0).unwrap();
        assert_eq!((out.action, out.data), (XDP_TX, ethernet(BACKEND_MAC, LB_MAC, ETH_P_IP, &ip4)));
        // A device nobody registered (the daemon is not attached there): nothing is ours.
        let frame = ethernet(LB2_MAC, CLIENT_MAC, ETH_P_IP, &ip4);
        let mut fresh = lb_user::dataplane::Dataplane::load(fixture::sizes()).unwrap();
        two_services(&mut fresh, forwarding::IPIP, b"mac");
        assert_eq!(fresh.run_test(Program::Lb, &frame, topo.lbv2).unwrap().action, XDP_PASS);
        assert_eq!(fresh.stats().unwrap().get(stat::PASS_NOT_OUR_MAC), 1);
    });
}

/// Service 1 on 198.18.0.100:80/TCP (L2 DSR) and service 2 on [2001:db8::100]:80/TCP
/// (forwarded as `v6_forwarding`), tables to backends 1 and 2 (not set here); returns a TCP
/// SYN carrying `payload` to each, IPv4 and IPv6 datagrams.
fn two_services(dp: &mut lb_user::dataplane::Dataplane, v6_forwarding: u8, payload: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let vip4 = Ipv4Addr::new(198, 18, 0, 100);
    let vip6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
    let info = |id, fwd| service_info(id, affinity::NONE, tracking::PER_CONNECTION, fwd);
    dp.set_service(&[service_key(vip4.into(), 80, PROTO_TCP)], info(1, forwarding::L2_DSR)).unwrap();
    dp.set_service(&[service_key(vip6.into(), 80, PROTO_TCP)], info(2, v6_forwarding)).unwrap();
    dp.write_table(1, 0, 0, &uniform(1)).unwrap();
    dp.write_table(2, 0, 0, &uniform(2)).unwrap();
    let c4 = Ipv4Addr::new(198, 18, 1, 5);
    let c6 = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
    let ip4 = V4::new(c4, vip4, PROTO_TCP).build(&tcp4(c4, vip4, 40000, 80, TCP_SYN, payload));
    let ip6 = ipv6(c6, vip6, PROTO_TCP, 64, 0, &tcp6(c6, vip6, 40000, 80, TCP_SYN, payload));
    (ip4, ip6)
}

/// Test address `host` in subnet `net` of the family of `like`: 198.18.NET.HOST or
/// 2001:db8:NET::HOST.
fn test_addr(like: IpAddr, net: u8, host: u8) -> IpAddr {
    match like {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(198, 18, net, host)),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, net as u16, 0, 0, 0, 0, host as u16)),
    }
}

/// An L2 DSR service and an IPIP service that share a backend record each get their own next
/// hop, packet after packet: the next-hop cache keeps L2 lookups (no neighbour MAC needed)
/// apart from encapsulation lookups (the gateway's MAC), so neither uses the other's entry.
#[test]
fn l2_dsr_and_ipip_sharing_a_backend_each_get_their_own_next_hop() {
    use lb_tests::fixture_net::{in_netns, GW_MAC};
    use lb_user::dataplane::addr_words;
    in_netns(|topo| {
        let mut dp = fixture::load();
        let vip = Ipv4Addr::new(198, 18, 0, 100);
        let encap_src = Ipv4Addr::new(198, 18, 0, 1);
        // Behind the gateway on lbv0 (198.19.10.0/24 via 198.18.0.2, a permanent neighbour).
        let b = Ipv4Addr::new(198, 19, 10, 10);
        dp.set_service(
            &[service_key(vip.into(), 80, PROTO_TCP)],
            service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR),
        )
        .unwrap();
        let mut ipip = service_info(2, affinity::NONE, tracking::PER_CONNECTION, forwarding::IPIP);
        ipip.encap_src = addr_words(IpAddr::V4(encap_src)).0;
        dp.set_service(&[service_key(vip.into(), 81, PROTO_TCP)], ipip).unwrap();
        dp.set_backend(5, backend(IpAddr::V4(b), BACKEND_MAC, 0)).unwrap();
        dp.write_table(1, 0, 0, &uniform(5)).unwrap();
        dp.write_table(2, 0, 0, &uniform(5)).unwrap();
        let c = Ipv4Addr::new(198, 18, 1, 5);
        let to_l2 = V4::new(c, vip, PROTO_TCP).build(&tcp4(c, vip, 40000, 80, TCP_SYN, b"l2"));
        let to_ipip = V4::new(c, vip, PROTO_TCP).build(&tcp4(c, vip, 40000, 81, TCP_SYN, b"ipip"));
        let encapsulated = lb_tests::packet::expected_ipip(GW_MAC, LB_MAC, encap_src, b, &to_ipip);
        for round in 0..3 {
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &to_l2), topo.lbv0).unwrap();
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet(BACKEND_MAC, LB_MAC, ETH_P_IP, &to_l2)),
                "round {round}: L2 DSR"
            );
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &to_ipip), topo.lbv0).unwrap();
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, encapsulated.clone()),
                "round {round}: IPIP to the gateway's MAC"
            );
        }

        // The case the cache's L2 mark exists for: an IPIP service without an outer source
        // (so its lookup key equals an L2 one) and an on-link backend the host has no neighbour
        // entry for. The L2 frame is sent (it needs no MAC from the route) and leaves a cache
        // entry with zero MACs, long enough for the IPIP packet; IPIP must not use it (it would
        // send a frame with zero MACs) but look up, find no neighbour and drop.
        let mut unsourced = service_info(2, affinity::NONE, tracking::PER_CONNECTION, forwarding::IPIP);
        unsourced.encap_src = [0; 4];
        dp.set_service(&[service_key(vip.into(), 81, PROTO_TCP)], unsourced).unwrap();
        dp.set_backend(5, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 77)), BACKEND_MAC, 0)).unwrap();
        let long_l2 = V4::new(c, vip, PROTO_TCP).build(&tcp4(c, vip, 40001, 80, TCP_SYN, &[7; 200]));
        for round in 0..2 {
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &long_l2), topo.lbv0).unwrap();
            assert_eq!(
                (out.action, out.data),
                (XDP_TX, ethernet(BACKEND_MAC, LB_MAC, ETH_P_IP, &long_l2)),
                "round {round}: L2 DSR, no neighbour"
            );
            let drops = dp.stats().unwrap().get(lb_common::maps::stat::DROP_FIB);
            let out = dp.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &to_ipip), topo.lbv0).unwrap();
            assert_eq!(out.action, lb_user::dataplane::XDP_DROP, "round {round}: IPIP without a neighbour entry");
            assert_eq!(dp.stats().unwrap().get(lb_common::maps::stat::DROP_FIB), drops + 1);
        }
    });
}
