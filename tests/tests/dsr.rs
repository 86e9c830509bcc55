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
