//! Validation of the TOML configuration contract: one test per rejected case (each checks the
//! error names the service and the field path, and what is allowed), the accepted cases and
//! defaults of spec §1.4 / §1.6, and the example files. Spec-derived tests carry the vector ID.

use lb_user::config::{raw, Config, ConfigError, ConfigErrorKind, Scope, Violation};
use lb_user::model::*;
use std::path::{Path, PathBuf};

const ZONES: &str = r#"
[[zone]]
name = "zone-1"
client_prefixes = ["198.18.1.0/24", "2001:db8:1::/64"]

[[zone]]
name = "zone-2"
client_prefixes = ["198.18.2.0/24", "2001:db8:2::/64"]
"#;

/// Two zones and one valid TCP service "web" on 198.18.0.100:80 with a backend in each zone.
/// `keys` are extra top-level keys of the service, `tables` extra sub-tables (TOML requires the
/// keys before the tables).
fn toml_with(keys: &str, tables: &str) -> String {
    format!(
        r#"{ZONES}
[[service]]
name = "web"
vip = "198.18.0.100"
protocol = "TCP"
ports = [80]
{keys}
{tables}

[[service.backend]]
address = "198.18.11.1"
zone = "zone-1"

[[service.backend]]
address = "198.18.12.1"
zone = "zone-2"
"#
    )
}

/// The file structs of a valid configuration `text` (as written, before the typed model).
fn parse_raw(text: &str) -> raw::Config {
    Config::parse(text).unwrap_or_else(|e| panic!("{e}"));
    raw::Config::read(text).unwrap()
}

fn load_raw(path: &Path) -> raw::Config {
    Config::load(path).unwrap_or_else(|e| panic!("{e}"));
    raw::Config::read(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn base() -> raw::Config {
    let text = toml_with("", "");
    Config::parse(&text).expect("the base configuration is valid");
    raw::Config::read(&text).expect("the base configuration is valid")
}

fn config_error(err: &anyhow::Error) -> &ConfigError {
    err.downcast_ref::<ConfigError>().expect("errors are ConfigError")
}

/// Asserts that `result` was rejected for exactly one violation of `field` in `scope` and that
/// the rendered message names the scope, the field and every `needle` (the allowed values).
fn assert_single(
    result: anyhow::Result<impl std::fmt::Debug>,
    scope: &str,
    field: &str,
    needles: &[&str],
) -> Violation {
    let err = result.expect_err("configuration must be rejected");
    let msg = err.to_string();
    let violations = config_error(&err).violations();
    assert_eq!(violations.len(), 1, "expected one violation, got: {msg}");
    let v = violations[0].clone();
    assert_eq!(v.field, field, "{msg}");
    assert!(msg.contains(field), "message lacks field path {field:?}: {msg}");
    assert!(msg.contains(scope), "message lacks {scope:?}: {msg}");
    for needle in needles {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
    v
}

const WEB: &str = "service \"web\"";

/// Validate a mutated base config and expect one violation in service "web".
fn reject_web(cfg: raw::Config, field: &str, needles: &[&str]) -> Violation {
    let v = assert_single(cfg.validate(), WEB, field, needles);
    assert_eq!(v.service(), Some("web"));
    v
}

fn reject_text(text: &str, scope: &str, field: &str, needles: &[&str]) -> Violation {
    assert_single(Config::parse(text), scope, field, needles)
}

fn syntax_error(text: &str) -> String {
    let err = Config::parse(text).expect_err("must be rejected");
    assert!(matches!(config_error(&err).kind, ConfigErrorKind::Syntax(_)), "{err}");
    err.to_string()
}

// ------------------------------------------------------------------ zonal affinity

#[test]
fn z18_spillover_ratio_1_2_rejected() {
    let text = toml_with(
        "",
        "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 1.2\n",
    );
    reject_text(&text, WEB, "zonal_affinity.spillover_ratio", &["1.2", "[0.0, 1.0]"]);
}

#[test]
fn spillover_ratio_negative_rejected() {
    let mut cfg = base();
    cfg.services[0].zonal_affinity.spillover = Spillover::SpillCrossZone;
    cfg.services[0].zonal_affinity.spillover_ratio = -0.1;
    reject_web(cfg, "zonal_affinity.spillover_ratio", &["-0.1", "[0.0, 1.0]"]);
}

#[test]
fn spillover_ratio_nan_rejected() {
    let text = toml_with(
        "",
        "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = nan\n",
    );
    reject_text(&text, WEB, "zonal_affinity.spillover_ratio", &["NaN", "[0.0, 1.0]"]);
}

#[test]
fn spillover_ratio_nonzero_without_spill_cross_zone_rejected() {
    for spillover in [Spillover::Disabled, Spillover::StayWithinZone] {
        let mut cfg = base();
        cfg.services[0].zonal_affinity.spillover = spillover;
        cfg.services[0].zonal_affinity.spillover_ratio = 0.5;
        reject_web(cfg, "zonal_affinity.spillover_ratio", &["ZONAL_AFFINITY_SPILL_CROSS_ZONE", spillover.as_str()]);
    }
}

#[test]
fn spillover_ratio_bounds_accepted() {
    for ratio in [0.0, 1.0] {
        let mut cfg = base();
        cfg.services[0].zonal_affinity.spillover = Spillover::SpillCrossZone;
        cfg.services[0].zonal_affinity.spillover_ratio = ratio;
        cfg.validate().expect("ratio in [0, 1] with SPILL is valid");
    }
}

#[test]
fn z19_stay_within_zone_with_subsetting_rejected() {
    let text = toml_with(
        "subsetting = \"CONSISTENT_HASH_SUBSETTING\"",
        "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_STAY_WITHIN_ZONE\"\n",
    );
    reject_text(
        &text,
        WEB,
        "subsetting",
        &["CONSISTENT_HASH_SUBSETTING", "ZONAL_AFFINITY_STAY_WITHIN_ZONE", "ZONAL_AFFINITY_DISABLED"],
    );
}

#[test]
fn z19_spill_cross_zone_with_subsetting_rejected() {
    let mut cfg = base();
    cfg.services[0].subsetting = Subsetting::ConsistentHashSubsetting;
    cfg.services[0].zonal_affinity.spillover = Spillover::SpillCrossZone;
    reject_web(cfg, "subsetting", &["ZONAL_AFFINITY_DISABLED"]);
}

/// Issue #32-6: the balancer never subsets, so the policy is refused rather than ignored.
#[test]
fn subsetting_without_zonal_affinity_rejected_as_unsupported() {
    let text = toml_with("subsetting = \"CONSISTENT_HASH_SUBSETTING\"", "");
    reject_text(&text, WEB, "subsetting", &["CONSISTENT_HASH_SUBSETTING", "not supported", "allowed: NONE"]);
    let mut cfg = base();
    cfg.services[0].subsetting = Subsetting::None;
    cfg.validate().expect("subsetting = NONE is the default");
}

// ------------------------------------------------------------------ backends and zones

#[test]
fn backend_zone_unknown_rejected_lists_zones() {
    let mut cfg = base();
    cfg.services[0].backends[1].zone = Some("zone-9".into());
    reject_web(cfg, "backend[1].zone", &["zone-9", "zone-1, zone-2"]);
}

#[test]
fn backend_zone_without_any_zone_rejected() {
    let mut cfg = base();
    cfg.zones.clear();
    let err = cfg.validate().expect_err("zones are referenced but none exist");
    let msg = err.to_string();
    assert_eq!(config_error(&err).violations().len(), 2, "{msg}");
    assert!(
        msg.contains("backend[0].zone") && msg.contains("backend[1].zone") && msg.contains("none are configured"),
        "{msg}"
    );
}

#[test]
fn backend_without_zone_accepted() {
    let mut cfg = base();
    cfg.services[0].backends[0].zone = None;
    cfg.validate().expect("a backend may be in no zone");
}

#[test]
fn duplicate_backend_address_rejected() {
    let mut cfg = base();
    cfg.services[0].backends[1].address = "198.18.11.1".parse().unwrap();
    reject_web(cfg, "backend[1].address", &["198.18.11.1", "backend[0]", "unique"]);
}

#[test]
fn more_than_250_backends_rejected() {
    let mut cfg = base();
    let template = cfg.services[0].backends[0].clone();
    cfg.services[0].backends = (0..250u32)
        .map(|i| raw::Backend {
            address: std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(198, 18, 100, 0)) + i).into(),
            ..template.clone()
        })
        .collect();
    cfg.validate().expect("250 backends are allowed");
    cfg.services[0].backends.push(raw::Backend { address: "198.18.99.1".parse().unwrap(), ..template });
    reject_web(cfg, "backend", &["251", "250"]);
}

#[test]
fn prefixes_overlapping_across_zones_rejected() {
    let mut cfg = base();
    cfg.zones[1].client_prefixes.push("198.18.1.128/25".parse().unwrap());
    let v = assert_single(
        cfg.validate(),
        "zone \"zone-2\"",
        "client_prefixes[2]",
        &["198.18.1.128/25", "198.18.1.0/24", "zone \"zone-1\""],
    );
    assert_eq!(v.scope, Scope::Zone { index: 1, name: "zone-2".into() });
}

#[test]
fn prefixes_overlapping_across_zones_ipv6_rejected() {
    let mut cfg = base();
    cfg.zones[0].client_prefixes.push("2001:db8::/32".parse().unwrap());
    let err = cfg.validate().expect_err("a /32 covering both zones' /64s overlaps");
    let msg = err.to_string();
    // The /32 sorts first; each zone's /64 is reported against it.
    assert_eq!(config_error(&err).violations().len(), 2, "{msg}");
    assert!(
        msg.contains("2001:db8:1::/64 overlaps 2001:db8::/32")
            && msg.contains("2001:db8:2::/64 overlaps 2001:db8::/32"),
        "{msg}"
    );
}

#[test]
fn prefixes_overlapping_within_zone_rejected() {
    let mut cfg = base();
    cfg.zones[0].client_prefixes.push("198.18.1.0/24".parse().unwrap());
    assert_single(cfg.validate(), "zone \"zone-1\"", "client_prefixes[2]", &["198.18.1.0/24", "same zone"]);
}

#[test]
fn adjacent_prefixes_accepted() {
    let mut cfg = base();
    cfg.zones[0].client_prefixes.push("198.18.0.0/24".parse().unwrap());
    cfg.zones[1].client_prefixes.push("198.18.3.0/24".parse().unwrap());
    cfg.validate().expect("adjacent prefixes do not overlap");
}

#[test]
fn non_canonical_prefix_rejected() {
    let text = ZONES.replace("198.18.1.0/24", "198.18.1.5/24");
    assert_single(
        Config::parse(&text),
        "zone \"zone-1\"",
        "client_prefixes[0]",
        &["198.18.1.5/24", "host bits", "198.18.1.0/24"],
    );
}

#[test]
fn bare_address_is_a_host_prefix() {
    let text = format!("{ZONES}\n[[zone]]\nname = \"zone-3\"\nclient_prefixes = [\"198.18.3.7\"]\n");
    let cfg = Config::parse(&text).expect("a bare address is a /32");
    assert_eq!(cfg.zones[2].client_prefixes, vec!["198.18.3.7/32".parse::<ipnet::IpNet>().unwrap()]);
}

#[test]
fn ipv4_mapped_prefix_is_the_ipv4_prefix() {
    let text = format!(
        "{ZONES}\n[[zone]]\nname = \"zone-3\"\nclient_prefixes = [\"::ffff:198.19.0.0/112\", \"2001:db8:3::/48\"]\n"
    );
    let cfg = Config::parse(&text).expect("an IPv4-mapped prefix is accepted");
    assert_eq!(
        cfg.zones[2].client_prefixes,
        vec!["198.19.0.0/16".parse::<ipnet::IpNet>().unwrap(), "2001:db8:3::/48".parse().unwrap()],
        "read as the IPv4 prefix it covers; other IPv6 prefixes as they are"
    );
    // So it overlaps an IPv4 spelling of the same addresses, which validation reports.
    let twice = format!("{ZONES}\n[[zone]]\nname = \"zone-3\"\nclient_prefixes = [\"::ffff:198.18.1.0/120\"]\n");
    assert!(Config::parse(&twice).is_err(), "zone-1 has 198.18.1.0/24 already");
}

#[test]
fn malformed_prefix_rejected() {
    let msg = syntax_error(&ZONES.replace("198.18.1.0/24", "198.18.1.0/33"));
    assert!(msg.contains("invalid prefix \"198.18.1.0/33\"") && msg.contains("line 4,"), "{msg}");
}

#[test]
fn duplicate_zone_name_rejected() {
    let mut cfg = base();
    cfg.zones[1].name = "zone-1".into();
    // The backend in "zone-2" now names no zone: clear it to keep one violation.
    cfg.services[0].backends[1].zone = None;
    let v = assert_single(cfg.validate(), "zone \"zone-1\"", "name", &["duplicate zone name", "zone[0]"]);
    assert_eq!(v.scope, Scope::Zone { index: 1, name: "zone-1".into() });
}

#[test]
fn empty_zone_name_rejected() {
    let mut cfg = base();
    cfg.zones[1].name = String::new();
    cfg.services[0].backends[1].zone = None;
    assert_single(cfg.validate(), "zone[1]", "name", &["non-empty"]);
}

// ------------------------------------------------------------------ failover policy

#[test]
fn failover_backend_without_policy_rejected() {
    let mut cfg = base();
    cfg.services[0].backends[1].failover = true;
    reject_web(cfg, "backend[1].failover", &["[service.failover_policy]", "false"]);
}

#[test]
fn failover_ratio_out_of_range_rejected() {
    for (ratio, shown) in [(1.5, "1.5"), (-0.5, "-0.5"), (f64::NAN, "NaN")] {
        let mut cfg = base();
        cfg.services[0].failover_policy =
            Some(lb_user::config::FailoverPolicy { failover_ratio: ratio, ..Default::default() });
        cfg.services[0].backends[1].failover = true;
        reject_web(cfg, "failover_policy.failover_ratio", &[shown, "[0.0, 1.0]"]);
    }
}

#[test]
fn disable_connection_drain_on_failover_udp_rejected() {
    // [AMBIG] spec §1.2: validated as TCP-only.
    for protocol in [Protocol::Udp, Protocol::L3Default] {
        let mut cfg = base();
        cfg.services[0].protocol = protocol;
        if protocol == Protocol::L3Default {
            cfg.services[0].ports.clear();
        }
        cfg.services[0].failover_policy =
            Some(lb_user::config::FailoverPolicy { disable_connection_drain_on_failover: true, ..Default::default() });
        reject_web(cfg, "failover_policy.disable_connection_drain_on_failover", &["TCP", protocol.as_str(), "false"]);
    }
}

#[test]
fn disable_connection_drain_on_failover_tcp_accepted() {
    let mut cfg = base();
    cfg.services[0].failover_policy = Some(lb_user::config::FailoverPolicy {
        disable_connection_drain_on_failover: true,
        failover_ratio: 0.5,
        ..Default::default()
    });
    cfg.services[0].backends[1].failover = true;
    cfg.validate().expect("TCP may disable the drain on failover");
}

// ------------------------------------------------------------------ connection tracking

#[test]
fn p7_always_persist_with_per_session_rejected() {
    for affinity in SessionAffinity::ALLOWED {
        let text = toml_with(
            &format!("session_affinity = \"{affinity}\""),
            "[service.connection_tracking]\ntracking_mode = \"PER_SESSION\"\n\
             connection_persistence_on_unhealthy_backends = \"ALWAYS_PERSIST\"\n",
        );
        reject_text(
            &text,
            WEB,
            "connection_tracking.connection_persistence_on_unhealthy_backends",
            &["ALWAYS_PERSIST", "PER_SESSION", "DEFAULT_FOR_PROTOCOL", "NEVER_PERSIST"],
        );
    }
}

#[test]
fn p6_always_persist_with_per_connection_accepted() {
    let mut cfg = base();
    cfg.services[0].connection_tracking.connection_persistence_on_unhealthy_backends = Persistence::AlwaysPersist;
    cfg.validate().expect("ALWAYS_PERSIST is valid with PER_CONNECTION");
}

fn with_tracking(mode: TrackingMode, affinity: SessionAffinity, idle: Option<u32>) -> raw::Config {
    let mut cfg = base();
    cfg.services[0].session_affinity = affinity;
    cfg.services[0].connection_tracking.tracking_mode = mode;
    cfg.services[0].connection_tracking.idle_timeout_sec = idle;
    cfg
}

#[test]
fn idle_timeout_per_session_client_ip_proto_3600_ok() {
    let text = toml_with(
        "session_affinity = \"CLIENT_IP_PROTO\"",
        "[service.connection_tracking]\ntracking_mode = \"PER_SESSION\"\nidle_timeout_sec = 3600\n",
    );
    let cfg = Config::parse(&text).expect("valid");
    assert_eq!(cfg.services[0].idle_timeout_sec(), 3600);
}

#[test]
fn idle_timeout_per_session_client_ip_unset_is_600() {
    let cfg = with_tracking(TrackingMode::PerSession, SessionAffinity::ClientIp, None);
    cfg.validate().expect("valid");
    assert_eq!(cfg.services[0].idle_timeout_sec(), 600);
}

#[test]
fn idle_timeout_per_connection_client_ip_3600_rejected() {
    let cfg = with_tracking(TrackingMode::PerConnection, SessionAffinity::ClientIp, Some(3600));
    reject_web(
        cfg,
        "connection_tracking.idle_timeout_sec",
        &["PER_SESSION", "CLIENT_IP_PROTO, CLIENT_IP, CLIENT_IP_NO_DESTINATION", "PER_CONNECTION"],
    );
}

#[test]
fn idle_timeout_per_session_none_3600_rejected() {
    let cfg = with_tracking(TrackingMode::PerSession, SessionAffinity::None, Some(3600));
    reject_web(cfg, "connection_tracking.idle_timeout_sec", &["session_affinity = NONE", "CLIENT_IP_PROTO"]);
}

#[test]
fn idle_timeout_per_session_client_ip_port_proto_rejected() {
    let cfg = with_tracking(TrackingMode::PerSession, SessionAffinity::ClientIpPortProto, Some(3600));
    reject_web(cfg, "connection_tracking.idle_timeout_sec", &["CLIENT_IP_PORT_PROTO"]);
}

#[test]
fn idle_timeout_per_session_client_ip_300_rejected() {
    let cfg = with_tracking(TrackingMode::PerSession, SessionAffinity::ClientIp, Some(300));
    reject_web(cfg, "connection_tracking.idle_timeout_sec", &["300", "600..=57600"]);
}

#[test]
fn idle_timeout_57601_rejected() {
    let cfg = with_tracking(TrackingMode::PerSession, SessionAffinity::ClientIp, Some(57_601));
    reject_web(cfg, "connection_tracking.idle_timeout_sec", &["57601", "600..=57600"]);
}

#[test]
fn idle_timeout_bounds_accepted() {
    for affinity in [SessionAffinity::ClientIpProto, SessionAffinity::ClientIp, SessionAffinity::ClientIpNoDestination]
    {
        for idle in [600, 57_600] {
            let cfg = with_tracking(TrackingMode::PerSession, affinity, Some(idle));
            cfg.validate().unwrap_or_else(|e| panic!("{affinity} {idle}: {e}"));
            assert_eq!(cfg.services[0].idle_timeout_sec(), idle);
        }
    }
}

#[test]
fn draining_timeout_above_3600_rejected() {
    let mut cfg = base();
    cfg.services[0].connection_draining.draining_timeout_sec = 3601;
    reject_web(cfg, "connection_draining.draining_timeout_sec", &["3601", "0..=3600"]);
}

#[test]
fn draining_timeout_3600_accepted() {
    let mut cfg = base();
    cfg.services[0].connection_draining.draining_timeout_sec = 3600;
    cfg.validate().expect("3600 is the maximum");
}

// ------------------------------------------------------------------ names, listeners, ports

#[test]
fn empty_service_name_rejected() {
    let mut cfg = base();
    cfg.services[0].name = String::new();
    let v = assert_single(cfg.validate(), "service[0]", "name", &["non-empty"]);
    assert_eq!(v.service(), Some(""));
}

/// The base service plus a second one on the same zones; `second` is its TOML body after name.
fn two_services(second: &str) -> String {
    format!(
        "{}\n[[service]]\nname = \"api\"\n{second}\n[[service.backend]]\naddress = \"198.18.11.9\"\n",
        toml_with("", "")
    )
}

#[test]
fn duplicate_service_name_rejected() {
    let text = two_services("vip = \"198.18.0.101\"\nprotocol = \"TCP\"\n").replace("name = \"api\"", "name = \"web\"");
    let v = reject_text(&text, WEB, "name", &["duplicate service name", "service[0]"]);
    assert_eq!(v.scope, Scope::Service { index: 1, name: "web".into() });
}

#[test]
fn same_vip_port_protocol_rejected() {
    let text = two_services("vip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [443, 80]\n");
    reject_text(&text, "service \"api\"", "ports[1]", &["198.18.0.100", "service \"web\"", "(vip, port, protocol)"]);
}

#[test]
fn all_ports_service_overlapping_port_list_rejected() {
    let text = two_services("vip = \"198.18.0.100\"\nprotocol = \"TCP\"\n");
    reject_text(&text, "service \"api\"", "ports", &["every TCP port of 198.18.0.100", "service \"web\""]);
}

#[test]
fn l3_default_overlapping_anything_on_vip_rejected() {
    let text = two_services("vip = \"198.18.0.100\"\nprotocol = \"L3_DEFAULT\"\n");
    reject_text(&text, "service \"api\"", "protocol", &["every protocol and port of 198.18.0.100", "service \"web\""]);
    // And in the other order: a UDP service after an L3_DEFAULT one.
    let mut cfg = base();
    cfg.services[0].protocol = Protocol::L3Default;
    cfg.services[0].ports.clear();
    let mut udp = cfg.services[0].clone();
    udp.name = "dns".into();
    udp.protocol = Protocol::Udp;
    udp.ports = vec![53];
    cfg.services.push(udp);
    assert_single(cfg.validate(), "service \"dns\"", "vip", &["every protocol and port", "service \"web\""]);
}

#[test]
fn distinct_listeners_accepted() {
    // Same VIP and port, other protocol; same port, other VIP; disjoint ports.
    for second in [
        "vip = \"198.18.0.100\"\nprotocol = \"UDP\"\nports = [80]\n",
        "vip = \"198.18.0.101\"\nprotocol = \"TCP\"\nports = [80]\n",
        "vip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [443]\n",
    ] {
        Config::parse(&two_services(second)).unwrap_or_else(|e| panic!("{second}: {e}"));
    }
}

/// Issue #31-2: a backend that is a VIP would get its packets balanced again.
#[test]
fn backend_equal_to_a_vip_rejected() {
    // Another service's VIP.
    let text = two_services("vip = \"198.18.11.1\"\nprotocol = \"UDP\"\nports = [53]\n");
    reject_text(&text, WEB, "backend[0].address", &["198.18.11.1", "the vip of service \"api\"", "no service's vip"]);
    // Its own.
    let mut cfg = base();
    cfg.services[0].backends[1].address = cfg.services[0].vip.unwrap();
    reject_web(cfg, "backend[1].address", &["198.18.0.100", "this service's own vip"]);
}

/// Issue #31-2: a VIP held by an interface of the host (`lb validate`, `lb run`, reloads) is
/// refused naming the interface; every such VIP at once, with the other problems.
#[test]
fn vip_on_a_host_interface_rejected() {
    use lb_user::config::HostAddrs;
    let text = two_services("vip = \"2001:db8::1\"\nprotocol = \"TCP\"\nports = [80]\n")
        .replace("address = \"198.18.11.9\"", "address = \"2001:db8::11\"");
    let host = HostAddrs::from_list(vec![
        ("198.18.0.100".parse().unwrap(), "eth0".into()),
        ("2001:db8::1".parse().unwrap(), "eth1".into()),
        ("198.18.0.1".parse().unwrap(), "eth0".into()),
    ]);
    let path = Path::new("lb.toml");
    Config::parse_file_text(path, &text, None).expect("valid without the host's addresses");
    let err = Config::parse_file_text(path, &text, Some(&host)).unwrap_err();
    let msg = err.to_string();
    let v = config_error(&err).violations();
    assert_eq!(v.len(), 2, "{msg}");
    assert_eq!((v[0].service(), v[0].field.as_str()), (Some("web"), "vip"), "{msg}");
    assert_eq!((v[1].service(), v[1].field.as_str()), (Some("api"), "vip"), "{msg}");
    for needle in
        ["lb.toml", "198.18.0.100 is an address of this host (interface eth0)", "2001:db8::1", "eth1", "allowed:"]
    {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
    // The host's other addresses are no VIP: accepted.
    let other = HostAddrs::from_list(vec![("198.18.0.1".parse().unwrap(), "eth0".into())]);
    Config::parse_file_text(path, &text, Some(&other)).expect("no VIP is the host's");
}

#[test]
fn port_zero_rejected() {
    let mut cfg = base();
    cfg.services[0].ports = vec![80, 0];
    reject_web(cfg, "ports[1]", &["port 0", "1..=65535", "all ports"]);
}

#[test]
fn duplicate_port_rejected() {
    let mut cfg = base();
    cfg.services[0].ports = vec![80, 443, 80];
    reject_web(cfg, "ports[2]", &["duplicate port 80"]);
}

#[test]
fn l3_default_with_ports_rejected() {
    let mut cfg = base();
    cfg.services[0].protocol = Protocol::L3Default;
    reject_web(cfg, "ports", &["L3_DEFAULT", "must be empty"]);
}

#[test]
fn backend_family_differs_from_vip_rejected() {
    let mut cfg = base();
    cfg.services[0].backends[0].address = "2001:db8:11::1".parse().unwrap();
    reject_web(cfg, "backend[0].address", &["2001:db8:11::1", "IPv6", "198.18.0.100", "IPv4-in-IPv4 / IPv6-in-IPv6"]);
}

#[test]
fn weight_out_of_range_rejected() {
    for weight in [0, 1001] {
        let mut cfg = base();
        cfg.services[0].backends[0].weight = weight;
        reject_web(cfg, "backend[0].weight", &[&weight.to_string(), "1..=1000"]);
    }
    let mut cfg = base();
    cfg.services[0].backends[0].weight = 1000;
    cfg.validate().expect("1000 is the maximum weight");
}

/// Issue 16.5: `mac` is an optional override; without it the backend's MAC comes from the host's
/// neighbour table (as IPVS direct routing), so an L2_DSR backend may omit it.
#[test]
fn l2_dsr_backend_without_mac_accepted() {
    let mut cfg = base();
    cfg.services[0].forwarding = Some(Forwarding::L2Dsr);
    cfg.services[0].backends[0].mac = Some("02:00:c6:12:0b:01".parse().unwrap());
    cfg.validate().expect("one backend with a MAC, one without");
    cfg.services[0].backends[0].mac = None;
    cfg.validate().expect("no MAC at all");
}

/// A malformed MAC is refused when the file is parsed (the field is a `MacAddr`): the error
/// names the field, its line and the allowed form.
#[test]
fn malformed_mac_rejected() {
    for mac in ["02:00:c6:12:0b", "02-00-c6-12-0b-01", "02:00:c6:12:0b:zz", "2:00:c6:12:0b:01"] {
        let text = toml_with("forwarding = \"L2_DSR\"", "")
            .replacen("zone = \"zone-1\"\n", &format!("zone = \"zone-1\"\nmac = \"{mac}\"\n"), 1)
            .replacen("zone = \"zone-2\"\n", "zone = \"zone-2\"\nmac = \"02:00:c6:12:0c:01\"\n", 1);
        let line = text.lines().position(|l| l.starts_with("mac = ")).unwrap() + 1;
        let msg = syntax_error(&text);
        for needle in ["mac", mac, "six hex octets separated by ':'", &format!("line {line},")] {
            assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
        }
    }
}

#[test]
fn l2_dsr_with_macs_accepted() {
    let mut cfg = base();
    cfg.services[0].forwarding = Some(Forwarding::L2Dsr);
    cfg.services[0].backends[0].mac = Some("02:00:C6:12:0B:01".parse().unwrap());
    cfg.services[0].backends[1].mac = Some("02:00:c6:12:0c:01".parse().unwrap());
    cfg.validate().expect("valid");
}

// ------------------------------------------------------------------ dataplane

#[test]
fn maglev_table_size_not_prime_rejected() {
    let mut cfg = base();
    cfg.dataplane.maglev_table_size = 16383;
    assert_single(
        cfg.validate(),
        "dataplane.maglev_table_size",
        "dataplane.maglev_table_size",
        &["16383", "prime", "[251, 1000003]"],
    );
}

#[test]
fn maglev_table_size_out_of_range_rejected() {
    // Both are prime: only the range is wrong.
    for m in [241, 1_000_033] {
        let mut cfg = base();
        cfg.dataplane.maglev_table_size = m;
        assert_single(
            cfg.validate(),
            "dataplane.maglev_table_size",
            "dataplane.maglev_table_size",
            &[&m.to_string(), "[251, 1000003]"],
        );
    }
    for m in [251, 65537, 1_000_003] {
        let mut cfg = base();
        cfg.dataplane.maglev_table_size = m;
        cfg.validate().unwrap_or_else(|e| panic!("{m}: {e}"));
    }
}

#[test]
fn conntrack_entries_zero_rejected() {
    let text = format!("[dataplane]\nconntrack_entries = 0\n{}", toml_with("", ""));
    reject_text(&text, "dataplane.conntrack_entries", "dataplane.conntrack_entries", &["at least 1"]);
}

#[test]
fn encap_source_v4_not_ipv4_rejected() {
    let text = format!("[dataplane]\nencap_source_v4 = \"2001:db8::1\"\n{}", toml_with("", ""));
    reject_text(&text, "dataplane.encap_source_v4", "dataplane.encap_source_v4", &["2001:db8::1/128", "IPv4"]);
}

#[test]
fn encap_source_v6_not_ipv6_rejected() {
    let text = format!("[dataplane]\nencap_source_v6 = \"198.18.0.0/28\"\n{}", toml_with("", ""));
    reject_text(&text, "dataplane.encap_source_v6", "dataplane.encap_source_v6", &["198.18.0.0/28", "IPv6"]);
}

#[test]
fn encap_sources_accepted() {
    let text = format!(
        "[dataplane]\nencap_source_v4 = \"198.18.0.1\"\nencap_source_v6 = \"2001:db8::/120\"\n{}",
        toml_with("", "")
    );
    let cfg = Config::parse(&text).expect("valid");
    assert_eq!(cfg.dataplane.encap_source_v4, Some("198.18.0.1/32".parse().unwrap()));
    assert_eq!(cfg.dataplane.encap_source_v6, Some("2001:db8::/120".parse().unwrap()));
}

// ------------------------------------------------------------------ health check

fn with_health_check(table: &str) -> String {
    toml_with("", &format!("[service.health_check]\n{table}"))
}

#[test]
fn health_check_interval_zero_rejected() {
    reject_text(
        &with_health_check("check_interval_sec = 0\n"),
        WEB,
        "health_check.check_interval_sec",
        &["at least 1"],
    );
}

#[test]
fn health_check_timeout_zero_rejected() {
    reject_text(&with_health_check("timeout_sec = 0\n"), WEB, "health_check.timeout_sec", &["at least 1"]);
}

#[test]
fn health_check_timeout_above_interval_rejected() {
    reject_text(
        &with_health_check("check_interval_sec = 5\ntimeout_sec = 6\n"),
        WEB,
        "health_check.timeout_sec",
        &["6", "health_check.check_interval_sec = 5", "1..=5"],
    );
}

#[test]
fn health_check_thresholds_zero_rejected() {
    for field in ["healthy_threshold", "unhealthy_threshold"] {
        reject_text(
            &with_health_check(&format!("{field} = 0\n")),
            WEB,
            &format!("health_check.{field}"),
            &["at least 1"],
        );
    }
}

#[test]
fn health_check_request_path_with_tcp_rejected() {
    reject_text(
        &with_health_check("request_path = \"/healthz\"\n"),
        WEB,
        "health_check.request_path",
        &["HTTP", "TCP"],
    );
}

#[test]
fn health_check_expected_status_with_tcp_rejected() {
    reject_text(&with_health_check("expected_status = 200\n"), WEB, "health_check.expected_status", &["HTTP", "TCP"]);
}

#[test]
fn health_check_request_path_without_slash_rejected() {
    reject_text(
        &with_health_check("protocol = \"HTTP\"\nrequest_path = \"healthz\"\n"),
        WEB,
        "health_check.request_path",
        &["\"healthz\"", "start with '/'"],
    );
}

#[test]
fn health_check_expected_status_out_of_range_rejected() {
    for status in [99, 600] {
        reject_text(
            &with_health_check(&format!("protocol = \"HTTP\"\nexpected_status = {status}\n")),
            WEB,
            "health_check.expected_status",
            &[&status.to_string(), "100..=599"],
        );
    }
}

#[test]
fn health_check_without_port_on_all_ports_service_rejected() {
    let mut cfg = base();
    cfg.services[0].ports.clear();
    cfg.services[0].health_check = Some(parse_raw(&with_health_check("")).services[0].health_check.clone().unwrap());
    reject_web(cfg.clone(), "health_check.port", &["required", "all ports", "1..=65535"]);
    cfg.services[0].health_check.as_mut().unwrap().port = Some(8080);
    cfg.validate().expect("an explicit port is enough");
    assert_eq!(cfg.services[0].health_check_port(), Some(8080));
}

#[test]
fn health_check_http_defaults_accepted() {
    let cfg =
        parse_raw(&with_health_check("protocol = \"HTTP\"\nrequest_path = \"/healthz\"\nexpected_status = 204\n"));
    let hc = cfg.services[0].health_check.as_ref().unwrap();
    assert_eq!((hc.check_interval_sec, hc.timeout_sec, hc.healthy_threshold, hc.unhealthy_threshold), (5, 5, 2, 2));
    assert_eq!(cfg.services[0].health_check_port(), Some(80), "defaults to the first service port");
}

// ------------------------------------------------------------------ serde-level rejections

#[test]
fn unknown_key_names_the_key_and_line() {
    let text = toml_with("session_afinity = \"NONE\"", "");
    let line = 1 + text.lines().position(|l| l.starts_with("session_afinity")).unwrap();
    let msg = syntax_error(&text);
    assert!(msg.contains("unknown field `session_afinity`"), "{msg}");
    assert!(msg.contains("`session_affinity`"), "lists the known keys: {msg}");
    assert!(msg.contains(&format!("line {line},")), "{msg}");
}

#[test]
fn unknown_key_in_sub_table_rejected() {
    let msg = syntax_error(&toml_with("", "[service.zonal_affinity]\nspill_ratio = 0.5\n"));
    assert!(msg.contains("unknown field `spill_ratio`") && msg.contains("`spillover_ratio`"), "{msg}");
}

#[test]
fn unknown_enum_values_list_the_allowed_values() {
    let cases: [(String, &[&str]); 5] = [
        (toml_with("", "").replace("protocol = \"TCP\"", "protocol = \"SCTP\""), Protocol::ALLOWED),
        (toml_with("session_affinity = \"CLIENT_PORT\"", ""), SessionAffinity::ALLOWED),
        (toml_with("subsetting = \"SUBSET\"", ""), Subsetting::ALLOWED),
        (toml_with("", "[service.zonal_affinity]\nspillover = \"STAY\"\n"), Spillover::ALLOWED),
        (toml_with("", "[service.connection_tracking]\ntracking_mode = \"PER_FLOW\"\n"), TrackingMode::ALLOWED),
    ];
    for (text, allowed) in cases {
        let msg = syntax_error(&text);
        assert!(msg.contains("unknown variant"), "{msg}");
        for value in allowed {
            assert!(msg.contains(&format!("`{value}`")), "{value} missing: {msg}");
        }
    }
}

// ------------------------------------------------------------------ whole-file behaviour

#[test]
fn all_violations_are_reported_at_once() {
    let mut cfg = base();
    cfg.services[0].zonal_affinity.spillover_ratio = 2.0;
    cfg.services[0].backends[0].weight = 0;
    cfg.dataplane.conntrack_entries = 0;
    let fields: Vec<String> = cfg.violations().into_iter().map(|v| v.field).collect();
    assert_eq!(fields, ["dataplane.conntrack_entries", "zonal_affinity.spillover_ratio", "backend[0].weight"]);
    let msg = cfg.validate().unwrap_err().to_string();
    assert!(msg.contains("3 problems"), "{msg}");
}

fn temp_file(name: &str, text: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!("lb-config-test-{}-{name}", std::process::id()));
    std::fs::write(&path, text).expect("write temp file");
    path
}

#[test]
fn load_names_the_file() {
    let bad = temp_file("bad.toml", &toml_with("", "[service.zonal_affinity]\nspillover_ratio = 1.2\n"));
    let err = Config::load(&bad).expect_err("invalid");
    let msg = err.to_string();
    std::fs::remove_file(&bad).ok();
    assert!(msg.starts_with(&bad.display().to_string()), "{msg}");
    assert!(msg.contains(WEB) && msg.contains("zonal_affinity.spillover_ratio"), "{msg}");
    assert_eq!(config_error(&err).file.as_deref(), Some(bad.as_path()));

    let syntax = temp_file("syntax.toml", "[[service]\n");
    let msg = Config::load(&syntax).expect_err("syntax").to_string();
    std::fs::remove_file(&syntax).ok();
    assert!(msg.starts_with(&syntax.display().to_string()), "{msg}");

    let missing = std::env::temp_dir().join("lb-config-test-does-not-exist.toml");
    let msg = Config::load(&missing).expect_err("missing").to_string();
    assert!(msg.contains(&missing.display().to_string()) && msg.contains("cannot read"), "{msg}");

    let good = temp_file("good.toml", &toml_with("", ""));
    let loaded = Config::load(&good);
    std::fs::remove_file(&good).ok();
    assert_eq!(loaded.expect("valid"), Config::from(base()));
}

#[test]
fn defaults() {
    let text = "[[service]]\nname = \"s\"\nvip = \"2001:db8::100\"\nprotocol = \"UDP\"\n\
                [[service.backend]]\naddress = \"2001:db8::11\"\n";
    let cfg = parse_raw(text);
    assert_eq!(cfg.dataplane.maglev_table_size, 16381);
    assert_eq!(cfg.dataplane.conntrack_entries, 1 << 20);
    let s = &cfg.services[0];
    assert!(s.ports.is_empty());
    assert_eq!(s.idle_timeout_sec(), 600);
    assert_eq!(s.session_affinity, SessionAffinity::None);
    // Unset in the file; IPIP once converted (L2_DSR for a next hop).
    assert_eq!(s.forwarding, None);
    assert_eq!(lb_user::config::Config::parse(text).unwrap().services[0].forwarding, Forwarding::Ipip);
    assert_eq!(s.zonal_affinity.spillover, Spillover::Disabled);
    assert_eq!(s.zonal_affinity.spillover_ratio, 0.0);
    assert_eq!(s.connection_tracking.tracking_mode, TrackingMode::PerConnection);
    assert_eq!(s.connection_tracking.connection_persistence_on_unhealthy_backends, Persistence::DefaultForProtocol);
    assert_eq!(s.connection_draining.draining_timeout_sec, 0);
    assert_eq!(s.subsetting, Subsetting::None);
    assert!(s.failover_policy.is_none() && s.health_check.is_none());
    let b = &s.backends[0];
    assert_eq!((b.weight, b.failover, b.zone.as_deref(), b.mac), (1, false, None, None));
}

#[test]
fn failover_policy_defaults() {
    let cfg = parse_raw(&toml_with("", "[service.failover_policy]\n"));
    let fp = cfg.services[0].failover_policy.as_ref().expect("present = configured");
    assert_eq!(
        (fp.failover_ratio, fp.drop_traffic_if_unhealthy, fp.disable_connection_drain_on_failover),
        (0.0, false, false)
    );
}

// ------------------------------------------------------------------ examples

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples")
}

#[test]
fn every_example_parses() {
    let mut n = 0;
    for entry in std::fs::read_dir(examples_dir()).expect("examples/ exists") {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 2, "expected at least zonal.toml and failover.toml");
}

#[test]
fn z13_example_zonal_toml() {
    let cfg = load_raw(&examples_dir().join("zonal.toml"));
    let names: Vec<&str> = cfg.zones.iter().map(|z| z.name.as_str()).collect();
    assert_eq!(names, ["zone-1", "zone-2"]);
    assert_eq!(cfg.zones[0].client_prefixes, ["198.18.1.0/24".parse().unwrap(), "2001:db8:1::/64".parse().unwrap()]);
    assert_eq!(cfg.zones[1].client_prefixes, ["198.18.2.0/24".parse().unwrap(), "2001:db8:2::/64".parse().unwrap()]);
    let web = &cfg.services[0];
    assert_eq!(
        (web.name.as_str(), web.vip.unwrap().to_string(), web.protocol, web.ports.clone()),
        ("web", "198.18.0.100".into(), Protocol::Tcp, vec![80])
    );
    assert_eq!(web.zonal_affinity.spillover, Spillover::SpillCrossZone);
    assert_eq!(web.zonal_affinity.spillover_ratio, 0.8);
    let hc = web.health_check.as_ref().expect("health check");
    assert_eq!((hc.protocol, hc.port), (HealthProtocol::Tcp, Some(80)));
    let backends: Vec<(String, &str)> =
        web.backends.iter().map(|b| (b.address.to_string(), b.zone.as_deref().unwrap_or(""))).collect();
    let expected: Vec<(String, &str)> = (1..=5)
        .map(|h| (format!("198.18.11.{h}"), "zone-1"))
        .chain((1..=5).map(|h| (format!("198.18.12.{h}"), "zone-2")))
        .collect();
    assert_eq!(backends, expected);
}

#[test]
fn failover_example() {
    let cfg = load_raw(&examples_dir().join("failover.toml"));
    let s = &cfg.services[0];
    assert_eq!(s.failover_policy.as_ref().map(|fp| fp.failover_ratio), Some(0.5));
    assert_eq!(s.zonal_affinity.spillover, Spillover::StayWithinZone);
    let failover = s.backends.iter().filter(|b| b.failover).count();
    assert!(failover >= 1 && failover < s.backends.len(), "both primaries and failover backends");
}

// ------------------------------------------------------------------ addresses and text that cannot work

#[test]
fn non_unicast_vips_rejected() {
    for (vip, what) in [
        ("255.255.255.255", "broadcast"),
        ("0.0.0.0", "unspecified"),
        ("224.0.0.1", "multicast"),
        ("127.0.0.1", "loopback"),
        ("ff02::1", "multicast"),
        ("::1", "loopback"),
    ] {
        let mut cfg = base();
        cfg.services[0].vip = Some(vip.parse().unwrap());
        // Backends of the VIP's family, so the family rule stays quiet.
        if vip.contains(':') {
            cfg.services[0].backends[0].address = "2001:db8:11::1".parse().unwrap();
            cfg.services[0].backends[1].address = "2001:db8:12::1".parse().unwrap();
        }
        reject_web(cfg, "vip", &[vip, what, "allowed: a unicast address"]);
    }
}

#[test]
fn non_unicast_backends_rejected() {
    for (addr, what) in [("255.255.255.255", "broadcast"), ("224.0.0.1", "multicast"), ("127.0.0.1", "loopback")] {
        let mut cfg = base();
        cfg.services[0].backends[1].address = addr.parse().unwrap();
        reject_web(cfg, "backend[1].address", &[addr, what, "allowed: a unicast address"]);
    }
    let mut cfg = base();
    cfg.services[0].vip = Some("2001:db8::100".parse().unwrap());
    cfg.services[0].backends[0].address = "2001:db8:11::1".parse().unwrap();
    cfg.services[0].backends[1].address = "ff02::1".parse().unwrap();
    reject_web(cfg, "backend[1].address", &["ff02::1", "multicast", "allowed: a unicast address"]);
}

#[test]
fn non_unicast_l2_dsr_macs_rejected() {
    for (mac, what) in
        [("ff:ff:ff:ff:ff:ff", "broadcast"), ("01:00:5e:00:00:01", "multicast"), ("00:00:00:00:00:00", "zero")]
    {
        let mut cfg = base();
        cfg.services[0].forwarding = Some(Forwarding::L2Dsr);
        cfg.services[0].backends[0].mac = Some("02:00:c6:12:0b:01".parse().unwrap());
        cfg.services[0].backends[1].mac = Some(mac.parse().unwrap());
        reject_web(cfg, "backend[1].mac", &[mac, what, "allowed a unicast MAC"]);
    }
}

#[test]
fn encap_sources_covering_special_ranges_rejected() {
    for (field, value, needles) in [
        ("encap_source_v4", "0.0.0.0/0", ["0.0.0.0/8", "127.0.0.0/8, 224.0.0.0/4, 240.0.0.0/4"]),
        ("encap_source_v4", "127.0.0.1", ["127.0.0.0/8", "loopback"]),
        ("encap_source_v4", "224.0.0.0/3", ["224.0.0.0/4", "multicast"]),
        ("encap_source_v4", "255.255.255.255", ["240.0.0.0/4", "broadcast"]),
        ("encap_source_v6", "::/0", ["::/8", "ff00::/8"]),
        ("encap_source_v6", "::1", ["::/8", "loopback"]),
        ("encap_source_v6", "ff02::/16", ["ff00::/8", "multicast"]),
    ] {
        let text = format!("[dataplane]\n{field} = \"{value}\"\n{}", toml_with("", ""));
        let full = format!("dataplane.{field}");
        let mut all = vec!["every outer source must be a unicast address", "allowed"];
        all.extend(needles);
        reject_text(&text, &full, &full, &all);
    }
}

#[test]
fn health_check_request_path_with_control_characters_rejected() {
    for path in ["/health\r\nX-Injected: 1", "/a b", "/\u{1b}[2J"] {
        let mut cfg = base();
        cfg.services[0].health_check = Some(lb_user::config::HealthCheck {
            protocol: HealthProtocol::Http,
            port: None,
            request_path: Some(path.into()),
            expected_status: None,
            request: None,
            response: None,
            host: None,
            port_specification: None,
            proxy_header: Default::default(),
            grpc_service_name: None,
            path: None,
            check_interval_sec: 5,
            timeout_sec: 5,
            healthy_threshold: 2,
            unhealthy_threshold: 2,
        });
        reject_web(cfg, "health_check.request_path", &["control character", "allowed printable ASCII only"]);
    }
}

#[test]
fn names_with_control_characters_rejected() {
    let mut cfg = base();
    cfg.services[0].name = "web\nlb: forged line".into();
    assert_single(
        cfg.validate(),
        "service \"web\\nlb: forged line\"",
        "name",
        &["control characters", "allowed printable"],
    );

    let mut cfg = base();
    cfg.zones[0].name = "zone-\u{1b}[31m".into();
    cfg.services[0].backends[0].zone = Some(cfg.zones[0].name.clone());
    assert_single(cfg.validate(), "zone \"zone-\\u{1b}[31m\"", "name", &["control characters", "allowed printable"]);

    let mut cfg = base();
    cfg.services[0].backends[0].name = Some("b\r\n".into());
    reject_web(cfg, "backend[0].name", &["control characters", "allowed printable"]);
}

#[test]
fn conntrack_entries_above_the_maximum_rejected() {
    let text = format!("[dataplane]\nconntrack_entries = 4294967295\n{}", toml_with("", ""));
    reject_text(
        &text,
        "dataplane.conntrack_entries",
        "dataplane.conntrack_entries",
        &["4294967295", "too large", "allowed 1..=16777216", "MiB"],
    );
    let ok = format!("[dataplane]\nconntrack_entries = 16777216\n{}", toml_with("", ""));
    Config::parse(&ok).expect("the maximum is allowed");
}

#[test]
fn health_check_fields_of_another_protocol_rejected() {
    reject_text(
        &with_health_check("protocol = \"HTTP\"\nrequest = \"PING\"\n"),
        WEB,
        "health_check.request",
        &["TCP or SSL", "HTTP"],
    );
    reject_text(
        &with_health_check("host = \"app.example\"\n"),
        WEB,
        "health_check.host",
        &["HTTP, HTTPS or HTTP2", "TCP"],
    );
    let ok = Config::parse(&with_health_check("protocol = \"SSL\"\nrequest = \"PING\"\nresponse = \"PONG\"\n"));
    ok.expect("SSL with a request and a response is valid");
    Config::parse(&with_health_check("protocol = \"HTTPS\"\nhost = \"app.example\"\nresponse = \"ok\"\n"))
        .expect("HTTPS with a host and a body prefix is valid");
}

// ------------------------------------------------------------------ next hop (issue 29)

const FIREWALLS: &str = "[[service]]\nname = \"fw\"\nprotocol = \"L3_DEFAULT\"\n\
    [service.next_hop]\ndestinations = [\"0.0.0.0/0\", \"::/0\"]\n\
    [[service.backend]]\naddress = \"198.18.3.1\"\n[[service.backend]]\naddress = \"198.18.3.2\"\n";
const FW: &str = "service \"fw\"";

#[test]
fn a_next_hop_service_loads_with_its_defaults() {
    let cfg = Config::parse(FIREWALLS).unwrap();
    let s = &cfg.services[0];
    assert_eq!(s.vip(), None);
    let n = s.next_hop().expect("a next hop");
    assert_eq!(n.destinations, ["0.0.0.0/0".parse().unwrap(), "::/0".parse().unwrap()]);
    assert!(n.symmetric, "symmetric by default");
    assert_eq!(s.forwarding, Forwarding::L2Dsr, "L2_DSR by default for a next hop");
    assert_eq!(s.frontend_text(), "next hop for 0.0.0.0/0, ::/0");
}

#[test]
fn a_service_needs_a_vip_or_a_next_hop_and_not_both() {
    let neither = "[[service]]\nname = \"fw\"\nprotocol = \"TCP\"\n";
    reject_text(neither, FW, "vip", &["missing", "[service.next_hop]"]);
    let both = FIREWALLS.replace("protocol =", "vip = \"198.18.0.100\"\nprotocol =");
    reject_text(&both, FW, "next_hop", &["not both"]);
}

#[test]
fn a_next_hop_refuses_what_it_cannot_do() {
    let ipip = FIREWALLS.replace("protocol =", "forwarding = \"IPIP\"\nprotocol =");
    reject_text(&ipip, FW, "forwarding", &["unchanged", "L2_DSR"]);
    let tcp_ports = FIREWALLS.replace("\"L3_DEFAULT\"", "\"TCP\"\nports = [443]");
    reject_text(&tcp_ports, FW, "ports", &["every port"]);
    let tm = FIREWALLS.replace("protocol =", "routing_method = \"WEIGHTED\"\nprotocol =");
    let err = Config::parse(&tm).expect_err("a Traffic Manager next hop");
    assert!(err.to_string().contains("routing_method") && err.to_string().contains("allowed: ZONAL"), "{err}");
    let source_only = FIREWALLS.replace("protocol =", "session_affinity = \"CLIENT_IP_NO_DESTINATION\"\nprotocol =");
    reject_text(&source_only, FW, "session_affinity", &["CLIENT_IP_NO_DESTINATION", "symmetric = false"]);
    let asymmetric = source_only.replace("[service.next_hop]\n", "[service.next_hop]\nsymmetric = false\n");
    Config::parse(&asymmetric).expect("without symmetric hashing the source alone may choose");
    let empty = FIREWALLS.replace("[\"0.0.0.0/0\", \"::/0\"]", "[]");
    reject_text(&empty, FW, "next_hop.destinations", &["empty"]);
    let twice = FIREWALLS.replace("\"::/0\"]", "\"::/0\", \"0.0.0.0/0\"]");
    reject_text(&twice, FW, "next_hop.destinations[2]", &["duplicate prefix 0.0.0.0/0"]);
}

#[test]
fn a_destination_prefix_has_one_next_hop_service() {
    let second = FIREWALLS.replace("name = \"fw\"", "name = \"ids\"").replace("198.18.3.", "198.18.4.");
    let text = format!("{FIREWALLS}{}", second.replace("\"::/0\"]", "\"2001:db8::/32\"]"));
    reject_text(&text, "service \"ids\"", "next_hop.destinations[0]", &["already routed by service \"fw\""]);
}

/// What a next-hop service compiles to: its keys under its route, every port, family
/// FAMILY_NEXT_HOP; its destinations routed there and the configuration's VIPs exempted.
#[test]
fn a_next_hop_service_compiles_to_routes_and_route_keys() {
    use lb_common::maps::{service_flags, FAMILY_NEXT_HOP, NEXT_HOP_UNTOUCHED};
    let web = "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\
               [[service.backend]]\naddress = \"198.18.3.9\"\n";
    let cfg = Config::parse(&format!("{FIREWALLS}{web}")).unwrap();
    let compiled = lb_user::compile::compile(&cfg, &|_, _| true, &mut lb_user::compile::Ids::default()).unwrap();
    let fw = &compiled.services[0];
    let route = lb_user::compile::next_hop_route(fw.id);
    assert_eq!(fw.keys.len(), 1);
    assert_eq!((fw.keys[0].addr, fw.keys[0].port, fw.keys[0].family), ([route, 0, 0, 0], 0, FAMILY_NEXT_HOP));
    assert_ne!(fw.info.flags & service_flags::SYMMETRIC, 0);
    assert_eq!(compiled.services[1].info.flags & service_flags::SYMMETRIC, 0, "a VIP service is not symmetric");
    let routes: Vec<(String, u32)> = compiled.next_hop_routes.iter().map(|(n, r)| (n.to_string(), *r)).collect();
    assert_eq!(
        routes,
        [("0.0.0.0/0".into(), route), ("198.18.0.100/32".into(), NEXT_HOP_UNTOUCHED), ("::/0".into(), route)]
    );
    // Without next hops, no routes at all.
    let cfg = Config::parse(web).unwrap();
    let compiled = lb_user::compile::compile(&cfg, &|_, _| true, &mut lb_user::compile::Ids::default()).unwrap();
    assert!(compiled.next_hop_routes.is_empty());
}

#[test]
fn a_next_hop_may_be_limited_to_interfaces_of_this_host() {
    use lb_user::config::HostAddrs;
    let limited = |names: &str| {
        FIREWALLS.replace("[service.next_hop]\n", &format!("[service.next_hop]\ninterfaces = [{names}]\n"))
    };
    let cfg = Config::parse(&limited("\"lo\"")).unwrap();
    let compiled = lb_user::compile::compile(&cfg, &|_, _| true, &mut lb_user::compile::Ids::default()).unwrap();
    assert_eq!(compiled.services[0].info.forward_params.ingress, [1, 0, 0, 0], "lo is ifindex 1");
    // An interface this host lacks: refused where the daemon runs, never matched if compiled.
    let text = limited("\"lo\", \"nope0\"");
    let host = HostAddrs::from_list(Vec::new());
    let err = Config::parse_file_text(Path::new("lb.toml"), &text, Some(&host)).expect_err("no interface nope0");
    assert!(err.to_string().contains("next_hop.interfaces[1]: no interface nope0 on this host"), "{err}");
    let compiled =
        lb_user::compile::compile(&Config::parse(&text).unwrap(), &|_, _| true, &mut Default::default()).unwrap();
    assert_eq!(compiled.services[0].info.forward_params.ingress, [1, u32::MAX, 0, 0]);
    let five = limited("\"a\", \"b\", \"c\", \"d\", \"e\"");
    reject_text(&five, FW, "next_hop.interfaces", &["at most 4"]);
    reject_text(&limited("\"lo\", \"lo\""), FW, "next_hop.interfaces[1]", &["duplicate interface lo"]);
    reject_text(&limited("\"a/b\""), FW, "next_hop.interfaces[0]", &["not an interface name"]);
}

#[test]
fn health_check_port_specification() {
    let web = |hc: &str| {
        format!(
            "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\
             [service.health_check]\n{hc}[[service.backend]]\naddress = \"198.18.11.1\"\n"
        )
    };
    let port = |hc: &str| Config::parse(&web(hc)).unwrap().services[0].health_check_port();
    assert_eq!(port("port_specification = \"USE_SERVING_PORT\"\n"), Some(80));
    assert_eq!(port("port_specification = \"USE_FIXED_PORT\"\nport = 8080\n"), Some(8080));
    assert_eq!(port("port = 8080\n"), Some(8080), "a port alone is USE_FIXED_PORT");
    reject_text(&web("port_specification = \"USE_FIXED_PORT\"\n"), WEB, "health_check.port", &["required"]);
    reject_text(
        &web("port_specification = \"USE_SERVING_PORT\"\nport = 8080\n"),
        WEB,
        "health_check.port",
        &["must be absent"],
    );
    reject_text(
        &web("port_specification = \"USE_NAMED_PORT\"\n"),
        WEB,
        "health_check.port_specification",
        &["not supported", "USE_FIXED_PORT, USE_SERVING_PORT"],
    );
    let all_ports = web("port_specification = \"USE_SERVING_PORT\"\n").replace("ports = [80]\n", "");
    reject_text(&all_ports, WEB, "health_check.port_specification", &["needs a serving port"]);
}

/// `[service.health_check] path`: VIP by default for a VIP service (delivered by its
/// forwarding), DIRECT for a next-hop service, where VIP is refused naming the field.
#[test]
fn a_health_check_path_follows_the_frontend() {
    use lb_user::daemon::health::{ProbeSpec, Route};
    use lb_user::daemon::probe_path::Delivery;
    let check = "[service.health_check]\nprotocol = \"TCP\"\nport = 80\n";
    let web = |keys: &str, path: &str| {
        format!(
            "[dataplane]\nencap_source_v4 = \"198.18.0.1\"\n[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\n\
             protocol = \"TCP\"\nports = [80]\n{keys}{check}{path}[[service.backend]]\naddress = \"198.18.3.9\"\n"
        )
    };
    let route = |text: &str| {
        let cfg = Config::parse(text).unwrap();
        let s = &cfg.services[0];
        ProbeSpec::from_config(s.health_check().unwrap(), 80, Route::of(s, s.health_check().unwrap(), &cfg.dataplane))
            .route
    };
    let vip = "198.18.0.100".parse().unwrap();
    let encap = Delivery::Encap { outer_source: "198.18.0.1".parse().unwrap() };
    assert_eq!(route(&web("", "")), Route::Vip { vip, delivery: encap });
    assert_eq!(route(&web("forwarding = \"L2_DSR\"\n", "")), Route::Vip { vip, delivery: Delivery::L2 });
    assert_eq!(route(&web("", "path = \"DIRECT\"\n")), Route::Direct);
    let fw = FIREWALLS.replace(
        "[[service.backend]]\naddress = \"198.18.3.1\"",
        &format!("{check}[[service.backend]]\naddress = \"198.18.3.1\""),
    );
    assert_eq!(route(&fw), Route::Direct, "a next hop has no VIP");
    let fw_vip = fw.replace("port = 80\n", "port = 80\npath = \"VIP\"\n");
    reject_text(&fw_vip, FW, "health_check.path", &["VIP is not allowed for a next-hop service", "allowed DIRECT"]);
    let err = Config::parse(&web("", "path = \"direct\"\n")).unwrap_err().to_string();
    assert!(err.contains("health_check.path") && err.contains("`VIP` or `DIRECT`"), "{err}");
}

/// GRPC health checks: `grpc_service_name` with GRPC / GRPC_WITH_TLS only; the fields of other
/// protocols refused with GRPC, each naming itself.
#[test]
fn grpc_health_checks_take_their_own_fields_only() {
    let web = |check: &str| {
        format!(
            "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\
             [service.health_check]\n{check}\n[[service.backend]]\naddress = \"198.18.3.9\"\n"
        )
    };
    let cfg = Config::parse(&web("protocol = \"GRPC\"\ngrpc_service_name = \"shop.v1\"")).unwrap();
    let hc = cfg.services[0].health_check().unwrap();
    assert_eq!((hc.protocol, hc.grpc_service_name.as_deref()), (HealthProtocol::Grpc, Some("shop.v1")));
    Config::parse(&web("protocol = \"GRPC_WITH_TLS\"")).unwrap();
    let svc = "service \"web\"";
    reject_text(
        &web("protocol = \"TCP\"\ngrpc_service_name = \"shop\""),
        svc,
        "health_check.grpc_service_name",
        &["only allowed with health_check.protocol = GRPC or GRPC_WITH_TLS", "here TCP"],
    );
    // Each field refused with GRPC names exactly the protocols that take it.
    for (check, field, problem) in [
        (
            "request_path = \"/\"",
            "health_check.request_path",
            "only allowed with health_check.protocol = HTTP, HTTPS or HTTP2 (here GRPC)",
        ),
        (
            "expected_status = 200",
            "health_check.expected_status",
            "only allowed with health_check.protocol = HTTP, HTTPS or HTTP2 (here GRPC)",
        ),
        (
            "host = \"shop\"",
            "health_check.host",
            "only allowed with health_check.protocol = HTTP, HTTPS or HTTP2 (here GRPC)",
        ),
        (
            "request = \"PING\"",
            "health_check.request",
            "not allowed with health_check.protocol = GRPC: allowed with TCP or SSL",
        ),
        (
            "response = \"ok\"",
            "health_check.response",
            "not allowed with health_check.protocol = GRPC: allowed with TCP, SSL, HTTP, HTTPS or HTTP2",
        ),
        (
            "proxy_header = \"PROXY_V1\"",
            "health_check.proxy_header",
            "not allowed with health_check.protocol = GRPC: allowed with TCP, SSL, HTTP, HTTPS or HTTP2",
        ),
    ] {
        let v = reject_text(&web(&format!("protocol = \"GRPC\"\n{check}")), svc, field, &[]);
        assert_eq!(v.problem, problem, "{check}");
    }
    reject_text(
        &web("protocol = \"GRPC\"\ngrpc_service_name = \"a b\""),
        svc,
        "health_check.grpc_service_name",
        &["printable ASCII"],
    );
}
