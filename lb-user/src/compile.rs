//! Compiles a validated configuration plus the backends' health into what the data plane
//! executes: service keys and flags, backend records, client-class prefixes and one Maglev
//! table per (service, client class).
//!
//! Pure: no BPF here. `dataplane` writes the result; `policy` and `maglev` decide its content.
//! Ids are handed out by [`Ids`], which keeps them stable across reloads (a tracked flow stores
//! a backend id; renumbering would silently move established connections).

use crate::config::{Config, Service};
use crate::maglev::{self, MaglevBackend};
use crate::model::{Forwarding, Persistence, Protocol, SessionAffinity, TrackingMode};
use crate::model::MonitorStatus;
use crate::policy::{self, ServicePlan};
use crate::tm::{self, ProbeStatuses, Statuses, TmServicePlan};
use ipnet::IpNet;
use lb_common::maps::{
    addr_words, backend_flags, forwarding, service_flags, table_flags, tracking, Backend, ServiceInfo, ServiceKey,
    CLASS_NONE, PROTO_ANY, PROTO_TCP, PROTO_UDP,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::net::IpAddr;

/// Stable ids for services (by name) and backends (by service name and address).
#[derive(Clone, Debug, Default)]
pub struct Ids {
    services: BTreeMap<String, u32>,
    backends: BTreeMap<(String, IpAddr), u32>,
    /// Generation of each backend id's current holder (`Backend::generation`): bumped when the
    /// id is handed to another backend, kept after the id is freed.
    generations: BTreeMap<u32, u16>,
}

/// Serializable form of [`Ids`] (JSON maps need string keys).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IdsSnapshot {
    pub services: Vec<(String, u32)>,
    pub backends: Vec<(String, IpAddr, u32)>,
    /// Absent in an older daemon's state: every id is then at generation 0, as its backend
    /// records and connection-table entries are.
    #[serde(default)]
    pub generations: Vec<(u32, u16)>,
}

impl Ids {
    pub fn snapshot(&self) -> IdsSnapshot {
        IdsSnapshot {
            services: self.services.iter().map(|(n, i)| (n.clone(), *i)).collect(),
            backends: self.backends.iter().map(|((s, a), i)| (s.clone(), *a, *i)).collect(),
            generations: self.generations.iter().map(|(i, g)| (*i, *g)).collect(),
        }
    }

    pub fn from_snapshot(s: &IdsSnapshot) -> Self {
        Self {
            services: s.services.iter().cloned().collect(),
            backends: s.backends.iter().map(|(svc, a, i)| ((svc.clone(), *a), *i)).collect(),
            generations: s.generations.iter().copied().collect(),
        }
    }

    fn service(&mut self, name: &str) -> u32 {
        if let Some(id) = self.services.get(name) {
            return *id;
        }
        let id = first_free(self.services.len() as u32, self.services.values());
        self.services.insert(name.to_owned(), id);
        id
    }

    fn backend(&mut self, service: &str, addr: IpAddr) -> u32 {
        let next = self.backends.len() as u32;
        let key = (service.to_owned(), addr);
        if let Some(id) = self.backends.get(&key) {
            return *id;
        }
        let id = first_free(next, self.backends.values());
        self.backends.insert(key, id);
        let generation = self.generations.entry(id).or_insert(0);
        *generation = generation.wrapping_add(1);
        id
    }

    /// Adds what `other` (a copy of these ids that handed out more) has and these lack: its
    /// new services and backends, with the generations it reached.
    pub fn absorb(&mut self, other: &Ids) {
        for (name, id) in &other.services {
            self.services.entry(name.clone()).or_insert(*id);
        }
        for (key, id) in &other.backends {
            self.backends.entry(key.clone()).or_insert(*id);
        }
        self.generations.extend(other.generations.iter().map(|(i, g)| (*i, *g)));
    }

    /// Every backend's (service, address) and id.
    pub fn backends(&self) -> impl Iterator<Item = (&(String, IpAddr), u32)> {
        self.backends.iter().map(|(k, id)| (k, *id))
    }

    /// The (service, address) that holds backend id `id`.
    pub fn owner_of(&self, id: u32) -> Option<(&str, IpAddr)> {
        self.backends.iter().find(|(_, i)| **i == id).map(|((s, a), _)| (s.as_str(), *a))
    }

    /// The generation of the backend that holds `id` (0 for an id never handed out here).
    pub fn backend_generation(&self, id: u32) -> u16 {
        self.generations.get(&id).copied().unwrap_or(0)
    }

    /// Forget ids of services and backends that are no longer configured, except backends for
    /// which `keep(service, address)` holds (tracked flows may still point at their id).
    pub fn retain(&mut self, cfg: &Config, keep: &dyn Fn(&str, IpAddr) -> bool) {
        self.backends.retain(|(svc, addr), _| {
            keep(svc, *addr) || cfg.services.iter().any(|s| &s.name == svc && s.backends.iter().any(|b| &b.address == addr))
        });
        let backends = &self.backends;
        self.services.retain(|name, _| cfg.services.iter().any(|s| &s.name == name) || backends.keys().any(|(s, _)| s == name));
    }

    pub fn backend_id(&self, service: &str, addr: IpAddr) -> Option<u32> {
        self.backends.get(&(service.to_owned(), addr)).copied()
    }
}

/// The lowest id not in use (ids are dense so arrays stay small).
fn first_free<'a>(hint: u32, used: impl Iterator<Item = &'a u32>) -> u32 {
    let mut used: Vec<u32> = used.copied().collect();
    used.sort_unstable();
    if !used.contains(&hint) {
        return hint;
    }
    (0..).find(|i| used.binary_search(i).is_err()).unwrap_or(hint)
}

/// Everything the data plane needs for one service.
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledService {
    pub name: String,
    pub id: u32,
    pub keys: Vec<ServiceKey>,
    pub info: ServiceInfo,
    /// (client prefix, class id); sources matching none are class [`CLASS_NONE`].
    pub class_prefixes: Vec<(IpNet, u32)>,
    /// One table per class id (index = class id), entries are backend ids.
    pub tables: Vec<ClassTable>,
    /// Backend ids and addresses in config order.
    pub backend_ids: Vec<u32>,
    pub backend_addrs: Vec<IpAddr>,
    /// The zonal policy's plan. For a Traffic Manager service it has no classes (see `tm`).
    pub plan: ServicePlan,
    /// A Traffic Manager service's classes with their eligible sets and reasons.
    pub tm: Option<TmServicePlan>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClassTable {
    pub class: u32,
    pub flags: u32,
    pub entries: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    pub services: Vec<CompiledService>,
    /// (backend id, record).
    pub backends: Vec<(u32, Backend)>,
    pub classes_per_service: u32,
}

/// Number of client classes per service the data plane must hold: "none" plus one per zone
/// for ZONAL services, and the class count of every Traffic Manager service (its prefix map
/// depends on the configuration only, so this does not change with health).
pub fn classes_per_service(cfg: &Config) -> u32 {
    let zonal = cfg.zones.len() as u32 + 1;
    let tm = (0..cfg.services.len())
        .filter(|&s| cfg.services[s].routing_method.is_traffic_manager())
        .map(|s| tm::compile_classes(cfg, s).classes.len() as u32)
        .max()
        .unwrap_or(0);
    zonal.max(tm)
}

/// Probe statuses implied by plain health verdicts: healthy = Online, unhealthy = Degraded
/// (what `lb plan --unhealthy` and callers without monitors mean).
pub fn probes_from_health(cfg: &Config, healthy: &dyn Fn(usize, usize) -> bool) -> ProbeStatuses {
    let mut probes = ProbeStatuses::new(cfg, MonitorStatus::Online);
    for (si, svc) in cfg.services.iter().enumerate() {
        for bi in 0..svc.backends.len() {
            if !healthy(si, bi) {
                probes.set_index(si, bi, MonitorStatus::Degraded);
            }
        }
    }
    probes
}

/// Class id of zone index `z`.
pub fn zone_class(z: usize) -> u32 {
    z as u32 + 1
}

/// Compile `cfg` with `healthy(service_index, backend_index)`; Traffic Manager endpoints are
/// Online when healthy and Degraded otherwise (see [`compile_with`]).
pub fn compile(cfg: &Config, healthy: &dyn Fn(usize, usize) -> bool, ids: &mut Ids) -> anyhow::Result<Compiled> {
    compile_with(cfg, healthy, &probes_from_health(cfg, healthy), ids)
}

/// Compile `cfg`: ZONAL services with `healthy(service_index, backend_index)`, Traffic Manager
/// services with the endpoints' monitor statuses `probes` (spec §2.2: endpoint Disabled,
/// nested and alwaysServe statuses are derived from the configuration on top of them).
pub fn compile_with(
    cfg: &Config,
    healthy: &dyn Fn(usize, usize) -> bool,
    probes: &ProbeStatuses,
    ids: &mut Ids,
) -> anyhow::Result<Compiled> {
    compile_cached(cfg, healthy, probes, ids, &mut TableCache::default())
}

/// Maglev tables already built, by (M, members): a table is rebuilt only when its eligible set
/// (or a weight) changed, and classes with the same set share one build. The controller keeps
/// one across reconciles, so a health change costs the tables it really changes.
#[derive(Debug, Default)]
pub struct TableCache {
    tables: HashMap<(u32, Vec<(Vec<u8>, u32)>), Arc<Vec<u32>>>,
    used: HashSet<(u32, Vec<(Vec<u8>, u32)>)>,
}

impl TableCache {
    fn build(&mut self, members: &[MaglevBackend], m: u32) -> Result<Arc<Vec<u32>>, maglev::MaglevError> {
        let key = (m, members.iter().map(|b| (b.key.to_vec(), b.weight)).collect::<Vec<_>>());
        self.used.insert(key.clone());
        if let Some(t) = self.tables.get(&key) {
            return Ok(t.clone());
        }
        let t = Arc::new(maglev::build_table(members, m)?);
        self.tables.insert(key, t.clone());
        Ok(t)
    }

    /// Forget the tables the last compile did not use.
    pub fn sweep(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.tables.retain(|k, _| used.contains(k));
    }
}

/// [`compile_with`], reusing and refreshing `cache`.
pub fn compile_cached(
    cfg: &Config,
    healthy: &dyn Fn(usize, usize) -> bool,
    probes: &ProbeStatuses,
    ids: &mut Ids,
    cache: &mut TableCache,
) -> anyhow::Result<Compiled> {
    let m = cfg.dataplane.maglev_table_size;
    let plans = policy::plan_config(cfg, healthy);
    let mut services = Vec::new();
    let mut backends = Vec::new();
    for (si, (svc, plan)) in cfg.services.iter().zip(plans).enumerate() {
        if svc.routing_method.is_traffic_manager() {
            let (compiled, records) = compile_tm(cfg, si, plan, probes, ids, cache)?;
            services.push(compiled);
            backends.extend(records);
            continue;
        }
        let id = ids.service(&svc.name);
        let backend_ids: Vec<u32> = svc.backends.iter().map(|b| ids.backend(&svc.name, b.address)).collect();
        for (bi, b) in svc.backends.iter().enumerate() {
            let zone_class = svc.backend_zone_index(cfg, b).map(zone_class).unwrap_or(CLASS_NONE) as u16;
            let mut flags = 0;
            if healthy(si, bi) {
                flags |= backend_flags::HEALTHY;
            }
            backends.push((
                backend_ids[bi],
                Backend {
                    addr: addr_words(b.address).0,
                    family: addr_words(b.address).1,
                    flags,
                    zone_class,
                    mac: b.mac.as_deref().and_then(parse_mac).unwrap_or_default(),
                    generation: ids.backend_generation(backend_ids[bi]),
                    ..Default::default()
                },
            ));
        }
        // Maglev identifies a backend by its address bytes, so a table does not depend on config
        // order and is identical on every host.
        let maglev_keys: Vec<Vec<u8>> = svc.backends.iter().map(|b| addr_bytes(b.address)).collect();
        let mut keys_to_tables = |class: u32, eligible: &[usize], zonal: bool| {
            let members: Vec<MaglevBackend> = eligible
                .iter()
                .map(|&bi| MaglevBackend { key: &maglev_keys[bi], weight: svc.backends[bi].weight })
                .collect();
            let picks = cache.build(&members, m).map_err(|e| anyhow::anyhow!("service {:?}: Maglev table: {e}", svc.name))?;
            let entries = picks.iter().map(|&i| if i == lb_common::maps::BACKEND_DROP { i } else { backend_ids[eligible[i as usize]] }).collect();
            let mut flags = if zonal { table_flags::ZONAL } else { 0 };
            if !eligible.iter().any(|&bi| healthy(si, bi)) {
                flags |= table_flags::NO_HEALTHY;
            }
            Ok::<_, anyhow::Error>(ClassTable { class, flags, entries })
        };
        let mut tables = Vec::new();
        for cp in &plan.classes {
            let class = cp.client_zone.map(zone_class).unwrap_or(CLASS_NONE);
            tables.push(keys_to_tables(class, &cp.eligible, cp.client_zone.is_some())?);
        }
        tables.sort_by_key(|t| t.class);
        let class_prefixes = cfg
            .zones
            .iter()
            .enumerate()
            .flat_map(|(z, zone)| zone.client_prefixes.iter().map(move |p| (*p, zone_class(z))))
            .collect();
        services.push(CompiledService {
            name: svc.name.clone(),
            id,
            keys: service_keys(svc),
            info: service_info(cfg, svc, id),
            class_prefixes,
            tables,
            backend_ids,
            backend_addrs: svc.backends.iter().map(|b| b.address).collect(),
            plan,
            tm: None,
        });
    }
    Ok(Compiled { services, backends, classes_per_service: classes_per_service(cfg) })
}

/// A Traffic Manager service: classes, prefixes and tables from `tm::compile_service`, and the
/// records of its own (non-nested) endpoints. A nested endpoint's set holds its child's leaf
/// backends, whose ids are the child's own ((child service, address) in [`Ids`]): one record
/// per real endpoint, whichever services route to it.
fn compile_tm(
    cfg: &Config,
    si: usize,
    mut plan: ServicePlan,
    probes: &ProbeStatuses,
    ids: &mut Ids,
    cache: &mut TableCache,
) -> anyhow::Result<(CompiledService, Vec<(u32, Backend)>)> {
    let svc = &cfg.services[si];
    let m = cfg.dataplane.maglev_table_size;
    let id = ids.service(&svc.name);
    let st = Statuses::new(cfg, probes);
    // The HEALTHY flag (read by connection persistence) = routable without the all-degraded
    // rule: Online, CheckingEndpoint or Unmonitored.
    let routable = |s: usize, b: usize| tm::status::is_routable(st.endpoint_status(s, b));
    let mut records = Vec::new();
    let (mut backend_ids, mut backend_addrs) = (Vec::new(), Vec::new());
    for (bi, b) in svc.backends.iter().enumerate() {
        if b.is_nested() {
            continue;
        }
        let bid = ids.backend(&svc.name, b.address);
        backend_ids.push(bid);
        backend_addrs.push(b.address);
        let (addr, family) = addr_words(b.address);
        records.push((
            bid,
            Backend {
                addr,
                family,
                flags: if routable(si, bi) { backend_flags::HEALTHY } else { 0 },
                zone_class: CLASS_NONE as u16,
                mac: b.mac.as_deref().and_then(parse_mac).unwrap_or_default(),
                generation: ids.backend_generation(bid),
                ..Default::default()
            },
        ));
    }
    let tm_plan = tm::compile_service(cfg, si, probes);
    let mut tables = Vec::new();
    for class in &tm_plan.classes {
        let keys: Vec<Vec<u8>> = class.eligible.iter().map(|e| addr_bytes(e.address)).collect();
        let members: Vec<MaglevBackend> = class
            .eligible
            .iter()
            .zip(&keys)
            .map(|(e, key)| MaglevBackend { key, weight: e.weight })
            .collect();
        let member_ids: Vec<u32> =
            class.eligible.iter().map(|e| ids.backend(&cfg.services[e.service].name, e.address)).collect();
        let picks = cache
            .build(&members, m)
            .map_err(|e| anyhow::anyhow!("service {:?}: Maglev table of class {}: {e}", svc.name, class.id))?;
        let entries =
            picks.iter().map(|&i| if i == lb_common::maps::BACKEND_DROP { i } else { member_ids[i as usize] }).collect();
        let mut flags = 0;
        if class.eligible.is_empty() {
            flags |= table_flags::UNROUTABLE | table_flags::NO_HEALTHY;
        } else if !class.eligible.iter().any(|e| routable(e.service, e.backend)) {
            // The all-degraded rule (§2.2) picked Degraded endpoints: like E-2, tracked flows
            // to unhealthy backends are kept rather than re-hashed onto equally bad ones.
            flags |= table_flags::NO_HEALTHY;
        }
        tables.push(ClassTable { class: class.id as u32, flags, entries });
    }
    // The zonal view does not apply: no zone classes for status/explain to misread.
    plan.classes.clear();
    let compiled = CompiledService {
        name: svc.name.clone(),
        id,
        keys: service_keys(svc),
        info: service_info(cfg, svc, id),
        class_prefixes: tm_plan.prefixes.iter().map(|(net, c)| (*net, *c as u32)).collect(),
        tables,
        backend_ids,
        backend_addrs,
        plan,
        tm: Some(tm_plan),
    };
    Ok((compiled, records))
}

fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

pub fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        return None;
    }
    let mut mac = [0u8; 6];
    for (i, p) in parts.iter().enumerate() {
        if p.len() != 2 {
            return None;
        }
        mac[i] = u8::from_str_radix(p, 16).ok()?;
    }
    Some(mac)
}

/// Service keys and client-class prefixes a configuration installs in the data plane (its
/// sizing must hold them: `daemon::sizes_for`).
pub fn installed_counts(cfg: &Config) -> (u32, u32) {
    let keys = cfg.services.iter().map(|s| service_keys(s).len() as u32).sum();
    // Every zonal-affinity (non-Traffic Manager) service installs every zone's prefixes.
    let zone_prefixes: u32 = cfg.zones.iter().map(|z| z.client_prefixes.len() as u32).sum();
    let prefixes = (0..cfg.services.len())
        .map(|s| {
            if cfg.services[s].routing_method.is_traffic_manager() {
                tm::compile_classes(cfg, s).prefixes.len() as u32
            } else {
                zone_prefixes
            }
        })
        .sum();
    (keys, prefixes)
}

fn service_keys(svc: &Service) -> Vec<ServiceKey> {
    let proto = match svc.protocol {
        Protocol::Tcp => PROTO_TCP,
        Protocol::Udp => PROTO_UDP,
        Protocol::L3Default => PROTO_ANY,
    };
    let ports: Vec<u16> = if svc.ports.is_empty() { vec![0] } else { svc.ports.clone() };
    ports
        .into_iter()
        .map(|p| ServiceKey { addr: addr_words(svc.vip).0, port: p.to_be(), proto, family: addr_words(svc.vip).1 })
        .collect()
}

fn service_info(cfg: &Config, svc: &Service, id: u32) -> ServiceInfo {
    let ct = &svc.connection_tracking;
    let affinity = match svc.session_affinity {
        SessionAffinity::None => lb_common::maps::affinity::NONE,
        SessionAffinity::ClientIpPortProto => lb_common::maps::affinity::CLIENT_IP_PORT_PROTO,
        SessionAffinity::ClientIpProto => lb_common::maps::affinity::CLIENT_IP_PROTO,
        SessionAffinity::ClientIp => lb_common::maps::affinity::CLIENT_IP,
        SessionAffinity::ClientIpNoDestination => lb_common::maps::affinity::CLIENT_IP_NO_DESTINATION,
    };
    let tracking = match ct.tracking_mode {
        TrackingMode::PerConnection => tracking::PER_CONNECTION,
        TrackingMode::PerSession => tracking::PER_SESSION,
    };
    let persistence = match ct.connection_persistence_on_unhealthy_backends {
        Persistence::DefaultForProtocol => lb_common::maps::persistence::DEFAULT_FOR_PROTOCOL,
        Persistence::NeverPersist => lb_common::maps::persistence::NEVER_PERSIST,
        Persistence::AlwaysPersist => lb_common::maps::persistence::ALWAYS_PERSIST,
    };
    // Validation rejects the one invalid combination (ALWAYS_PERSIST + PER_SESSION).
    let mut flags = lb_common::decide::persistence_flags(persistence, tracking, affinity).unwrap_or(0);
    if svc.failover_policy.as_ref().is_some_and(|f| f.disable_connection_drain_on_failover) {
        flags |= service_flags::FLUSH_ON_POOL_CHANGE;
    }
    let encap = if svc.vip.is_ipv4() { cfg.dataplane.encap_source_v4 } else { cfg.dataplane.encap_source_v6 };
    let (encap_src, encap_src_hash_mask) = match encap {
        Some(net) => {
            let host_bits = (net.max_prefix_len() - net.prefix_len()).min(32) as u32;
            let mask = if host_bits == 0 { 0 } else { u32::MAX >> (32 - host_bits) };
            (addr_words(net.network()).0, mask)
        }
        None => ([0; 4], 0),
    };
    ServiceInfo {
        id,
        affinity,
        tracking,
        forwarding: match svc.forwarding {
            Forwarding::Ipip => forwarding::IPIP,
            Forwarding::L2Dsr => forwarding::L2_DSR,
        },
        flags,
        idle_timeout_ns: svc.idle_timeout_sec() as u64 * 1_000_000_000,
        pool_gen: 0,
        encap_src_hash_mask,
        encap_src,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = r#"
        [dataplane]
        maglev_table_size = 251
        [[geo]]
        client_prefixes = ["198.18.1.0/24"]
        region = "IE"
        [[service]]
        name = "parent"
        vip = "198.18.0.1"
        protocol = "TCP"
        routing_method = "PRIORITY"
        [[service.backend]]
        target_service = "child"
        [[service]]
        name = "child"
        vip = "198.18.0.2"
        protocol = "TCP"
        routing_method = "GEOGRAPHIC"
        [[service.backend]]
        address = "198.18.13.1"
        geo_mapping = ["IE"]
    "#;

    #[test]
    fn tm_tables_use_the_leaf_owner_ids_and_flag_unroutable_classes() {
        let cfg = Config::parse(CFG).unwrap();
        let mut ids = Ids::default();
        let c = compile(&cfg, &|_, _| true, &mut ids).unwrap();
        let leaf = ids.backend_id("child", "198.18.13.1".parse().unwrap()).unwrap();
        assert_eq!(c.backends.len(), 1, "one record per real endpoint; nested endpoints have none");
        for svc in &c.services {
            assert_eq!(svc.class_prefixes, vec![("198.18.1.0/24".parse().unwrap(), 1)], "{}", svc.name);
            let ie = &svc.tables[1];
            assert!(ie.entries.iter().all(|&e| e == leaf), "{}: IE class -> the child's backend id", svc.name);
            assert_eq!(ie.flags, 0, "not ZONAL, healthy");
            let none = &svc.tables[0];
            assert!(none.entries.iter().all(|&e| e == lb_common::maps::BACKEND_DROP));
            assert_eq!(none.flags & table_flags::UNROUTABLE, table_flags::UNROUTABLE, "{}: NODATA class", svc.name);
        }
        assert_eq!(c.classes_per_service, 2);
        // Degraded (the only mapping): still served, but flagged NO_HEALTHY.
        let c = compile(&cfg, &|_, _| false, &mut ids).unwrap();
        assert_eq!(c.services[1].tables[1].flags, table_flags::NO_HEALTHY);
        assert_eq!(c.backends[0].1.flags & backend_flags::HEALTHY, 0);
    }
}
