//! lb_decap fixtures: the balancer's encapsulated output, fed to the backend's decap program,
//! comes out as the original inner packet; packets not for this host pass untouched.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::maps::{affinity, forwarding, stat, tracking, PROTO_TCP, PROTO_UDP};
use lb_tests::fixture::{self, backend, service_info, service_key, uniform};
use lb_tests::fixture_net::{in_netns, GW_MAC, LB_MAC};
use lb_tests::packet::*;
use lb_user::cli::decap::Decapsulator;
use lb_user::dataplane::{addr_words, Program, XDP_DROP, XDP_PASS, XDP_TX};

const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const BACKEND4: Ipv4Addr = Ipv4Addr::new(198, 19, 10, 3);
const BACKEND6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 3);

#[test]
fn balancer_output_decapsulates_to_the_original_inner_packet() {
    in_netns(|topo| {
        let mut lb = fixture::load();
        let vip4 = Ipv4Addr::new(198, 18, 0, 100);
        let vip6 = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
        let mut info = service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::IPIP);
        info.encap_src = addr_words(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1))).0;
        lb.set_service(&[service_key(vip4.into(), 80, PROTO_TCP)], info).unwrap();
        let mut info6 = info;
        info6.id = 2;
        info6.encap_src = addr_words(IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1))).0;
        lb.set_service(&[service_key(vip6.into(), 53, PROTO_UDP)], info6).unwrap();
        lb.set_backend(3, backend(BACKEND4.into(), [0; 6], 0)).unwrap();
        lb.set_backend(4, backend(BACKEND6.into(), [0; 6], 0)).unwrap();
        lb.write_table(1, 0, 0, &uniform(3)).unwrap();
        lb.write_table(2, 0, 0, &uniform(4)).unwrap();

        let mut host = Decapsulator::load().expect("loading lb_decap (tests must run as root)");
        host.add_decap_address(BACKEND4.into()).unwrap();
        host.add_decap_address(BACKEND6.into()).unwrap();

        let c4 = Ipv4Addr::new(198, 18, 1, 5);
        let inner4 = V4::new(c4, vip4, PROTO_TCP).build(&tcp4(c4, vip4, 40000, 80, TCP_SYN, b"round trip"));
        let c6 = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
        let inner6 = ipv6(c6, vip6, PROTO_UDP, 64, 0, &udp6(c6, vip6, 5353, 53, b"round trip 6"));
        for (inner, ethertype) in [(inner4, ETH_P_IP), (inner6, ETH_P_IPV6)] {
            let encapsulated =
                lb.run_test(Program::Lb, &ethernet(LB_MAC, CLIENT_MAC, ethertype, &inner), topo.lbv0).unwrap();
            assert_eq!(encapsulated.action, XDP_TX);
            let out = host.run_test(&encapsulated.data, 0).unwrap();
            assert_eq!(out.action, XDP_PASS);
            assert_eq!(out.data, ethernet(GW_MAC, LB_MAC, ethertype, &inner), "the original inner packet");
        }
        assert_eq!(host.stats().unwrap().get(stat::DECAP), 2);
    });
}

#[test]
fn decap_leaves_other_traffic_alone_and_drops_malformed_tunnels() {
    let mut host = Decapsulator::load().expect("loading lb_decap (tests must run as root)");
    host.add_decap_address(BACKEND4.into()).unwrap();
    let c4 = Ipv4Addr::new(198, 18, 1, 5);
    let inner = V4::new(c4, Ipv4Addr::new(198, 18, 0, 100), PROTO_UDP).build(&udp4(
        c4,
        Ipv4Addr::new(198, 18, 0, 100),
        1,
        2,
        b"x",
    ));
    // Tunnel to another address: untouched.
    let other = ethernet(
        LB_MAC,
        GW_MAC,
        ETH_P_IP,
        &V4::new(Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 19, 10, 4), 4).build(&inner),
    );
    let out = host.run_test(&other, 0).unwrap();
    assert_eq!((out.action, out.data), (XDP_PASS, other));
    // Plain traffic to this host: untouched.
    let plain = ethernet(LB_MAC, GW_MAC, ETH_P_IP, &inner);
    let out = host.run_test(&plain, 0).unwrap();
    assert_eq!((out.action, out.data), (XDP_PASS, plain));
    // IPIP to this host whose inner header is not IPv4: dropped and counted.
    let bogus =
        ethernet(LB_MAC, GW_MAC, ETH_P_IP, &V4::new(Ipv4Addr::new(198, 18, 0, 1), BACKEND4, 4).build(&[0x60; 24]));
    assert_eq!(host.run_test(&bogus, 0).unwrap().action, XDP_DROP);
    assert_eq!(host.stats().unwrap().get(stat::DECAP_DROP_MALFORMED), 1);
    // A piece of a fragmented tunnel datagram (first or later) holds no whole inner packet:
    // passed untouched, for the stack to reassemble.
    for frag in [0x2000, 0x0003] {
        let mut outer = V4::new(Ipv4Addr::new(198, 18, 0, 1), BACKEND4, 4);
        outer.frag = frag;
        let piece = ethernet(LB_MAC, GW_MAC, ETH_P_IP, &outer.build(&inner[..16]));
        let out = host.run_test(&piece, 0).unwrap();
        assert_eq!((out.action, out.data), (XDP_PASS, piece), "frag {frag:#x}");
    }
    assert_eq!(host.stats().unwrap().get(stat::DECAP), 0);
}
