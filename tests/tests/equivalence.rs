//! Model equivalence: for 12,000 pseudo-random flows over several services (IPv4 and IPv6,
//! every session affinity, TCP/UDP/other protocols) and client classes, the backend the kernel
//! picks equals the one userspace predicts from the same tables with lb-common's functions.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use lb_common::decide::{hash_tuple, syn_keeps_entry};
use lb_common::hash::{flow_hash, maglev_slot};
use lb_common::maps::{
    affinity, forwarding, stat, tracking, CtEntry, FlowTuple, ServiceKey, PROTO_ANY, PROTO_TCP, PROTO_UDP,
};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, TEST_M};
use lb_tests::packet::*;
use lb_user::dataplane::{addr_words, Dataplane, Program, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const FLOWS: usize = 12_000;

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct Service {
    id: u32,
    vip: IpAddr,
    affinity: u8,
    /// Protocol of the service key (PROTO_ANY = L3_DEFAULT), all ports.
    proto: u8,
}

struct Model {
    services: Vec<Service>,
    /// (service, prefix, class)
    prefixes: Vec<(u32, IpNet, u32)>,
    /// (service, class) -> table
    tables: std::collections::HashMap<(u32, u32), Vec<u32>>,
}

impl Model {
    /// Longest matching prefix of the service, then fall back to class 0 without a table.
    fn table_for(&self, service: u32, src: IpAddr) -> &Vec<u32> {
        let class = self.class_for(service, src);
        &self.tables[&(service, class)]
    }

    /// The class whose table a client's new flows use.
    fn class_for(&self, service: u32, src: IpAddr) -> u32 {
        let class = self
            .prefixes
            .iter()
            .filter(|(s, net, _)| *s == service && net.contains(&src))
            .max_by_key(|(_, net, _)| net.prefix_len())
            .map(|&(_, _, c)| c)
            .unwrap_or(0);
        if self.tables.contains_key(&(service, class)) {
            class
        } else {
            0
        }
    }

    fn predict(&self, svc: &Service, src: IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
        self.table_for(svc.id, src)[self.slot(svc, src, sport, dport, proto) as usize]
    }

    /// The Maglev slot of a flow.
    fn slot(&self, svc: &Service, src: IpAddr, sport: u16, dport: u16, proto: u8) -> u32 {
        let ports_valid = proto == PROTO_TCP || proto == PROTO_UDP;
        let full = FlowTuple {
            src: addr_words(src).0,
            dst: addr_words(svc.vip).0,
            sport: if ports_valid { sport.to_be() } else { 0 },
            dport: if ports_valid { dport.to_be() } else { 0 },
            proto,
            _pad: [0; 3],
        };
        maglev_slot(flow_hash(&hash_tuple(svc.affinity, &full, ports_valid)), TEST_M)
    }
}

fn build(dp: &mut Dataplane, rng: &mut Rng) -> Model {
    let v4 = |d| IpAddr::V4(Ipv4Addr::new(198, 18, 0, d));
    let v6 = |d| IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, d));
    let services = vec![
        Service { id: 0, vip: v4(10), affinity: affinity::NONE, proto: PROTO_TCP },
        Service { id: 1, vip: v4(11), affinity: affinity::CLIENT_IP_PROTO, proto: PROTO_UDP },
        Service { id: 2, vip: v6(12), affinity: affinity::CLIENT_IP_PORT_PROTO, proto: PROTO_TCP },
        Service { id: 3, vip: v4(13), affinity: affinity::CLIENT_IP, proto: PROTO_ANY },
        Service { id: 4, vip: v6(14), affinity: affinity::CLIENT_IP_NO_DESTINATION, proto: PROTO_ANY },
        Service { id: 5, vip: v6(15), affinity: affinity::NONE, proto: PROTO_UDP },
    ];
    for s in &services {
        let info = service_info(s.id, s.affinity, tracking::PER_CONNECTION, forwarding::L2_DSR);
        let key: ServiceKey = service_key(s.vip, 0, s.proto);
        dp.set_service(&[key], info).unwrap();
    }
    for id in 0..60u32 {
        dp.set_backend(id, backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, id as u8)), backend_mac(id), 0)).unwrap();
    }
    let mut prefixes = Vec::new();
    for s in &services {
        for (net, class) in [
            ("198.18.64.0/20", 1),
            ("198.18.72.0/24", 2),
            ("198.18.80.0/24", 3), // class 3 gets no table: falls back to class 0
            ("2001:db8:aa::/48", 1),
            ("2001:db8:aa:5::/64", 2),
            ("2001:db8:bb::/48", 3),
        ] {
            let net: IpNet = net.parse().unwrap();
            dp.set_class_prefix(s.id, net, class).unwrap();
            prefixes.push((s.id, net, class));
        }
    }
    let mut tables = std::collections::HashMap::new();
    for s in &services {
        for class in 0..3u32 {
            // A pseudo-random subset of 3..10 backends, spread over the table.
            let n = 3 + rng.below(8) as usize;
            let pool: Vec<u32> = (0..n).map(|_| rng.below(60) as u32).collect();
            let table: Vec<u32> = (0..TEST_M).map(|_| pool[rng.below(n as u64) as usize]).collect();
            dp.write_table(s.id, class, 0, &table).unwrap();
            tables.insert((s.id, class), table);
        }
    }
    Model { services, prefixes, tables }
}

fn random_client(rng: &mut Rng, v6: bool) -> IpAddr {
    if v6 {
        let group = [0xaa, 0xbb, 0xcc][rng.below(3) as usize];
        let sub = [0u16, 5, 9][rng.below(3) as usize];
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, group, sub, 0, 0, rng.next() as u16, rng.next() as u16))
    } else {
        let third = [64u8, 70, 72, 80, 90][rng.below(5) as usize];
        IpAddr::V4(Ipv4Addr::new(198, 18, third, rng.next() as u8))
    }
}

fn frame(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, proto: u8) -> Vec<u8> {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            let l4 = match proto {
                PROTO_TCP => tcp4(s, d, sport, dport, TCP_SYN, b""),
                PROTO_UDP => udp4(s, d, sport, dport, b"x"),
                _ => vec![8, 0, 0, 0, 0, 1, 0, 1], // ICMP echo
            };
            ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &V4::new(s, d, proto).build(&l4))
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            let l4 = match proto {
                PROTO_TCP => tcp6(s, d, sport, dport, TCP_SYN, b""),
                PROTO_UDP => udp6(s, d, sport, dport, b"x"),
                _ => vec![128, 0, 0, 0, 0, 1, 0, 1], // ICMPv6 echo
            };
            ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, &ipv6(s, d, proto, 64, 0, &l4))
        }
        _ => unreachable!("family mismatch"),
    }
}

#[test]
fn kernel_choice_equals_userspace_prediction_for_random_flows() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = fixture::load();
    let mut rng = Rng(0x5eed_1b0b_cafe_f00d);
    let model = build(&mut dp, &mut rng);
    let mut hits = std::collections::HashMap::<u32, usize>::new();
    // (service, client, ports, backend) of TCP flows, sent again after a table change.
    let mut sent_again = Vec::new();
    for i in 0..FLOWS {
        let svc = &model.services[rng.below(model.services.len() as u64) as usize];
        let proto = match svc.proto {
            PROTO_ANY => [PROTO_TCP, PROTO_UDP, if svc.vip.is_ipv4() { 1 } else { 58 }][rng.below(3) as usize],
            p => p,
        };
        let src = random_client(&mut rng, svc.vip.is_ipv6());
        let (sport, dport) = (1024 + rng.below(60000) as u16, 1 + rng.below(65000) as u16);
        let out = dp.run_test(Program::Lb, &frame(src, svc.vip, sport, dport, proto), 0).unwrap();
        assert_eq!(out.action, XDP_TX, "flow {i}");
        let got = u32::from(out.data[4]) << 8 | u32::from(out.data[5]);
        assert_eq!(backend_mac(got), out.data[0..6], "flow {i}: unknown MAC");
        let want = model.predict(svc, src, sport, dport, proto);
        assert_eq!(got, want, "flow {i}: service {} src {src} {sport}->{dport} proto {proto}", svc.id);
        *hits.entry(got).or_default() += 1;
        if proto == PROTO_TCP && sent_again.len() < 2000 {
            sent_again.push((svc.id, src, sport, dport, got));
        }
    }
    assert!(hits.len() > 20, "flows should spread over many backends, got {}", hits.len());

    // New tables everywhere, then the tracked TCP flows' SYNs again (issue 20.2): the model
    // applies lb-common's rule to each flow's entry, as the kernel does.
    let model = build(&mut dp, &mut rng);
    let now = dp.now_ns().unwrap();
    let mut kept = 0;
    // What each tracked flow's entry names after its second SYN.
    let mut tracked = Vec::new();
    for (i, &(id, src, sport, dport, first)) in sent_again.iter().enumerate() {
        let svc = &model.services[id as usize];
        let info = service_info(svc.id, svc.affinity, tracking::PER_CONNECTION, forwarding::L2_DSR);
        let entry = CtEntry { backend: first, last_seen_ns: now, ..Default::default() };
        let b = backend(IpAddr::V4(Ipv4Addr::new(198, 18, 3, first as u8)), backend_mac(first), 0);
        let want = if syn_keeps_entry(&entry, Some(&b), &info, now) {
            first
        } else {
            model.predict(svc, src, sport, dport, PROTO_TCP)
        };
        let out = dp.run_test(Program::Lb, &frame(src, svc.vip, sport, dport, PROTO_TCP), 0).unwrap();
        let got = u32::from(out.data[4]) << 8 | u32::from(out.data[5]);
        assert_eq!((out.action, got), (XDP_TX, want), "SYN {i} again: service {id} src {src} {sport}->{dport}");
        tracked.push(want);
        kept += usize::from(want != model.predict(svc, src, sport, dport, PROTO_TCP));
    }
    assert!(kept > sent_again.len() / 2, "most flows hash elsewhere under the new tables and stay: {kept}");

    // Issue 35: after a scan, SYNs of new flows in clean slots go without the connection table;
    // the choice is the model's all the same, and the tracked flows' SYNs still keep their
    // entries (their slots stay dirty).
    dp.scan_clean_slots().unwrap();
    let before = dp.stats().unwrap().get(stat::CT_SYN_STATELESS);
    let mut clean = 0;
    for i in 0..FLOWS {
        let svc = &model.services[rng.below(model.services.len() as u64) as usize];
        if svc.proto != PROTO_TCP && svc.proto != PROTO_ANY {
            continue;
        }
        let src = random_client(&mut rng, svc.vip.is_ipv6());
        let (sport, dport) = (1024 + rng.below(60000) as u16, 1 + rng.below(65000) as u16);
        let out = dp.run_test(Program::Lb, &frame(src, svc.vip, sport, dport, PROTO_TCP), 0).unwrap();
        let got = u32::from(out.data[4]) << 8 | u32::from(out.data[5]);
        let want = model.predict(svc, src, sport, dport, PROTO_TCP);
        assert_eq!((out.action, got), (XDP_TX, want), "SYN {i} after the scan: service {} src {src}", svc.id);
        let class = model.class_for(svc.id, src);
        clean += u64::from(dp.slot_clean(svc.id, class, model.slot(svc, src, sport, dport, PROTO_TCP)) == Some(true));
    }
    // (With 257-slot tables and thousands of flows from before the change, most slots hold a
    // flow the new tables moved: few are clean.)
    let stateless = dp.stats().unwrap().get(stat::CT_SYN_STATELESS) - before;
    assert!(clean > 0, "some new SYNs find their slot clean");
    assert_eq!(stateless, clean, "exactly the SYNs in clean slots go without the connection table");
    for (i, (&(id, src, sport, dport, _), &want)) in sent_again.iter().zip(&tracked).enumerate() {
        let svc = &model.services[id as usize];
        let out = dp.run_test(Program::Lb, &frame(src, svc.vip, sport, dport, PROTO_TCP), 0).unwrap();
        let got = u32::from(out.data[4]) << 8 | u32::from(out.data[5]);
        assert_eq!(got, want, "tracked SYN {i} after the scan keeps its entry");
    }
}
