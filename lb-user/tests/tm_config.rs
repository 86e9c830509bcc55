//! Validation of the Traffic Manager configuration (spec §2.1, §2.3-§2.5): the vectors A5, A6,
//! W4, F4, Q7, M4, N5, H5, O1, O2 by ID, the other rejected cases, and the example file. Each
//! rejection checks that exactly one violation names the service, the field path and what is
//! allowed.

use lb_user::config::{Config, ConfigError, ConfigErrorKind};
use lb_user::policy::tm::effective_priorities;
use std::path::Path;

// ---------------------------------------------------------------- helpers

mod common;
use common::ep;
use common::service as svc;

fn two(method: &str, e1: &str, e2: &str) -> String {
    svc("tm", method, "", &[ep("e1", "192.0.2.1", e1), ep("e2", "192.0.2.2", e2)])
}

fn config_error(err: &anyhow::Error) -> &ConfigError {
    err.downcast_ref::<ConfigError>().expect("errors are ConfigError")
}

fn accept(text: &str) -> Config {
    Config::parse(text).unwrap_or_else(|e| panic!("must be accepted: {e}\n{text}"))
}

/// Exactly one violation, on `field`, whose message names `scope`, the field and `needles`.
fn reject(text: &str, scope: &str, field: &str, needles: &[&str]) {
    let err = Config::parse(text).expect_err("configuration must be rejected");
    let msg = err.to_string();
    let v = config_error(&err).violations();
    assert_eq!(v.len(), 1, "expected one violation, got: {msg}\n{text}");
    assert_eq!(v[0].field, field, "{msg}");
    assert!(msg.contains(scope), "message lacks {scope:?}: {msg}");
    for needle in needles {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
}

const TM: &str = "service \"tm\"";

// ---------------------------------------------------------------- PRIORITY / WEIGHTED

#[test]
fn a5_priorities_default_to_file_order() {
    let cfg = accept(&svc(
        "tm",
        "PRIORITY",
        "",
        &[ep("x", "192.0.2.1", ""), ep("y", "192.0.2.2", ""), ep("z", "192.0.2.3", "")],
    ));
    assert_eq!(effective_priorities(&cfg.services[0]), [1, 2, 3]);
    let cfg = accept(&two("PRIORITY", "priority = 7", "priority = 3"));
    assert_eq!(effective_priorities(&cfg.services[0]), [7, 3]);
    // Set on all endpoints or none.
    reject(&two("PRIORITY", "priority = 1", ""), TM, "backend[1].priority", &["every endpoint or on none"]);
}

/// Issue #32-6: a weight is drawn by WEIGHTED only; elsewhere it would be ignored, so it is
/// refused (1, the default, is what every endpoint counts as anyway).
#[test]
fn weight_refused_outside_weighted() {
    for method in ["PRIORITY", "PERFORMANCE", "MULTIVALUE", "SUBNET"] {
        // What each method needs of the two endpoints besides the weight.
        let (e1, e2) = match method {
            "PERFORMANCE" => ("location = \"westeurope\"\n", "location = \"westeurope\"\n"),
            "SUBNET" => ("subnets = [\"10.0.0.0/8\"]\n", ""),
            _ => ("", ""),
        };
        let text = two(method, &format!("{e1}weight = 5"), e2);
        reject(&text, TM, "backend[0].weight", &["5 is used only with routing_method = WEIGHTED", method, "allowed 1"]);
        accept(&two(method, &format!("{e1}weight = 1"), e2));
    }
    accept(&two("WEIGHTED", "weight = 5", ""));
}

/// Issue #32-6: `ttl` goes only into the DNS answers for `dns_name`; without one it is refused.
#[test]
fn ttl_refused_without_dns_name() {
    reject(&svc("tm", "PRIORITY", "ttl = 30", &[ep("a", "192.0.2.1", "")]), TM, "ttl", &["dns_name", "remove ttl"]);
    accept(&svc("tm", "PRIORITY", "ttl = 30\ndns_name = \"tm.example\"", &[ep("a", "192.0.2.1", "")]));
}

#[test]
fn a6_priority_duplicate_or_out_of_range() {
    reject(
        &two("PRIORITY", "priority = 5", "priority = 5"),
        TM,
        "backend[1].priority",
        &["duplicate priority 5", "backend[0]"],
    );
    reject(&two("PRIORITY", "priority = 0", "priority = 2"), TM, "backend[0].priority", &["1..=1000"]);
    reject(&two("PRIORITY", "priority = 1001", "priority = 2"), TM, "backend[0].priority", &["1..=1000"]);
}

#[test]
fn w4_weight_out_of_range() {
    reject(&two("WEIGHTED", "weight = 0", ""), TM, "backend[0].weight", &["1..=1000"]);
    reject(&two("WEIGHTED", "weight = 1001", ""), TM, "backend[0].weight", &["1..=1000"]);
    accept(&two("WEIGHTED", "weight = 1000", "weight = 1"));
}

// ---------------------------------------------------------------- PERFORMANCE

#[test]
fn f4_performance_requires_location() {
    reject(
        &two("PERFORMANCE", "location = \"westeurope\"", ""),
        TM,
        "backend[1].location",
        &["required with routing_method = PERFORMANCE"],
    );
    accept(&two("PERFORMANCE", "location = \"westeurope\"", "location = \"eastus\""));
    // With latency data, a location that no [[latency]] entry lists is a typo to report.
    let latency = "[[latency]]\nclient_prefixes = [\"198.18.0.0/16\"]\nregions = [\"westeurope\", \"eastus\"]\n";
    accept(&format!("{latency}{}", two("PERFORMANCE", "location = \"westeurope\"", "location = \"eastus\"")));
    reject(
        &format!("{latency}{}", two("PERFORMANCE", "location = \"westeurope\"", "location = \"westeuropa\"")),
        TM,
        "backend[1].location",
        &["\"westeuropa\" is in no [[latency]] regions list", "eastus, westeurope"],
    );
}

// ---------------------------------------------------------------- GEOGRAPHIC

#[test]
fn q7_geo_code_mapped_twice_or_endpoint_unmapped() {
    reject(
        &two("GEOGRAPHIC", "geo_mapping = [\"FR\"]", "geo_mapping = [\"FR\"]"),
        TM,
        "backend[1].geo_mapping[0]",
        &["FR is already mapped by backend[0]", "one endpoint per service"],
    );
    // Switching to GEOGRAPHIC with an unmapped endpoint.
    reject(
        &two("GEOGRAPHIC", "geo_mapping = [\"FR\"]", ""),
        TM,
        "backend[1].geo_mapping",
        &["required with routing_method = GEOGRAPHIC"],
    );
    // Nested codes (country and its state) may go to different endpoints (vector Q6).
    accept(&two("GEOGRAPHIC", "geo_mapping = [\"US-CA\"]", "geo_mapping = [\"US\", \"GEO-EU\"]"));
}

#[test]
fn geo_codes_must_be_known() {
    reject(
        &two("GEOGRAPHIC", "geo_mapping = [\"FR-IDF\"]", "geo_mapping = [\"WORLD\"]"),
        TM,
        "backend[0].geo_mapping[0]",
        &["not a known region code", "AU, CA, GB and US"],
    );
}

// ---------------------------------------------------------------- MULTIVALUE

#[test]
fn m4_multivalue_targets_and_max_return() {
    // A nested (name-addressed) endpoint under MULTIVALUE.
    let text = format!(
        "{}{}",
        svc("tm", "MULTIVALUE", "", &[ep("a", "192.0.2.1", ""), ep("n", "", "target_service = \"child\"")]),
        svc("child", "PRIORITY", "", &[ep("c", "192.0.2.9", "")])
    );
    reject(&text, TM, "backend[1].target_service", &["MULTIVALUE", "cannot be a parent"]);
    // A DNS name is not an address at all; given as `target`, MULTIVALUE refuses it.
    let err = Config::parse(&svc("tm", "MULTIVALUE", "", &[ep("a", "www.example.com", "")])).expect_err("rejected");
    assert!(matches!(config_error(&err).kind, ConfigErrorKind::Syntax(_)), "{err}");
    reject(
        &svc("tm", "MULTIVALUE", "", &[ep("a", "", "target = \"www.example.com\"")]),
        TM,
        "backend[0].target",
        &["MULTIVALUE", "IPv4/IPv6 address"],
    );
    for bad in [0, 11] {
        reject(
            &svc("tm", "MULTIVALUE", &format!("max_return = {bad}"), &[ep("a", "192.0.2.1", "")]),
            TM,
            "max_return",
            &["1..=10"],
        );
    }
    let cfg = accept(&svc("tm", "MULTIVALUE", "max_return = 10", &[ep("a", "192.0.2.1", "")]));
    assert_eq!(cfg.services[0].tm().unwrap().max_return, 10);
    let cfg = accept(&svc("tm", "MULTIVALUE", "", &[ep("a", "192.0.2.1", ""), ep("b", "2001:db8::1", "")]));
    assert_eq!(cfg.services[0].tm().unwrap().max_return, 2, "default");
    reject(
        &svc("tm", "PRIORITY", "max_return = 2", &[ep("a", "192.0.2.1", "")]),
        TM,
        "max_return",
        &["only allowed with routing_method = MULTIVALUE"],
    );
    // Mixed families are MULTIVALUE-only.
    reject(
        &svc("tm", "WEIGHTED", "", &[ep("a", "192.0.2.1", ""), ep("b", "2001:db8::1", "")]),
        TM,
        "backend[1].address",
        &["address family"],
    );
}

// ---------------------------------------------------------------- SUBNET

#[test]
fn n5_subnet_malformed_or_overlapping() {
    reject(
        &two("SUBNET", "subnets = [\"1.2.3.4/24\"]", ""),
        TM,
        "backend[0].subnets[0]",
        &["must be the block start", "1.2.3.0/24"],
    );
    reject(
        &two("SUBNET", "subnets = [\"5.6.7.8-1.2.3.4\"]", ""),
        TM,
        "backend[0].subnets[0]",
        &["first must not be above last"],
    );
    reject(
        &two("SUBNET", "subnets = [\"10.0.0.0/8\"]", "subnets = [\"10.1.0.0/16\"]"),
        TM,
        "backend[1].subnets[0]",
        &["overlaps \"10.0.0.0/8\"", "backend[0].subnets[0]", "must not overlap"],
    );
    // Both notations, several ranges, single addresses.
    accept(&two("SUBNET", "subnets = [\"10.0.0.0/8\", \"192.168.1.10-192.168.1.20\", \"172.16.0.1\"]", ""));
}

#[test]
fn subnet_at_most_one_fallback() {
    let text = svc(
        "tm",
        "SUBNET",
        "",
        &[ep("e1", "192.0.2.1", "subnets = [\"10.0.0.0/8\"]"), ep("f1", "192.0.2.2", ""), ep("f2", "192.0.2.3", "")],
    );
    reject(&text, TM, "backend[2].subnets", &["backend[1] is already the fallback"]);
}

// ---------------------------------------------------------------- nesting

/// A chain s0 -> s1 -> ... -> s(n-1) of PRIORITY services (n - 1 nesting levels).
fn chain(n: usize) -> String {
    (0..n)
        .map(|i| {
            let name = format!("s{i:02}");
            let e = if i + 1 < n {
                ep("n", "", &format!("target_service = \"s{:02}\"", i + 1))
            } else {
                ep("leaf", "192.0.2.1", "")
            };
            // Distinct VIPs by index.
            svc(&name, "PRIORITY", "", &[e]).replace("198.51.100.", &format!("198.51.{}.", i + 1))
        })
        .collect()
}

#[test]
fn h5_nesting_depth_loops_and_multivalue_parent() {
    accept(&chain(11)); // 10 levels
    reject(&chain(12), "service \"s00\"", "backend.target_service", &["11 levels", "at most 10"]);

    let looped = format!(
        "{}{}",
        svc("a", "PRIORITY", "", &[ep("n", "", "target_service = \"b\"")]),
        svc("b", "PRIORITY", "", &[ep("n", "", "target_service = \"a\"")])
    );
    let err = Config::parse(&looped).expect_err("loop rejected");
    let v = config_error(&err).violations();
    assert_eq!(v.len(), 2, "{err}");
    assert!(v.iter().all(|v| v.field == "backend.target_service" && v.problem.contains("nesting loop")), "{err}");
    assert!(err.to_string().contains("a -> b -> a"), "{err}");

    reject(
        &svc("tm", "PRIORITY", "", &[ep("n", "", "target_service = \"tm\"")]),
        TM,
        "backend[0].target_service",
        &["cannot nest itself"],
    );

    let mv_parent = format!(
        "{}{}",
        svc("tm", "MULTIVALUE", "", &[ep("a", "192.0.2.1", ""), ep("n", "", "target_service = \"c\"")]),
        svc("c", "WEIGHTED", "", &[ep("x", "192.0.2.9", "")])
    );
    reject(&mv_parent, TM, "backend[1].target_service", &["cannot be a parent"]);
}

#[test]
fn nested_endpoint_rules() {
    let child = svc("c", "WEIGHTED", "", &[ep("x", "192.0.2.9", "")]);
    reject(
        &format!("{}{child}", svc("tm", "PRIORITY", "", &[ep("n", "192.0.2.1", "target_service = \"c\"")])),
        TM,
        "backend[0].address",
        &["not allowed on a nested endpoint"],
    );
    reject(
        &svc("tm", "PRIORITY", "", &[ep("n", "", "target_service = \"nope\"")]),
        TM,
        "backend[0].target_service",
        &["\"nope\" names no [[service]]"],
    );
    reject(
        &format!(
            "{}{child}",
            svc("tm", "PRIORITY", "", &[ep("n", "", "target_service = \"c\"\nmin_child_endpoints = 0")])
        ),
        TM,
        "backend[0].min_child_endpoints",
        &["at least 1"],
    );
    reject(
        &two("PRIORITY", "min_child_endpoints = 2", ""),
        TM,
        "backend[0].min_child_endpoints",
        &["only allowed on a nested endpoint"],
    );
    reject(&svc("tm", "PRIORITY", "", &[ep("e", "", "")]), TM, "backend[0].address", &["required"]);
    let zonal_child = "\n[[service]]\nname = \"z\"\nvip = \"198.51.100.200\"\nprotocol = \"TCP\"\nports = [80]\n\n[[service.backend]]\naddress = \"192.0.2.50\"\n";
    reject(
        &format!("{}{zonal_child}", svc("tm", "PRIORITY", "", &[ep("n", "", "target_service = \"z\"")])),
        TM,
        "backend[0].target_service",
        &["ZONAL", "Traffic Manager method"],
    );
    reject(
        &format!("{}{child}", svc("tm", "PRIORITY", "", &[ep("n", "", "target_service = \"c\"\nalways_serve = true")])),
        TM,
        "backend[0].always_serve",
        &["nested"],
    );
}

// ---------------------------------------------------------------- monitoring

fn monitored(monitor: &str) -> String {
    format!("{}\n[service.monitor]\n{monitor}\n{}", svc("tm", "PRIORITY", "", &[]), ep("e1", "192.0.2.1", ""))
}

#[test]
fn o1_timeout_defaults_follow_interval() {
    for (interval, timeout) in [(30, 10), (10, 9)] {
        let cfg =
            accept(&monitored(&format!("protocol = \"HTTP\"\nport = 80\npath = \"/\"\ninterval_sec = {interval}")));
        let m = cfg.services[0].tm().unwrap().monitor.clone().unwrap();
        assert_eq!((m.interval_sec, m.timeout_sec, m.tolerated_failures), (interval, timeout, 3));
        assert_eq!(m.expected_status, [(200, 200)]);
    }
    let cfg = accept(&monitored("protocol = \"TCP\"\nport = 443"));
    let m = cfg.services[0].tm().unwrap().monitor.clone().unwrap();
    assert_eq!((m.interval_sec, m.timeout_sec), (30, 10));
}

#[test]
fn o2_monitor_settings_out_of_range() {
    let http = "protocol = \"HTTP\"\nport = 80\npath = \"/\"\n";
    reject(&monitored(&format!("{http}interval_sec = 10\ntimeout_sec = 10")), TM, "monitor.timeout_sec", &["5..=9"]);
    reject(&monitored(&format!("{http}interval_sec = 20")), TM, "monitor.interval_sec", &["30 (normal) or 10 (fast)"]);
    reject(&monitored(&format!("{http}tolerated_failures = 10")), TM, "monitor.tolerated_failures", &["0..=9"]);
    reject(
        &monitored("protocol = \"TCP\"\nport = 80\npath = \"/\""),
        TM,
        "monitor.path",
        &["not allowed with protocol = TCP"],
    );
    // And the other rules of the settings table.
    reject(&monitored(&format!("{http}timeout_sec = 4")), TM, "monitor.timeout_sec", &["5..=10"]);
    reject(&monitored("protocol = \"HTTPS\"\nport = 443"), TM, "monitor.path", &["required with protocol = HTTPS"]);
    reject(&monitored("protocol = \"HTTP\"\npath = \"/\""), TM, "monitor.port", &["required"]);
    reject(
        &monitored(&format!("{http}expected_status_ranges = [\"300-200\"]")),
        TM,
        "monitor.expected_status_ranges",
        &["min must not be above max"],
    );
    let nine: Vec<String> = (0..9).map(|i| format!("\"{}\"", 200 + i)).collect();
    reject(
        &monitored(&format!("{http}expected_status_ranges = [{}]", nine.join(","))),
        TM,
        "monitor.expected_status_ranges",
        &["at most 8"],
    );
    reject(&monitored(&format!("{http}custom_headers = [\"novalue\"]")), TM, "monitor.custom_headers", &["name:value"]);
    accept(&monitored(&format!(
        "{http}custom_headers = [\"Host:example.com\"]\nexpected_status_ranges = [\"200-299\", \"301\"]"
    )));
}

/// Spec §2.3: custom headers at the profile and/or the endpoint level, the endpoint's winning.
#[test]
fn endpoint_custom_headers_need_an_http_monitor_and_win() {
    let with = |monitor: &str, headers: &str| {
        format!(
            "{}\n[service.monitor]\n{monitor}\n{}",
            svc("tm", "PRIORITY", "", &[]),
            ep("e1", "192.0.2.1", &format!("custom_headers = [{headers}]"))
        )
    };
    let http =
        "protocol = \"HTTP\"\nport = 80\npath = \"/\"\ncustom_headers = [\"Host:profile.example\", \"X-Env:prod\"]";
    let cfg = accept(&with(http, "\"host:endpoint.example\""));
    let probes = lb_user::daemon::health::probes_for(&cfg);
    match &probes[..] {
        [lb_user::daemon::health::Probe::Monitor { settings, .. }] => assert_eq!(
            settings.custom_headers,
            [("X-Env".to_string(), "prod".to_string()), ("host".to_string(), "endpoint.example".to_string())],
            "the endpoint's Host replaces the profile's"
        ),
        other => panic!("{other:?}"),
    }
    reject(&with("protocol = \"TCP\"\nport = 80", "\"Host:x\""), TM, "backend[0].custom_headers", &["HTTP or HTTPS"]);
    reject(&with(http, "\"novalue\""), TM, "backend[0].custom_headers", &["name:value"]);
    let nine: Vec<String> = (0..9).map(|i| format!("\"X-{i}:v\"")).collect();
    reject(&with(http, &nine.join(",")), TM, "backend[0].custom_headers", &["at most 8"]);
}

/// Issue #34-1: a name endpoint is monitored at each resolved address, with its name as the
/// HTTP Host (and so the TLS SNI), unless a custom header sets the Host; none resolved, none
/// probed.
#[test]
fn name_endpoints_are_probed_at_each_address_with_their_name_as_host() {
    use lb_user::config::{Endpoint, Resolution};
    use lb_user::daemon::health::{probes_for, Probe};
    let with = |headers: &str| {
        let text = format!(
            "{}\n[service.monitor]\nprotocol = \"HTTPS\"\nport = 443\npath = \"/health\"\ncustom_headers = [{headers}]\n{}",
            svc("tm", "PRIORITY", "", &[]),
            ep("e1", "", "target = \"App.Example.net\"")
        );
        accept(&text)
    };
    let probed = |cfg: &lb_user::config::Config| -> Vec<(String, Vec<(String, String)>)> {
        probes_for(cfg)
            .into_iter()
            .map(|p| match p {
                Probe::Monitor { backend, settings, .. } => (backend.to_string(), settings.custom_headers),
                other => panic!("{other:?}"),
            })
            .collect()
    };
    let mut cfg = with("\"X-Env:prod\"");
    assert!(probed(&cfg).is_empty(), "nothing resolved: nothing to probe");
    let Endpoint::Name(t) = &mut cfg.services[0].backends[0].endpoint else { panic!() };
    t.resolved.addresses = vec!["192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap()];
    t.resolved.state = Resolution::Answered;
    let h = |n: &str, v: &str| (n.to_owned(), v.to_owned());
    assert_eq!(
        probed(&cfg),
        [
            ("192.0.2.1".to_owned(), vec![h("Host", "app.example.net"), h("X-Env", "prod")]),
            ("192.0.2.2".to_owned(), vec![h("Host", "app.example.net"), h("X-Env", "prod")]),
        ]
    );
    let mut cfg = with("\"host:www.example.net\"");
    let Endpoint::Name(t) = &mut cfg.services[0].backends[0].endpoint else { panic!() };
    t.resolved.addresses = vec!["192.0.2.1".parse().unwrap()];
    assert_eq!(probed(&cfg), [("192.0.2.1".to_owned(), vec![h("host", "www.example.net")])], "a custom Host wins");
}

// ---------------------------------------------------------------- method vs. fields

#[test]
fn zonal_services_reject_traffic_manager_fields() {
    let zonal = "\n[[service]]\nname = \"web\"\nvip = \"198.51.100.1\"\nprotocol = \"TCP\"\nports = [80]\n\n\
                 [[service.backend]]\naddress = \"192.0.2.1\"\npriority = 1\n";
    reject(zonal, "service \"web\"", "backend[0].priority", &["Traffic Manager routing_method", "ZONAL"]);
    let no_address = "\n[[service]]\nname = \"web\"\nvip = \"198.51.100.1\"\nprotocol = \"TCP\"\n\
                      ports = [80]\n\n[[service.backend]]\nweight = 2\n";
    reject(no_address, "service \"web\"", "backend[0].address", &["required"]);
}

#[test]
fn traffic_manager_services_reject_gcp_fields() {
    let zone = "[[zone]]\nname = \"zone-1\"\nclient_prefixes = [\"10.0.0.0/8\"]\n";
    let text = format!("{zone}{}", two("PRIORITY", "zone = \"zone-1\"", ""));
    reject(&text, TM, "backend[0].zone", &["Google Cloud", "PRIORITY"]);
    let hc = format!(
        "{}\n[service.health_check]\nprotocol = \"TCP\"\nport = 80\n{}",
        svc("tm", "WEIGHTED", "", &[]),
        ep("e1", "192.0.2.1", "")
    );
    reject(&hc, TM, "health_check", &["[service.monitor]"]);
    let dup = svc("tm", "PRIORITY", "", &[ep("e", "192.0.2.1", ""), ep("e", "192.0.2.2", "")]);
    reject(&dup, TM, "backend[1].name", &["duplicate endpoint name"]);
}

// ---------------------------------------------------------------- client inputs

#[test]
fn latency_and_geo_inputs() {
    let base = svc("tm", "PRIORITY", "", &[ep("e", "192.0.2.1", "")]);
    reject(
        &format!("[[geo]]\nclient_prefixes = [\"10.0.0.0/8\"]\nregion = \"XX\"\n{base}"),
        "geo[0]",
        "region",
        &["not a known region code"],
    );
    reject(
        &format!("[[latency]]\nclient_prefixes = [\"10.0.0.0/8\"]\nregions = []\n{base}"),
        "latency[0]",
        "regions",
        &["at least one region"],
    );
    reject(
        &format!(
            "[[latency]]\nclient_prefixes = [\"10.0.0.0/8\"]\nregions = [\"a\"]\n\
             [[latency]]\nclient_prefixes = [\"10.0.0.0/8\"]\nregions = [\"b\"]\n{base}"
        ),
        "latency[1]",
        "client_prefixes[0]",
        &["also listed in latency[0]"],
    );
    reject(
        &format!("[[geo]]\nclient_prefixes = [\"10.0.0.1/8\"]\nregion = \"IE\"\n{base}"),
        "geo[0]",
        "client_prefixes[0]",
        &["host bits", "10.0.0.0/8"],
    );
    // Nested prefixes are fine: the longest match wins.
    accept(&format!(
        "[[geo]]\nclient_prefixes = [\"10.0.0.0/8\"]\nregion = \"IE\"\n\
         [[geo]]\nclient_prefixes = [\"10.1.0.0/16\"]\nregion = \"US-CA\"\n{base}"
    ));
}

#[test]
fn example_traffic_manager_toml_loads() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/traffic_manager.toml");
    let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(cfg.services.iter().any(|s| s.routing_method().is_traffic_manager()));
    assert!(!cfg.latency.is_empty() && !cfg.geo.is_empty());
}

// ---------------------------------------------------------------- endpoints given by DNS name

/// Issue #34-1: `target = "name"` makes an external endpoint given by DNS name: accepted under
/// every method but MULTIVALUE (vector M4), typed as `Endpoint::Name` with the canonical name
/// and no address until the daemon resolves it.
#[test]
fn name_endpoints_are_accepted_and_typed() {
    use lb_user::config::{Endpoint, Resolution};
    for method in ["PRIORITY", "WEIGHTED", "GEOGRAPHIC", "SUBNET"] {
        let extra = match method {
            "GEOGRAPHIC" => "geo_mapping = [\"WORLD\"]\n",
            _ => "",
        };
        let cfg = accept(&svc("tm", method, "", &[ep("e", "", &format!("{extra}target = \"App.Example.NET.\""))]));
        let b = &cfg.services[0].backends[0];
        let Endpoint::Name(t) = &b.endpoint else { panic!("{method}: a name endpoint, got {:?}", b.endpoint) };
        assert_eq!(t.name.as_str(), "app.example.net", "canonical form");
        assert_eq!(t.resolved.state, Resolution::Pending);
        assert!(b.addresses().is_empty() && b.address().is_none());
    }
    let cfg =
        accept(&svc("tm", "PERFORMANCE", "", &[ep("e", "", "location = \"westeurope\"\ntarget = \"a.example\"")]));
    assert_eq!(cfg.services[0].backends[0].label(), "e");
    // Without a name, the label is the DNS name.
    let text = "[[service]]\nname = \"tm\"\nvip = \"198.51.100.7\"\nprotocol = \"TCP\"\nports = [80]\n\
                routing_method = \"PRIORITY\"\n[[service.backend]]\ntarget = \"b.example\"\n";
    assert_eq!(accept(text).services[0].backends[0].label(), "b.example");
}

#[test]
fn name_endpoints_are_refused_where_a_name_cannot_go() {
    let one = |extra: &str| svc("tm", "PRIORITY", "", &[ep("e", "", extra)]);
    reject(&one("target = \"bad_name.example\""), TM, "backend[0].target", &["not a host name", "DNS host name"]);
    reject(&one("target = \"-a.example\""), TM, "backend[0].target", &["not a host name"]);
    reject(&one("target = \"198.18.0.1\""), TM, "backend[0].target", &["is an IP address", "`address`"]);
    reject(&one("target = \"2001:db8::1\""), TM, "backend[0].target", &["is an IP address"]);
    reject(
        &svc("tm", "PRIORITY", "", &[ep("e", "198.18.0.1", "target = \"a.example\"")]),
        TM,
        "backend[0].address",
        &["not allowed with target"],
    );
    reject(
        &format!(
            "{}{}",
            one("target = \"a.example\"\ntarget_service = \"c\""),
            svc("c", "PRIORITY", "", &[ep("x", "198.51.100.9", "")])
        ),
        TM,
        "backend[0].target",
        &["not allowed with target_service"],
    );
    reject(&one("target = \"a.example\"\nmin_child_endpoints = 1"), TM, "backend[0].min_child_endpoints", &["nested"]);
    // Spec §2.1: A/AAAA and CNAME addressing are not mixed in one profile.
    reject(
        &svc("tm", "PRIORITY", "", &[ep("a", "192.0.2.1", ""), ep("n", "", "target = \"a.example\"")]),
        TM,
        "backend[1].target",
        &["cannot be mixed", "backend[0]", "target_service"],
    );
    // A name this balancer answers for would loop.
    reject(
        &svc("tm", "PRIORITY", "dns_name = \"tm.example\"", &[ep("n", "", "target = \"TM.example.\"")]),
        TM,
        "backend[0].target",
        &["dns_name of service \"tm\"", "target_service"],
    );
    // A zonal backend has no target.
    let zonal = "[[service]]\nname = \"z\"\nvip = \"198.51.100.8\"\nprotocol = \"TCP\"\nports = [80]\n\
                 [[service.backend]]\naddress = \"192.0.2.1\"\ntarget = \"a.example\"\n";
    reject(zonal, "service \"z\"", "backend[0].target", &["Traffic Manager"]);
    // Two endpoints of the same name are two endpoints of the same label.
    reject(
        &format!(
            "{}\n[[service.backend]]\ntarget = \"a.example\"\n[[service.backend]]\ntarget = \"A.example\"\n",
            svc("tm", "WEIGHTED", "", &[])
        ),
        TM,
        "backend[1].name",
        &["duplicate endpoint name \"a.example\""],
    );
}

/// `[resolver]`: servers as "ADDR" or "ADDR:PORT", the TTL floor and cap, the time a failed
/// resolution keeps the last answer.
#[test]
fn resolver_settings() {
    let base = svc("tm", "PRIORITY", "", &[ep("e", "", "target = \"a.example\"")]);
    let cfg = accept(&base);
    assert!(cfg.resolver.servers.is_empty());
    assert_eq!((cfg.resolver.min_ttl_sec, cfg.resolver.max_ttl_sec, cfg.resolver.keep_last_answer_sec), (5, 3600, 300));
    let cfg = accept(&format!(
        "[resolver]\nservers = [\"198.18.0.53\", \"198.18.0.54:5353\", \"[2001:db8::53]:53\"]\nmin_ttl_sec = 1\n\
         max_ttl_sec = 60\nkeep_last_answer_sec = 0\n{base}"
    ));
    let servers: Vec<String> = cfg.resolver.servers.iter().map(|s| s.to_string()).collect();
    assert_eq!(servers, ["198.18.0.53:53", "198.18.0.54:5353", "[2001:db8::53]:53"]);
    assert_eq!((cfg.resolver.min_ttl_sec, cfg.resolver.max_ttl_sec, cfg.resolver.keep_last_answer_sec), (1, 60, 0));
    let err = Config::parse(&format!("[resolver]\nservers = [\"dns.example\"]\n{base}")).expect_err("rejected");
    assert!(err.to_string().contains("not a server address"), "{err}");
    reject(
        &format!("[resolver]\nmin_ttl_sec = 0\n{base}"),
        "resolver.min_ttl_sec",
        "resolver.min_ttl_sec",
        &["1..=3600"],
    );
    reject(
        &format!("[resolver]\nmin_ttl_sec = 30\nmax_ttl_sec = 10\n{base}"),
        "resolver.max_ttl_sec",
        "resolver.max_ttl_sec",
        &["min_ttl_sec (30)"],
    );
    reject(
        &format!("[resolver]\nservers = [\"198.18.0.53:0\"]\n{base}"),
        "resolver.servers[0]",
        "resolver.servers[0]",
        &["port in 1..=65535"],
    );
}
