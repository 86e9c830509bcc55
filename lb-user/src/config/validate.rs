//! The rules of the configuration contract (docs/config.md, spec §1). Each check appends
//! [`Violation`]s naming the object, the TOML field path and what is allowed; nothing stops at
//! the first problem.

use super::error::{ConfigError, ConfigErrorKind, Report, Scope, Sink, Violation};
use super::raw::{Backend, Config, Service};
use super::{Dataplane, HealthCheck, Zone};
use crate::model::*;
use ipnet::IpNet;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// Spec §1.0: without subsetting a backend service serves at most 250 VMs/endpoints. The
/// balancer never subsets, so the limit applies to every service.
pub const MAX_BACKENDS_PER_SERVICE: usize = 250;
/// Maglev weights are small integers: a weight is a count of preference-list turns.
pub const MAX_WEIGHT: u32 = 1000;
pub const MIN_MAGLEV_TABLE_SIZE: u32 = 251;
pub const MAX_MAGLEV_TABLE_SIZE: u32 = 1_000_003;
/// Spec §1.4: 10 min .. 16 h.
pub const MIN_IDLE_TIMEOUT_SEC: u32 = 600;
pub const MAX_IDLE_TIMEOUT_SEC: u32 = 57_600;
/// Flows per connection table: 2^24 flows take 2^22 buckets of 8 slots per address family, a few
/// GiB of kernel memory in all; more fails at load time with ENOMEM.
pub const MAX_CONNTRACK_ENTRIES: u32 = 1 << 24;
/// Spec §1.4: `drainingTimeoutSec` ∈ [0, 3600].
pub const MAX_DRAINING_TIMEOUT_SEC: u32 = 3600;

/// Affinities that may carry an idle timeout under PER_SESSION (spec §1.4).
const IDLE_TIMEOUT_AFFINITIES: [SessionAffinity; 3] =
    [SessionAffinity::ClientIpProto, SessionAffinity::ClientIp, SessionAffinity::ClientIpNoDestination];

/// Every rule; with `host`, also that no VIP is one of its addresses (`super::host`).
pub(super) fn check(cfg: &Config, host: Option<&super::HostAddrs>) -> Vec<Violation> {
    let mut out = Sink::default();
    check_dataplane(&cfg.dataplane, &mut out);
    check_resolver(&cfg.resolver, &mut out);
    if let Some(a) = &cfg.announce {
        super::announce::check(a, &mut out);
    }
    check_zones(&cfg.zones, &mut out);
    let zone_names: Vec<&str> = cfg.zones.iter().map(|z| z.name.as_str()).collect();
    for (index, svc) in cfg.services.iter().enumerate() {
        let mut r = Report { out: &mut out, scope: Scope::Service { index, name: svc.name.clone() } };
        check_service(svc, &zone_names, &mut r);
        super::tm_validate::check_service(cfg, svc, &mut r);
    }
    check_service_names(&cfg.services, &mut out);
    check_listeners(&cfg.services, &mut out);
    check_next_hop_destinations(&cfg.services, &mut out);
    check_backends_are_not_vips(&cfg.services, &mut out);
    if let Some(host) = host {
        super::host::check(cfg, host, &mut out);
    }
    super::tm_validate::check_client_inputs(cfg, &mut out);
    super::tm_validate::check_nesting(cfg, &mut out);
    super::tm_validate::check_dns_names(cfg, &mut out);
    out.finish()
}

// ---------------------------------------------------------------- dataplane

fn is_prime(n: u32) -> bool {
    if n < 2 {
        return false;
    }
    let n = u64::from(n);
    (2u64..).take_while(|d| d * d <= n).all(|d| n % d != 0)
}

fn check_dataplane(dp: &Dataplane, out: &mut Sink) {
    let mut r = Report { out, scope: Scope::Dataplane };
    let m = dp.maglev_table_size;
    if !(MIN_MAGLEV_TABLE_SIZE..=MAX_MAGLEV_TABLE_SIZE).contains(&m) || !is_prime(m) {
        r.push(
            "dataplane.maglev_table_size",
            format!(
                "{m} is not allowed: must be a prime in [{MIN_MAGLEV_TABLE_SIZE}, \
                 {MAX_MAGLEV_TABLE_SIZE}] (e.g. 16381, 65537)"
            ),
        );
    }
    if dp.conntrack_entries == 0 {
        r.push("dataplane.conntrack_entries", "0 is not allowed: must be at least 1");
    } else if dp.conntrack_entries > MAX_CONNTRACK_ENTRIES {
        let bytes = u64::from(lb_common::ct_table::buckets_for(dp.conntrack_entries))
            * (std::mem::size_of::<lb_common::ct_table::Bucket4>()
                + std::mem::size_of::<lb_common::ct_table::Bucket6>()) as u64;
        r.push(
            "dataplane.conntrack_entries",
            format!(
                "{} is too large: allowed 1..={MAX_CONNTRACK_ENTRIES} (the connection tables would \
                 take {} MiB of kernel memory)",
                dp.conntrack_entries,
                bytes >> 20
            ),
        );
    }
    for (field, net) in
        [("dataplane.encap_source_v4", dp.encap_source_v4), ("dataplane.encap_source_v6", dp.encap_source_v6)]
    {
        if let Some((special, what)) = net.and_then(|n| special_overlap(&n)) {
            r.push(
                field,
                format!(
                    "{} includes {special} ({what}): every outer source must be a unicast address; \
                     allowed: an address or prefix outside {}",
                    net.expect("checked"),
                    special_ranges(&special).join(", ")
                ),
            );
        }
    }
    if let Some(net @ IpNet::V6(_)) = dp.encap_source_v4 {
        r.push("dataplane.encap_source_v4", format!("{net} is IPv6: must be an IPv4 address or prefix"));
    }
    if let Some(net @ IpNet::V4(_)) = dp.encap_source_v6 {
        r.push("dataplane.encap_source_v6", format!("{net} is IPv4: must be an IPv6 address or prefix"));
    }
}

/// Longest `[resolver] max_ttl_sec` and `keep_last_answer_sec`: a day.
pub const MAX_RESOLVER_SEC: u32 = 86_400;

fn check_resolver(res: &super::Resolver, out: &mut Sink) {
    let mut r = Report { out, scope: Scope::Resolver };
    if !(1..=3600).contains(&res.min_ttl_sec) {
        r.push("resolver.min_ttl_sec", format!("{} is out of range: allowed 1..=3600 seconds", res.min_ttl_sec));
    }
    if res.max_ttl_sec < res.min_ttl_sec.max(1) || res.max_ttl_sec > MAX_RESOLVER_SEC {
        r.push(
            "resolver.max_ttl_sec",
            format!(
                "{} is out of range: allowed min_ttl_sec ({})..={MAX_RESOLVER_SEC} seconds",
                res.max_ttl_sec, res.min_ttl_sec
            ),
        );
    }
    if res.keep_last_answer_sec > MAX_RESOLVER_SEC {
        r.push(
            "resolver.keep_last_answer_sec",
            format!("{} is out of range: allowed 0..={MAX_RESOLVER_SEC} seconds", res.keep_last_answer_sec),
        );
    }
    for (i, s) in res.servers.iter().enumerate() {
        if s.port() == 0 || s.ip().is_unspecified() || s.ip().is_multicast() {
            r.push(
                format!("resolver.servers[{i}]"),
                format!("{s} is not a server address: allowed a unicast address and a port in 1..=65535"),
            );
        }
    }
}

/// Ranges no VIP, backend or outer source may use: (prefix, what it is).
const SPECIAL_V4: [(&str, &str); 4] = [
    ("0.0.0.0/8", "unspecified / \"this network\""),
    ("127.0.0.0/8", "loopback"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved, with the broadcast address 255.255.255.255"),
];
const SPECIAL_V6: [(&str, &str); 2] =
    [("::/8", "reserved, with the unspecified address :: and loopback ::1"), ("ff00::/8", "multicast")];

fn special_table(net: &IpNet) -> &'static [(&'static str, &'static str)] {
    match net {
        IpNet::V4(_) => &SPECIAL_V4,
        IpNet::V6(_) => &SPECIAL_V6,
    }
}

/// The first special range `net` overlaps, if any.
fn special_overlap(net: &IpNet) -> Option<(IpNet, &'static str)> {
    special_table(net).iter().find_map(|(text, what)| {
        let special: IpNet = text.parse().expect("valid constant");
        (special.contains(&net.network()) || net.contains(&special.network())).then_some((special, *what))
    })
}

/// The special ranges of `net`'s family, for messages.
fn special_ranges(net: &IpNet) -> Vec<&'static str> {
    special_table(net).iter().map(|(text, _)| *text).collect()
}

/// Why a VIP or backend address cannot carry unicast traffic, if it cannot.
fn non_unicast(addr: &IpAddr) -> Option<&'static str> {
    match addr {
        IpAddr::V4(a) if a.is_broadcast() => Some("the broadcast address"),
        a if a.is_unspecified() => Some("the unspecified address"),
        a if a.is_multicast() => Some("a multicast address"),
        a if a.is_loopback() => Some("a loopback address"),
        _ => None,
    }
}

const UNICAST_ONLY: &str = "allowed: a unicast address (not unspecified 0.0.0.0 / ::, loopback 127.0.0.0/8 / \
     ::1, multicast 224.0.0.0/4 / ff00::/8 or broadcast 255.255.255.255)";

/// A name that ends up in logs and terminals: no control characters (newlines, escapes).
pub(super) fn check_printable(field: impl Into<String>, text: &str, r: &mut Report) {
    if text.chars().any(char::is_control) {
        r.push(
            field,
            format!("{text:?} contains control characters: allowed printable characters only (no newlines, tabs or escape sequences)"),
        );
    }
}

// ---------------------------------------------------------------- zones

fn check_zones(zones: &[Zone], out: &mut Sink) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (index, zone) in zones.iter().enumerate() {
        let mut r = Report { out, scope: Scope::Zone { index, name: zone.name.clone() } };
        check_printable("name", &zone.name, &mut r);
        if zone.name.trim().is_empty() {
            r.push("name", "must be a non-empty string");
        } else if let Some(&first) = seen.get(zone.name.as_str()) {
            r.push("name", format!("duplicate zone name (also zone[{first}]); zone names must be unique"));
        } else {
            seen.insert(zone.name.as_str(), index);
        }
        for (i, net) in zone.client_prefixes.iter().enumerate() {
            if net.trunc() != *net {
                r.push(
                    format!("client_prefixes[{i}]"),
                    format!("{net} has host bits set: must be canonical, e.g. {}", net.trunc()),
                );
            }
        }
    }
    check_prefix_overlaps(zones, out);
}

/// Every client prefix of every zone must be disjoint from every other one, so a source
/// address names at most one zone. Sorting by network address makes this O(n log n): canonical
/// prefixes are nested or disjoint, so a prefix overlaps an earlier one iff its first address
/// lies at or below the highest last address seen so far in the same family.
fn check_prefix_overlaps(zones: &[Zone], out: &mut Sink) {
    // (network, zone index, prefix index); host bits are cleared (reported separately).
    let mut all: Vec<(IpNet, usize, usize)> = zones
        .iter()
        .enumerate()
        .flat_map(|(z, zone)| zone.client_prefixes.iter().enumerate().map(move |(p, n)| (n.trunc(), z, p)))
        .collect();
    all.sort_by_key(|(net, z, p)| (net.network(), net.prefix_len(), *z, *p));
    let mut widest: Option<(IpNet, usize, usize)> = None;
    for &(net, z, p) in &all {
        match widest {
            Some((w, wz, wp)) if same_family(&w, &net) && net.network() <= w.broadcast() => {
                let owner = if wz == z { "in the same zone".to_string() } else { zone_label(zones, wz) };
                let mut r = Report { out, scope: Scope::Zone { index: z, name: zones[z].name.clone() } };
                r.push(
                    format!("client_prefixes[{p}]"),
                    format!(
                        "{net} overlaps {} (client_prefixes[{wp}] {owner}): client prefixes must \
                         not overlap, within a zone or across zones",
                        zones[wz].client_prefixes[wp]
                    ),
                );
                // Keep the wider range as the reference.
                if net.broadcast() > w.broadcast() {
                    widest = Some((net, z, p));
                }
            }
            _ => widest = Some((net, z, p)),
        }
    }
}

fn same_family(a: &IpNet, b: &IpNet) -> bool {
    matches!((a, b), (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_)))
}

fn zone_label(zones: &[Zone], index: usize) -> String {
    Scope::Zone { index, name: zones[index].name.clone() }.to_string()
}

// ---------------------------------------------------------------- one service

fn check_service(svc: &Service, zone_names: &[&str], r: &mut Report) {
    if let Some((vip, what)) = svc.vip.and_then(|vip| Some((vip, non_unicast(&vip)?))) {
        r.push("vip", format!("{vip} is {what}: {UNICAST_ONLY}"));
    }
    check_frontend(svc, r);
    check_ports(svc, r);
    check_zonal_affinity(svc, r);
    check_subsetting(svc, r);
    check_failover_policy(svc, r);
    check_connection_tracking(svc, r);
    if svc.connection_draining.draining_timeout_sec > MAX_DRAINING_TIMEOUT_SEC {
        r.push(
            "connection_draining.draining_timeout_sec",
            format!(
                "{} is out of range: allowed 0..={MAX_DRAINING_TIMEOUT_SEC} seconds (0 = no draining)",
                svc.connection_draining.draining_timeout_sec
            ),
        );
    }
    if let Some(hc) = &svc.health_check {
        check_health_check(svc, hc, r);
    }
    check_backends(svc, zone_names, r);
}

/// A VIP or a next hop, one of them; a next hop is a Google Cloud (ZONAL) service on every
/// port, forwarding packets unchanged (L2_DSR), with destinations and symmetric hashing that
/// its session affinity can honour.
fn check_frontend(svc: &Service, r: &mut Report) {
    let Some(next_hop) = &svc.next_hop else {
        if svc.vip.is_none() {
            r.push(
                "vip",
                "missing: a service balances packets to its `vip`, or packets routed to it as a                  next hop (`[service.next_hop]` with `destinations`)",
            );
        }
        return;
    };
    if svc.vip.is_some() {
        r.push("next_hop", "a service has a `vip` or a `next_hop`, not both: make the next hop a service of its own");
    }
    if next_hop.destinations.is_empty() {
        r.push(
            "next_hop.destinations",
            "empty: list the destination prefixes the service balances (e.g. \"0.0.0.0/0\", \"::/0\")",
        );
    }
    let mut seen = HashSet::new();
    for (i, d) in next_hop.destinations.iter().enumerate() {
        if !seen.insert(d.trunc()) {
            r.push(format!("next_hop.destinations[{i}]"), format!("duplicate prefix {d}: list each once"));
        }
    }
    if next_hop.interfaces.len() > lb_common::maps::MAX_NEXT_HOP_INTERFACES {
        r.push(
            "next_hop.interfaces",
            format!(
                "{} interfaces: at most {} (or none: any interface)",
                next_hop.interfaces.len(),
                lb_common::maps::MAX_NEXT_HOP_INTERFACES
            ),
        );
    }
    let mut names = HashSet::new();
    for (i, name) in next_hop.interfaces.iter().enumerate() {
        let valid = !name.is_empty() && name.len() < 16 && name.bytes().all(|b| b.is_ascii_graphic() && b != b'/');
        if !valid {
            r.push(
                format!("next_hop.interfaces[{i}]"),
                format!("{name:?} is not an interface name: 1 to 15 printable characters, no '/'"),
            );
        } else if !names.insert(name) {
            r.push(format!("next_hop.interfaces[{i}]"), format!("duplicate interface {name}: list each once"));
        }
    }
    if svc.routing_method != RoutingMethod::Zonal {
        r.push(
            "routing_method",
            format!(
                "{} with next_hop: a next-hop service is a Google Cloud passthrough balancer; allowed: ZONAL",
                svc.routing_method.as_str()
            ),
        );
    }
    if svc.forwarding.is_some_and(|f| f != Forwarding::L2Dsr) {
        r.push(
            "forwarding",
            "IPIP with next_hop: the packet must reach the appliance unchanged (it routes it on); \
             allowed: L2_DSR (the default for a next hop)",
        );
    }
    if !svc.ports.is_empty() {
        r.push("ports", "must be empty with next_hop: a route's next hop takes every port of its protocol");
    }
    if next_hop.symmetric && svc.session_affinity == SessionAffinity::ClientIpNoDestination {
        r.push(
            "session_affinity",
            "CLIENT_IP_NO_DESTINATION with next_hop.symmetric: hashing the source alone cannot be \
             the same in both directions; allowed: NONE, CLIENT_IP, CLIENT_IP_PROTO, CLIENT_IP_PORT_PROTO \
             (or symmetric = false)",
        );
    }
}

/// No destination prefix may be routed by two next-hop services.
fn check_next_hop_destinations(services: &[Service], out: &mut Sink) {
    let mut owner: HashMap<IpNet, usize> = HashMap::new();
    for (index, svc) in services.iter().enumerate() {
        let Some(next_hop) = &svc.next_hop else { continue };
        for (i, d) in next_hop.destinations.iter().enumerate() {
            match owner.get(&d.trunc()) {
                Some(&first) if first != index => out.push(Violation {
                    scope: Scope::Service { index, name: svc.name.clone() },
                    field: format!("next_hop.destinations[{i}]"),
                    problem: format!(
                        "{d} is already routed by {}: a destination prefix has one next-hop service",
                        Scope::Service { index: first, name: services[first].name.clone() }
                    ),
                }),
                _ => {
                    owner.entry(d.trunc()).or_insert(index);
                }
            }
        }
    }
}

fn check_ports(svc: &Service, r: &mut Report) {
    if svc.protocol == Protocol::L3Default && !svc.ports.is_empty() {
        r.push(
            "ports",
            "must be empty with protocol = L3_DEFAULT (it serves every protocol and port); \
             use TCP or UDP to select ports",
        );
        return;
    }
    let mut seen = HashSet::new();
    for (i, &port) in svc.ports.iter().enumerate() {
        if port == 0 {
            r.push(
                format!("ports[{i}]"),
                "port 0 is not allowed: ports are 1..=65535 (omit `ports` or leave it empty for all ports)",
            );
        } else if !seen.insert(port) {
            r.push(format!("ports[{i}]"), format!("duplicate port {port}: each port may be listed once"));
        }
    }
}

/// A ratio field of the API: a float in [0.0, 1.0]; NaN is never in range.
fn ratio_in_range(x: f64) -> bool {
    (0.0..=1.0).contains(&x)
}

fn check_zonal_affinity(svc: &Service, r: &mut Report) {
    let za = &svc.zonal_affinity;
    if !ratio_in_range(za.spillover_ratio) {
        r.push("zonal_affinity.spillover_ratio", format!("{} is out of range: allowed [0.0, 1.0]", za.spillover_ratio));
    } else if za.spillover_ratio != 0.0 && za.spillover != Spillover::SpillCrossZone {
        r.push(
            "zonal_affinity.spillover_ratio",
            format!(
                "{} is only meaningful with spillover = {}; with spillover = {} it must be 0.0 or absent",
                za.spillover_ratio,
                Spillover::SpillCrossZone,
                za.spillover
            ),
        );
    }
}

/// `subsetting`: the balancer always spreads over every backend of the service, so a subsetting
/// policy would be silently ignored; it is refused (issue #32-6). Spec §1.5 (vector Z19) would
/// refuse it with zonal affinity anyway; the message says so too.
fn check_subsetting(svc: &Service, r: &mut Report) {
    if svc.subsetting == Subsetting::None {
        return;
    }
    let spillover = svc.zonal_affinity.spillover;
    let z19 = if spillover != Spillover::Disabled {
        format!(
            " (with zonal_affinity.spillover = {spillover} it would be refused in any case: backend \
             subsetting needs spillover = {})",
            Spillover::Disabled
        )
    } else {
        String::new()
    };
    r.push(
        "subsetting",
        format!(
            "{} is not supported: the balancer always uses every backend of the service; allowed: {}{z19}",
            svc.subsetting,
            Subsetting::None
        ),
    );
}

fn check_failover_policy(svc: &Service, r: &mut Report) {
    let Some(fp) = &svc.failover_policy else {
        return;
    };
    if !ratio_in_range(fp.failover_ratio) {
        r.push("failover_policy.failover_ratio", format!("{} is out of range: allowed [0.0, 1.0]", fp.failover_ratio));
    }
    // [AMBIG] spec §1.2: older docs allow this only for TCP backend services, newer ones for
    // UDP too; we take the stricter reading (TCP only).
    if fp.disable_connection_drain_on_failover && svc.protocol != Protocol::Tcp {
        r.push(
            "failover_policy.disable_connection_drain_on_failover",
            format!(
                "true is only allowed with protocol = {} (this service is {}); allowed here: false",
                Protocol::Tcp,
                svc.protocol
            ),
        );
    }
}

fn check_connection_tracking(svc: &Service, r: &mut Report) {
    let ct = &svc.connection_tracking;
    // Spec §1.4 persistence table, vector P7.
    if ct.connection_persistence_on_unhealthy_backends == Persistence::AlwaysPersist
        && ct.tracking_mode == TrackingMode::PerSession
    {
        r.push(
            "connection_tracking.connection_persistence_on_unhealthy_backends",
            format!(
                "{} is invalid with tracking_mode = {}: allowed {}, {}",
                Persistence::AlwaysPersist,
                TrackingMode::PerSession,
                Persistence::DefaultForProtocol,
                Persistence::NeverPersist
            ),
        );
    }
    // [AMBIG] spec §1.4: out-of-range values and values in other modes are rejected.
    if let Some(t) = ct.idle_timeout_sec {
        let allowed_mode =
            ct.tracking_mode == TrackingMode::PerSession && IDLE_TIMEOUT_AFFINITIES.contains(&svc.session_affinity);
        if !allowed_mode {
            let affinities: Vec<&str> = IDLE_TIMEOUT_AFFINITIES.iter().map(|a| a.as_str()).collect();
            r.push(
                "connection_tracking.idle_timeout_sec",
                format!(
                    "may be set only with tracking_mode = {} and session_affinity in {{{}}} \
                     (here tracking_mode = {}, session_affinity = {}); remove it to use the \
                     default {} s",
                    TrackingMode::PerSession,
                    affinities.join(", "),
                    ct.tracking_mode,
                    svc.session_affinity,
                    super::DEFAULT_IDLE_TIMEOUT_SEC
                ),
            );
        } else if !(MIN_IDLE_TIMEOUT_SEC..=MAX_IDLE_TIMEOUT_SEC).contains(&t) {
            r.push(
                "connection_tracking.idle_timeout_sec",
                format!("{t} is out of range: allowed {MIN_IDLE_TIMEOUT_SEC}..={MAX_IDLE_TIMEOUT_SEC} seconds"),
            );
        }
    }
}

fn check_health_check(svc: &Service, hc: &HealthCheck, r: &mut Report) {
    if hc.check_interval_sec == 0 {
        r.push("health_check.check_interval_sec", "0 is not allowed: must be at least 1 second");
    }
    if hc.timeout_sec == 0 {
        r.push("health_check.timeout_sec", "0 is not allowed: must be at least 1 second");
    } else if hc.check_interval_sec != 0 && hc.timeout_sec > hc.check_interval_sec {
        r.push(
            "health_check.timeout_sec",
            format!(
                "{} exceeds health_check.check_interval_sec = {}: allowed 1..={}",
                hc.timeout_sec, hc.check_interval_sec, hc.check_interval_sec
            ),
        );
    }
    for (field, value) in [
        ("health_check.healthy_threshold", hc.healthy_threshold),
        ("health_check.unhealthy_threshold", hc.unhealthy_threshold),
    ] {
        if value == 0 {
            r.push(field, "0 is not allowed: must be at least 1");
        }
    }
    if let Some(path) = &hc.request_path {
        if !hc.protocol.is_http() {
            r.push(
                "health_check.request_path",
                format!("only allowed with health_check.protocol = HTTP, HTTPS or HTTP2 (here {})", hc.protocol),
            );
        } else if !path.starts_with('/') {
            r.push("health_check.request_path", format!("{path:?} must start with '/'"));
        } else if !path.bytes().all(|c| c.is_ascii_graphic()) {
            r.push(
                "health_check.request_path",
                format!(
                    "{path:?} contains a space, control character (CR, LF, ...) or non-ASCII byte: \
                     allowed printable ASCII only (percent-encode the rest, e.g. %20)"
                ),
            );
        }
    }
    if let Some(status) = hc.expected_status {
        if !hc.protocol.is_http() {
            r.push(
                "health_check.expected_status",
                format!("only allowed with health_check.protocol = HTTP, HTTPS or HTTP2 (here {})", hc.protocol),
            );
        } else if !(100..=599).contains(&status) {
            r.push("health_check.expected_status", format!("{status} is out of range: allowed 100..=599"));
        }
    }
    if hc.request.is_some() && hc.protocol.is_http() {
        r.push(
            "health_check.request",
            format!(
                "only allowed with health_check.protocol = TCP or SSL (here {}; HTTP sends request_path)",
                hc.protocol
            ),
        );
    }
    if hc.host.is_some() && !hc.protocol.is_http() {
        r.push(
            "health_check.host",
            format!("only allowed with health_check.protocol = HTTP, HTTPS or HTTP2 (here {})", hc.protocol),
        );
    }
    if hc.grpc_service_name.is_some() && !hc.protocol.is_grpc() {
        r.push(
            "health_check.grpc_service_name",
            format!("only allowed with health_check.protocol = GRPC or GRPC_WITH_TLS (here {})", hc.protocol),
        );
    }
    if let Some(name) = &hc.grpc_service_name {
        if name.len() > 1024 || !name.bytes().all(|c| c.is_ascii_graphic()) {
            r.push(
                "health_check.grpc_service_name",
                format!("{name:?}: allowed at most 1024 printable ASCII characters without spaces"),
            );
        }
    }
    if hc.protocol.is_grpc() {
        // The health service's answer is judged: no conversation, no PROXY line (Google
        // Cloud's gRPC checks have neither). Each field names the protocols that take it.
        for (field, set, allowed) in [
            ("health_check.request", hc.request.is_some(), "TCP or SSL"),
            ("health_check.response", hc.response.is_some(), "TCP, SSL, HTTP, HTTPS or HTTP2"),
            ("health_check.proxy_header", hc.proxy_header != ProxyHeader::None, "TCP, SSL, HTTP, HTTPS or HTTP2"),
        ] {
            if set {
                r.push(
                    field,
                    format!("not allowed with health_check.protocol = {}: allowed with {allowed}", hc.protocol),
                );
            }
        }
    }
    if hc.path == Some(HealthPath::Vip) && svc.next_hop.is_some() {
        r.push(
            "health_check.path",
            "VIP is not allowed for a next-hop service (it has no VIP to probe through): allowed DIRECT",
        );
    }
    for (field, value) in [("health_check.request", &hc.request), ("health_check.response", &hc.response)] {
        if value.as_ref().is_some_and(|v| v.len() > 1024) {
            r.push(field, "longer than 1024 bytes: allowed at most 1024");
        }
    }
    if let Some(host) = &hc.host {
        if host.is_empty() || !host.bytes().all(|c| c.is_ascii_graphic()) {
            r.push(
                "health_check.host",
                format!("{host:?}: allowed a host name or address, printable ASCII without spaces"),
            );
        }
    }
    match (hc.port_specification, hc.port) {
        (Some(PortSpecification::UseNamedPort), _) => {
            return r.push(
                "health_check.port_specification",
                "USE_NAMED_PORT is not supported: backends here are addresses, not instance groups with \
                 named ports; allowed: USE_FIXED_PORT, USE_SERVING_PORT",
            )
        }
        (Some(PortSpecification::UseFixedPort), None) => {
            return r.push(
                "health_check.port",
                "required with port_specification = USE_FIXED_PORT: set a port in 1..=65535",
            )
        }
        (Some(PortSpecification::UseServingPort), Some(_)) => {
            return r.push(
                "health_check.port",
                "must be absent with port_specification = USE_SERVING_PORT (the service's port is probed)",
            )
        }
        (Some(PortSpecification::UseServingPort), None) if svc.ports.is_empty() => {
            return r.push(
                "health_check.port_specification",
                "USE_SERVING_PORT needs a serving port, and the service has no `ports` (it serves all ports); \
                 allowed here: USE_FIXED_PORT with a port",
            )
        }
        _ => {}
    }
    match hc.port {
        Some(0) => r.push("health_check.port", "0 is not allowed: ports are 1..=65535"),
        None if svc.ports.is_empty() => r.push(
            "health_check.port",
            "required because the service has no `ports` (it serves all ports): set a port in 1..=65535",
        ),
        _ => {}
    }
}

// ---------------------------------------------------------------- backends

fn check_backends(svc: &Service, zone_names: &[&str], r: &mut Report) {
    if svc.backends.len() > MAX_BACKENDS_PER_SERVICE {
        r.push(
            "backend",
            format!("{} backends configured: at most {MAX_BACKENDS_PER_SERVICE} per service", svc.backends.len()),
        );
    }
    let mut seen: HashMap<IpAddr, usize> = HashMap::new();
    for (i, b) in svc.backends.iter().enumerate() {
        // A nested endpoint and one given by DNS name have no address (Traffic Manager; checked
        // in tm_validate).
        if b.addressless() {
            check_backend(svc, b, i, zone_names, r);
            continue;
        }
        if let Some(&first) = seen.get(&b.address) {
            r.push(
                format!("backend[{i}].address"),
                format!("duplicate backend address {} (also backend[{first}]): addresses must be unique", b.address),
            );
        } else {
            seen.insert(b.address, i);
        }
        check_backend(svc, b, i, zone_names, r);
    }
}

fn check_backend(svc: &Service, b: &Backend, i: usize, zone_names: &[&str], r: &mut Report) {
    // Encapsulation is IPv4-in-IPv4 or IPv6-in-IPv6 only; L2 DSR keeps the VIP as destination, so
    // a backend of the other family could not own it either.
    // Traffic Manager MULTIVALUE may mix A and AAAA endpoints (spec §2.1); the packet view
    // uses those of the VIP's family. Nested and DNS-name endpoints have no address.
    // A next hop's appliances are reached by MAC: one routes both families.
    let Some(vip) = svc.vip else { return check_backend_address(b, i, zone_names, svc, r) };
    let mixed_ok = svc.routing_method == RoutingMethod::MultiValue || b.addressless();
    if !mixed_ok && b.address.is_ipv4() != vip.is_ipv4() {
        let family = |a: &IpAddr| if a.is_ipv4() { "IPv4" } else { "IPv6" };
        r.push(
            format!("backend[{i}].address"),
            format!(
                "{} is {} but vip {} is {}: backends must have the VIP's address family \
                 (IPv4-in-IPv4 / IPv6-in-IPv6 only)",
                b.address,
                family(&b.address),
                vip,
                family(&vip)
            ),
        );
    }
    check_backend_address(b, i, zone_names, svc, r)
}

fn check_backend_address(b: &Backend, i: usize, zone_names: &[&str], svc: &Service, r: &mut Report) {
    // 0.0.0.0 and :: stand for "absent" (reported as a missing address elsewhere).
    if let Some(what) = non_unicast(&b.address).filter(|_| !b.address.is_unspecified()) {
        r.push(format!("backend[{i}].address"), format!("{} is {what}: {UNICAST_ONLY}", b.address));
    }
    if let Some(name) = &b.name {
        check_printable(format!("backend[{i}].name"), name, r);
    }
    if let Some(zone) = &b.zone {
        if !zone_names.contains(&zone.as_str()) {
            let configured = if zone_names.is_empty() {
                "none are configured".to_string()
            } else {
                format!("configured zones: {}", zone_names.join(", "))
            };
            r.push(format!("backend[{i}].zone"), format!("{zone:?} names no [[zone]]; {configured}"));
        }
    }
    if !(1..=MAX_WEIGHT).contains(&b.weight) {
        r.push(format!("backend[{i}].weight"), format!("{} is out of range: allowed 1..={MAX_WEIGHT}", b.weight));
    }
    if b.failover && svc.failover_policy.is_none() {
        r.push(
            format!("backend[{i}].failover"),
            "true requires a [service.failover_policy] table in this service; \
             without one, allowed: false",
        );
    }
    // A malformed `mac` is refused when the file is parsed (`MacAddr`). Without one, an L2_DSR
    // backend gets the MAC of the host's neighbour entry for its address (the data plane's
    // route lookup; the daemon keeps the entry resolved).
    if let Some(mac) = b.mac {
        let what = if mac.0 == [0; 6] {
            Some("the zero address")
        } else if mac.0 == [0xff; 6] {
            Some("the broadcast address")
        } else if mac.0[0] & 1 == 1 {
            Some("a multicast address (the low bit of the first octet is set)")
        } else {
            None
        };
        if let Some(what) = what {
            r.push(
                format!("backend[{i}].mac"),
                format!("\"{mac}\" is {what}: allowed a unicast MAC, not zero, with an even first octet (e.g. \"02:00:c6:12:0b:01\")"),
            );
        }
    }
}

// ---------------------------------------------------------------- across services

fn check_service_names(services: &[Service], out: &mut Sink) {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for (index, svc) in services.iter().enumerate() {
        let mut r = Report { out, scope: Scope::Service { index, name: svc.name.clone() } };
        check_printable("name", &svc.name, &mut r);
        if svc.name.trim().is_empty() {
            r.push("name", "must be a non-empty string");
        } else if let Some(&first) = seen.get(svc.name.as_str()) {
            r.push("name", format!("duplicate service name (also service[{first}]); service names must be unique"));
        } else {
            seen.insert(svc.name.as_str(), index);
        }
    }
}

/// No two services may claim the same (vip, port, protocol). An empty port list claims every
/// port of its protocol; L3_DEFAULT claims every protocol and port of its VIP.
///
/// Services that clash, directly or through one another, form a group; each group is reported
/// once, on its first member that clashes with an earlier one, with the group's size and first
/// names. Linear in the number of claims: each service is compared with the first earlier
/// owner of each claim, not with every earlier service.
fn check_listeners(services: &[Service], out: &mut Sink) {
    let mut by_vip: HashMap<IpAddr, Vec<usize>> = HashMap::new();
    for (index, svc) in services.iter().enumerate() {
        if let Some(vip) = svc.vip {
            by_vip.entry(vip).or_default().push(index);
        }
    }
    let mut groups = UnionFind::new(services.len());
    // The first earlier service each service clashes with.
    let mut partner: Vec<Option<usize>> = vec![None; services.len()];
    for members in by_vip.values().filter(|m| m.len() > 1) {
        let mut l3: Option<usize> = None;
        let mut all_ports: HashMap<Protocol, usize> = HashMap::new();
        let mut of_protocol: HashMap<Protocol, Vec<usize>> = HashMap::new();
        let mut port_owner: HashMap<(Protocol, u16), usize> = HashMap::new();
        for (k, &s) in members.iter().enumerate() {
            let svc = &services[s];
            let mut clashes: Vec<usize> = Vec::new();
            if svc.protocol == Protocol::L3Default {
                // The first L3_DEFAULT joins every earlier service; later ones join it.
                match l3 {
                    Some(first) => clashes.push(first),
                    None => clashes.extend(&members[..k]),
                }
                l3.get_or_insert(s);
            } else {
                clashes.extend(l3);
                let same = of_protocol.entry(svc.protocol).or_default();
                if svc.ports.is_empty() {
                    match all_ports.get(&svc.protocol) {
                        Some(&first) => clashes.push(first),
                        None => clashes.extend(same.iter().copied()),
                    }
                    all_ports.entry(svc.protocol).or_insert(s);
                } else {
                    clashes.extend(all_ports.get(&svc.protocol));
                    for &port in &svc.ports {
                        match port_owner.get(&(svc.protocol, port)) {
                            Some(&owner) if owner != s => clashes.push(owner),
                            Some(_) => {}
                            None => {
                                port_owner.insert((svc.protocol, port), s);
                            }
                        }
                    }
                }
                // An all-ports service joins all earlier ones of its protocol once; keep the
                // list only while no all-ports service exists.
                if all_ports.contains_key(&svc.protocol) {
                    same.clear();
                } else {
                    same.push(s);
                }
            }
            for &j in &clashes {
                groups.union(s, j);
            }
            partner[s] = clashes.iter().copied().min();
        }
    }
    const SHOWN: usize = 8;
    // Per group: its size and its first names.
    let mut group: HashMap<usize, (usize, Vec<usize>)> = HashMap::new();
    for s in 0..services.len() {
        let (n, first) = group.entry(groups.find(s)).or_default();
        *n += 1;
        if first.len() < SHOWN {
            first.push(s);
        }
    }
    let mut reported: HashSet<usize> = HashSet::new();
    for (index, svc) in services.iter().enumerate() {
        let Some(j) = partner[index] else { continue };
        let root = groups.find(index);
        if !reported.insert(root) {
            continue;
        }
        let Some((field, mut problem)) = listener_clash(svc, &services[j], j) else { continue };
        let (n, first) = &group[&root];
        let n = *n;
        if n > 2 {
            let names: Vec<String> = first.iter().map(|&s| format!("{:?}", services[s].name)).collect();
            let more = if n > SHOWN { format!(" and {} more", n - SHOWN) } else { String::new() };
            problem.push_str(&format!(
                " ({n} services on {} clash in one group: {}{more}; reported once)",
                svc.vip_text(),
                names.join(", ")
            ));
        }
        out.push(Violation { scope: Scope::Service { index, name: svc.name.clone() }, field, problem });
    }
}

/// No backend address may be a VIP (of its own service or another): its packets would come back
/// to the balancer and be balanced again (issue #31-2).
fn check_backends_are_not_vips(services: &[Service], out: &mut Sink) {
    let mut vips: HashMap<IpAddr, usize> = HashMap::new();
    for (index, svc) in services.iter().enumerate() {
        if let Some(vip) = svc.vip {
            vips.entry(vip).or_insert(index);
        }
    }
    for (index, svc) in services.iter().enumerate() {
        let mut r = Report { out, scope: Scope::Service { index, name: svc.name.clone() } };
        for (i, b) in svc.backends.iter().enumerate().filter(|(_, b)| !b.addressless()) {
            if let Some(&owner) = vips.get(&b.address) {
                let whose = if owner == index {
                    "this service's own vip".to_string()
                } else {
                    format!("the vip of {}", Scope::Service { index: owner, name: services[owner].name.clone() })
                };
                r.push(
                    format!("backend[{i}].address"),
                    format!(
                        "{} is {whose}: a backend cannot be a VIP (its packets would be balanced again); \
                         allowed: an address that is no service's vip",
                        b.address
                    ),
                );
            }
        }
    }
}

/// Disjoint sets of indices (path halving, union by index).
struct UnionFind {
    parent: Vec<usize>,
}

impl UnionFind {
    fn new(n: usize) -> Self {
        Self { parent: (0..n).collect() }
    }

    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }

    fn union(&mut self, a: usize, b: usize) {
        let (a, b) = (self.find(a), self.find(b));
        if a != b {
            self.parent[a.max(b)] = a.min(b);
        }
    }
}

/// How `svc` clashes with the earlier service `other` (index `j`) on the same VIP, if it does.
fn listener_clash(svc: &Service, other: &Service, j: usize) -> Option<(String, String)> {
    let other_label = Scope::Service { index: j, name: other.name.clone() };
    let claim = |s: &Service| match (s.protocol, s.ports.is_empty()) {
        (Protocol::L3Default, _) => format!("every protocol and port of {}", s.vip_text()),
        (p, true) => format!("every {p} port of {}", s.vip_text()),
        (p, false) => format!("{p} ports {:?} of {}", s.ports, s.vip_text()),
    };
    let clash = |field: String| {
        Some((
            field,
            format!(
                "claims {}, which overlaps {} already claimed by {other_label}: each \
                 (vip, port, protocol) may belong to one service only",
                claim(svc),
                claim(other)
            ),
        ))
    };
    if svc.protocol == Protocol::L3Default {
        return clash("protocol".into());
    }
    if other.protocol == Protocol::L3Default {
        return clash("vip".into());
    }
    if svc.protocol != other.protocol {
        return None;
    }
    if svc.ports.is_empty() {
        return clash("ports".into());
    }
    if other.ports.is_empty() {
        return clash("ports".into());
    }
    let i = svc.ports.iter().position(|p| other.ports.contains(p))?;
    clash(format!("ports[{i}]"))
}

/// The contract's checks as methods of the serde structs.
impl Config {
    /// Every check of the configuration contract (docs/config.md) and the spec. All violations
    /// are reported at once, so a user fixes a file in one pass.
    pub fn validate(&self) -> anyhow::Result<()> {
        let violations = self.violations();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { file: None, kind: ConfigErrorKind::Invalid(violations) }.into())
        }
    }

    /// The list of violations (empty = valid), in file order.
    pub fn violations(&self) -> Vec<Violation> {
        check(self, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primes() {
        assert!(is_prime(251) && is_prime(16381) && is_prime(65537) && is_prime(1_000_003));
        assert!(!is_prime(0) && !is_prime(1) && !is_prime(16383) && !is_prime(1_000_001));
    }
}
