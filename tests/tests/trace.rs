//! Packet tracing through the real traced program (`lb_traced`, BPF_PROG_TEST_RUN): each event
//! names the packet's verdict, the drop or pass counter that decided it, the service, the
//! backend, whether the connection table decided, and the class; the filter is applied in the
//! kernel; a per-CPU token bucket caps the events; over generated hostile frames, one event per
//! matching frame and none for the others. And `lb` itself is untouched (no event from it).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use lb_common::maps::{
    addr_words, affinity, forwarding, stat, tracking, BACKEND_DROP, FAMILY_V4, PROTO_TCP, PROTO_UDP,
};
use lb_common::trace::{TraceEvent, TraceFilter, TRACE_CT_HIT, TRACE_NEW_FLOW, TRACE_NONE, TRACE_PARSED};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, TEST_M};
use lb_tests::fuzz::{Gen, Targets};
use lb_tests::packet::*;
use lb_user::dataplane::{Dataplane, Program, XDP_DROP, XDP_PASS, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const OTHER_CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 9);
const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// A service whose table has no backend: new flows are dropped (`drop_no_backend`).
const VIP_EMPTY: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);

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
        ],
        info,
    )
    .unwrap();
    dp.set_service(
        &[service_key(VIP_EMPTY.into(), 80, PROTO_TCP)],
        service_info(2, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR),
    )
    .unwrap();
    for id in 1..=4 {
        dp.set_backend(id, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, id as u8)), backend_mac(id), 0)).unwrap();
    }
    dp.write_table(1, 0, 0, &(0..TEST_M).map(|i| 1 + i % 4).collect::<Vec<_>>()).unwrap();
    dp.write_table(2, 0, 0, &vec![BACKEND_DROP; TEST_M as usize]).unwrap();
    dp
}

fn all(rate: u32) -> TraceFilter {
    TraceFilter { rate_per_sec: rate, ..TraceFilter::default() }
}

fn eth4(ip: &[u8]) -> Vec<u8> {
    ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, ip)
}

fn tcp(src: Ipv4Addr, dst: Ipv4Addr, sport: u16, flags: u8) -> Vec<u8> {
    eth4(&V4::new(src, dst, PROTO_TCP).build(&tcp4(src, dst, sport, 80, flags, b"x")))
}

/// Runs `frame` through the traced program; returns its action and the events it sent.
fn traced(dp: &mut Dataplane, frame: &[u8]) -> (u32, Vec<TraceEvent>) {
    let out = dp.run_test(Program::LbTraced, frame, 0).unwrap();
    (out.action, dp.trace_events())
}

#[test]
fn a_dropped_packet_names_its_reason() {
    let mut dp = setup();
    dp.set_trace_filter(&all(1000)).unwrap();
    let (action, events) = traced(&mut dp, &tcp(CLIENT, VIP_EMPTY, 40000, TCP_SYN));
    assert_eq!(action, XDP_DROP);
    let [e] = events.as_slice() else { panic!("one event: {events:?}") };
    assert_eq!(stat::NAMES[e.reason as usize], "drop_no_backend");
    assert_eq!(e.action as u32, XDP_DROP);
    assert_eq!((e.service, e.backend), (2, TRACE_NONE));
    assert!(e.flags & TRACE_PARSED != 0 && e.family == FAMILY_V4);
    assert_eq!(e.tuple.src, addr_words(CLIENT.into()).0);
    assert_eq!(u16::from_be(e.tuple.dport), 80);
    // A malformed packet to a VIP, dropped by the parser: no tuple, the parser's reason (an
    // unconstrained filter matches it).
    let frame = tcp(CLIENT, VIP, 40000, TCP_SYN);
    let (action, events) = traced(&mut dp, &frame[..14 + 12]);
    assert_eq!(action, XDP_DROP);
    let [e] = events.as_slice() else { panic!("one event: {events:?}") };
    assert_eq!(stat::NAMES[e.reason as usize], "drop_truncated_ip");
    assert_eq!(e.flags & TRACE_PARSED, 0);
    // A packet for the host: passed, with the pass counter's name.
    let (action, events) = traced(&mut dp, &tcp(CLIENT, Ipv4Addr::new(198, 18, 0, 250), 1, TCP_SYN));
    assert_eq!(action, XDP_PASS);
    assert_eq!(stat::NAMES[events[0].reason as usize], "pass_not_vip");
    // The balancer's own program sends nothing.
    dp.run_test(Program::Lb, &tcp(CLIENT, VIP_EMPTY, 40001, TCP_SYN), 0).unwrap();
    assert!(dp.trace_events().is_empty());
}

#[test]
fn a_forwarded_flow_shows_its_backend_class_and_table_hit() {
    let mut dp = setup();
    dp.set_trace_filter(&all(1000)).unwrap();
    let (action, events) = traced(&mut dp, &tcp(CLIENT, VIP, 40000, TCP_SYN));
    assert_eq!(action, XDP_TX);
    let [syn] = events.as_slice() else { panic!("one event: {events:?}") };
    assert!((1..=4).contains(&syn.backend), "{syn:?}");
    assert_eq!((syn.service, syn.class, syn.action as u32), (1, 0, XDP_TX));
    assert_eq!(syn.flags & (TRACE_NEW_FLOW | TRACE_CT_HIT), TRACE_NEW_FLOW);
    assert_eq!(syn.reason, lb_common::trace::TRACE_NO_REASON);
    let (_, events) = traced(&mut dp, &tcp(CLIENT, VIP, 40000, TCP_ACK));
    let [ack] = events.as_slice() else { panic!("one event: {events:?}") };
    assert_eq!(ack.backend, syn.backend);
    assert_eq!(ack.flags & (TRACE_NEW_FLOW | TRACE_CT_HIT), TRACE_CT_HIT);
}

#[test]
fn the_filter_is_applied_in_the_kernel() {
    let mut dp = setup();
    let (client, _) = addr_words(CLIENT.into());
    let by_client =
        TraceFilter { client, client_len: 32, client_family: FAMILY_V4, rate_per_sec: 1000, ..Default::default() };
    dp.set_trace_filter(&by_client).unwrap();
    assert_eq!(traced(&mut dp, &tcp(OTHER_CLIENT, VIP, 40000, TCP_SYN)).1.len(), 0);
    assert_eq!(traced(&mut dp, &tcp(CLIENT, VIP, 40000, TCP_SYN)).1.len(), 1);
    // A constrained filter does not match what the parser could not read.
    let frame = tcp(CLIENT, VIP, 40000, TCP_SYN);
    assert_eq!(traced(&mut dp, &frame[..14 + 12]).1.len(), 0);
    let (vip, _) = addr_words(VIP_EMPTY.into());
    dp.set_trace_filter(&TraceFilter { vip, vip_family: FAMILY_V4, rate_per_sec: 1000, ..Default::default() }).unwrap();
    assert_eq!(traced(&mut dp, &tcp(CLIENT, VIP, 40001, TCP_SYN)).1.len(), 0);
    assert_eq!(traced(&mut dp, &tcp(CLIENT, VIP_EMPTY, 40001, TCP_SYN)).1.len(), 1);
    dp.set_trace_filter(&TraceFilter { proto: PROTO_UDP, rate_per_sec: 1000, ..Default::default() }).unwrap();
    assert_eq!(traced(&mut dp, &tcp(CLIENT, VIP, 40002, TCP_SYN)).1.len(), 0);
    dp.set_trace_filter(&TraceFilter { port: 443u16.to_be(), rate_per_sec: 1000, ..Default::default() }).unwrap();
    assert_eq!(traced(&mut dp, &tcp(CLIENT, VIP, 40003, TCP_SYN)).1.len(), 0);
    // Rate 0: nothing.
    dp.set_trace_filter(&all(0)).unwrap();
    assert_eq!(traced(&mut dp, &tcp(CLIENT, VIP, 40004, TCP_SYN)).1.len(), 0);
}

/// Keeps this thread on one CPU: the token bucket is per CPU.
fn pin_to_one_cpu() {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        assert_eq!(libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set), 0);
    }
}

#[test]
fn the_rate_limit_caps_the_events() {
    pin_to_one_cpu();
    let mut dp = setup();
    const RATE: u32 = 3;
    dp.set_trace_filter(&all(RATE)).unwrap();
    let start = Instant::now();
    let mut events = 0;
    for i in 0..60 {
        events += traced(&mut dp, &tcp(CLIENT, VIP, 30000 + i, TCP_SYN)).1.len();
    }
    // A burst of one second's worth, then RATE a second.
    let most = RATE as usize * (1 + start.elapsed().as_secs() as usize + 1);
    assert!(events >= RATE as usize && events <= most, "{events} events, expected {RATE}..={most}");
}

/// Generated hostile frames (`lb_tests::fuzz`): with a filter that takes everything, one event
/// per frame; with a filter on a VIP and protocol, exactly the frames whose tuple matches it
/// (as the events of the unfiltered run show them), and none for the others; with a rate
/// limit, no more than it allows.
#[test]
fn fuzz_frames_give_one_event_per_matching_frame() {
    pin_to_one_cpu();
    let mut dp = setup();
    let targets = Targets {
        local_mac: LB_MAC,
        client_mac: CLIENT_MAC,
        client4: CLIENT,
        client6: CLIENT6,
        vips4: vec![VIP, VIP_EMPTY],
        vips6: vec![VIP6],
        ports: vec![80, 53],
    };
    let seed = lb_tests::fuzz::seed_from_env(0x7ace);
    let frames: Vec<Vec<u8>> = {
        let mut g = Gen::new(seed, targets);
        (0..3000).map(|_| g.next_frame().bytes).filter(|f| f.len() >= 14).collect()
    };
    let run = |dp: &mut Dataplane, filter: &TraceFilter| -> Vec<Option<TraceEvent>> {
        dp.set_trace_filter(filter).unwrap();
        frames
            .iter()
            .map(|f| match dp.run_test(Program::LbTraced, f, 0) {
                Ok(_) => {
                    let mut ev = dp.trace_events();
                    assert!(ev.len() <= 1, "LB_FUZZ_SEED={seed:#x}: {} events for one frame", ev.len());
                    ev.pop()
                }
                Err(_) => None, // refused by BPF_PROG_TEST_RUN (too short): nothing ran
            })
            .collect()
    };
    let ran: Vec<bool> = frames.iter().map(|f| dp.run_test(Program::Lb, f, 0).is_ok()).collect();
    let _ = dp.trace_events();
    let everything = run(&mut dp, &all(1_000_000));
    for (i, e) in everything.iter().enumerate() {
        assert_eq!(e.is_some(), ran[i], "LB_FUZZ_SEED={seed:#x} frame {i}: one event per frame that ran");
    }
    let (vip, _) = addr_words(VIP.into());
    let filter =
        TraceFilter { vip, vip_family: FAMILY_V4, proto: PROTO_TCP, rate_per_sec: 1_000_000, ..Default::default() };
    let filtered = run(&mut dp, &filter);
    let mut matching = 0;
    for (i, (all_e, f_e)) in everything.iter().zip(&filtered).enumerate() {
        let should = all_e.is_some_and(|e| e.flags & TRACE_PARSED != 0 && filter.matches(e.family, &e.tuple));
        assert_eq!(f_e.is_some(), should, "LB_FUZZ_SEED={seed:#x} frame {i}: {all_e:?}");
        matching += should as usize;
    }
    assert!(matching > 100, "the seed's frames hit the filter too rarely to tell ({matching})");
    // Capped: at most the bucket's burst plus its refill while the run lasts.
    let start = Instant::now();
    let limited = run(&mut dp, &TraceFilter { rate_per_sec: 20, ..filter }).iter().flatten().count();
    let most = 20 * (2 + start.elapsed().as_secs() as usize);
    assert!((20..=most).contains(&limited), "{limited} events at 20/s, expected 20..={most}");
}
