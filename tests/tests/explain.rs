//! `lb explain` agrees with the data plane: the real `Controller` writes a configuration into the
//! loaded XDP program; for thousands of random new flows, the backend `explain` names (the
//! function behind `lb explain`) is the backend the kernel actually sends the packet to (L2 DSR:
//! the destination MAC names the backend).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::maps::{PROTO_TCP, PROTO_UDP};
use lb_tests::packet::*;
use lb_user::compile::explain::{explain, ClassFacts, Flow};
use lb_user::compile::sizes::sizes_for;
use lb_user::compile::Compiled;
use lb_user::config::Config;
use lb_user::controller::Controller;
use lb_user::dataplane::{Dataplane, Program, XDP_DROP, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];

fn config() -> String {
    let mut s = String::from(
        "[dataplane]\nmaglev_table_size = 1021\n\n\
         [[zone]]\nname = \"a\"\nclient_prefixes = [\"198.18.1.0/24\", \"2001:db8:1::/64\"]\n\
         [[zone]]\nname = \"b\"\nclient_prefixes = [\"198.18.2.0/24\", \"2001:db8:2::/64\"]\n\
         [[zone]]\nname = \"c\"\nclient_prefixes = [\"198.18.3.0/24\", \"2001:db8:3::/64\"]\n\n",
    );
    // (name, vip, protocol, affinity, spillover, ratio)
    let services = [
        ("web", "198.18.0.10", "TCP", "NONE", "ZONAL_AFFINITY_STAY_WITHIN_ZONE", 0.0),
        ("dns", "198.18.0.11", "UDP", "CLIENT_IP_PROTO", "ZONAL_AFFINITY_SPILL_CROSS_ZONE", 0.8),
        ("web6", "2001:db8::10", "TCP", "CLIENT_IP", "ZONAL_AFFINITY_DISABLED", 0.0),
    ];
    for (si, (name, vip, proto, aff, spill, ratio)) in services.iter().enumerate() {
        s += &format!(
            "[[service]]\nname = \"{name}\"\nvip = \"{vip}\"\nprotocol = \"{proto}\"\nports = [80]\nforwarding = \"L2_DSR\"\nsession_affinity = \"{aff}\"\n\
             [service.zonal_affinity]\nspillover = \"{spill}\"\n"
        );
        if *ratio > 0.0 {
            s += &format!("spillover_ratio = {ratio}\n");
        }
        // Zones a and b get backends, c none; weights vary.
        for (zi, zone) in ["a", "b"].iter().enumerate() {
            for i in 0..4 {
                let n = si * 16 + zi * 4 + i + 1;
                let addr = if vip.contains(':') { format!("2001:db8:10::{n:x}") } else { format!("198.18.10.{n}") };
                s += &format!("[[service.backend]]\naddress = \"{addr}\"\nzone = \"{zone}\"\nweight = {}\nmac = \"02:be:00:00:00:{n:02x}\"\n", 1 + i % 3);
            }
        }
        s += "\n";
    }
    s
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A random flow of `config()`: service, client zone (1..=`zones`), host, port, protocol.
    fn flow<'a>(&mut self, cfg: &'a Config, zones: u64) -> (&'a lb_user::config::Service, u16, u16, u16, u8) {
        let svc = &cfg.services[(self.next() % 3) as usize];
        let zone = 1 + (self.next() % zones) as u16;
        let host = 1 + (self.next() % 250) as u16;
        let sport = 1024 + (self.next() % 60000) as u16;
        (svc, zone, host, sport, if svc.name == "dns" { PROTO_UDP } else { PROTO_TCP })
    }
}

/// The object loaded in a namespace of its own, with `cfg`'s tables written by the real
/// controller (the backends of `unhealthy` failed their checks), and what it applied.
fn loaded(cfg: &Config, unhealthy: &[(&str, &str)]) -> (Dataplane, Compiled) {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = lb_tests::fixture::register_interfaces(
        Dataplane::load(sizes_for(cfg)).expect("loading the XDP object (needs root)"),
    );
    let mut ctl = Controller::new(cfg.clone());
    for (svc, addr) in unhealthy {
        ctl.set_checked(svc, addr.parse().unwrap(), false);
    }
    ctl.reconcile(&mut dp).unwrap();
    (dp, ctl.applied().unwrap().clone())
}

#[test]
fn explain_names_the_backend_the_kernel_picks() {
    let cfg = Config::parse(&config()).unwrap();
    // Some unhealthy backends so that refine/replace/spill all occur.
    let unhealthy = [("web", "198.18.10.1"), ("web", "198.18.10.2"), ("dns", "198.18.10.21"), ("dns", "198.18.10.22")];
    let (dp, applied) = loaded(&cfg, &unhealthy);
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut checked = 0;
    let mut distinct = std::collections::BTreeSet::new();
    for _ in 0..3000 {
        // Zone 4 = no zone prefix.
        let (svc, zone, host, sport, proto) = rng.flow(&cfg, 4);
        let (client, frame) = match svc.vip().expect("a VIP service") {
            IpAddr::V4(vip) => {
                let c = Ipv4Addr::new(198, 18, zone as u8, host as u8);
                let l4 =
                    if proto == PROTO_TCP { tcp4(c, vip, sport, 80, 0x02, b"") } else { udp4(c, vip, sport, 80, b"q") };
                let l3 = V4::new(c, vip, proto).build(&l4);
                (IpAddr::V4(c), ethernet(LB_MAC, CLIENT_MAC, 0x0800, &l3))
            }
            IpAddr::V6(vip) => {
                let c = Ipv6Addr::new(0x2001, 0xdb8, zone, 0, 0, 0, 0, host);
                let l3 = ipv6(c, vip, PROTO_TCP, 64, 0, &tcp6(c, vip, sport, 80, 0x02, b""));
                (IpAddr::V6(c), ethernet(LB_MAC, CLIENT_MAC, 0x86dd, &l3))
            }
        };
        let predicted =
            explain(&cfg, &applied, &svc.name, &Flow { client, dst: None, sport, dport: 80, proto }).unwrap();
        let out = dp.run_test(Program::Lb, &frame, 0).unwrap();
        if predicted.dropped {
            assert_eq!(out.action, XDP_DROP, "{predicted:?}");
            continue;
        }
        if out.action != XDP_TX {
            let st = dp.stats().unwrap();
            let counters: Vec<String> = lb_common::maps::stat::NAMES
                .iter()
                .enumerate()
                .filter(|(i, _)| st.get(*i as u32) != 0)
                .map(|(i, n)| format!("{n}={}", st.get(i as u32)))
                .collect();
            panic!(
                "{} {client}:{sport}: action {} but explain said {predicted:?}; counters {counters:?}",
                svc.name, out.action
            );
        }
        let mac = out.data[5];
        let want = predicted.backend.unwrap().to_string();
        let want = want.as_str();
        let backend = cfg
            .services
            .iter()
            .flat_map(|s| &s.backends)
            .find(|b| b.address().is_some_and(|a| a.to_string() == want))
            .unwrap();
        assert_eq!(
            backend.mac.unwrap().to_string(),
            format!("02:be:00:00:00:{mac:02x}"),
            "{} {client}:{sport}: explain said {want}",
            svc.name
        );
        distinct.insert(want.to_owned());
        checked += 1;
    }
    assert!(checked > 2500, "most flows are forwarded ({checked})");
    assert!(distinct.len() >= 12, "flows reached many backends: {distinct:?}");
}

/// An ICMP error about a backend's reply (addressed to the VIP, quoting VIP -> client) reaches
/// the backend `explain` names for the quoted flow: IPv4 fragmentation needed and time
/// exceeded, ICMPv6 packet too big, destination unreachable and time exceeded, TCP and UDP.
#[test]
fn icmp_errors_reach_the_backend_explain_names_for_the_quoted_flow() {
    let cfg = Config::parse(&config()).unwrap();
    let (dp, applied) = loaded(&cfg, &[]);
    let router4 = Ipv4Addr::new(198, 18, 9, 1);
    let router6 = Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 1);
    let mut rng = Rng(0x1c4e_0000_0000_0007);
    let mut forwarded = 0;
    for n in 0..600 {
        let (svc, zone, host, sport, proto) = rng.flow(&cfg, 3);
        let (client, frame) = match svc.vip().expect("a VIP service") {
            IpAddr::V4(vip) => {
                let c = Ipv4Addr::new(198, 18, zone as u8, host as u8);
                // The backend's reply, VIP:80 -> client, quoted as header + 8 bytes.
                let l4 = if proto == PROTO_TCP {
                    tcp4(vip, c, 80, sport, TCP_ACK, &[1; 1400])
                } else {
                    udp4(vip, c, 80, sport, b"answer")
                };
                let reply = V4::new(vip, c, proto).build(&l4);
                let (kind, code, rest) = if n % 2 == 0 { (3, 4, 1400u32) } else { (11, 0, 0) };
                let mut icmp = vec![kind, code, 0, 0];
                icmp.extend_from_slice(&rest.to_be_bytes());
                icmp.extend_from_slice(&reply[..28]);
                let sum = checksum(&icmp);
                icmp[2..4].copy_from_slice(&sum.to_be_bytes());
                (IpAddr::V4(c), ethernet(LB_MAC, CLIENT_MAC, 0x0800, &V4::new(router4, vip, 1).build(&icmp)))
            }
            IpAddr::V6(vip) => {
                let c = Ipv6Addr::new(0x2001, 0xdb8, zone, 0, 0, 0, 0, host);
                let reply = ipv6(vip, c, PROTO_TCP, 64, 0, &tcp6(vip, c, 80, sport, TCP_ACK, &[1; 1400]));
                let (kind, rest) = [(2, 1280u32), (1, 0), (3, 0)][n % 3];
                let mut icmp = vec![kind, 0, 0, 0];
                icmp.extend_from_slice(&rest.to_be_bytes());
                icmp.extend_from_slice(&reply[..1232]);
                (IpAddr::V6(c), ethernet(LB_MAC, CLIENT_MAC, 0x86dd, &ipv6(router6, vip, 58, 64, 0, &icmp)))
            }
        };
        let predicted =
            explain(&cfg, &applied, &svc.name, &Flow { client, dst: None, sport, dport: 80, proto }).unwrap();
        let out = dp.run_test(Program::Lb, &frame, 0).unwrap();
        if predicted.dropped {
            assert_eq!(out.action, XDP_DROP, "{predicted:?}");
            continue;
        }
        assert_eq!(out.action, XDP_TX, "{} {client}:{sport}: {predicted:?}", svc.name);
        let want = predicted.backend.unwrap().to_string();
        let b = cfg
            .services
            .iter()
            .flat_map(|s| &s.backends)
            .find(|b| b.address().is_some_and(|a| a.to_string() == want))
            .unwrap();
        assert_eq!(
            b.mac.unwrap().to_string(),
            format!("02:be:00:00:00:{:02x}", out.data[5]),
            "{} {client}:{sport}: explain said {want}",
            svc.name
        );
        // The error is forwarded whole, only the Ethernet addresses rewritten.
        assert_eq!(out.data[12..], frame[12..]);
        forwarded += 1;
    }
    assert!(forwarded > 400, "most errors are forwarded ({forwarded})");
}

/// The same agreement for Traffic Manager services (classes are routing-method prefix groups).
#[test]
fn explain_names_the_backend_the_kernel_picks_for_traffic_manager_services() {
    let text = r#"
[dataplane]
maglev_table_size = 1021

[[service]]
name = "weighted"
vip = "198.18.0.20"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "WEIGHTED"
[[service.backend]]
name = "w1"
address = "198.18.20.1"
weight = 1
mac = "02:be:00:00:00:21"
[[service.backend]]
name = "w2"
address = "198.18.20.2"
weight = 3
mac = "02:be:00:00:00:22"

[[service]]
name = "subnet"
vip = "198.18.0.21"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "SUBNET"
[[service.backend]]
name = "s1"
address = "198.18.21.1"
subnets = ["198.18.1.0/24"]
mac = "02:be:00:00:00:31"
[[service.backend]]
name = "s2"
address = "198.18.21.2"
subnets = ["198.18.2.10-198.18.2.200"]
mac = "02:be:00:00:00:32"
"#;
    let cfg = Config::parse(text).unwrap();
    let (dp, applied) = loaded(&cfg, &[]);
    let mut rng = Rng(0x7e57_0000_0000_0042);
    let (mut forwarded, mut dropped) = (0, 0);
    for _ in 0..1000 {
        let svc = &cfg.services[(rng.next() % 2) as usize];
        let IpAddr::V4(vip) = svc.vip().expect("a VIP service") else { unreachable!() };
        let c = Ipv4Addr::new(198, 18, 1 + (rng.next() % 3) as u8, 1 + (rng.next() % 250) as u8);
        let sport = 1024 + (rng.next() % 60000) as u16;
        let frame = ethernet(
            LB_MAC,
            CLIENT_MAC,
            0x0800,
            &V4::new(c, vip, PROTO_TCP).build(&tcp4(c, vip, sport, 80, 0x02, b"")),
        );
        let predicted = explain(
            &cfg,
            &applied,
            &svc.name,
            &Flow { client: IpAddr::V4(c), dst: None, sport, dport: 80, proto: PROTO_TCP },
        )
        .unwrap();
        let ClassFacts::TrafficManager { routing_method, .. } = &predicted.class else {
            panic!("a Traffic Manager class: {predicted:?}")
        };
        assert_eq!(routing_method, svc.routing_method().as_str());
        let out = dp.run_test(Program::Lb, &frame, 0).unwrap();
        if predicted.dropped {
            assert_eq!(out.action, XDP_DROP, "{predicted:?}");
            dropped += 1;
            continue;
        }
        assert_eq!(out.action, XDP_TX, "{predicted:?}");
        let want = predicted.backend.unwrap().to_string();
        let want = want.as_str();
        let b = cfg
            .services
            .iter()
            .flat_map(|s| &s.backends)
            .find(|b| b.address().is_some_and(|a| a.to_string() == want))
            .unwrap();
        assert_eq!(b.mac.unwrap().to_string(), format!("02:be:00:00:00:{:02x}", out.data[5]), "{predicted:?}");
        forwarded += 1;
    }
    assert!(
        forwarded > 600 && dropped > 50,
        "SUBNET drops clients outside its ranges: {forwarded} forwarded, {dropped} dropped"
    );
}
