//! Validation of the Traffic Manager part of the contract (spec §2.1, §2.3, §2.4, §2.5): the
//! routing method's fields on services and backends, `[service.monitor]`, `[[latency]]`,
//! `[[geo]]` and nesting. Same style as `validate`: every problem, with field path and the
//! allowed values.

use super::error::Scope;
use super::error::{Report, Sink};
use super::monitor::{parse_custom_headers, MonitorSettings};
use super::ranges::{parse_subnet, AddrRange};
use super::raw::{Backend, Config, Service};
use super::regions::RegionTree;
use crate::model::*;
use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

/// Spec §2.1: `priority` 1..=1000.
pub const MAX_PRIORITY: u32 = 1000;
/// Spec §2.4 **[AMBIG]**: `maxReturn` 1..=10 (FAQ cap; Terraform says 8).
pub const MAX_MAX_RETURN: u32 = 10;
/// Spec §2.1: `dnsConfig.ttl` 0..=2147483647.
pub const MAX_TTL: u32 = 2_147_483_647;

/// Traffic Manager nesting depth limit (spec §2.5); also guards recursion on an unvalidated
/// configuration.
pub const MAX_NESTING_DEPTH: usize = 10;

// ---------------------------------------------------------------- [[latency]] and [[geo]]

pub(super) fn check_client_inputs(cfg: &Config, out: &mut Sink) {
    let mut seen: HashMap<ipnet::IpNet, usize> = HashMap::new();
    for (index, entry) in cfg.latency.iter().enumerate() {
        let mut r = Report { out, scope: Scope::Latency { index } };
        check_prefixes(&entry.client_prefixes, &mut seen, index, "latency", &mut r);
        if entry.regions.is_empty() {
            r.push("regions", "must list at least one region name, nearest first");
        }
        let mut names = HashSet::new();
        for (i, region) in entry.regions.iter().enumerate() {
            if region.trim().is_empty() {
                r.push(format!("regions[{i}]"), "must be a non-empty region name");
            } else if !names.insert(region.as_str()) {
                r.push(format!("regions[{i}]"), format!("duplicate region {region:?}: each region may be listed once"));
            }
        }
    }
    let tree = RegionTree::builtin();
    let mut seen: HashMap<ipnet::IpNet, usize> = HashMap::new();
    for (index, entry) in cfg.geo.iter().enumerate() {
        let mut r = Report { out, scope: Scope::Geo { index } };
        check_prefixes(&entry.client_prefixes, &mut seen, index, "geo", &mut r);
        if !tree.contains(&entry.region) {
            r.push(
                "region",
                format!(
                    "{:?} is not a known region code: use a code of lb-user/data/regions.txt \
                     (e.g. \"US-CA\", \"IE\", \"GEO-EU\", \"WORLD\")",
                    entry.region
                ),
            );
        }
    }
}

/// Prefixes of a client-input table: canonical, and never listed twice in the table (nesting
/// is fine: the longest match wins).
fn check_prefixes(
    prefixes: &[ipnet::IpNet],
    seen: &mut HashMap<ipnet::IpNet, usize>,
    index: usize,
    table: &str,
    r: &mut Report,
) {
    if prefixes.is_empty() {
        r.push("client_prefixes", "must list at least one prefix");
    }
    for (i, net) in prefixes.iter().enumerate() {
        if net.trunc() != *net {
            r.push(
                format!("client_prefixes[{i}]"),
                format!("{net} has host bits set: must be canonical, e.g. {}", net.trunc()),
            );
        } else if let Some(&first) = seen.get(net) {
            r.push(
                format!("client_prefixes[{i}]"),
                format!(
                    "{net} is also listed in {table}[{first}]: a prefix may appear once per \
                     table (nested prefixes are fine: the longest match wins)"
                ),
            );
        } else {
            seen.insert(*net, index);
        }
    }
}

// ---------------------------------------------------------------- one service

pub(super) fn check_service(cfg: &Config, svc: &Service, r: &mut Report) {
    if svc.routing_method.is_traffic_manager() {
        check_tm_service(cfg, svc, r);
    } else {
        check_zonal_has_no_tm_fields(svc, r);
    }
}

fn only_tm(field: impl Into<String>, r: &mut Report) {
    r.push(
        field,
        format!(
            "only allowed with a Traffic Manager routing_method ({}); this \
             service uses ZONAL (the default)",
            TmMethod::ALLOWED.join(", ")
        ),
    );
}

fn check_zonal_has_no_tm_fields(svc: &Service, r: &mut Report) {
    for (set, field) in [
        (svc.profile_status.is_some(), "profile_status"),
        (svc.ttl.is_some(), "ttl"),
        (svc.max_return.is_some(), "max_return"),
        (svc.monitor.is_some(), "monitor"),
        (svc.dns_name.is_some(), "dns_name"),
    ] {
        if set {
            only_tm(field, r);
        }
    }
    for (i, b) in svc.backends.iter().enumerate() {
        // `address` may be omitted only on a nested endpoint, which ZONAL does not have.
        if b.address.is_unspecified() && b.target_service.is_none() {
            r.push(
                format!("backend[{i}].address"),
                "required: the backend's IP address (0.0.0.0 and :: are not valid addresses)",
            );
        }
        for (set, field) in [
            (b.endpoint_status != AdminStatus::Enabled, "endpoint_status"),
            (b.priority.is_some(), "priority"),
            (b.location.is_some(), "location"),
            (!b.geo_mapping.is_empty(), "geo_mapping"),
            (!b.subnets.is_empty(), "subnets"),
            (b.target_service.is_some(), "target_service"),
            (b.target.is_some(), "target"),
            (b.min_child_endpoints.is_some(), "min_child_endpoints"),
            (b.min_child_endpoints_ipv4.is_some(), "min_child_endpoints_ipv4"),
            (b.min_child_endpoints_ipv6.is_some(), "min_child_endpoints_ipv6"),
            (b.always_serve, "always_serve"),
            (!b.custom_headers.is_empty(), "custom_headers"),
        ] {
            if set {
                only_tm(format!("backend[{i}].{field}"), r);
            }
        }
    }
}

fn check_tm_service(cfg: &Config, svc: &Service, r: &mut Report) {
    let method = svc.routing_method;
    let not_with_tm = |field: &str, r: &mut Report, what: &str| {
        r.push(
            field.to_string(),
            format!(
                "{what} belongs to the Google Cloud pipeline: not allowed with routing_method = \
                 {method} (allowed only with ZONAL)"
            ),
        );
    };
    if svc.zonal_affinity.spillover != Spillover::Disabled {
        not_with_tm("zonal_affinity.spillover", r, "zonal affinity");
    }
    if svc.failover_policy.is_some() {
        not_with_tm("failover_policy", r, "a failover policy");
    }
    if svc.health_check.is_some() {
        not_with_tm("health_check", r, "[service.health_check] (use [service.monitor] here)");
    }
    if let Some(ttl) = svc.ttl {
        if ttl > MAX_TTL {
            r.push("ttl", format!("{ttl} is out of range: allowed 0..={MAX_TTL} seconds"));
        } else if svc.dns_name.is_none() {
            // The TTL only goes into the DNS front's answers for `dns_name` (issue #32-6).
            r.push(
                "ttl",
                "only used in the DNS answers for the service's dns_name, and this service has none: \
                 set dns_name (answered by [dns]) or remove ttl",
            );
        }
    }
    // Only WEIGHTED draws by weight (spec §2.4); elsewhere a weight would be ignored (issue #32-6).
    if method != RoutingMethod::Weighted {
        for (i, b) in svc.backends.iter().enumerate().filter(|(_, b)| b.weight != 1) {
            r.push(
                format!("backend[{i}].weight"),
                format!(
                    "{} is used only with routing_method = WEIGHTED (or ZONAL); with {method} every \
                     endpoint counts once: allowed 1 (the default) or no weight",
                    b.weight
                ),
            );
        }
    }
    match (svc.max_return, method) {
        (Some(n), RoutingMethod::MultiValue) if !(1..=MAX_MAX_RETURN).contains(&n) => {
            r.push("max_return", format!("{n} is out of range: allowed 1..={MAX_MAX_RETURN} (default 2)"))
        }
        (Some(_), m) if m != RoutingMethod::MultiValue => {
            r.push("max_return", format!("only allowed with routing_method = MULTIVALUE (this service uses {m})"))
        }
        _ => {}
    }
    if let Some(m) = &svc.monitor {
        if let Err(problems) = MonitorSettings::from_config(m) {
            for (field, problem) in problems {
                r.push(format!("monitor.{field}"), problem);
            }
        }
    }
    check_endpoint_names(svc, r);
    check_priorities(svc, r);
    check_geo_mappings(svc, r);
    check_subnets(svc, r);
    for (i, b) in svc.backends.iter().enumerate() {
        check_endpoint(cfg, svc, b, i, r);
    }
    if method == RoutingMethod::MultiValue {
        // (A Traffic Manager service without a VIP is refused by `check_frontend`.)
        let v4 = svc.vip.is_none_or(|v| v.is_ipv4());
        let family_ok = svc.backends.iter().any(|b| !b.addressless() && b.address.is_ipv4() == v4);
        // (Endpoints given by DNS name are refused under MULTIVALUE already.)
        let named = svc.backends.iter().any(|b| b.target.is_some());
        if !svc.backends.is_empty() && !family_ok && !named {
            r.push(
                "backend",
                format!(
                    "no backend has the address family of vip {}: at least one is needed to \
                     carry the VIP's traffic",
                    svc.vip_text()
                ),
            );
        }
    }
}

fn check_endpoint_names(svc: &Service, r: &mut Report) {
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (i, b) in svc.backends.iter().enumerate() {
        if let Some(n) = &b.name {
            if n.trim().is_empty() {
                r.push(format!("backend[{i}].name"), "must be a non-empty string");
                continue;
            }
        }
        let label = b.label();
        if let Some(&first) = seen.get(&label) {
            r.push(
                format!("backend[{i}].name"),
                format!("duplicate endpoint name {label:?} (also backend[{first}]): names must be unique"),
            );
        } else {
            seen.insert(label, i);
        }
    }
}

/// Spec §2.1 / vectors A5, A6: 1..=1000, unique, set on all endpoints or on none.
fn check_priorities(svc: &Service, r: &mut Report) {
    let set = svc.backends.iter().filter(|b| b.priority.is_some()).count();
    let mut seen: HashMap<u32, usize> = HashMap::new();
    for (i, b) in svc.backends.iter().enumerate() {
        let field = format!("backend[{i}].priority");
        match b.priority {
            Some(p) if !(1..=MAX_PRIORITY).contains(&p) => {
                r.push(field, format!("{p} is out of range: allowed 1..={MAX_PRIORITY} (lower wins)"))
            }
            Some(p) => {
                if let Some(&first) = seen.get(&p) {
                    r.push(
                        field,
                        format!(
                            "duplicate priority {p} (also backend[{first}]): priorities must be \
                             unique in the service"
                        ),
                    );
                } else {
                    seen.insert(p, i);
                }
            }
            None if set > 0 => r.push(
                field,
                "missing: set a priority on every endpoint or on none (then they follow file \
                 order: 1, 2, 3, ...)",
            ),
            None => {}
        }
    }
}

/// Spec §2.4 Geographic / vector Q7: known codes, each mapped once per service; under
/// GEOGRAPHIC every endpoint needs at least one.
fn check_geo_mappings(svc: &Service, r: &mut Report) {
    let tree = RegionTree::builtin();
    let mut owner: HashMap<&str, usize> = HashMap::new();
    for (i, b) in svc.backends.iter().enumerate() {
        if svc.routing_method == RoutingMethod::Geographic && b.geo_mapping.is_empty() {
            r.push(
                format!("backend[{i}].geo_mapping"),
                "required with routing_method = GEOGRAPHIC: every endpoint needs at least one \
                 region code (e.g. \"WORLD\" for the rest of the world)",
            );
        }
        for (j, code) in b.geo_mapping.iter().enumerate() {
            let field = format!("backend[{i}].geo_mapping[{j}]");
            if !tree.contains(code) {
                r.push(
                    field,
                    format!(
                        "{code:?} is not a known region code: use a code of \
                         lb-user/data/regions.txt (country \"FR\", state \"US-CA\", group \
                         \"GEO-EU\", or \"WORLD\"; states exist for AU, CA, GB and US only)"
                    ),
                );
            } else if let Some(&first) = owner.get(code.as_str()) {
                let whom = if first == i { "in the same endpoint".to_string() } else { format!("by backend[{first}]") };
                r.push(
                    field,
                    format!(
                        "{code} is already mapped {whom}: each region code may be mapped to \
                         one endpoint per service"
                    ),
                );
            } else {
                owner.insert(code.as_str(), i);
            }
        }
    }
}

/// Spec §2.4 Subnet / vector N5: ranges parse, never overlap within the service; under SUBNET
/// at most one endpoint without ranges (the fallback; **[AMBIG]** we allow one).
fn check_subnets(svc: &Service, r: &mut Report) {
    let mut ranges: Vec<(AddrRange, usize, usize)> = Vec::new();
    for (i, b) in svc.backends.iter().enumerate() {
        for (j, text) in b.subnets.iter().enumerate() {
            match parse_subnet(text) {
                Ok(range) => {
                    if let Some((_, oi, oj)) = ranges.iter().find(|(o, _, _)| o.overlaps(&range)) {
                        r.push(
                            format!("backend[{i}].subnets[{j}]"),
                            format!(
                                "{text:?} overlaps {:?} (backend[{oi}].subnets[{oj}]): ranges \
                                 must not overlap anywhere in the service",
                                svc.backends[*oi].subnets[*oj]
                            ),
                        );
                    }
                    ranges.push((range, i, j));
                }
                Err(e) => r.push(format!("backend[{i}].subnets[{j}]"), e),
            }
        }
    }
    if svc.routing_method == RoutingMethod::Subnet {
        let fallbacks: Vec<usize> = (0..svc.backends.len()).filter(|&i| svc.backends[i].subnets.is_empty()).collect();
        if let [first, rest @ ..] = fallbacks.as_slice() {
            for i in rest {
                r.push(
                    format!("backend[{i}].subnets"),
                    format!(
                        "empty, but backend[{first}] is already the fallback endpoint (the one \
                         without ranges): at most one fallback per service"
                    ),
                );
            }
        }
    }
}

fn check_endpoint(cfg: &Config, svc: &Service, b: &Backend, i: usize, r: &mut Report) {
    let method = svc.routing_method;
    if !b.custom_headers.is_empty() {
        let http =
            svc.monitor.as_ref().is_some_and(|m| matches!(m.protocol, MonitorProtocol::Http | MonitorProtocol::Https));
        if !http {
            r.push(
                format!("backend[{i}].custom_headers"),
                "only allowed with a [service.monitor] of protocol = HTTP or HTTPS (headers go with its probes)",
            );
        } else if let Err(e) = parse_custom_headers(&b.custom_headers) {
            r.push(format!("backend[{i}].custom_headers"), e);
        }
    }
    if b.zone.is_some() {
        r.push(
            format!("backend[{i}].zone"),
            format!("zones belong to the Google Cloud pipeline: not allowed with routing_method = {method}"),
        );
    }
    if b.failover {
        r.push(
            format!("backend[{i}].failover"),
            format!("failover backends belong to the Google Cloud pipeline: not allowed with routing_method = {method} (use PRIORITY)"),
        );
    }
    match &b.location {
        Some(l) if l.trim().is_empty() => {
            r.push(format!("backend[{i}].location"), "must be a non-empty region name (as used in [[latency]] regions)")
        }
        None if method == RoutingMethod::Performance => r.push(
            format!("backend[{i}].location"),
            "required with routing_method = PERFORMANCE: the endpoint's region name (as used \
             in [[latency]] regions, e.g. \"westeurope\")",
        ),
        // PERFORMANCE picks endpoints by region, nearest first, from the clients' [[latency]]
        // lists: with latency data given, a region in none of them (a typo, usually) would be
        // nobody's nearest; the endpoint would only get clients whose regions all lack one.
        Some(l)
            if method == RoutingMethod::Performance
                && !cfg.latency.is_empty()
                && !cfg.latency.iter().any(|e| e.regions.contains(l)) =>
        {
            let mut known: Vec<&str> = cfg.latency.iter().flat_map(|e| e.regions.iter().map(String::as_str)).collect();
            known.sort_unstable();
            known.dedup();
            r.push(
                format!("backend[{i}].location"),
                format!(
                    "{l:?} is in no [[latency]] regions list, so no client has it as a near region; \
                     the regions listed are: {}",
                    known.join(", ")
                ),
            )
        }
        _ => {}
    }
    let unspecified = b.address.is_unspecified();
    match (&b.target_service, &b.target) {
        (Some(_), Some(_)) => r.push(
            format!("backend[{i}].target"),
            "not allowed with target_service: an endpoint is an address, a DNS name (target) \
             or a nested service (target_service), one of them",
        ),
        (None, Some(name)) => check_name_endpoint(cfg, svc, b, i, name, r),
        (Some(child), None) => check_nested_endpoint(cfg, svc, b, i, child, r),
        (None, None) => {
            if unspecified {
                r.push(
                    format!("backend[{i}].address"),
                    "required: the endpoint's IP address (0.0.0.0 and :: are not valid \
                     addresses); or set target for an endpoint given by DNS name, or \
                     target_service for a nested endpoint",
                );
            }
            refuse_child_thresholds(b, i, r);
        }
    }
}

/// An external endpoint given by DNS name (`target`): a host name (not an address, not a name
/// this balancer answers for), without an address, not under MULTIVALUE (spec §2.4, vector M4),
/// and not next to endpoints given by address (spec §2.1: A/AAAA and CNAME addressing are not
/// mixed in one profile).
fn check_name_endpoint(cfg: &Config, svc: &Service, b: &Backend, i: usize, name: &str, r: &mut Report) {
    let field = format!("backend[{i}].target");
    if name.parse::<IpAddr>().is_ok() {
        r.push(
            field.clone(),
            format!("{name:?} is an IP address: set it as `address`; target is a DNS name, e.g. \"app.example.net\""),
        );
    } else if let Err(e) = check_dns_name(name) {
        r.push(field.clone(), format!("{e}; allowed: a DNS host name the endpoint is reached by"));
    } else if let Some(owner) = cfg
        .services
        .iter()
        .find(|s| s.dns_name.as_deref().is_some_and(|n| canonical_dns_name(n) == canonical_dns_name(name)))
    {
        r.push(
            field.clone(),
            format!(
                "{name:?} is the dns_name of service {:?}, which this balancer answers for: a CNAME to \
                 it would loop back here; to route to that service use target_service = {:?}",
                owner.name, owner.name
            ),
        );
    }
    if !b.address.is_unspecified() {
        r.push(
            format!("backend[{i}].address"),
            "not allowed with target: an endpoint given by DNS name gets its addresses by resolving it",
        );
    }
    if svc.routing_method == RoutingMethod::MultiValue {
        r.push(
            field.clone(),
            "not allowed with routing_method = MULTIVALUE: every endpoint must be an IPv4/IPv6 \
             address (as Traffic Manager requires); set address instead",
        );
    }
    if let Some(first) = svc.backends.iter().position(|x| !x.addressless()) {
        r.push(
            field,
            format!(
                "cannot be mixed with endpoints given by address (backend[{first}]) in one service: \
                 its DNS answers are either CNAMEs or A/AAAA records (as Traffic Manager requires); \
                 put the name endpoints in a service of their own and nest it (target_service)"
            ),
        );
    }
    refuse_child_thresholds(b, i, r);
}

/// The Online thresholds of a nested endpoint, refused on any other endpoint.
fn refuse_child_thresholds(b: &Backend, i: usize, r: &mut Report) {
    for (set, field) in [
        (b.min_child_endpoints.is_some(), "min_child_endpoints"),
        (b.min_child_endpoints_ipv4.is_some(), "min_child_endpoints_ipv4"),
        (b.min_child_endpoints_ipv6.is_some(), "min_child_endpoints_ipv6"),
    ] {
        if set {
            r.push(format!("backend[{i}].{field}"), "only allowed on a nested endpoint (with target_service)");
        }
    }
}

fn check_nested_endpoint(cfg: &Config, svc: &Service, b: &Backend, i: usize, child: &str, r: &mut Report) {
    if !b.address.is_unspecified() {
        r.push(
            format!("backend[{i}].address"),
            "not allowed on a nested endpoint (with target_service): its traffic goes to the \
             child service's backends",
        );
    }
    if svc.routing_method == RoutingMethod::MultiValue {
        // Spec §2.4 / vectors M4, H5.
        r.push(
            format!("backend[{i}].target_service"),
            "not allowed with routing_method = MULTIVALUE: every endpoint must be an IPv4/IPv6 \
             address, and a MULTIVALUE service cannot be a parent",
        );
    }
    if b.always_serve {
        r.push(
            format!("backend[{i}].always_serve"),
            "not allowed on a nested endpoint: its status always comes from the child service",
        );
    }
    for (value, field) in [
        (b.min_child_endpoints, "min_child_endpoints"),
        (b.min_child_endpoints_ipv4, "min_child_endpoints_ipv4"),
        (b.min_child_endpoints_ipv6, "min_child_endpoints_ipv6"),
    ] {
        if value == Some(0) {
            r.push(format!("backend[{i}].{field}"), "0 is not allowed: at least 1 (default 1)");
        }
    }
    let field = format!("backend[{i}].target_service");
    match cfg.service_index(child) {
        _ if child == svc.name => r.push(field, "a service cannot nest itself"),
        None => {
            let names: Vec<&str> = cfg
                .services
                .iter()
                .filter(|s| s.routing_method.is_traffic_manager() && s.name != svc.name)
                .map(|s| s.name.as_str())
                .collect();
            r.push(
                field,
                format!(
                    "{child:?} names no [[service]]; Traffic Manager services: {}",
                    if names.is_empty() { "none".to_string() } else { names.join(", ") }
                ),
            );
        }
        Some(c) => {
            let child_svc = &cfg.services[c];
            if !child_svc.routing_method.is_traffic_manager() {
                r.push(
                    field,
                    format!(
                        "{child:?} uses routing_method = ZONAL: a child must use a Traffic \
                         Manager method ({})",
                        TmMethod::ALLOWED.join(", ")
                    ),
                );
            } else if child_svc.vip.map(|v| v.is_ipv4()) != svc.vip.map(|v| v.is_ipv4()) {
                r.push(
                    field,
                    format!(
                        "{child:?} has vip {} of another address family than this service's {}: \
                         nesting keeps the family",
                        child_svc.vip_text(),
                        svc.vip_text()
                    ),
                );
            }
        }
    }
}

// ---------------------------------------------------------------- nesting across services

/// Spec §2.5 / vector H5: no loops, at most `MAX_NESTING_DEPTH` nesting levels below any
/// service (a chain of 11 services has 10 levels and is allowed). Linear in services plus
/// nested endpoints: every service's depth is computed once (`Nesting`), however many paths
/// lead to it.
pub(super) fn check_nesting(cfg: &Config, out: &mut Sink) {
    let mut index_of: HashMap<&str, usize> = HashMap::new();
    for (s, svc) in cfg.services.iter().enumerate() {
        index_of.entry(svc.name.as_str()).or_insert(s);
    }
    let edges: Vec<Vec<usize>> = cfg
        .services
        .iter()
        .enumerate()
        .map(|(s, svc)| {
            svc.backends
                .iter()
                .filter_map(|b| index_of.get(b.target_service.as_deref()?).copied())
                .filter(|&c| c != s)
                .collect()
        })
        .collect();
    let nesting = Nesting::of(&edges);
    for (index, svc) in cfg.services.iter().enumerate() {
        let mut r = Report { out, scope: Scope::Service { index, name: svc.name.clone() } };
        if nesting.on_loop[index] {
            // Finding the loop costs a search; past the listing cap only the count matters.
            let cycle = if r.out.is_full() { Vec::new() } else { nesting.cycle_through(&edges, index) };
            let mut names: Vec<&str> = cycle.iter().map(|&s| cfg.services[s].name.as_str()).collect();
            let shown = MAX_NESTING_DEPTH + 2;
            if names.len() > shown {
                let n = names.len() - 1;
                names.truncate(shown);
                names.push("...");
                names.push(&svc.name);
                r.push(
                    "backend.target_service",
                    format!("nesting loop of {n} services {}: nested services must form a tree", names.join(" -> ")),
                );
            } else {
                r.push(
                    "backend.target_service",
                    format!("nesting loop {}: nested services must form a tree", names.join(" -> ")),
                );
            }
        } else if nesting.depth[index] > MAX_NESTING_DEPTH {
            r.push(
                "backend.target_service",
                format!(
                    "nesting is {} levels deep below this service: allowed at most \
                     {MAX_NESTING_DEPTH}",
                    nesting.depth[index]
                ),
            );
        }
    }
}

/// The nesting graph's loops and depths, from one pass of Tarjan's strongly connected
/// components: a service is on a loop iff its component has several members, and components
/// come out children first, so each depth is computed once from its children's. A service
/// above a loop counts its levels down to the loop (the loop is reported on its members).
struct Nesting {
    on_loop: Vec<bool>,
    depth: Vec<usize>,
    component: Vec<usize>,
    /// Nodes and edges visited: a measure of work for tests.
    #[cfg_attr(not(test), allow(dead_code))]
    steps: usize,
}

impl Nesting {
    fn of(edges: &[Vec<usize>]) -> Self {
        const UNSEEN: usize = usize::MAX;
        let n = edges.len();
        let mut order = vec![UNSEEN; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack: Vec<usize> = Vec::new();
        let mut component = vec![UNSEEN; n];
        let mut on_loop = vec![false; n];
        let mut depth = vec![0; n];
        let (mut next, mut components, mut steps) = (0, 0, 0);
        for root in 0..n {
            if order[root] != UNSEEN {
                continue;
            }
            // (node, next edge to look at)
            let mut calls: Vec<(usize, usize)> = vec![(root, 0)];
            order[root] = next;
            low[root] = next;
            next += 1;
            stack.push(root);
            on_stack[root] = true;
            while let Some(&mut (v, ref mut e)) = calls.last_mut() {
                steps += 1;
                if let Some(&c) = edges[v].get(*e) {
                    *e += 1;
                    if order[c] == UNSEEN {
                        order[c] = next;
                        low[c] = next;
                        next += 1;
                        stack.push(c);
                        on_stack[c] = true;
                        calls.push((c, 0));
                    } else if on_stack[c] {
                        low[v] = low[v].min(order[c]);
                    }
                    continue;
                }
                calls.pop();
                if let Some(&(parent, _)) = calls.last() {
                    low[parent] = low[parent].min(low[v]);
                }
                if low[v] != order[v] {
                    continue;
                }
                // v roots a component: pop it; its children's components are all done.
                let mut members = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component[w] = components;
                    members.push(w);
                    if w == v {
                        break;
                    }
                }
                components += 1;
                let looped = members.len() > 1;
                for &w in &members {
                    on_loop[w] = looped;
                    if !looped {
                        depth[w] =
                            edges[w].iter().map(|&c| if on_loop[c] { 1 } else { depth[c] + 1 }).max().unwrap_or(0);
                        steps += edges[w].len();
                    }
                }
            }
        }
        Self { on_loop, depth, component, steps }
    }

    /// A shortest loop from `start` back to it (breadth first, in edge order, inside its
    /// component), with `start` at both ends.
    fn cycle_through(&self, edges: &[Vec<usize>], start: usize) -> Vec<usize> {
        let mut parent: HashMap<usize, usize> = HashMap::new();
        let mut queue = std::collections::VecDeque::from([start]);
        while let Some(v) = queue.pop_front() {
            for &c in &edges[v] {
                if self.component[c] != self.component[start] {
                    continue;
                }
                if c == start {
                    let mut path = vec![start, v];
                    let mut w = v;
                    while w != start {
                        w = parent[&w];
                        path.push(w);
                    }
                    path.reverse();
                    return path;
                }
                if let std::collections::hash_map::Entry::Vacant(slot) = parent.entry(c) {
                    slot.insert(v);
                    queue.push_back(c);
                }
            }
        }
        vec![start]
    }
}

// ---------------------------------------------------------------- DNS names

/// A host name the DNS front can answer for: dot-separated labels of letters, digits and '-'
/// (not at a label's ends), 1..=63 bytes each, 253 bytes in all; one trailing dot allowed.
pub fn check_dns_name(name: &str) -> Result<(), String> {
    let bare = name.strip_suffix('.').unwrap_or(name);
    if bare.is_empty() || bare.len() > 253 {
        return Err(format!("{name:?} is not a host name: 1..=253 characters"));
    }
    for label in bare.split('.') {
        let ok = (1..=63).contains(&label.len())
            && label.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
            && !label.starts_with('-')
            && !label.ends_with('-');
        if !ok {
            return Err(format!(
                "{name:?} is not a host name: labels of 1..=63 letters, digits or '-' (not at \
                 either end), separated by dots, e.g. \"app.tm.example\""
            ));
        }
    }
    Ok(())
}

/// The canonical form of a DNS name: lower case, no trailing dot.
pub fn canonical_dns_name(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// `dns_name`: a valid host name, unique across services (case-insensitive).
pub(super) fn check_dns_names(cfg: &Config, out: &mut Sink) {
    let mut seen: HashMap<String, &str> = HashMap::new();
    for (index, svc) in cfg.services.iter().enumerate() {
        let Some(name) = &svc.dns_name else { continue };
        let mut r = Report { out, scope: Scope::Service { index, name: svc.name.clone() } };
        if let Err(e) = check_dns_name(name) {
            r.push("dns_name", e);
        } else if let Some(other) = seen.insert(canonical_dns_name(name), &svc.name) {
            r.push("dns_name", format!("{name:?} is also the dns_name of service {other:?}: names must be unique"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `levels` levels of `width` services, each nesting every service of the next level.
    fn layered(levels: usize, width: usize) -> Vec<Vec<usize>> {
        (0..levels * width)
            .map(|s| {
                let next = (s / width + 1) * width;
                if next < levels * width {
                    (next..next + width).collect()
                } else {
                    Vec::new()
                }
            })
            .collect()
    }

    #[test]
    fn nesting_depth_is_linear_in_services_and_edges() {
        // 4^10 paths lead from a top service to the bottom level; each edge is looked at a
        // bounded number of times.
        let edges = layered(11, 4);
        let nesting = Nesting::of(&edges);
        assert_eq!(nesting.depth[0], 10);
        assert_eq!(nesting.depth[43], 0);
        assert!(nesting.on_loop.iter().all(|l| !l));
        let work = edges.len() + edges.iter().map(Vec::len).sum::<usize>();
        assert!(nesting.steps <= 3 * work, "{} steps for {work} nodes and edges", nesting.steps);
    }

    #[test]
    fn nesting_loops_are_found_on_their_members_only() {
        // 0 -> 1 -> 2 -> 1, 3 -> 0
        let edges = vec![vec![1], vec![2], vec![1], vec![0]];
        let nesting = Nesting::of(&edges);
        assert_eq!(nesting.on_loop, [false, true, true, false]);
        assert_eq!(nesting.depth[0], 1);
        assert_eq!(nesting.depth[3], 2);
        assert_eq!(nesting.cycle_through(&edges, 2), [2, 1, 2]);
    }
}
