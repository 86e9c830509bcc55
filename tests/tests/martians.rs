//! Packets the balancer must not take at face value, through the real program (issue 31, item
//! 9): a new flow from a VIP or from a backend of its service is dropped and counted as a
//! martian (a backend of another service is an ordinary client); a forged ICMP error quoting a VIP flow follows the stateless choice but makes no
//! connection-table entry; a later fragment to a port-specific VIP is counted as
//! `pass_fragment`, not `pass_not_vip`; and a packet's TTL is not a routing hop's (the VIP is
//! its destination: README, "TTL").

use std::net::{IpAddr, Ipv4Addr};

use lb_common::maps::{affinity, forwarding, stat, tracking, PROTO_TCP};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, uniform};
use lb_tests::packet::*;
use lb_user::dataplane::{Dataplane, Program, XDP_DROP, XDP_PASS, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
const OTHER_VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
const B1_ADDR: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 1);

/// An L2 DSR service on VIP:80/TCP (every flow to backend 1), another on OTHER_VIP:80/TCP.
fn setup() -> Dataplane {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = fixture::register_interfaces(fixture::load());
    let info = service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&[service_key(VIP.into(), 80, PROTO_TCP)], info).unwrap();
    let other = service_info(2, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&[service_key(OTHER_VIP.into(), 80, PROTO_TCP)], other).unwrap();
    dp.set_backend(1, backend(IpAddr::V4(B1_ADDR), backend_mac(1), 0)).unwrap();
    dp.write_table(1, 0, 0, &uniform(1)).unwrap();
    dp.write_table(2, 0, 0, &uniform(1)).unwrap();
    dp
}

fn syn_from(src: Ipv4Addr, dst: Ipv4Addr, sport: u16) -> Vec<u8> {
    ethernet(
        LB_MAC,
        CLIENT_MAC,
        ETH_P_IP,
        &V4::new(src, dst, PROTO_TCP).build(&tcp4(src, dst, sport, 80, TCP_SYN, b"")),
    )
}

fn counted(dp: &Dataplane, frame: &[u8], counter: u32) -> u32 {
    let before = dp.stats().unwrap().get(counter);
    let action = dp.run_test(Program::Lb, frame, 0).unwrap().action;
    assert_eq!(dp.stats().unwrap().get(counter), before + 1, "{}", stat::NAMES[counter as usize]);
    action
}

#[test]
fn new_flows_from_a_vip_or_from_their_backend_are_martians() {
    let dp = setup();
    let entries = dp.conntrack_entries().len();
    // From a VIP (this service's and another's), and from the backend the flow would go to.
    for src in [VIP, OTHER_VIP, B1_ADDR] {
        assert_eq!(counted(&dp, &syn_from(src, VIP, 40000), stat::DROP_MARTIAN), XDP_DROP, "from {src}");
    }
    assert_eq!(dp.conntrack_entries().len(), entries, "a martian makes no entry");
    // An ordinary client still gets through.
    assert_eq!(counted(&dp, &syn_from(CLIENT, VIP, 40000), stat::NEW_FLOW), XDP_TX);
}

/// An ICMP "fragmentation needed" to the VIP quoting a packet the VIP sent to the client.
fn frag_needed_quoting(sport_client: u16) -> Vec<u8> {
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &icmp4_frag_needed_quoting(CLIENT, VIP, sport_client))
}

#[test]
fn a_forged_icmp_error_follows_the_stateless_choice_without_an_entry() {
    let dp = setup();
    let before = dp.conntrack_entries().len();
    let out = dp.run_test(Program::Lb, &frag_needed_quoting(41000), 0).unwrap();
    assert_eq!(out.action, XDP_TX, "forwarded to the flow's stateless backend");
    assert_eq!(out.data[..6], backend_mac(1));
    assert_eq!(dp.conntrack_entries().len(), before, "no entry for a flow nobody opened");
    // A real flow's entry is followed by its ICMP errors, and the error adds no entry either.
    dp.run_test(Program::Lb, &syn_from(CLIENT, VIP, 41001), 0).unwrap();
    let with_flow = dp.conntrack_entries().len();
    let hits = dp.stats().unwrap().get(stat::CT_HIT);
    assert_eq!(dp.run_test(Program::Lb, &frag_needed_quoting(41001), 0).unwrap().action, XDP_TX);
    assert_eq!(dp.stats().unwrap().get(stat::CT_HIT), hits + 1, "the error found the flow's entry");
    assert_eq!(dp.conntrack_entries().len(), with_flow);
}

#[test]
fn a_later_fragment_to_a_port_specific_vip_is_counted_as_such() {
    let dp = setup();
    let mut frag = V4::new(CLIENT, VIP, PROTO_TCP);
    frag.frag = 10; // offset 80 bytes: no TCP header in this piece
    let frame = ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &frag.build(&[0u8; 16]));
    let not_vip = dp.stats().unwrap().get(stat::PASS_NOT_VIP);
    assert_eq!(counted(&dp, &frame, stat::PASS_FRAGMENT), XDP_PASS);
    assert_eq!(dp.stats().unwrap().get(stat::PASS_NOT_VIP), not_vip);
    // A fragment to an address that is no VIP is still just not ours.
    let mut other = V4::new(CLIENT, Ipv4Addr::new(198, 18, 0, 250), PROTO_TCP);
    other.frag = 10;
    let frame = ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &other.build(&[0u8; 16]));
    assert_eq!(counted(&dp, &frame, stat::PASS_NOT_VIP), XDP_PASS);
}

/// The VIP is the packet's destination, reached at the balancer: like Google Cloud's
/// passthrough balancer and Katran, it forwards without decrementing the TTL (README, "TTL").
#[test]
fn ttl_is_left_as_the_client_sent_it() {
    let dp = setup();
    for ttl in [1u8, 0] {
        let mut ip = V4::new(CLIENT, VIP, PROTO_TCP);
        ip.ttl = ttl;
        let frame =
            ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip.build(&tcp4(CLIENT, VIP, 42000 + ttl as u16, 80, TCP_SYN, b"")));
        let out = dp.run_test(Program::Lb, &frame, 0).unwrap();
        assert_eq!(out.action, XDP_TX);
        assert_eq!(out.data[14 + 8], ttl, "the inner TTL is the client's");
    }
}

/// Backend addresses come from the configuration through the real controller: a new flow from
/// a backend of the same service is a martian, from another service's backend it is a client,
/// and a backend the configuration drops is neither.
#[test]
fn a_backend_of_the_same_service_is_a_martian_and_of_another_a_client() {
    use lb_user::compile::sizes::sizes_for;
    use lb_user::config::Config;
    use lb_user::controller::Controller;
    let config = |web_backends: &[&str]| {
        let mut text = String::new();
        for (name, vip, backends) in [("web", VIP, web_backends), ("api", OTHER_VIP, &["198.18.3.9"][..])] {
            text += &format!(
                "[[service]]\nname = \"{name}\"\nvip = \"{vip}\"\nprotocol = \"TCP\"\nports = [80]\nforwarding = \"L2_DSR\"\n"
            );
            for (i, b) in backends.iter().enumerate() {
                text += &format!("[[service.backend]]\naddress = \"{b}\"\nmac = \"02:be:00:00:00:{:02x}\"\n", i + 1);
            }
        }
        Config::parse(&text).unwrap()
    };
    lb_tests::fixture_net::enter_lo_routed_netns();
    let cfg = config(&["198.18.3.1", "198.18.3.2"]);
    let mut dp = fixture::register_interfaces(Dataplane::load(sizes_for(&cfg)).unwrap());
    let mut ctl = Controller::new(cfg);
    ctl.reconcile(&mut dp).unwrap();
    let other_backend: Ipv4Addr = "198.18.3.2".parse().unwrap();
    let api_backend: Ipv4Addr = "198.18.3.9".parse().unwrap();
    // From web's other backend (whichever the table picks): dropped, no entry.
    for sport in 40000..40008 {
        assert_eq!(counted(&dp, &syn_from(other_backend, VIP, sport), stat::DROP_MARTIAN), XDP_DROP);
    }
    // From api's backend, to web: a client like any other.
    assert_eq!(counted(&dp, &syn_from(api_backend, VIP, 40000), stat::NEW_FLOW), XDP_TX);
    // 198.18.3.2 leaves web: no longer a martian there.
    ctl.reload(config(&["198.18.3.1"]), &mut dp).unwrap();
    assert_eq!(counted(&dp, &syn_from(other_backend, VIP, 40003), stat::NEW_FLOW), XDP_TX);
}
