//! Azure Traffic Manager vectors of spec §2.6 about selection, monitoring status and nesting
//! (A*, W*, F*, Q*, M*, N*, H*, O3-O6), one test per vector named by its ID. Each selection
//! vector is checked in both views of the engine: the DNS answer and the packet view's
//! eligible set. Statistical vectors state their sample count and tolerance.

use lb_user::config::Config;
use lb_user::model::AdminStatus;
use lb_user::model::{MonitorProtocol, MonitorStatus, ProfileMonitorStatus};
use lb_user::policy::tm::*;
use std::collections::HashMap;
use std::net::IpAddr;

use MonitorStatus::{CheckingEndpoint, Degraded, Online, Stopped};

// ---------------------------------------------------------------- helpers

mod common;
use common::ep;
use common::service;

fn config(text: &str) -> Config {
    Config::parse(text).unwrap_or_else(|e| panic!("valid configuration expected: {e}\n{text}"))
}

/// Every endpoint Online, then the listed (service, endpoint, status) overrides.
fn probes(cfg: &Config, set: &[(&str, &str, MonitorStatus)]) -> ProbeStatuses {
    let mut p = ProbeStatuses::new(cfg, Online);
    for (s, e, st) in set {
        p.set(cfg, s, e, *st).expect("known endpoint");
    }
    p
}

fn label(cfg: &Config, r: &Record) -> String {
    cfg.services[r.service].backends[r.backend].label()
}

/// The DNS answer as labels; "NODATA" / "NXDOMAIN" otherwise.
fn dns(cfg: &Config, p: &ProbeStatuses, svc: &str, client: &Client, q: QueryType, seed: u64) -> Vec<String> {
    let st = Statuses::new(cfg, p);
    let s = cfg.service_index(svc).expect("service");
    match resolve_dns(&st, s, client, q, &mut SplitMix64(seed)) {
        DnsAnswer::NxDomain => vec!["NXDOMAIN".into()],
        DnsAnswer::NoData => vec!["NODATA".into()],
        DnsAnswer::Records(r) => r.iter().map(|r| label(cfg, r)).collect(),
        DnsAnswer::Cname(c) => vec![format!("CNAME {}", c.target)],
    }
}

fn dns_a(cfg: &Config, p: &ProbeStatuses, svc: &str, client: &Client) -> String {
    dns(cfg, p, svc, client, QueryType::A, 1).join(",")
}

/// The packet view: (label, weight) sorted by label; empty = drop.
fn packet(cfg: &Config, p: &ProbeStatuses, svc: &str, client: &Client) -> Vec<(String, u32)> {
    let st = Statuses::new(cfg, p);
    let s = cfg.service_index(svc).expect("service");
    let mut v: Vec<(String, u32)> = eligible(&st, s, client)
        .backends
        .iter()
        .map(|b| (cfg.services[b.service].backends[b.backend].label(), b.weight))
        .collect();
    v.sort();
    v
}

fn set(items: &[(&str, u32)]) -> Vec<(String, u32)> {
    let mut v: Vec<(String, u32)> = items.iter().map(|(l, w)| (l.to_string(), *w)).collect();
    v.sort();
    v
}

/// Shares of each answer over `n` A queries with different seeds.
fn shares(cfg: &Config, p: &ProbeStatuses, svc: &str, client: &Client, n: u64) -> HashMap<String, f64> {
    let st = Statuses::new(cfg, p);
    let s = cfg.service_index(svc).expect("service");
    let mut rng = SplitMix64(42);
    let mut counts: HashMap<String, u64> = HashMap::new();
    for _ in 0..n {
        if let DnsAnswer::Records(r) = resolve_dns(&st, s, client, QueryType::A, &mut rng) {
            *counts.entry(label(cfg, &r[0])).or_default() += 1;
        }
    }
    counts.into_iter().map(|(k, c)| (k, c as f64 / n as f64)).collect()
}

fn assert_share(shares: &HashMap<String, f64>, name: &str, expected: f64, tolerance: f64) {
    let got = shares.get(name).copied().unwrap_or(0.0);
    assert!(
        (got - expected).abs() <= tolerance,
        "{name}: share {got:.4}, expected {expected} ± {tolerance} ({shares:?})"
    );
}

fn anyone() -> Client {
    Client::default()
}

// ---------------------------------------------------------------- PRIORITY

fn priority_profile(n: usize) -> Config {
    let eps: Vec<String> =
        (1..=n).map(|i| ep(&format!("e{i}"), &format!("192.0.2.{i}"), &format!("priority = {i}"))).collect();
    config(&service("prio", "PRIORITY", "", &eps))
}

#[test]
fn a1_priority_first_online() {
    let cfg = priority_profile(2);
    let p = probes(&cfg, &[]);
    assert_eq!(dns_a(&cfg, &p, "prio", &anyone()), "e1");
    assert_eq!(packet(&cfg, &p, "prio", &anyone()), set(&[("e1", 1)]));
}

#[test]
fn a2_priority_skips_degraded() {
    let cfg = priority_profile(3);
    let p = probes(&cfg, &[("prio", "e1", Degraded)]);
    assert_eq!(dns_a(&cfg, &p, "prio", &anyone()), "e2");
    assert_eq!(packet(&cfg, &p, "prio", &anyone()), set(&[("e2", 1)]));
}

#[test]
fn a3_priority_checking_endpoint_is_available() {
    let text = service(
        "prio",
        "PRIORITY",
        "",
        &[
            ep("e1", "192.0.2.1", "priority = 1\nendpoint_status = \"Disabled\""),
            ep("e2", "192.0.2.2", "priority = 2"),
            ep("e3", "192.0.2.3", "priority = 3"),
        ],
    );
    let cfg = config(&text);
    let p = probes(&cfg, &[("prio", "e2", Degraded), ("prio", "e3", CheckingEndpoint)]);
    assert_eq!(dns_a(&cfg, &p, "prio", &anyone()), "e3");
    assert_eq!(packet(&cfg, &p, "prio", &anyone()), set(&[("e3", 1)]));
    let st = Statuses::new(&cfg, &p);
    assert_eq!(st.endpoint_status(0, 0), MonitorStatus::Disabled);
}

#[test]
fn a4_priority_all_degraded_answers_best_effort() {
    let cfg = priority_profile(2);
    let p = probes(&cfg, &[("prio", "e1", Degraded), ("prio", "e2", Degraded)]);
    assert_eq!(dns_a(&cfg, &p, "prio", &anyone()), "e1");
    assert_eq!(packet(&cfg, &p, "prio", &anyone()), set(&[("e1", 1)]));
}

// ---------------------------------------------------------------- WEIGHTED

const SAMPLES: u64 = 100_000;
/// At 10^5 samples one standard deviation of a share is at most 0.0016: 0.01 is > 6 sigma.
const TOLERANCE: f64 = 0.01;

#[test]
fn w1_weighted_one_to_three() {
    let cfg = config(&service(
        "w",
        "WEIGHTED",
        "",
        &[ep("A", "192.0.2.1", "weight = 1"), ep("B", "192.0.2.2", "weight = 3")],
    ));
    let p = probes(&cfg, &[]);
    let s = shares(&cfg, &p, "w", &anyone(), SAMPLES);
    assert_share(&s, "A", 0.25, TOLERANCE);
    assert_share(&s, "B", 0.75, TOLERANCE);
    assert_eq!(packet(&cfg, &p, "w", &anyone()), set(&[("A", 1), ("B", 3)]));
}

#[test]
fn w2_weighted_degraded_gets_nothing() {
    let cfg = config(&service(
        "w",
        "WEIGHTED",
        "",
        &[ep("A", "192.0.2.1", "weight = 1"), ep("B", "192.0.2.2", "weight = 3"), ep("C", "192.0.2.3", "weight = 1")],
    ));
    let p = probes(&cfg, &[("w", "A", Degraded)]);
    let s = shares(&cfg, &p, "w", &anyone(), SAMPLES);
    assert_share(&s, "A", 0.0, 0.0);
    assert_share(&s, "B", 0.75, TOLERANCE);
    assert_share(&s, "C", 0.25, TOLERANCE);
    assert_eq!(packet(&cfg, &p, "w", &anyone()), set(&[("B", 3), ("C", 1)]));
}

#[test]
fn w3_weighted_default_weights_split_evenly() {
    let eps: Vec<String> = (1..=4).map(|i| ep(&format!("e{i}"), &format!("192.0.2.{i}"), "")).collect();
    let cfg = config(&service("w", "WEIGHTED", "", &eps));
    let p = probes(&cfg, &[]);
    let s = shares(&cfg, &p, "w", &anyone(), SAMPLES);
    for e in ["e1", "e2", "e3", "e4"] {
        assert_share(&s, e, 0.25, TOLERANCE);
    }
    assert_eq!(packet(&cfg, &p, "w", &anyone()), set(&[("e1", 1), ("e2", 1), ("e3", 1), ("e4", 1)]));
}

// ---------------------------------------------------------------- PERFORMANCE

fn perf_profile() -> Config {
    config(&service(
        "perf",
        "PERFORMANCE",
        "",
        &[
            ep("we1", "192.0.2.1", "location = \"westeurope\""),
            ep("we2", "192.0.2.2", "location = \"westeurope\""),
            ep("us1", "192.0.2.3", "location = \"eastus\""),
        ],
    ))
}

fn european(addr: &str) -> Client {
    Client { addr: Some(addr.parse().unwrap()), latency: vec!["westeurope".into(), "eastus".into()], geo: None }
}

#[test]
fn f1_performance_nearest_region() {
    let cfg = perf_profile();
    // F1 has a single endpoint in westeurope: disable we2.
    let p = probes(&cfg, &[("perf", "we2", MonitorStatus::Stopped)]);
    assert_eq!(dns_a(&cfg, &p, "perf", &european("203.0.113.7")), "we1");
    assert_eq!(packet(&cfg, &p, "perf", &european("203.0.113.7")), set(&[("we1", 1)]));
}

#[test]
fn f2_performance_degraded_region_goes_to_next() {
    let cfg = perf_profile();
    let p = probes(&cfg, &[("perf", "we1", Degraded), ("perf", "we2", Degraded)]);
    assert_eq!(dns_a(&cfg, &p, "perf", &european("203.0.113.7")), "us1");
    assert_eq!(packet(&cfg, &p, "perf", &european("203.0.113.7")), set(&[("us1", 1)]));
}

#[test]
fn f3_performance_spreads_evenly_inside_region() {
    let cfg = perf_profile();
    let p = probes(&cfg, &[]);
    let st = Statuses::new(&cfg, &p);
    let n = 20_000u32;
    let mut we1 = 0;
    for i in 0..n {
        // One client per /24: the spread hashes the client subnet.
        let addr = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + (i << 8)));
        let client = Client { addr: Some(addr), ..european("0.0.0.0") };
        match resolve_dns(&st, 0, &client, QueryType::A, &mut SplitMix64(u64::from(i))) {
            DnsAnswer::Records(r) if label(&cfg, &r[0]) == "we1" => we1 += 1,
            DnsAnswer::Records(r) => assert_eq!(label(&cfg, &r[0]), "we2"),
            other => panic!("{other:?}"),
        }
        // Deterministic per client: the same client always gets the same endpoint.
        if i < 50 {
            let again = dns(&cfg, &p, "perf", &client, QueryType::A, 99);
            let first = dns(&cfg, &p, "perf", &client, QueryType::A, 7);
            assert_eq!(again, first);
        }
    }
    let share = f64::from(we1) / f64::from(n);
    // 2 * 10^4 clients: sigma = 0.0035; 0.02 is > 5 sigma.
    assert!((share - 0.5).abs() < 0.02, "we1 share {share}");
    assert_eq!(packet(&cfg, &p, "perf", &european("203.0.113.7")), set(&[("we1", 1), ("we2", 1)]));
}

#[test]
fn f5_performance_all_degraded_treated_online() {
    let cfg = perf_profile();
    let p = probes(&cfg, &[("perf", "we1", Degraded), ("perf", "we2", Stopped), ("perf", "us1", Degraded)]);
    assert_eq!(dns_a(&cfg, &p, "perf", &european("203.0.113.7")), "we1");
    assert_eq!(packet(&cfg, &p, "perf", &european("203.0.113.7")), set(&[("we1", 1)]));
}

// ---------------------------------------------------------------- GEOGRAPHIC

fn from(code: &str) -> Client {
    Client { geo: Some(code.into()), ..Client::default() }
}

fn geo_profile(extra: &[String], e1_extra: &str) -> Config {
    let mut eps = vec![
        ep("E1", "192.0.2.1", &format!("geo_mapping = [\"IE\"]\n{e1_extra}")),
        ep("E2", "192.0.2.2", "geo_mapping = [\"GEO-EU\"]"),
    ];
    eps.extend(extra.iter().cloned());
    config(&service("geo", "GEOGRAPHIC", "", &eps))
}

#[test]
fn q1_geographic_most_specific_mapping() {
    let cfg = geo_profile(&[], "");
    let p = probes(&cfg, &[]);
    for (code, want, set_want) in
        [("IE", "E1", set(&[("E1", 1)])), ("FR", "E2", set(&[("E2", 1)])), ("US-CA", "NODATA", vec![])]
    {
        assert_eq!(dns_a(&cfg, &p, "geo", &from(code)), want, "{code}");
        assert_eq!(packet(&cfg, &p, "geo", &from(code)), set_want, "{code}");
    }
}

#[test]
fn q2_geographic_world_catches_the_rest() {
    let cfg = geo_profile(&[ep("E3", "192.0.2.3", "geo_mapping = [\"WORLD\"]")], "");
    let p = probes(&cfg, &[]);
    assert_eq!(dns_a(&cfg, &p, "geo", &from("US-CA")), "E3");
    assert_eq!(packet(&cfg, &p, "geo", &from("US-CA")), set(&[("E3", 1)]));
}

#[test]
fn q3_geographic_degraded_still_returned() {
    let cfg = geo_profile(&[], "");
    let p = probes(&cfg, &[("geo", "E1", Degraded)]);
    assert_eq!(dns_a(&cfg, &p, "geo", &from("IE")), "E1");
    assert_eq!(packet(&cfg, &p, "geo", &from("IE")), set(&[("E1", 1)]));
}

#[test]
fn q4_geographic_stopped_is_nodata() {
    let cfg = geo_profile(&[], "");
    let p = probes(&cfg, &[("geo", "E1", Stopped)]);
    assert_eq!(dns_a(&cfg, &p, "geo", &from("IE")), "NODATA");
    assert_eq!(packet(&cfg, &p, "geo", &from("IE")), vec![]);
}

#[test]
fn q5_geographic_disabled_is_ignored() {
    let cfg = geo_profile(&[], "endpoint_status = \"Disabled\"");
    let p = probes(&cfg, &[]);
    assert_eq!(dns_a(&cfg, &p, "geo", &from("IE")), "E2");
    assert_eq!(packet(&cfg, &p, "geo", &from("IE")), set(&[("E2", 1)]));
}

#[test]
fn q6_geographic_state_before_country() {
    let cfg = config(&service(
        "geo",
        "GEOGRAPHIC",
        "",
        &[ep("E4", "192.0.2.4", "geo_mapping = [\"US-CA\"]"), ep("E5", "192.0.2.5", "geo_mapping = [\"US\"]")],
    ));
    let p = probes(&cfg, &[]);
    assert_eq!(dns_a(&cfg, &p, "geo", &from("US-CA")), "E4");
    assert_eq!(dns_a(&cfg, &p, "geo", &from("US-TX")), "E5");
    assert_eq!(packet(&cfg, &p, "geo", &from("US-TX")), set(&[("E5", 1)]));
}

// ---------------------------------------------------------------- MULTIVALUE

fn multivalue(max_return: u32, addrs: &[(&str, &str)]) -> Config {
    let eps: Vec<String> = addrs.iter().map(|(n, a)| ep(n, a, "")).collect();
    config(&service("mv", "MULTIVALUE", &format!("max_return = {max_return}"), &eps))
}

#[test]
fn m1_multivalue_max_return_distinct() {
    let cfg = multivalue(2, &[("a", "192.0.2.1"), ("b", "192.0.2.2"), ("c", "192.0.2.3"), ("d", "192.0.2.4")]);
    let p = probes(&cfg, &[]);
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let answer = dns(&cfg, &p, "mv", &anyone(), QueryType::A, seed);
        assert_eq!(answer.len(), 2, "{answer:?}");
        assert_ne!(answer[0], answer[1]);
        seen.extend(answer);
    }
    assert_eq!(seen.len(), 4, "every endpoint appears in some answer: {seen:?}");
    assert_eq!(packet(&cfg, &p, "mv", &anyone()), set(&[("a", 1), ("b", 1), ("c", 1), ("d", 1)]));
}

#[test]
fn m2_multivalue_only_healthy() {
    let cfg = multivalue(5, &[("a", "192.0.2.1"), ("b", "192.0.2.2"), ("c", "192.0.2.3")]);
    let p = probes(&cfg, &[("mv", "b", Degraded)]);
    for seed in 0..20 {
        let mut answer = dns(&cfg, &p, "mv", &anyone(), QueryType::A, seed);
        answer.sort();
        assert_eq!(answer, ["a", "c"]);
    }
    assert_eq!(packet(&cfg, &p, "mv", &anyone()), set(&[("a", 1), ("c", 1)]));
}

#[test]
fn m3_multivalue_record_types() {
    let cfg = multivalue(5, &[("a1", "192.0.2.1"), ("a2", "192.0.2.2"), ("q", "2001:db8::1")]);
    let p = probes(&cfg, &[]);
    let mut a = dns(&cfg, &p, "mv", &anyone(), QueryType::A, 3);
    a.sort();
    assert_eq!(a, ["a1", "a2"]);
    assert_eq!(dns(&cfg, &p, "mv", &anyone(), QueryType::Aaaa, 3), ["q"]);
    assert_eq!(dns(&cfg, &p, "mv", &anyone(), QueryType::Cname, 3), ["NODATA"]);
    // The IPv4 VIP carries only the A endpoints.
    assert_eq!(packet(&cfg, &p, "mv", &anyone()), set(&[("a1", 1), ("a2", 1)]));
}

// ---------------------------------------------------------------- SUBNET

fn subnet_profile(with_fallback: bool, e1_extra: &str) -> Config {
    let mut eps = vec![
        ep("E1", "192.0.2.1", &format!("subnets = [\"10.0.0.0/8\"]\n{e1_extra}")),
        ep("E2", "192.0.2.2", "subnets = [\"192.168.1.10-192.168.1.20\"]"),
    ];
    if with_fallback {
        eps.push(ep("F", "192.0.2.3", ""));
    }
    config(&service("sn", "SUBNET", "", &eps))
}

fn src(addr: &str) -> Client {
    Client { addr: Some(addr.parse().unwrap()), ..Client::default() }
}

/// The packet view through the compiled classes: the class of `addr` and its eligible set.
fn via_classes(cfg: &Config, p: &ProbeStatuses, svc: &str, addr: &str) -> Vec<String> {
    let plan = compile_service(cfg, cfg.service_index(svc).unwrap(), p);
    let class = &plan.classes[plan.class_of(addr.parse().unwrap())];
    class.eligible.iter().map(|b| cfg.services[b.service].backends[b.backend].label()).collect()
}

#[test]
fn n1_subnet_mapping_and_fallback() {
    let cfg = subnet_profile(true, "");
    let p = probes(&cfg, &[]);
    for (addr, want) in [("10.1.2.3", "E1"), ("192.168.1.15", "E2"), ("8.8.8.8", "F")] {
        assert_eq!(dns_a(&cfg, &p, "sn", &src(addr)), want, "{addr}");
        assert_eq!(packet(&cfg, &p, "sn", &src(addr)), set(&[(want, 1)]), "{addr}");
        assert_eq!(via_classes(&cfg, &p, "sn", addr), [want], "{addr}");
    }
    // Range edges.
    assert_eq!(via_classes(&cfg, &p, "sn", "192.168.1.10"), ["E2"]);
    assert_eq!(via_classes(&cfg, &p, "sn", "192.168.1.20"), ["E2"]);
    assert_eq!(via_classes(&cfg, &p, "sn", "192.168.1.21"), ["F"]);
    assert_eq!(via_classes(&cfg, &p, "sn", "192.168.1.9"), ["F"]);
    // The first-last range is split into CIDR blocks for the trie, and `lb plan` shows them.
    let plan = compile_service(&cfg, 0, &p);
    let text = plan.render(&cfg).join("\n");
    for line in [
        "client 192.168.1.10/31 -> class",
        "client 192.168.1.12/30 -> class",
        "client 192.168.1.16/30 -> class",
        "client 192.168.1.20/32 -> class",
        "client 10.0.0.0/8 -> class",
        "default class: {sn/F x1}",
    ] {
        assert!(text.contains(line), "{line:?} missing in:\n{text}");
    }
}

#[test]
fn n2_subnet_no_fallback_is_nodata() {
    let cfg = subnet_profile(false, "");
    let p = probes(&cfg, &[]);
    assert_eq!(dns_a(&cfg, &p, "sn", &src("8.8.8.8")), "NODATA");
    assert!(packet(&cfg, &p, "sn", &src("8.8.8.8")).is_empty());
    assert!(via_classes(&cfg, &p, "sn", "8.8.8.8").is_empty());
}

#[test]
fn n3_subnet_disabled_endpoint_ranges_vanish() {
    let cfg = subnet_profile(true, "endpoint_status = \"Disabled\"");
    let p = probes(&cfg, &[]);
    assert_eq!(dns_a(&cfg, &p, "sn", &src("10.1.2.3")), "F");
    assert_eq!(via_classes(&cfg, &p, "sn", "10.1.2.3"), ["F"]);
}

#[test]
fn n4_subnet_uses_edns_client_subnet() {
    let cfg = subnet_profile(true, "");
    let p = probes(&cfg, &[]);
    let addr = location_address("8.8.8.8".parse().unwrap(), Some("10.9.0.0/16".parse().unwrap()));
    assert_eq!(dns_a(&cfg, &p, "sn", &Client { addr: Some(addr), ..Client::default() }), "E1");
    let no_ecs = location_address("8.8.8.8".parse().unwrap(), None);
    assert_eq!(dns_a(&cfg, &p, "sn", &Client { addr: Some(no_ecs), ..Client::default() }), "F");
}

#[test]
fn n6_subnet_unhealthy_mapping_falls_back() {
    let cfg = subnet_profile(true, "");
    let p = probes(&cfg, &[("sn", "E1", Degraded)]);
    assert_eq!(dns_a(&cfg, &p, "sn", &src("10.1.2.3")), "F");
    assert_eq!(via_classes(&cfg, &p, "sn", "10.1.2.3"), ["F"]);
}

// ---------------------------------------------------------------- nesting

/// Parent PRIORITY: nested endpoint "N" (priority 1, min_child_endpoints = `min`) to child
/// WEIGHTED with c1, c2; then leaf "L" (priority 2).
fn nested(min: u32, child_keys: &str) -> Config {
    let parent = service(
        "parent",
        "PRIORITY",
        "",
        &[ep("N", "", &format!("target_service = \"child\"\nmin_child_endpoints = {min}")), ep("L", "192.0.2.9", "")],
    );
    let child = service("child", "WEIGHTED", child_keys, &[ep("c1", "192.0.2.1", ""), ep("c2", "192.0.2.2", "")]);
    config(&format!("{parent}{child}"))
}

fn nested_status(cfg: &Config, p: &ProbeStatuses) -> MonitorStatus {
    Statuses::new(cfg, p).endpoint_status(0, 0)
}

#[test]
fn h1_nested_online() {
    let cfg = nested(1, "");
    let p = probes(&cfg, &[]);
    assert_eq!(nested_status(&cfg, &p), Online);
    assert_eq!(nested_endpoint_status(ProfileMonitorStatus::Online, 2, 0, 1), Online);
    // Routed to the child: its answer (one of c1, c2) and its set in the packet view.
    let answer = dns_a(&cfg, &p, "parent", &anyone());
    assert!(answer == "c1" || answer == "c2", "{answer}");
    assert_eq!(packet(&cfg, &p, "parent", &anyone()), set(&[("c1", 1), ("c2", 1)]));
}

#[test]
fn h2_nested_below_min_is_degraded() {
    let cfg = nested(2, "");
    let p = probes(&cfg, &[("child", "c2", Degraded)]);
    assert_eq!(nested_status(&cfg, &p), Degraded);
    assert_eq!(nested_endpoint_status(ProfileMonitorStatus::Degraded, 1, 0, 2), Degraded);
    // Not routable: the parent moves on to L.
    assert_eq!(dns_a(&cfg, &p, "parent", &anyone()), "L");
    assert_eq!(packet(&cfg, &p, "parent", &anyone()), set(&[("L", 1)]));
}

#[test]
fn h3_nested_checking_is_routable() {
    let cfg = nested(2, "");
    let p = probes(&cfg, &[("child", "c2", CheckingEndpoint)]);
    assert_eq!(nested_status(&cfg, &p), CheckingEndpoint);
    assert_eq!(nested_endpoint_status(ProfileMonitorStatus::Online, 1, 1, 2), CheckingEndpoint);
    assert_eq!(packet(&cfg, &p, "parent", &anyone()), set(&[("c1", 1), ("c2", 1)]));
}

#[test]
fn h4_nested_disabled_child_is_stopped() {
    let cfg = nested(1, "profile_status = \"Disabled\"");
    let p = probes(&cfg, &[]);
    assert_eq!(nested_status(&cfg, &p), Stopped);
    assert_eq!(dns_a(&cfg, &p, "parent", &anyone()), "L");

    let text = format!(
        "{}{}",
        service("parent", "PRIORITY", "", &[ep("N", "", "target_service = \"child\""), ep("L", "192.0.2.9", "")]),
        service(
            "child",
            "WEIGHTED",
            "",
            &[
                ep("c1", "192.0.2.1", "endpoint_status = \"Disabled\""),
                ep("c2", "192.0.2.2", "endpoint_status = \"Disabled\""),
            ]
        )
    );
    let cfg = config(&text);
    let p = probes(&cfg, &[]);
    assert_eq!(Statuses::new(&cfg, &p).profile_status(1), ProfileMonitorStatus::Inactive);
    assert_eq!(nested_status(&cfg, &p), Stopped);
    assert_eq!(packet(&cfg, &p, "parent", &anyone()), set(&[("L", 1)]));
}

#[test]
fn nested_per_family_threshold() {
    // min_child_endpoints_ipv4 = 2 with one IPv4 child endpoint: Degraded for A queries only.
    let text = format!(
        "{}{}",
        service(
            "parent",
            "PRIORITY",
            "",
            &[ep("N", "", "target_service = \"child\"\nmin_child_endpoints_ipv4 = 2"), ep("L", "192.0.2.9", ""),]
        ),
        service("child", "WEIGHTED", "", &[ep("c1", "192.0.2.1", "")])
    );
    let cfg = config(&text);
    let p = probes(&cfg, &[]);
    let st = Statuses::new(&cfg, &p);
    assert_eq!(st.endpoint_status_for(0, 0, None, 0), Online);
    assert_eq!(st.endpoint_status_for(0, 0, Some(ranges::Family::V4), 0), Degraded);
    assert_eq!(dns_a(&cfg, &p, "parent", &anyone()), "L");
}

#[test]
fn nested_weighted_parent_mixes_child_weights() {
    // Parent WEIGHTED: leaf P (weight 1) and nested N (weight 1) -> child c1, c2 (1 each):
    // P gets 1/2, c1 and c2 1/4 each, i.e. weights 2, 1, 1.
    let text = format!(
        "{}{}",
        service("parent", "WEIGHTED", "", &[ep("P", "192.0.2.9", ""), ep("N", "", "target_service = \"child\"")]),
        service("child", "WEIGHTED", "", &[ep("c1", "192.0.2.1", ""), ep("c2", "192.0.2.2", "")])
    );
    let cfg = config(&text);
    let p = probes(&cfg, &[]);
    assert_eq!(packet(&cfg, &p, "parent", &anyone()), set(&[("P", 2), ("c1", 1), ("c2", 1)]));
    let s = shares(&cfg, &p, "parent", &anyone(), SAMPLES);
    assert_share(&s, "P", 0.5, TOLERANCE);
    assert_share(&s, "c1", 0.25, TOLERANCE);
    assert_share(&s, "c2", 0.25, TOLERANCE);
}

// ---------------------------------------------------------------- monitoring

fn run(tolerated: u32, probes: &str) -> MonitorStatus {
    let mut m = EndpointMonitor::new(tolerated);
    assert_eq!(m.status(), CheckingEndpoint, "CheckingEndpoint until the first result");
    let mut last = m.status();
    for c in probes.chars() {
        last = m.record(c == 'S');
    }
    last
}

#[test]
fn o3_degraded_after_tolerated_plus_one_failures() {
    assert_eq!(run(3, "FFF"), Online);
    assert_eq!(run(3, "FFFF"), Degraded);
    assert_eq!(run(3, "FFSFFF"), Online);
    // The first success after Degraded brings it back.
    assert_eq!(run(3, "FFFFS"), Online);
}

#[test]
fn o4_zero_tolerance_degrades_on_first_failure() {
    assert_eq!(run(0, "F"), Degraded);
    assert_eq!(run(0, "S"), Online);
}

fn http_monitor(ranges: &str) -> MonitorSettings {
    let cfg = config(&format!(
        "{}\n[service.monitor]\nprotocol = \"HTTP\"\nport = 80\npath = \"/\"\n{ranges}\n{}",
        service("m", "PRIORITY", "", &[]),
        ep("e1", "192.0.2.1", "")
    ));
    cfg.services[0].tm().unwrap().monitor.clone().unwrap()
}

#[test]
fn o5_http_status_ranges() {
    let default = http_monitor("");
    assert!(!default.probe_succeeded(ProbeOutcome::HttpStatus(301)));
    assert!(!default.probe_succeeded(ProbeOutcome::HttpStatus(204)));
    assert!(default.probe_succeeded(ProbeOutcome::HttpStatus(200)));
    assert!(!default.probe_succeeded(ProbeOutcome::Failed));
    let wide = http_monitor("expected_status_ranges = [\"200-399\"]");
    assert!(wide.probe_succeeded(ProbeOutcome::HttpStatus(301)));
    assert!(!wide.probe_succeeded(ProbeOutcome::HttpStatus(404)));
    assert_eq!(wide.protocol, MonitorProtocol::Http);
}

#[test]
fn o6_disabled_profile_is_nxdomain_and_inactive() {
    let cfg = config(&service(
        "off",
        "PRIORITY",
        "profile_status = \"Disabled\"",
        &[ep("e1", "192.0.2.1", ""), ep("e2", "192.0.2.2", "")],
    ));
    let p = probes(&cfg, &[]);
    assert_eq!(dns_a(&cfg, &p, "off", &anyone()), "NXDOMAIN");
    let st = Statuses::new(&cfg, &p);
    assert_eq!(st.endpoint_status(0, 0), MonitorStatus::Inactive);
    assert_eq!(st.endpoint_status(0, 1), MonitorStatus::Inactive);
    assert_eq!(st.profile_status(0), ProfileMonitorStatus::Disabled);
    assert!(packet(&cfg, &p, "off", &anyone()).is_empty());
    assert_eq!(cfg.services[0].profile_status(), AdminStatus::Disabled);
}

#[test]
fn profile_status_precedence() {
    use ProfileMonitorStatus as P;
    let on = AdminStatus::Enabled;
    assert_eq!(profile_monitor_status(on, [Online, Degraded, CheckingEndpoint]), P::Degraded);
    assert_eq!(profile_monitor_status(on, [Online, CheckingEndpoint]), P::Online);
    assert_eq!(profile_monitor_status(on, [MonitorStatus::Unmonitored]), P::Online);
    assert_eq!(profile_monitor_status(on, [CheckingEndpoint, Stopped]), P::CheckingEndpoints);
    assert_eq!(profile_monitor_status(on, [MonitorStatus::Disabled, Stopped]), P::Inactive);
    assert_eq!(profile_monitor_status(on, []), P::Inactive);
    assert_eq!(profile_monitor_status(AdminStatus::Disabled, [Online]), P::Disabled);
}

#[test]
fn always_serve_is_unmonitored_and_routable() {
    let cfg = priority_profile(1);
    let mut cfg2 = cfg.clone();
    cfg2.services[0].backends[0].tm_mut().unwrap().always_serve = true;
    let p = probes(&cfg2, &[("prio", "e1", Degraded)]);
    assert_eq!(Statuses::new(&cfg2, &p).endpoint_status(0, 0), MonitorStatus::Unmonitored);
    assert_eq!(dns_a(&cfg2, &p, "prio", &anyone()), "e1");
}

// ---------------------------------------------------------------- client classes

const INPUTS: &str = r#"
[[latency]]
client_prefixes = ["10.0.0.0/8"]
regions = ["westeurope", "eastus"]

[[latency]]
client_prefixes = ["10.1.0.0/16", "2001:db8:1::/48"]
regions = ["eastus", "westeurope"]

[[geo]]
client_prefixes = ["10.0.0.0/8"]
region = "IE"

[[geo]]
client_prefixes = ["10.1.2.0/24"]
region = "US-CA"
"#;

fn assert_disjoint(plan: &TmServicePlan) {
    for (i, (a, _)) in plan.prefixes.iter().enumerate() {
        assert_eq!(a.trunc(), *a, "{a} is canonical");
        for (b, _) in &plan.prefixes[i + 1..] {
            assert!(!a.contains(b) && !b.contains(a), "{a} and {b} overlap");
        }
    }
    for (_, id) in &plan.prefixes {
        assert!(*id != DEFAULT_CLASS && *id < plan.classes.len());
    }
}

#[test]
fn classes_from_nested_latency_prefixes() {
    let cfg = config(&format!(
        "{INPUTS}{}",
        service(
            "perf",
            "PERFORMANCE",
            "",
            &[ep("we1", "192.0.2.1", "location = \"westeurope\""), ep("us1", "192.0.2.3", "location = \"eastus\""),]
        )
    ));
    let p = probes(&cfg, &[]);
    let plan = compile_service(&cfg, 0, &p);
    assert_disjoint(&plan);
    let set_of = |addr: &str| -> Vec<String> {
        plan.classes[plan.class_of(addr.parse().unwrap())]
            .eligible
            .iter()
            .map(|b| cfg.services[0].backends[b.backend].label())
            .collect()
    };
    assert_eq!(set_of("10.0.0.1"), ["we1"]);
    assert_eq!(set_of("10.200.0.1"), ["we1"]);
    assert_eq!(set_of("10.1.99.1"), ["us1"]);
    // No latency data: every available endpoint (our choice).
    assert_eq!(set_of("8.8.8.8"), ["we1", "us1"]);
    // The 10/8 entry minus the 10.1/16 hole: 8 blocks + the hole; + 1 IPv6 prefix.
    let v4 = plan.prefixes.iter().filter(|(n, _)| matches!(n, ipnet::IpNet::V4(_))).count();
    assert_eq!(v4, 9, "{:?}", plan.prefixes);
    assert_eq!(plan.prefixes.len(), 10);
    // The prefix map does not depend on health; only the sets do.
    let p2 = probes(&cfg, &[("perf", "us1", Degraded)]);
    let plan2 = compile_service(&cfg, 0, &p2);
    assert_eq!(plan.prefixes, plan2.prefixes);
    let c = plan2.class_of("10.1.99.1".parse().unwrap());
    assert_eq!(plan2.classes[c].eligible.len(), 1);
    assert_eq!(plan2.classes[c].eligible[0].backend, 0, "us1 degraded: next region");
}

#[test]
fn classes_follow_nested_children_inputs() {
    // PRIORITY parent: nested GEOGRAPHIC child first, then a nested SUBNET child.
    let text = format!(
        "{INPUTS}{}{}{}",
        service(
            "parent",
            "PRIORITY",
            "",
            &[ep("G", "", "target_service = \"geo\""), ep("S", "", "target_service = \"sub\""),]
        ),
        service(
            "geo",
            "GEOGRAPHIC",
            "",
            &[ep("ie", "192.0.2.1", "geo_mapping = [\"IE\"]"), ep("us", "192.0.2.2", "geo_mapping = [\"US\"]"),]
        ),
        service(
            "sub",
            "SUBNET",
            "",
            &[ep("s1", "192.0.2.5", "subnets = [\"10.1.2.128-10.1.2.255\"]"), ep("sf", "192.0.2.6", ""),]
        ),
    );
    let cfg = config(&text);
    let p = probes(&cfg, &[]);
    let plan = compile_service(&cfg, 0, &p);
    assert_disjoint(&plan);
    let set_of = |plan: &TmServicePlan, addr: &str| -> Vec<String> {
        plan.classes[plan.class_of(addr.parse().unwrap())]
            .eligible
            .iter()
            .map(|b| cfg.services[b.service].backends[b.backend].label())
            .collect()
    };
    assert_eq!(set_of(&plan, "10.9.9.9"), ["ie"]);
    assert_eq!(set_of(&plan, "10.1.2.3"), ["us"]);
    // Unknown location: the geo child answers NODATA, but its endpoints are Online, so the
    // nested endpoint is chosen and its class is dropped (no failover between mappings).
    assert!(set_of(&plan, "8.8.8.8").is_empty());
    // Geo child disabled: the parent falls to the SUBNET child, whose ranges now matter.
    let mut off = cfg.clone();
    off.services[1].tm_mut().unwrap().profile_status = AdminStatus::Disabled;
    let plan = compile_service(&off, 0, &probes(&off, &[]));
    assert_disjoint(&plan);
    assert_eq!(set_of(&plan, "10.1.2.200"), ["s1"]);
    assert_eq!(set_of(&plan, "10.1.2.100"), ["sf"]);
    assert_eq!(set_of(&plan, "8.8.8.8"), ["sf"]);
    assert!(plan.classes[plan.class_of("10.1.2.200".parse().unwrap())].reason.contains("S ->"));
}

#[test]
fn clients_are_located_by_longest_prefix() {
    let cfg = config(&format!("{INPUTS}{}", service("p", "PRIORITY", "", &[ep("e", "192.0.2.1", "")])));
    let c = Client::locate(&cfg, "10.1.2.3".parse().unwrap());
    assert_eq!(c.latency, ["eastus", "westeurope"]);
    assert_eq!(c.geo.as_deref(), Some("US-CA"));
    let c = Client::locate(&cfg, "10.7.0.1".parse().unwrap());
    assert_eq!(c.latency, ["westeurope", "eastus"]);
    assert_eq!(c.geo.as_deref(), Some("IE"));
    assert_eq!(Client::locate(&cfg, "8.8.8.8".parse().unwrap()).geo, None);
}

// ---------------------------------------------------------------- endpoints given by DNS name

/// A WEIGHTED profile of two name endpoints (issue #34-1), `a` resolved to `a_addrs` and `b`
/// to `b_addrs` (what the daemon's resolver fills in).
fn named_profile(a_addrs: &[&str], b_addrs: &[&str], b_state: lb_user::config::Resolution) -> Config {
    use lb_user::config::{Endpoint, Resolution};
    let mut cfg = config(&service(
        "named",
        "WEIGHTED",
        "",
        &[ep("a", "", "target = \"a.example.net\"\nweight = 1"), ep("b", "", "target = \"b.example.net\"\nweight = 3")],
    ));
    for (b, (addrs, state)) in
        cfg.services[0].backends.iter_mut().zip([(a_addrs, Resolution::Answered), (b_addrs, b_state)])
    {
        let Endpoint::Name(t) = &mut b.endpoint else { panic!("a name endpoint") };
        t.resolved.addresses = addrs.iter().map(|a| a.parse().unwrap()).collect();
        t.resolved.state = state;
    }
    cfg
}

/// The DNS view answers a CNAME to the chosen endpoint's name for every query type (spec §2.2:
/// A and AAAA accept a CNAME endpoint); the weights and statuses choose it as for addresses.
#[test]
fn name_endpoints_answer_cnames() {
    use lb_user::config::Resolution;
    let cfg = named_profile(&["198.51.100.11"], &["198.51.100.21"], Resolution::Answered);
    let p = probes(&cfg, &[("named", "a", Degraded)]);
    for q in [QueryType::A, QueryType::Aaaa, QueryType::Cname, QueryType::Any] {
        assert_eq!(dns(&cfg, &p, "named", &anyone(), q, 7), ["CNAME b.example.net"], "{q:?}");
    }
    // Weighted 1:3 between the two names.
    let p = probes(&cfg, &[]);
    let st = Statuses::new(&cfg, &p);
    let (mut a, n) = (0, 4000);
    let mut rng = SplitMix64(3);
    for _ in 0..n {
        match resolve_dns(&st, 0, &anyone(), QueryType::A, &mut rng) {
            DnsAnswer::Cname(c) if c.target.as_str() == "a.example.net" => a += 1,
            DnsAnswer::Cname(c) => assert_eq!(c.target.as_str(), "b.example.net"),
            other => panic!("{other:?}"),
        }
    }
    let share = f64::from(a) / f64::from(n);
    assert!((share - 0.25).abs() < 0.03, "a's share {share}");
}

/// The packet view: each resolved address of the VIP's family is a leaf backend; the
/// endpoint's weight is shared by its addresses. A name that no longer resolves (its last
/// answer expired) is Degraded: the other endpoint takes everything.
#[test]
fn name_endpoints_expand_into_their_resolved_addresses() {
    use lb_user::config::Resolution;
    let cfg =
        named_profile(&["198.51.100.11", "198.51.100.12", "2001:db8::11"], &["198.51.100.21"], Resolution::Answered);
    let p = probes(&cfg, &[]);
    let st = Statuses::new(&cfg, &p);
    let mut got: Vec<(String, u32)> =
        eligible(&st, 0, &anyone()).backends.iter().map(|b| (b.address.to_string(), b.weight)).collect();
    got.sort();
    // a: weight 1 over two addresses, b: weight 3 over one: 1/2 : 1/2 : 3 = 1 : 1 : 6.
    assert_eq!(got, set(&[("198.51.100.11", 1), ("198.51.100.12", 1), ("198.51.100.21", 6)]));
    let cfg = named_profile(&["198.51.100.11"], &[], Resolution::Failed("SERVFAIL".into()));
    let p = probes(&cfg, &[]);
    let st = Statuses::new(&cfg, &p);
    assert_eq!(st.endpoint_status(0, 1), Degraded);
    assert_eq!(dns_a(&cfg, &p, "named", &anyone()), "CNAME a.example.net");
    let got: Vec<String> = eligible(&st, 0, &anyone()).backends.iter().map(|b| b.address.to_string()).collect();
    assert_eq!(got, ["198.51.100.11"]);
    // Not resolved yet: CheckingEndpoint (routable), but nothing to forward to.
    let cfg = named_profile(&["198.51.100.11"], &[], Resolution::Pending);
    let p = ProbeStatuses::new(&cfg, CheckingEndpoint);
    assert_eq!(Statuses::new(&cfg, &p).endpoint_status(0, 1), CheckingEndpoint);
}
