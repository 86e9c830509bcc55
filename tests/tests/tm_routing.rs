//! Traffic Manager routing methods through the real XDP program (BPF_PROG_TEST_RUN): the real
//! `Controller` compiles a configuration into the loaded data plane, packets from clients in
//! different prefixes run through `lb`, and L2 DSR's destination MAC names the backend each new
//! flow reached. Then endpoints turn Degraded (probe verdicts) or Disabled (reload) and new
//! flows must move as spec §2.2/§2.4 says.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use lb_common::maps::{stat, PROTO_TCP};
use lb_tests::packet::*;
use lb_user::compile::sizes::sizes_for;
use lb_user::config::Config;
use lb_user::controller::Controller;
use lb_user::dataplane::{Dataplane, Program, XDP_DROP, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];

/// Clients: C1 in Ireland measuring westeurope first, C2 in California measuring eastus first,
/// C3 in Japan (no latency data), C4 known to no input.
const C1: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const C2: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 5);
const C3: Ipv4Addr = Ipv4Addr::new(198, 18, 3, 5);
const C4: Ipv4Addr = Ipv4Addr::new(198, 18, 4, 5);

/// One service per method; backend `name` = its MAC's last octet in hex, so a frame names it.
const CFG: &str = r#"
[dataplane]
maglev_table_size = 257

[[latency]]
client_prefixes = ["198.18.1.0/24"]
regions = ["westeurope", "eastus"]
[[latency]]
client_prefixes = ["198.18.2.0/24"]
regions = ["eastus", "westeurope"]
[[geo]]
client_prefixes = ["198.18.1.0/24"]
region = "IE"
[[geo]]
client_prefixes = ["198.18.2.0/24"]
region = "US-CA"
[[geo]]
client_prefixes = ["198.18.3.0/24"]
region = "JP"

[[service]]
name = "prio"
vip = "198.18.0.1"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "PRIORITY"
[[service.backend]]
name = "p1"
address = "198.18.10.1"
mac = "02:be:00:00:00:11"
[[service.backend]]
name = "p2"
address = "198.18.10.2"
mac = "02:be:00:00:00:12"

[[service]]
name = "weighted"
vip = "198.18.0.2"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "WEIGHTED"
[[service.backend]]
name = "w1"
address = "198.18.11.1"
mac = "02:be:00:00:00:21"
weight = 1
[[service.backend]]
name = "w2"
address = "198.18.11.2"
mac = "02:be:00:00:00:22"
weight = 3

[[service]]
name = "perf"
vip = "198.18.0.3"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "PERFORMANCE"
[[service.backend]]
name = "we1"
address = "198.18.12.1"
mac = "02:be:00:00:00:31"
location = "westeurope"
[[service.backend]]
name = "we2"
address = "198.18.12.2"
mac = "02:be:00:00:00:32"
location = "westeurope"
[[service.backend]]
name = "us1"
address = "198.18.12.3"
mac = "02:be:00:00:00:33"
location = "eastus"

[[service]]
name = "geo"
vip = "198.18.0.4"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "GEOGRAPHIC"
[[service.backend]]
name = "g_ie"
address = "198.18.13.1"
mac = "02:be:00:00:00:41"
geo_mapping = ["IE"]
[[service.backend]]
name = "g_us"
address = "198.18.13.2"
mac = "02:be:00:00:00:42"
geo_mapping = ["US"]

[[service]]
name = "subnet"
vip = "198.18.0.5"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "SUBNET"
[[service.backend]]
name = "s1"
address = "198.18.14.1"
mac = "02:be:00:00:00:51"
subnets = ["198.18.1.0/24"]
[[service.backend]]
name = "s2"
address = "198.18.14.2"
mac = "02:be:00:00:00:52"
subnets = ["198.18.2.0-198.18.2.127"]
[[service.backend]]
name = "sf"
address = "198.18.14.3"
mac = "02:be:00:00:00:53"

[[service]]
name = "multi"
vip = "198.18.0.6"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "MULTIVALUE"
max_return = 2
[[service.backend]]
name = "m1"
address = "198.18.15.1"
mac = "02:be:00:00:00:61"
[[service.backend]]
name = "m2"
address = "198.18.15.2"
mac = "02:be:00:00:00:62"
[[service.backend]]
name = "m3"
address = "198.18.15.3"
mac = "02:be:00:00:00:63"

[[service]]
name = "nested"
vip = "198.18.0.7"
protocol = "TCP"
ports = [80]
forwarding = "L2_DSR"
routing_method = "PRIORITY"
[[service.backend]]
name = "regional"
target_service = "perf"
min_child_endpoints = 1
[[service.backend]]
name = "standby"
address = "198.18.16.1"
mac = "02:be:00:00:00:71"
"#;

fn name_of_mac(mac: &[u8]) -> &'static str {
    match mac[5] {
        0x11 => "p1",
        0x12 => "p2",
        0x21 => "w1",
        0x22 => "w2",
        0x31 => "we1",
        0x32 => "we2",
        0x33 => "us1",
        0x41 => "g_ie",
        0x42 => "g_us",
        0x51 => "s1",
        0x52 => "s2",
        0x53 => "sf",
        0x61 => "m1",
        0x62 => "m2",
        0x63 => "m3",
        0x71 => "standby",
        other => panic!("frame sent to an unknown MAC ending {other:#x}"),
    }
}

struct Rig {
    ctl: Controller,
    dp: Dataplane,
}

impl Rig {
    fn new(cfg: &str) -> Rig {
        let cfg = Config::parse(cfg).expect("test configuration is valid");
        lb_tests::fixture_net::enter_lo_routed_netns();
        let dp = lb_tests::fixture::register_interfaces(
            Dataplane::load(sizes_for(&cfg)).expect("loading the data plane (tests must run as root)"),
        );
        let mut rig = Rig { ctl: Controller::new(cfg), dp };
        rig.ctl.reconcile(&mut rig.dp).expect("initial reconcile");
        rig
    }

    fn vip(&self, service: &str) -> Ipv4Addr {
        match self.ctl.config().services.iter().find(|s| s.name == service).and_then(|s| s.vip()) {
            Some(std::net::IpAddr::V4(v)) => v,
            other => panic!("no IPv4 service {service}: {other:?}"),
        }
    }

    /// The backend a new TCP flow (SYN) from `client:sport` reaches, or None if dropped.
    fn new_flow(&self, service: &str, client: Ipv4Addr, sport: u16) -> Option<&'static str> {
        self.packet(service, client, sport, TCP_SYN)
    }

    fn packet(&self, service: &str, client: Ipv4Addr, sport: u16, flags: u8) -> Option<&'static str> {
        let vip = self.vip(service);
        let ip = V4::new(client, vip, PROTO_TCP).build(&tcp4(client, vip, sport, 80, flags, b"x"));
        let frame = ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip);
        let out = self.dp.run_test(Program::Lb, &frame, 0).expect("BPF_PROG_TEST_RUN");
        match out.action {
            XDP_TX => {
                assert_eq!(&out.data[12..], &frame[12..], "DSR leaves the packet after the MACs untouched");
                Some(name_of_mac(&out.data[0..6]))
            }
            XDP_DROP => None,
            other => panic!("unexpected XDP action {other}"),
        }
    }

    /// Backends reached by `n` new flows from `client`, with counts.
    fn spread(&self, service: &str, client: Ipv4Addr, first_sport: u16, n: u16) -> BTreeMap<&'static str, u32> {
        let mut seen = BTreeMap::new();
        for sport in first_sport..first_sport + n {
            let b = self.new_flow(service, client, sport).unwrap_or("DROP");
            *seen.entry(b).or_insert(0) += 1;
        }
        seen
    }

    fn degrade(&mut self, service: &str, addr: &str) {
        self.ctl.set_checked(service, addr.parse().unwrap(), false);
        self.ctl.reconcile(&mut self.dp).unwrap();
    }

    fn recover(&mut self, service: &str, addr: &str) {
        self.ctl.set_checked(service, addr.parse().unwrap(), true);
        self.ctl.reconcile(&mut self.dp).unwrap();
    }

    /// Reload with one endpoint `endpoint_status = "Disabled"`.
    fn disable(&mut self, backend_name: &str) {
        let marker = format!("name = \"{backend_name}\"\n");
        let text = CFG.replacen(&marker, &format!("{marker}endpoint_status = \"Disabled\"\n"), 1);
        assert_ne!(text, CFG, "no endpoint {backend_name}");
        self.ctl.replace_config(Config::parse(&text).unwrap());
        self.ctl.reconcile(&mut self.dp).unwrap();
    }

    fn unroutable_drops(&self) -> u64 {
        self.dp.stats().unwrap().get(stat::DROP_CLASS_UNROUTABLE)
    }
}

fn only(name: &'static str, n: u32) -> BTreeMap<&'static str, u32> {
    BTreeMap::from([(name, n)])
}

#[test]
fn priority_first_available_then_failover_and_all_degraded() {
    let mut rig = Rig::new(CFG);
    for c in [C1, C2, C4] {
        assert_eq!(rig.spread("prio", c, 1000, 20), only("p1", 20), "every client class gets p1");
    }
    // An established flow on p1, then p1 turns Degraded: new flows go to p2.
    assert_eq!(rig.new_flow("prio", C1, 7000), Some("p1"));
    rig.degrade("prio", "198.18.10.1");
    assert_eq!(rig.spread("prio", C1, 2000, 20), only("p2", 20));
    assert_eq!(rig.packet("prio", C1, 7000, TCP_ACK), Some("p1"), "TCP flows persist (DEFAULT_FOR_PROTOCOL)");
    // Both Degraded: the all-degraded rule treats them as available; the first wins again (A4).
    rig.degrade("prio", "198.18.10.2");
    assert_eq!(rig.spread("prio", C2, 3000, 20), only("p1", 20));
    rig.recover("prio", "198.18.10.1");
    rig.recover("prio", "198.18.10.2");
    assert_eq!(rig.spread("prio", C2, 4000, 10), only("p1", 10));
    // p1 Disabled by configuration: p2 (A3 style).
    rig.disable("p1");
    assert_eq!(rig.spread("prio", C4, 5000, 20), only("p2", 20));
}

#[test]
fn weighted_spreads_by_weight_and_drops_degraded() {
    let mut rig = Rig::new(CFG);
    let spread = rig.spread("weighted", C1, 1000, 400);
    let (w1, w2) = (spread.get("w1").copied().unwrap_or(0), spread.get("w2").copied().unwrap_or(0));
    assert_eq!(w1 + w2, 400, "{spread:?}");
    // Weights 1:3 -> 25 % / 75 % of the Maglev table; 400 flows land within a wide band.
    assert!((60..=140).contains(&w1), "w1 should get about 100 of 400 flows: {spread:?}");
    let other = rig.spread("weighted", C4, 1000, 400);
    assert!((60..=140).contains(&other.get("w1").copied().unwrap_or(0)), "same weights for every class: {other:?}");
    rig.degrade("weighted", "198.18.11.2");
    assert_eq!(rig.spread("weighted", C1, 2000, 40), only("w1", 40), "W2: a Degraded endpoint gets nothing");
    rig.disable("w1");
    // w1 Disabled, w2 Degraded: the all-degraded rule serves w2.
    assert_eq!(rig.spread("weighted", C2, 3000, 40), only("w2", 40));
}

#[test]
fn performance_nearest_region_then_next_region() {
    let mut rig = Rig::new(CFG);
    let c1 = rig.spread("perf", C1, 1000, 200);
    assert_eq!(c1.keys().copied().collect::<Vec<_>>(), ["we1", "we2"], "westeurope, spread inside it: {c1:?}");
    assert!(c1["we1"] >= 60 && c1["we2"] >= 60, "about even (F3): {c1:?}");
    assert_eq!(rig.spread("perf", C2, 1000, 40), only("us1", 40), "eastus is C2's nearest");
    // Our choice for clients without latency data: every available endpoint.
    assert_eq!(rig.spread("perf", C4, 1000, 200).len(), 3);
    rig.degrade("perf", "198.18.12.1");
    assert_eq!(rig.spread("perf", C1, 2000, 40), only("we2", 40), "we1 Degraded: we2 alone");
    rig.degrade("perf", "198.18.12.2");
    assert_eq!(rig.spread("perf", C1, 3000, 40), only("us1", 40), "F2: whole region Degraded -> next region");
    rig.degrade("perf", "198.18.12.3");
    let all_degraded = rig.spread("perf", C1, 4000, 200);
    assert_eq!(all_degraded.keys().copied().collect::<Vec<_>>(), ["we1", "we2"], "F5: all Degraded -> nearest region");
}

#[test]
fn geographic_most_specific_mapping_and_nodata_drop() {
    let mut rig = Rig::new(CFG);
    assert_eq!(rig.spread("geo", C1, 1000, 20), only("g_ie", 20), "IE");
    assert_eq!(rig.spread("geo", C2, 1000, 20), only("g_us", 20), "US-CA climbs to US");
    let before = rig.unroutable_drops();
    assert_eq!(rig.spread("geo", C3, 1000, 10), only("DROP", 10), "JP is mapped nowhere: NODATA");
    assert_eq!(rig.spread("geo", C4, 1000, 10), only("DROP", 10), "unknown location: NODATA");
    assert_eq!(rig.unroutable_drops() - before, 20, "NODATA drops are counted as unroutable");
    // Q3: Degraded does not move a geographic mapping.
    rig.degrade("geo", "198.18.13.1");
    assert_eq!(rig.spread("geo", C1, 2000, 20), only("g_ie", 20));
    // Q5 with no coarser mapping: g_ie Disabled -> IE has no endpoint -> dropped.
    rig.disable("g_ie");
    let before = rig.unroutable_drops();
    assert_eq!(rig.spread("geo", C1, 3000, 10), only("DROP", 10));
    assert_eq!(rig.unroutable_drops() - before, 10);
    assert_eq!(rig.spread("geo", C2, 3000, 10), only("g_us", 10));
}

#[test]
fn subnet_mapped_then_fallback_then_drop() {
    let mut rig = Rig::new(CFG);
    assert_eq!(rig.spread("subnet", C1, 1000, 20), only("s1", 20));
    assert_eq!(rig.spread("subnet", C2, 1000, 20), only("s2", 20), "198.18.2.5 is in 198.18.2.0-198.18.2.127");
    assert_eq!(rig.spread("subnet", Ipv4Addr::new(198, 18, 2, 200), 1000, 20), only("sf", 20), "outside the range");
    assert_eq!(rig.spread("subnet", C4, 1000, 20), only("sf", 20), "N1: unmatched -> fallback");
    rig.degrade("subnet", "198.18.14.1");
    assert_eq!(rig.spread("subnet", C1, 2000, 20), only("sf", 20), "N6: mapped Degraded -> fallback");
    rig.degrade("subnet", "198.18.14.3");
    let before = rig.unroutable_drops();
    assert_eq!(rig.spread("subnet", C1, 3000, 10), only("DROP", 10), "mapped and fallback Degraded, s2 Online: NODATA");
    assert_eq!(rig.unroutable_drops() - before, 10);
    assert_eq!(rig.spread("subnet", C2, 3000, 10), only("s2", 10), "C2 unaffected");
    rig.disable("s2");
    // s2 Disabled (its range gone): C2 is unmatched, fallback sf Degraded; s1 and sf are all
    // Degraded, so the all-degraded rule makes sf available again.
    assert_eq!(rig.spread("subnet", C2, 4000, 10), only("sf", 10));
}

#[test]
fn multivalue_spreads_over_every_available_endpoint() {
    let mut rig = Rig::new(CFG);
    let all = rig.spread("multi", C1, 1000, 300);
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        ["m1", "m2", "m3"],
        "max_return limits DNS answers, not flows: {all:?}"
    );
    rig.degrade("multi", "198.18.15.2");
    let two = rig.spread("multi", C2, 2000, 300);
    assert_eq!(two.keys().copied().collect::<Vec<_>>(), ["m1", "m3"], "M2: {two:?}");
    rig.disable("m1");
    assert_eq!(rig.spread("multi", C2, 3000, 40), only("m3", 40));
}

#[test]
fn nested_child_set_then_parent_failover() {
    let mut rig = Rig::new(CFG);
    let c1 = rig.spread("nested", C1, 1000, 200);
    assert_eq!(c1.keys().copied().collect::<Vec<_>>(), ["we1", "we2"], "the child's PERFORMANCE set for C1: {c1:?}");
    assert_eq!(rig.spread("nested", C2, 1000, 40), only("us1", 40));
    // Every child endpoint Degraded: the nested endpoint is Degraded (fewer than 1 Online
    // child), so the parent's PRIORITY moves on to the standby.
    for a in ["198.18.12.1", "198.18.12.2", "198.18.12.3"] {
        rig.degrade("perf", a);
    }
    assert_eq!(rig.spread("nested", C1, 2000, 20), only("standby", 20));
    assert_eq!(rig.spread("nested", C2, 2000, 20), only("standby", 20));
    rig.recover("perf", "198.18.12.3");
    assert_eq!(rig.spread("nested", C1, 3000, 20), only("us1", 20), "us1 is the child's only available endpoint");
}

#[test]
fn operator_override_counts_as_a_monitor_verdict() {
    let mut rig = Rig::new(CFG);
    rig.ctl.set_override("prio", "198.18.10.1".parse().unwrap(), Some(false)).unwrap();
    rig.ctl.reconcile(&mut rig.dp).unwrap();
    assert_eq!(rig.spread("prio", C1, 1000, 10), only("p2", 10));
    rig.ctl.set_checked("prio", "198.18.10.1".parse().unwrap(), true);
    rig.ctl.reconcile(&mut rig.dp).unwrap();
    assert_eq!(rig.spread("prio", C1, 2000, 10), only("p2", 10), "the override beats the probe verdict");
    rig.ctl.set_override("prio", "198.18.10.1".parse().unwrap(), None).unwrap();
    rig.ctl.reconcile(&mut rig.dp).unwrap();
    assert_eq!(rig.spread("prio", C1, 3000, 10), only("p1", 10));
}
