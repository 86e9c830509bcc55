//! Compilation of a Traffic Manager service into client classes for the data plane: disjoint
//! source prefixes (LPM-trie keys, exactly like zones) -> class id, plus each class's eligible
//! set. Classes come from every input the service's routing can look at, through its nested
//! children too: SUBNET endpoint ranges (first-last ranges split into CIDRs), `[[latency]]`
//! prefixes (PERFORMANCE) and `[[geo]]` prefixes (GEOGRAPHIC). The prefix map depends only on
//! the configuration; health changes only change the per-class eligible sets.

use super::client::{geo_of, latency_entry, Client};
use super::methods::{eligible, EligibleBackend};
use super::ranges::{from_int, int_range_to_cidrs, to_int, AddrRange, Family};
use super::status::{ProbeStatuses, Statuses, MAX_NESTING_DEPTH};
use crate::config::Config;
use crate::model::TmMethod;
use ipnet::IpNet;
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

/// Class 0: clients matching no prefix.
pub const DEFAULT_CLASS: usize = 0;

/// What the inputs say about every address of a class.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClassKey {
    /// Index of the matching `[[latency]]` entry (if PERFORMANCE is used).
    pub latency: Option<usize>,
    /// The region the clients are located in (if GEOGRAPHIC is used): by a `[[geo]]` prefix,
    /// else the GeoIP database.
    pub geo: Option<String>,
    /// For each SUBNET service used: (service, endpoint whose range matches).
    pub subnets: Vec<(usize, Option<usize>)>,
}

/// The configuration-only part: prefixes -> classes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassMap {
    /// Disjoint canonical prefixes, sorted; each maps to a class id >= 1.
    pub prefixes: Vec<(IpNet, usize)>,
    /// Indexed by class id; entry 0 is the default class.
    pub classes: Vec<ClassKey>,
    /// One address of each class (None for the default class), to evaluate it.
    pub representatives: Vec<Option<IpAddr>>,
}

/// Services whose selection can run for `svc`'s clients: itself and its nested descendants.
pub fn reachable_services(cfg: &Config, svc: usize) -> Vec<usize> {
    let mut seen = vec![svc];
    let mut frontier = vec![(svc, 0usize)];
    while let Some((s, depth)) = frontier.pop() {
        if depth >= MAX_NESTING_DEPTH {
            continue;
        }
        for b in &cfg.services[s].backends {
            if let Some(c) = b.nested().and_then(|n| cfg.service_index(&n.service)) {
                if !seen.contains(&c) {
                    seen.push(c);
                    frontier.push((c, depth + 1));
                }
            }
        }
    }
    seen
}

/// Builds the prefix map of a service.
pub fn compile_classes(cfg: &Config, svc: usize) -> ClassMap {
    let services = reachable_services(cfg, svc);
    let method = |s: usize| cfg.services[s].tm().map(|t| t.method);
    let uses = |m: TmMethod| services.iter().any(|&s| method(s) == Some(m));
    let (use_latency, use_geo) = (uses(TmMethod::Performance), uses(TmMethod::Geographic));
    let subnet_services: Vec<usize> =
        services.iter().copied().filter(|&s| method(s) == Some(TmMethod::Subnet)).collect();
    // Per SUBNET service: (endpoint, range) of every endpoint, disabled ones included so the
    // map does not depend on administrative state.
    let subnet_ranges: Vec<(usize, Vec<(usize, AddrRange)>)> = subnet_services
        .iter()
        .map(|&s| {
            let ranges = cfg.services[s]
                .backends
                .iter()
                .enumerate()
                .flat_map(|(e, b)| b.tm().into_iter().flat_map(move |t| t.subnets.iter().map(move |r| (e, *r))))
                .collect();
            (s, ranges)
        })
        .collect();

    // Every input as an integer interval per family.
    let mut inputs: Vec<AddrRange> = Vec::new();
    if use_latency {
        inputs.extend(cfg.latency.iter().flat_map(|e| e.client_prefixes.iter().map(AddrRange::of_net)));
    }
    if use_geo {
        inputs.extend(cfg.geo.iter().flat_map(|e| e.client_prefixes.iter().map(AddrRange::of_net)));
        // The database's networks: where a `[[geo]]` prefix covers one, `geo_of` gives the
        // prefix's region, so the prefixes win.
        if let Some(db) = &cfg.geoip {
            inputs.extend(db.networks.iter().map(|(net, _)| AddrRange::of_net(net)));
        }
    }
    for (_, ranges) in &subnet_ranges {
        inputs.extend(ranges.iter().map(|(_, r)| *r));
    }

    let key_of = |addr: IpAddr| ClassKey {
        latency: if use_latency { latency_entry(cfg, addr) } else { None },
        geo: if use_geo { geo_of(cfg, addr).map(|(region, _)| region) } else { None },
        subnets: subnet_ranges
            .iter()
            .map(|(s, ranges)| (*s, ranges.iter().find(|(_, r)| r.contains(addr)).map(|(e, _)| *e)))
            .collect(),
    };
    let default_key =
        ClassKey { latency: None, geo: None, subnets: subnet_services.iter().map(|&s| (s, None)).collect() };

    let mut map = ClassMap { prefixes: Vec::new(), classes: vec![default_key.clone()], representatives: vec![None] };
    let mut ids: HashMap<ClassKey, usize> = HashMap::new();
    for family in [Family::V4, Family::V6] {
        // Elementary intervals: between consecutive boundaries nothing changes.
        let mut bounds: BTreeSet<u128> = BTreeSet::new();
        for r in inputs.iter().filter(|r| r.family() == family) {
            bounds.insert(to_int(r.first));
            if to_int(r.last) < family.max() {
                bounds.insert(to_int(r.last) + 1);
            }
        }
        let starts: Vec<u128> = bounds.into_iter().collect();
        // Runs of adjacent intervals with the same class: (first, last, class).
        let mut runs: Vec<(u128, u128, usize)> = Vec::new();
        for (i, &first) in starts.iter().enumerate() {
            let last = starts.get(i + 1).map(|n| n - 1).unwrap_or(family.max());
            let addr = from_int(family, first);
            let key = key_of(addr);
            if key == default_key {
                continue;
            }
            let id = *ids.entry(key.clone()).or_insert_with(|| {
                map.classes.push(key);
                map.representatives.push(Some(addr));
                map.classes.len() - 1
            });
            match runs.last_mut() {
                Some((_, run_last, run_id)) if *run_id == id && *run_last + 1 == first => *run_last = last,
                _ => runs.push((first, last, id)),
            }
        }
        for (first, last, id) in runs {
            map.prefixes.extend(int_range_to_cidrs(family, first, last).into_iter().map(|n| (n, id)));
        }
    }
    map
}

/// One class with its current eligible set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmClass {
    pub id: usize,
    /// Empty = packets of this class are dropped and counted as unroutable.
    pub eligible: Vec<EligibleBackend>,
    pub reason: String,
}

/// Everything the data plane needs for one Traffic Manager service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TmServicePlan {
    pub service: usize,
    pub method: TmMethod,
    /// Disjoint source prefixes -> class id (load into the LPM trie like zone prefixes).
    pub prefixes: Vec<(IpNet, usize)>,
    /// Indexed by class id; `classes[DEFAULT_CLASS]` serves sources matching no prefix.
    pub classes: Vec<TmClass>,
}

impl TmServicePlan {
    /// Human-readable lines for `lb plan`: one per prefix, then one per class.
    pub fn render(&self, cfg: &Config) -> Vec<String> {
        let svc = &cfg.services[self.service];
        let mut lines = vec![format!("service {} ({})", svc.name, self.method)];
        for (net, id) in &self.prefixes {
            lines.push(format!("  client {net} -> class {id}"));
        }
        for class in &self.classes {
            let set: Vec<String> = class
                .eligible
                .iter()
                .map(|b| {
                    let owner = &cfg.services[b.service];
                    format!("{}/{} x{}", owner.name, owner.backends[b.backend].label(), b.weight)
                })
                .collect();
            let which =
                if class.id == DEFAULT_CLASS { "default class".to_string() } else { format!("class {}", class.id) };
            let target =
                if set.is_empty() { "{} drop (unroutable)".to_string() } else { format!("{{{}}}", set.join(", ")) };
            lines.push(format!("  {which}: {target} -- {}", class.reason));
        }
        lines
    }

    /// The class of a source address (a linear LPM, for tests and `lb plan`).
    pub fn class_of(&self, addr: IpAddr) -> usize {
        self.prefixes
            .iter()
            .filter(|(n, _)| n.contains(&addr))
            .max_by_key(|(n, _)| n.prefix_len())
            .map(|(_, id)| *id)
            .unwrap_or(DEFAULT_CLASS)
    }
}

/// Compiles service `svc` (a Traffic Manager method) for the data plane under the given probe
/// results.
pub fn compile_service(cfg: &Config, svc: usize, probes: &ProbeStatuses) -> TmServicePlan {
    let map = compile_classes(cfg, svc);
    let st = Statuses::new(cfg, probes);
    let classes = map
        .classes
        .iter()
        .zip(&map.representatives)
        .enumerate()
        .map(|(id, (key, rep))| {
            let client = Client {
                addr: *rep,
                latency: key.latency.map(|i| cfg.latency[i].regions.clone()).unwrap_or_default(),
                geo: key.geo.clone(),
            };
            let e = eligible(&st, svc, &client);
            TmClass { id, eligible: e.backends, reason: e.reason }
        })
        .collect();
    let method = cfg.services[svc].tm().map(|t| t.method).expect("compile_service: a Traffic Manager service");
    TmServicePlan { service: svc, method, prefixes: map.prefixes, classes }
}
