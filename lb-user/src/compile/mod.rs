//! Compiles a validated configuration plus the backends' health into what the data plane
//! executes: service keys and flags, backend records, client-class prefixes and one Maglev
//! table per (service, client class).
//!
//! Pure: no BPF here. `dataplane` writes the result; `policy` and `maglev` decide its content.
//! Ids are handed out by [`Ids`], which keeps them stable across reloads (a tracked flow stores
//! a backend id; renumbering would silently move established connections).

pub mod cache;
pub mod explain;
pub mod ids;
pub mod maglev;
pub mod sizes;

use crate::config::{Config, Service};
use crate::dataplane::{Demand, ServiceDemand};
use crate::model::MonitorStatus;
use crate::model::{Forwarding, Persistence, Protocol, SessionAffinity, TrackingMode};
use crate::policy::tm::ProbeStatuses;
use crate::policy::{self, ServicePlan};
pub use cache::TableCache;
pub use ids::{Ids, IdsSnapshot};
use ipnet::IpNet;
use lb_common::maps::{
    addr_words, backend_flags, forwarding, service_flags, table_flags, tracking, Backend, ForwardParams, ServiceInfo,
    ServiceKey, FAMILY_NEXT_HOP, NEXT_HOP_UNTOUCHED, PROTO_ANY, PROTO_TCP, PROTO_UDP,
};
use maglev::MaglevBackend;
use std::net::IpAddr;

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
    /// The policy's plan the tables come from (zonal or Traffic Manager), with its reasons.
    pub plan: ServicePlan,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ClassTable {
    pub class: u32,
    pub flags: u32,
    /// Shared by the classes with the same members (see [`TableCache::build_entries`]).
    pub entries: std::sync::Arc<Vec<u32>>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    pub services: Vec<CompiledService>,
    /// (backend id, record).
    pub backends: Vec<(u32, Backend)>,
    pub classes_per_service: u32,
    /// (destination prefix, next-hop route) for `NEXT_HOP_ROUTES`, sorted; empty without
    /// next-hop services ([`next_hop_routes`]).
    pub next_hop_routes: Vec<(IpNet, u32)>,
}

/// The (service id, class) tables of `new` that differ from `old`'s, in the order a reconcile
/// writes them.
pub fn tables_to_write<'a>(
    old: Option<&'a Compiled>,
    new: &'a Compiled,
) -> impl Iterator<Item = (&'a CompiledService, &'a ClassTable)> {
    new.services.iter().flat_map(move |svc| {
        let prev = old.and_then(|o| o.services.iter().find(|p| p.name == svc.name));
        svc.tables
            .iter()
            .filter(move |t| !prev.is_some_and(|p| p.tables.iter().any(|pt| pt == *t)))
            .map(move |t| (svc, t))
    })
}

impl Compiled {
    /// What this state occupies in the data plane, with the tables written to reach it from
    /// `old` (what was written before; None: everything is written).
    pub fn demand<'a>(&'a self, old: Option<&'a Compiled>) -> Demand<'a> {
        Demand {
            services: self
                .services
                .iter()
                .map(|s| ServiceDemand {
                    name: &s.name,
                    id: s.id,
                    keys: &s.keys,
                    info: &s.info,
                    class_prefixes: &s.class_prefixes,
                    classes: s.tables.iter().map(|t| t.class).collect(),
                })
                .collect(),
            backends: self.backends.iter().map(|(id, _)| *id).collect(),
            table_writes: tables_to_write(old, self).map(|(s, t)| (s.id, t.class)).collect(),
        }
    }
}

/// Number of client classes per service the data plane must hold: "none" plus one per zone
/// for ZONAL services, and the class count of every Traffic Manager service (its prefix map
/// depends on the configuration only, so this does not change with health).
pub fn classes_per_service(cfg: &Config) -> u32 {
    let zonal = cfg.zones.len() as u32 + 1;
    (0..cfg.services.len()).map(|s| policy::class_layout(cfg, s).0).fold(zonal, u32::max)
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

pub use policy::zone_class;

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

/// [`compile_with`], reusing and refreshing `cache`.
pub fn compile_cached(
    cfg: &Config,
    healthy: &dyn Fn(usize, usize) -> bool,
    probes: &ProbeStatuses,
    ids: &mut Ids,
    cache: &mut TableCache,
) -> anyhow::Result<Compiled> {
    let m = cfg.dataplane.maglev_table_size;
    let mut services = Vec::new();
    let mut backends = Vec::new();
    for (si, svc) in cfg.services.iter().enumerate() {
        let routed = policy::route_service(cfg, si, healthy, probes);
        let id = ids.service(&svc.name);
        let (mut backend_ids, mut backend_addrs) = (Vec::new(), Vec::new());
        for ep in &routed.endpoints {
            let b = &svc.backends[ep.backend];
            // One record per address: an endpoint given by DNS name has one per resolved
            // address (a nested one has none: `Routed::endpoints`).
            for &address in b.addresses() {
                let bid = ids.backend(&svc.name, address);
                backend_ids.push(bid);
                backend_addrs.push(address);
                let (addr, family) = addr_words(address);
                backends.push((
                    bid,
                    Backend {
                        addr,
                        family,
                        flags: if ep.healthy { backend_flags::HEALTHY } else { 0 },
                        zone_class: ep.zone_class as u16,
                        mac: b.mac.unwrap_or_default().0,
                        generation: ids.backend_generation(bid),
                        ..Default::default()
                    },
                ));
            }
        }
        // A member's id is its owner's ((service, address) in [`Ids`]): a nested Traffic
        // Manager endpoint's set holds its child's leaf backends, one record per real endpoint,
        // whichever services route to it.
        let mut tables = Vec::new();
        for class in &routed.classes {
            tables.push(class_table(cfg, class, ids, cache, m).map_err(|e| match routed.plan {
                ServicePlan::Zonal(_) => anyhow::anyhow!("service {:?}: Maglev table: {e}", svc.name),
                ServicePlan::TrafficManager(_) => {
                    anyhow::anyhow!("service {:?}: Maglev table of class {}: {e}", svc.name, class.class)
                }
            })?);
        }
        services.push(CompiledService {
            name: svc.name.clone(),
            id,
            keys: service_keys(svc, id),
            info: service_info(cfg, svc, id),
            class_prefixes: routed.prefixes,
            tables,
            backend_ids,
            backend_addrs,
            plan: routed.plan,
        });
    }
    let next_hop_routes = next_hop_routes(cfg, &services);
    Ok(Compiled { services, backends, classes_per_service: classes_per_service(cfg), next_hop_routes })
}

/// The Maglev table of one class. Maglev identifies a backend by its address bytes, so a table
/// does not depend on config order and is identical on every host.
fn class_table(
    cfg: &Config,
    class: &policy::RoutedClass,
    ids: &mut Ids,
    cache: &mut TableCache,
    m: u32,
) -> Result<ClassTable, maglev::MaglevError> {
    let keys: Vec<Vec<u8>> = class.members.iter().map(|e| addr_bytes(e.address)).collect();
    let members: Vec<MaglevBackend> =
        class.members.iter().zip(&keys).map(|(e, key)| MaglevBackend { key, weight: e.weight }).collect();
    let member_ids: Vec<u32> =
        class.members.iter().map(|e| ids.backend(&cfg.services[e.service].name, e.address)).collect();
    let entries = cache.build_entries(&members, &member_ids, m)?;
    let mut flags = if class.zonal { table_flags::ZONAL } else { 0 };
    if class.unroutable {
        flags |= table_flags::UNROUTABLE;
    }
    if !class.members.iter().any(|e| e.healthy) {
        // Like E-2, tracked flows to unhealthy backends are kept rather than re-hashed onto
        // equally bad ones (Traffic Manager: the all-degraded rule picked Degraded endpoints).
        flags |= table_flags::NO_HEALTHY;
    }
    Ok(ClassTable { class: class.class, flags, entries })
}

fn addr_bytes(addr: IpAddr) -> Vec<u8> {
    match addr {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    }
}

/// Service keys and client-class prefixes a configuration installs in the data plane (its
/// sizing must hold them: `sizes::sizes_for`).
pub fn installed_counts(cfg: &Config) -> (u32, u32) {
    let keys = cfg.services.iter().map(|s| service_keys(s, 0).len() as u32).sum();
    // Every zonal-affinity service installs every zone's prefixes.
    let prefixes = (0..cfg.services.len()).map(|s| policy::class_layout(cfg, s).1).sum();
    (keys, prefixes)
}

/// The ifindexes a next-hop service is limited to (`ForwardParams::ingress`), looked up on this
/// host now. A name no interface has gets an ifindex none has (`u32::MAX`): the service then
/// takes nothing from it (fail closed), and `lb run` refuses such a name at start and reload
/// (`config::host`). An interface created again later has another ifindex: a reload picks it up.
fn ingress_of(svc: &Service) -> [u32; lb_common::maps::MAX_NEXT_HOP_INTERFACES] {
    let mut ingress = [0; lb_common::maps::MAX_NEXT_HOP_INTERFACES];
    let names = svc.next_hop().map(|n| n.interfaces.as_slice()).unwrap_or_default();
    for (slot, name) in ingress.iter_mut().zip(names) {
        let index = std::ffi::CString::new(name.as_str())
            // SAFETY: a NUL-terminated name, only read.
            .map(|c| unsafe { libc::if_nametoindex(c.as_ptr()) })
            .unwrap_or(0);
        *slot = if index == 0 { u32::MAX } else { index };
    }
    ingress
}

/// The next-hop route of the next-hop service `id`: `id + 1`, as route 0 is
/// `NEXT_HOP_UNTOUCHED`.
pub fn next_hop_route(id: u32) -> u32 {
    id + 1
}

fn service_keys(svc: &Service, id: u32) -> Vec<ServiceKey> {
    let proto = match svc.protocol {
        Protocol::Tcp => PROTO_TCP,
        Protocol::Udp => PROTO_UDP,
        Protocol::L3Default => PROTO_ANY,
    };
    let (addr, family) = match svc.vip() {
        Some(vip) => addr_words(vip),
        // Every port (validated: no `ports`), under the route the destinations map to.
        None => ([next_hop_route(id), 0, 0, 0], FAMILY_NEXT_HOP),
    };
    let ports: Vec<u16> = if svc.ports.is_empty() { vec![0] } else { svc.ports.clone() };
    ports.into_iter().map(|p| ServiceKey { addr, port: p.to_be(), proto, family }).collect()
}

/// The next-hop routes a configuration installs: each next-hop service's destinations to its
/// route and, when there are any, every VIP exempted (`NEXT_HOP_UNTOUCHED`): a VIP service wins
/// over a routed prefix, and a packet to one of its VIP's other ports passes to the host as it
/// does without next hops. The host's own addresses are exempted by the controller, which
/// knows them (`Controller::set_local_addresses`).
fn next_hop_routes(cfg: &Config, services: &[CompiledService]) -> Vec<(IpNet, u32)> {
    let mut routes: Vec<(IpNet, u32)> = Vec::new();
    for (svc, compiled) in cfg.services.iter().zip(services) {
        if let Some(next_hop) = svc.next_hop() {
            routes.extend(next_hop.destinations.iter().map(|d| (d.trunc(), next_hop_route(compiled.id))));
        }
    }
    if !routes.is_empty() {
        routes.extend(cfg.services.iter().filter_map(|s| s.vip()).map(|v| (IpNet::from(v), NEXT_HOP_UNTOUCHED)));
    }
    routes.sort();
    routes.dedup_by_key(|(net, _)| *net);
    routes
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
    if svc.zonal().and_then(|z| z.failover_policy.as_ref()).is_some_and(|f| f.disable_connection_drain_on_failover) {
        flags |= service_flags::FLUSH_ON_POOL_CHANGE;
    }
    if let Some(next_hop) = svc.next_hop() {
        flags |= service_flags::NEXT_HOP;
        if next_hop.symmetric {
            flags |= service_flags::SYMMETRIC;
        }
    }
    let encap = match svc.vip() {
        Some(IpAddr::V4(_)) => cfg.dataplane.encap_source_v4,
        Some(IpAddr::V6(_)) => cfg.dataplane.encap_source_v6,
        // A next hop forwards by L2 rewrite: no outer header.
        None => None,
    };
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
        // Neither IPIP nor L2 DSR has parameters beyond the outer source; a next hop may be
        // limited to interfaces.
        forward_params: ForwardParams { ingress: ingress_of(svc), ..Default::default() },
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
