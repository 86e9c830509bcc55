//! The routing methods (spec §2.4) as one selection step with two views:
//! - DNS view (`resolve_dns`): one answer per query (weighted random, MULTIVALUE subsets,
//!   NODATA / NXDOMAIN, A/AAAA filtering);
//! - packet view (`eligible`): per client, the weighted set of leaf backends that Maglev
//!   spreads flows over (nested endpoints expanded into their child's set).

use super::client::Client;
use super::ranges::{to_int, Family};
use super::regions::RegionTree;
use super::rng::{mix64, Rng};
use super::status::{Statuses, MAX_NESTING_DEPTH};
use crate::config::{Endpoint, Service};
use crate::model::{AdminStatus, MonitorStatus, TmMethod};
use std::collections::HashMap;
use std::net::IpAddr;

/// What one selection step chose in one service: endpoints with their relative share, or
/// nothing (`endpoints` empty = NODATA / drop).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    /// (endpoint index, relative weight). Single-answer methods give one entry.
    pub endpoints: Vec<(usize, u32)>,
    /// Why, for `lb plan` and logs.
    pub reason: String,
}

impl Selection {
    fn none(reason: impl Into<String>) -> Self {
        Self { endpoints: Vec::new(), reason: reason.into() }
    }
}

/// Priorities in effect: the configured ones, or 1, 2, 3, ... in file order (spec §2.1).
pub fn effective_priorities(service: &Service) -> Vec<u32> {
    service.backends.iter().enumerate().map(|(i, b)| b.tm().and_then(|t| t.priority).unwrap_or(i as u32 + 1)).collect()
}

/// The parsed SUBNET ranges of an endpoint (validated configurations parse cleanly; a broken
/// range is skipped rather than trusted).
fn endpoint_ranges(service: &Service, ep: usize) -> Vec<super::ranges::AddrRange> {
    service.backends[ep].tm().map(|t| t.subnets.clone()).unwrap_or_default()
}

fn label(service: &Service, ep: usize) -> String {
    service.backends[ep].label()
}

fn labels(service: &Service, eps: &[usize]) -> String {
    let names: Vec<String> = eps.iter().map(|&e| label(service, e)).collect();
    format!("{{{}}}", names.join(", "))
}

/// One selection step in service `svc` for `client` (spec §2.4 pseudo-code, after the common
/// availability rule of §2.2). `family` applies nested endpoints' per-record-type thresholds.
pub fn select(st: &Statuses, svc: usize, client: &Client, family: Option<Family>, depth: usize) -> Selection {
    st.count_work();
    let service = &st.cfg.services[svc];
    if service.profile_status() == AdminStatus::Disabled {
        return Selection::none("profile Disabled (NXDOMAIN)");
    }
    let available = st.available(svc, family, depth);
    let Some(method) = service.tm().map(|t| t.method) else {
        return Selection::none("not a Traffic Manager service");
    };
    match method {
        TmMethod::Priority => {
            let prio = effective_priorities(service);
            match available.iter().min_by_key(|&&e| prio[e]) {
                Some(&e) => Selection {
                    endpoints: vec![(e, 1)],
                    reason: format!("PRIORITY: {} (priority {}) is the first available", label(service, e), prio[e]),
                },
                None => Selection::none("PRIORITY: no endpoint available"),
            }
        }
        TmMethod::Weighted | TmMethod::MultiValue => {
            if available.is_empty() {
                return Selection::none(format!("{method}: no endpoint available"));
            }
            let weighted = method == TmMethod::Weighted;
            Selection {
                endpoints: available
                    .iter()
                    .map(|&e| (e, if weighted { service.backends[e].weight } else { 1 }))
                    .collect(),
                reason: format!("{method}: available {}", labels(service, &available)),
            }
        }
        TmMethod::Performance => select_performance(service, &available, client),
        TmMethod::Geographic => select_geographic(st, svc, client, family, depth),
        TmMethod::Subnet => select_subnet(service, &available, client),
    }
}

fn select_performance(service: &Service, available: &[usize], client: &Client) -> Selection {
    for region in &client.latency {
        let here: Vec<usize> = available
            .iter()
            .copied()
            .filter(|&e| service.backends[e].tm().and_then(|t| t.location.as_deref()) == Some(region.as_str()))
            .collect();
        if !here.is_empty() {
            return Selection {
                endpoints: here.iter().map(|&e| (e, 1)).collect(),
                reason: format!(
                    "PERFORMANCE: nearest region with an available endpoint is {region}: {}",
                    labels(service, &here)
                ),
            };
        }
    }
    if available.is_empty() {
        return Selection::none("PERFORMANCE: no endpoint available");
    }
    // Our choice: a client without latency data, or whose list names no region with an
    // available endpoint, is spread over every available endpoint rather than dropped
    // (Traffic Manager's own table covers every client and region).
    Selection {
        endpoints: available.iter().map(|&e| (e, 1)).collect(),
        reason: format!(
            "PERFORMANCE: no listed region has an available endpoint (client regions {:?}); \
             spread over all available {}",
            client.latency,
            labels(service, available)
        ),
    }
}

fn select_geographic(st: &Statuses, svc: usize, client: &Client, family: Option<Family>, depth: usize) -> Selection {
    let service = &st.cfg.services[svc];
    let Some(code) = client.geo.as_deref() else {
        return Selection::none("GEOGRAPHIC: client location unknown (NODATA)");
    };
    let tree = RegionTree::builtin();
    let chain = tree.ancestors_inclusive(code);
    for g in &chain {
        // Disabled endpoints are ignored as if unmapped, so a coarser mapping may match.
        let mapped = service.backends.iter().position(|b| {
            b.tm().is_some_and(|t| t.endpoint_status == AdminStatus::Enabled && t.geo_mapping.iter().any(|m| m == g))
        });
        if let Some(e) = mapped {
            let status = st.endpoint_status_for(svc, e, family, depth);
            if matches!(status, MonitorStatus::Stopped | MonitorStatus::Inactive) {
                // No climbing to a coarser mapping.
                return Selection::none(format!(
                    "GEOGRAPHIC: {g} maps to {} which is {status} (NODATA)",
                    label(service, e)
                ));
            }
            // Returned regardless of Degraded: there is no failover between mappings.
            return Selection {
                endpoints: vec![(e, 1)],
                reason: format!("GEOGRAPHIC: client {code} matched {g} -> {} ({status})", label(service, e)),
            };
        }
    }
    Selection::none(format!(
        "GEOGRAPHIC: no endpoint mapped for {} (NODATA)",
        if chain.is_empty() { format!("unknown region {code}") } else { chain.join(" > ") }
    ))
}

fn select_subnet(service: &Service, available: &[usize], client: &Client) -> Selection {
    let matched = client.addr.and_then(|addr| {
        (0..service.backends.len()).find(|&e| {
            service.backends[e].endpoint_status() == AdminStatus::Enabled
                && endpoint_ranges(service, e).iter().any(|r| r.contains(addr))
        })
    });
    if let Some(m) = matched {
        if available.contains(&m) {
            return Selection {
                endpoints: vec![(m, 1)],
                reason: format!("SUBNET: client range of {}", label(service, m)),
            };
        }
    }
    let fallback = (0..service.backends.len()).find(|&e| {
        service.backends[e].tm().is_some_and(|t| t.endpoint_status == AdminStatus::Enabled && t.subnets.is_empty())
    });
    let why = match matched {
        Some(m) => format!("{} (matched) is not available", label(service, m)),
        None => "no range matches".to_string(),
    };
    match fallback {
        Some(f) if available.contains(&f) => {
            Selection { endpoints: vec![(f, 1)], reason: format!("SUBNET: {why}; fallback {}", label(service, f)) }
        }
        _ => Selection::none(format!("SUBNET: {why} and no available fallback (NODATA)")),
    }
}

// ---------------------------------------------------------------- DNS view

/// DNS query type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueryType {
    A,
    Aaaa,
    Cname,
    Any,
}

impl QueryType {
    fn family(self) -> Option<Family> {
        match self {
            QueryType::A => Some(Family::V4),
            QueryType::Aaaa => Some(Family::V6),
            _ => None,
        }
    }

    fn accepts(self, addr: &IpAddr) -> bool {
        match self {
            QueryType::A => addr.is_ipv4(),
            QueryType::Aaaa => addr.is_ipv6(),
            QueryType::Any => true,
            // An address (A/AAAA) does not answer a CNAME query (an endpoint given by DNS name
            // answers every type with its CNAME: `resolve_at`).
            QueryType::Cname => false,
        }
    }
}

/// One address record of an answer and the endpoint it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub service: usize,
    pub backend: usize,
    pub address: IpAddr,
}

/// The answer to one query.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DnsAnswer {
    /// The profile is Disabled.
    NxDomain,
    /// The name exists but nothing is returned for this client / record type.
    NoData,
    Records(Vec<Record>),
    /// The chosen endpoint is given by DNS name: a CNAME to it, whatever the query type (spec
    /// §2.2: A and AAAA queries accept a CNAME endpoint; a resolver follows it).
    Cname(CnameRecord),
}

/// The CNAME answer of an endpoint given by DNS name and the endpoint it comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CnameRecord {
    pub service: usize,
    pub backend: usize,
    pub target: crate::config::DnsName,
}

/// Answers one query for service `svc` (spec §2.2, §2.4, §2.5).
pub fn resolve_dns(st: &Statuses, svc: usize, client: &Client, qtype: QueryType, rng: &mut impl Rng) -> DnsAnswer {
    if st.cfg.services[svc].profile_status() == AdminStatus::Disabled {
        return DnsAnswer::NxDomain;
    }
    resolve_at(st, svc, client, qtype, rng, 0)
}

fn resolve_at(
    st: &Statuses,
    svc: usize,
    client: &Client,
    qtype: QueryType,
    rng: &mut impl Rng,
    depth: usize,
) -> DnsAnswer {
    let service = &st.cfg.services[svc];
    if depth > MAX_NESTING_DEPTH {
        return DnsAnswer::NoData;
    }
    let method = service.tm().map(|t| t.method);
    if method == Some(TmMethod::MultiValue) {
        if qtype == QueryType::Cname {
            return DnsAnswer::NoData;
        }
        let mut pool: Vec<Record> = st
            .available(svc, qtype.family(), depth)
            .into_iter()
            .filter_map(|e| {
                service.backends[e].address().filter(|a| qtype.accepts(a)).map(|address| Record {
                    service: svc,
                    backend: e,
                    address,
                })
            })
            .collect();
        // Partial Fisher-Yates: up to max_return distinct members in random order.
        let n = (service.tm().map_or(0, |t| t.max_return) as usize).min(pool.len());
        for i in 0..n {
            let j = i + rng.below((pool.len() - i) as u64) as usize;
            pool.swap(i, j);
        }
        pool.truncate(n);
        return if pool.is_empty() { DnsAnswer::NoData } else { DnsAnswer::Records(pool) };
    }
    let sel = select(st, svc, client, qtype.family(), depth);
    let Some(e) = method.and_then(|m| pick_one(m, &sel.endpoints, client, rng)) else {
        return DnsAnswer::NoData;
    };
    match &service.backends[e].endpoint {
        Endpoint::Nested(n) => match st.cfg.service_index(&n.service) {
            Some(c) if st.cfg.services[c].profile_status() == AdminStatus::Enabled => {
                resolve_at(st, c, client, qtype, rng, depth + 1)
            }
            _ => DnsAnswer::NoData,
        },
        Endpoint::Address(address) if qtype.accepts(address) => {
            DnsAnswer::Records(vec![Record { service: svc, backend: e, address: *address }])
        }
        Endpoint::Address(_) => DnsAnswer::NoData,
        Endpoint::Name(t) => DnsAnswer::Cname(CnameRecord { service: svc, backend: e, target: t.name.clone() }),
    }
}

/// Hash of the client's subnet (/24 for IPv4, /48 for IPv6) for the PERFORMANCE spread.
pub fn client_subnet_hash(client: &Client) -> u64 {
    match client.addr {
        Some(a @ IpAddr::V4(_)) => mix64((to_int(a) >> 8) as u64),
        Some(a @ IpAddr::V6(_)) => mix64((to_int(a) >> 80) as u64 ^ 0x6),
        None => 0,
    }
}

/// One endpoint from a selection: PERFORMANCE spreads deterministically by client subnet
/// (**[AMBIG]** spec §2.4: the region choice is deterministic, the spread inside it hashes the
/// client subnet); every other method draws by weight.
fn pick_one(method: TmMethod, endpoints: &[(usize, u32)], client: &Client, rng: &mut impl Rng) -> Option<usize> {
    let total: u64 = endpoints.iter().map(|&(_, w)| u64::from(w)).sum();
    if endpoints.is_empty() || total == 0 {
        return None;
    }
    let mut ticket =
        if method == TmMethod::Performance { client_subnet_hash(client) % total } else { rng.below(total) };
    for &(e, w) in endpoints {
        if ticket < u64::from(w) {
            return Some(e);
        }
        ticket -= u64::from(w);
    }
    None
}

// ---------------------------------------------------------------- packet view

/// A leaf backend the data plane may send a client's flows to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EligibleBackend {
    /// Service owning the backend (the service itself, or a nested child).
    pub service: usize,
    pub backend: usize,
    pub address: IpAddr,
    /// Maglev weight relative to the other entries of the same set.
    pub weight: u32,
}

/// A client's eligible set; empty = drop, counted as unroutable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eligible {
    pub backends: Vec<EligibleBackend>,
    pub reason: String,
}

/// Largest weight emitted; Maglev weights are small integers (see `config::MAX_WEIGHT`).
const MAX_EMITTED_WEIGHT: u128 = crate::config::MAX_WEIGHT as u128;

/// The packet view of service `svc` for `client`: the VIP's address family decides which
/// leaves qualify (MULTIVALUE may mix families; IPIP only carries one).
pub fn eligible(st: &Statuses, svc: usize, client: &Client) -> Eligible {
    let vip = st.cfg.services[svc].vip().expect("validated: a Traffic Manager service has a vip");
    let family = Family::of(&vip);
    eligible_at(st, svc, client, family, 0, &mut HashMap::new())
}

/// The eligible set of `svc` at nesting `depth`, from `memo` if already expanded for this
/// client: a child nested by several endpoints (or several parents) is expanded once, so the
/// work grows with the number of services, not with the number of paths through them.
fn eligible_at(
    st: &Statuses,
    svc: usize,
    client: &Client,
    family: Family,
    depth: usize,
    memo: &mut HashMap<(usize, usize), Eligible>,
) -> Eligible {
    if let Some(e) = memo.get(&(svc, depth)) {
        return e.clone();
    }
    let service = &st.cfg.services[svc];
    let sel = select(st, svc, client, Some(family), depth);
    let mut reason = sel.reason.clone();
    let mut parts: Vec<(u32, Vec<EligibleBackend>)> = Vec::new();
    for &(e, w) in &sel.endpoints {
        let b = &service.backends[e];
        match &b.endpoint {
            Endpoint::Nested(n) => {
                let child = n.service.as_str();
                let child_set = match st.cfg.service_index(child) {
                    // Spelled out once per answer: repeating it under every parent would grow
                    // the text exponentially with the nesting depth.
                    Some(c) if memo.contains_key(&(c, depth + 1)) => Eligible {
                        reason: format!("{child:?} as above"),
                        ..eligible_at(st, c, client, family, depth + 1, memo)
                    },
                    Some(c) if depth < MAX_NESTING_DEPTH => eligible_at(st, c, client, family, depth + 1, memo),
                    _ => Eligible { backends: Vec::new(), reason: format!("nested service {child:?} not usable") },
                };
                reason.push_str(&format!("; {} -> [{}]", b.label(), child_set.reason));
                parts.push((w, child_set.backends));
            }
            Endpoint::Address(address) if Family::of(address) == family => {
                parts.push((w, vec![EligibleBackend { service: svc, backend: e, address: *address, weight: 1 }]))
            }
            Endpoint::Address(_) => {}
            // Its resolved addresses share the endpoint's weight evenly; none resolved (yet, or
            // any more): nothing, as an address of the other family.
            Endpoint::Name(t) => {
                let set: Vec<EligibleBackend> = t
                    .resolved
                    .addresses
                    .iter()
                    .filter(|a| Family::of(a) == family)
                    .map(|a| EligibleBackend { service: svc, backend: e, address: *a, weight: 1 })
                    .collect();
                if set.is_empty() {
                    let fam = if family == Family::V4 { "IPv4" } else { "IPv6" };
                    reason.push_str(&format!("; {} has no resolved {fam} address", b.label()));
                }
                parts.push((w, set));
            }
        }
    }
    let set = Eligible { backends: mix(parts), reason };
    memo.insert((svc, depth), set.clone());
    set
}

fn gcd(a: u128, b: u128) -> u128 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Combines sets chosen with relative weights into one weighted set: entry weight =
/// part weight x entry weight / part total, brought to integers with the lcm of the totals and
/// reduced by the gcd. Only deep weighted nesting can exceed `MAX_EMITTED_WEIGHT`; then the
/// weights are scaled down proportionally (rounded, at least 1).
fn mix(parts: Vec<(u32, Vec<EligibleBackend>)>) -> Vec<EligibleBackend> {
    let totals: Vec<u128> = parts.iter().map(|(_, set)| set.iter().map(|b| u128::from(b.weight)).sum()).collect();
    let lcm = totals.iter().filter(|&&t| t > 0).fold(1u128, |l, &t| (l / gcd(l, t)).saturating_mul(t));
    let mut out: Vec<(EligibleBackend, u128)> = Vec::new();
    for ((w, set), total) in parts.into_iter().zip(totals) {
        if total == 0 {
            continue;
        }
        for b in set {
            let weight = u128::from(w).saturating_mul(u128::from(b.weight)).saturating_mul(lcm / total);
            match out
                .iter_mut()
                .find(|(o, _)| o.service == b.service && o.backend == b.backend && o.address == b.address)
            {
                Some((_, acc)) => *acc = acc.saturating_add(weight),
                None => out.push((b, weight)),
            }
        }
    }
    let g = out.iter().fold(0u128, |g, (_, w)| gcd(g, *w)).max(1);
    let max = out.iter().map(|(_, w)| w / g).max().unwrap_or(1);
    out.into_iter()
        .map(|(mut b, w)| {
            let w = w / g;
            let scaled = if max > MAX_EMITTED_WEIGHT {
                (w.saturating_mul(MAX_EMITTED_WEIGHT).saturating_add(max / 2) / max).max(1)
            } else {
                w
            };
            b.weight = scaled as u32;
            b
        })
        .collect()
}
