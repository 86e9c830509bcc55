//! The client-class lookup through the real XDP program: the trie is consulted only for
//! services that have client prefixes (`CLASSED_SERVICES`), and that flag follows the prefixes
//! as they are added and removed, also after a restarted writer adopts the pinned maps.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::maps::{affinity, forwarding, tracking, PROTO_TCP};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, uniform};
use lb_tests::packet::*;
use lb_user::dataplane::{Dataplane, Program, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
const SVC: u32 = 1;
/// Class 0 (no prefix matches) goes to B0, class 1 to B1.
const B0: u32 = 3;
const B1: u32 = 4;

fn setup(dp: &mut Dataplane) {
    let info = service_info(SVC, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&[service_key(VIP.into(), 80, PROTO_TCP), service_key(VIP6.into(), 80, PROTO_TCP)], info).unwrap();
    for id in [B0, B1] {
        dp.set_backend(id, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, id as u8)), backend_mac(id), 0)).unwrap();
    }
    dp.write_table(SVC, 0, 0, &uniform(B0)).unwrap();
    dp.write_table(SVC, 1, 0, &uniform(B1)).unwrap();
}

/// The backend a new flow (SYN) from the v4 or v6 client goes to. Each call is another flow
/// (another source port): a SYN of a tracked flow whose backend is still usable would keep it
/// (`lb_common::decide::syn_keeps_entry`) instead of being classified again.
fn backend_of(dp: &Dataplane, v6: bool) -> u32 {
    static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(40000);
    let sport = NEXT_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let frame = if v6 {
        ethernet(
            LB_MAC,
            CLIENT_MAC,
            ETH_P_IPV6,
            &ipv6(CLIENT6, VIP6, PROTO_TCP, 64, 0, &tcp6(CLIENT6, VIP6, sport, 80, TCP_SYN, b"")),
        )
    } else {
        ethernet(
            LB_MAC,
            CLIENT_MAC,
            ETH_P_IP,
            &V4::new(CLIENT, VIP, PROTO_TCP).build(&tcp4(CLIENT, VIP, sport, 80, TCP_SYN, b"")),
        )
    };
    let out = dp.run_test(Program::Lb, &frame, 0).unwrap();
    assert_eq!(out.action, XDP_TX);
    let id = u32::from(out.data[4]) << 8 | u32::from(out.data[5]);
    assert!(id == B0 || id == B1, "unexpected backend {id}");
    id
}

#[test]
fn the_class_follows_the_prefixes_as_they_come_and_go() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = fixture::load();
    setup(&mut dp);
    assert_eq!((backend_of(&dp, false), backend_of(&dp, true)), (B0, B0), "no prefixes: class 0");
    dp.set_class_prefix(SVC, "198.18.1.0/24".parse().unwrap(), 1).unwrap();
    assert_eq!((backend_of(&dp, false), backend_of(&dp, true)), (B1, B0), "the v4 client is in class 1");
    dp.set_class_prefix(SVC, "2001:db8:1::/48".parse().unwrap(), 1).unwrap();
    assert_eq!((backend_of(&dp, false), backend_of(&dp, true)), (B1, B1));
    dp.remove_class_prefix(SVC, "198.18.1.0/24".parse().unwrap()).unwrap();
    assert_eq!((backend_of(&dp, false), backend_of(&dp, true)), (B0, B1), "one prefix left");
    dp.remove_class_prefix(SVC, "2001:db8:1::/48".parse().unwrap()).unwrap();
    assert_eq!((backend_of(&dp, false), backend_of(&dp, true)), (B0, B0), "no prefixes again");
    // Another service's prefix does not classify this service's clients.
    dp.set_class_prefix(SVC + 1, "198.18.1.0/24".parse().unwrap(), 1).unwrap();
    assert_eq!(backend_of(&dp, false), B0);
}

#[test]
fn a_restarted_writer_keeps_the_class_flags_exact() {
    let pins = fixture::PinDir::new("class");
    let dir = pins.path();
    {
        lb_tests::fixture_net::enter_lo_routed_netns();
        let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load_with(fixture::sizes(), Some(dir)).unwrap());
        setup(&mut dp);
        dp.set_class_prefix(SVC, "198.18.1.0/24".parse().unwrap(), 1).unwrap();
        dp.set_class_prefix(SVC, "198.18.0.0/16".parse().unwrap(), 1).unwrap();
    }
    let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load_with(fixture::sizes(), Some(dir)).unwrap());
    assert_eq!(backend_of(&dp, false), B1, "the adopted trie and flag classify the client");
    dp.remove_class_prefix(SVC, "198.18.1.0/24".parse().unwrap()).unwrap();
    assert_eq!(backend_of(&dp, false), B1, "the /16 still matches: the flag stays");
    dp.remove_class_prefix(SVC, "198.18.0.0/16".parse().unwrap()).unwrap();
    assert_eq!(backend_of(&dp, false), B0, "the adopted bookkeeping knew both prefixes");
    drop(dp);
    lb_user::dataplane::pinning::remove_map_pins(dir).unwrap();
}
