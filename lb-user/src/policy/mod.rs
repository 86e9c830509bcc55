//! Backend-selection policy: for every service and every client class, the set of backends a new
//! connection may be hashed onto, and why (spec §1.2 and §1.5). Pure Rust, no BPF, no I/O.
//!
//! The computation has two stages, one submodule each:
//!
//! 1. [`eligible`] — step 2.1, the service-wide decision table E-1..E-9 (health, failover
//!    policy). Its result, [`BaseSet`], does not depend on the client.
//! 2. A *class router* turns the base set into client classes. The class router is chosen per
//!    service by [`Routing::of`]: [`Routing::Zonal`] ([`zonal`], step 2.2: one
//!    class per configured zone plus the non-compatible class) or
//!    [`Routing::TrafficManager`] ([`tm`], spec §2: classes of disjoint client prefixes from
//!    the service's subnet, latency and geo inputs).
//!
//! Whatever the method, [`route_service`] hands `compile` one shape, [`Routed`]: client
//! prefixes -> class id, and per class its eligible members. That is exactly what the data
//! plane consumes (`CLIENT_CLASS` LPM -> class id -> Maglev table); [`class_layout`] is its
//! configuration-only size. A new routing method adds a variant and a match arm in each.
//!
//! Weights are not applied here: `eligible` is a set, Maglev weighs its members later.

pub mod eligible;
pub mod tm;
pub mod zonal;

use crate::config::{Config, Service, ServiceKind};
use crate::model::{Spillover, TmMethod};
use ipnet::IpNet;
use std::net::IpAddr;

pub use eligible::{base_set, BaseSet, Rule};

/// What the policy needs to know about one configured backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackendState {
    /// Index into `Config::zones`; `None` = the backend is in no client zone.
    pub zone: Option<usize>,
    /// Failover backend. Only meaningful when the service has a failover policy; without one
    /// the flag is ignored (config validation rejects it anyway).
    pub failover: bool,
    pub healthy: bool,
}

/// `failoverPolicy` of a service (spec §1.2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FailoverParams {
    /// In [0, 1]; 0 = fail over only when no primary is healthy.
    pub failover_ratio: f64,
    pub drop_traffic_if_unhealthy: bool,
}

/// `zonalAffinity` of a service (spec §1.5).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZonalParams {
    pub spillover: Spillover,
    /// In [0, 1]; only meaningful with `SpillCrossZone`.
    pub spillover_ratio: f64,
}

/// How a service routes its clients: one variant per product.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Routing {
    /// Google Cloud's pipeline (spec §1): eligible set, failover, then one class per configured
    /// zone and the non-compatible class.
    Zonal(ZonalPolicy),
    /// Azure Traffic Manager (spec §2): the method's classes of client prefixes ([`tm`]).
    TrafficManager(TmMethod),
}

impl Routing {
    /// The routing of a configured service (the one place that reads it from the TOML structs).
    pub fn of(svc: &Service) -> Self {
        match &svc.kind {
            ServiceKind::TrafficManager(t) => Self::TrafficManager(t.method),
            ServiceKind::Zonal(z) => {
                let failover = z.failover_policy.as_ref().map(|fp| FailoverParams {
                    failover_ratio: fp.failover_ratio,
                    drop_traffic_if_unhealthy: fp.drop_traffic_if_unhealthy,
                });
                Self::Zonal(ZonalPolicy::new(failover, z.zonal_affinity.spillover, z.zonal_affinity.spillover_ratio))
            }
        }
    }
}

/// The selection-relevant part of a zonal service, independent of the TOML structs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ZonalPolicy {
    /// `None` = no failover policy configured.
    pub failover: Option<FailoverParams>,
    pub zonal: ZonalParams,
}

impl ZonalPolicy {
    pub fn new(failover: Option<FailoverParams>, spillover: Spillover, spillover_ratio: f64) -> Self {
        Self { failover, zonal: ZonalParams { spillover, spillover_ratio } }
    }
}

/// The original eligible set of §1.2, before any per-class refinement (on the wire as
/// [`EligibleKind::as_str`] spells it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EligibleKind {
    AllHealthy,
    AllBackends,
    HealthyPrimary,
    HealthyFailover,
    AllPrimary,
    /// E-8: no healthy backend and `dropTrafficIfUnhealthy`; new connections are dropped.
    Drop,
}

impl EligibleKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::AllHealthy => "ALL_HEALTHY",
            Self::AllBackends => "ALL_BACKENDS",
            Self::HealthyPrimary => "HEALTHY_PRIMARY",
            Self::HealthyFailover => "HEALTHY_FAILOVER",
            Self::AllPrimary => "ALL_PRIMARY",
            Self::Drop => "DROP",
        }
    }

    /// A set of healthy backends only (as opposed to a last-resort set or a drop). Only these
    /// may be refined by SPILL_CROSS_ZONE (§1.5).
    pub fn is_healthy_set(self) -> bool {
        matches!(self, Self::AllHealthy | Self::HealthyPrimary | Self::HealthyFailover)
    }
}

/// Which backends form the active pool. Needed by the data plane: with
/// `disableConnectionDrainOnFailover`, a pool change flushes the connection table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Pool {
    /// Primary backends (failback; also the drop state E-8, see [`Rule::pool`]).
    Primary,
    /// Failover backends.
    Failover,
    /// No failover policy: every backend.
    All,
}

impl Pool {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Primary => "PRIMARY",
            Self::Failover => "FAILOVER",
            Self::All => "ALL",
        }
    }

    /// Whether a backend belongs to this pool — also the "relevant kind" of the zonal match.
    pub fn contains(self, b: &BackendState) -> bool {
        match self {
            Self::Primary => !b.failover,
            Self::Failover => b.failover,
            Self::All => true,
        }
    }
}

/// What zonal affinity (or, later, another routing method) did for one client class.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ZonalOutcome {
    /// `ZONAL_AFFINITY_DISABLED`: the base set is used as is.
    Disabled,
    /// The client is outside every zone (VPN, Interconnect, other region): behaves as disabled.
    NotCompatible,
    /// The client's zone has no configured backend of the relevant kind: base set unchanged.
    NoZonalMatch,
    /// Eligible := the base set's members in the client zone.
    Refined,
    /// STAY_WITHIN_ZONE with no eligible backend in the zone: the zone's (unhealthy) backends of
    /// the relevant kind.
    Replaced,
    /// The gate held but the option keeps the base set (spill, or the set is dropped).
    Unchanged,
}

impl ZonalOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "DISABLED",
            Self::NotCompatible => "NOT_COMPATIBLE",
            Self::NoZonalMatch => "NO_ZONAL_MATCH",
            Self::Refined => "REFINED",
            Self::Replaced => "REPLACED",
            Self::Unchanged => "UNCHANGED",
        }
    }
}

/// The eligible set of one client class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassPlan {
    /// Index into `Config::zones`; `None` = the non-compatible class.
    pub client_zone: Option<usize>,
    pub outcome: ZonalOutcome,
    /// Indices into the service's backends, in config order. Empty = drop new connections.
    pub eligible: Vec<usize>,
    /// The ratio test of SPILL_CROSS_ZONE with a spillover ratio, when it decided the outcome.
    pub spill: Option<SpillArithmetic>,
}

/// The numbers of a SPILL_CROSS_ZONE ratio test (spec §1.2 step 2.2): r = healthy backends in
/// the client zone / configured backends of the active pool in the zone, refined iff r >= the
/// configured `spillover_ratio` (`lb plan` prints it, e.g. `3/5 = 0.60 < 0.80`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpillArithmetic {
    pub healthy_in_zone: usize,
    pub relevant_in_zone: usize,
}

/// The zonal pipeline's plan of one service (spec §1.2): the decision table's row and the
/// eligible set per client zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZonalPlan {
    pub kind: EligibleKind,
    /// The row of the §1.2 decision table that matched (the "why" of `kind`).
    pub rule: Rule,
    pub active_pool: Pool,
    /// One per client class: every zone in config order, then the non-compatible class.
    pub classes: Vec<ClassPlan>,
}

/// One service's plan, whichever product routes it: what `compile` turns into tables and what
/// status, `lb plan`, explain and metrics show.
#[derive(Clone, Debug, PartialEq)]
pub enum ServicePlan {
    /// Google Cloud's pipeline: eligible set, failover, zonal affinity.
    Zonal(ZonalPlan),
    /// A Traffic Manager routing method's classes of client prefixes (spec §2).
    TrafficManager(tm::TmServicePlan),
}

impl ServicePlan {
    /// The pool new connections go to; a Traffic Manager service has no failover pools.
    pub fn active_pool(&self) -> Pool {
        match self {
            Self::Zonal(z) => z.active_pool,
            Self::TrafficManager(_) => Pool::All,
        }
    }

    pub fn zonal(&self) -> Option<&ZonalPlan> {
        match self {
            Self::Zonal(z) => Some(z),
            Self::TrafficManager(_) => None,
        }
    }

    pub fn traffic_manager(&self) -> Option<&tm::TmServicePlan> {
        match self {
            Self::Zonal(_) => None,
            Self::TrafficManager(t) => Some(t),
        }
    }
}

/// Plan one zonal service. `zones` is the number of configured client zones.
pub fn plan_service(params: &ZonalPolicy, backends: &[BackendState], zones: usize) -> ZonalPlan {
    let base = base_set(params.failover.as_ref(), backends);
    let classes = zonal::plan_classes(&params.zonal, &base, backends, zones);
    ZonalPlan { kind: base.kind(), rule: base.rule, active_pool: base.pool(), classes }
}

/// The policy's view of service `si`'s backends: zone, failover flag and health.
fn backend_states(cfg: &Config, si: usize, healthy: &dyn Fn(usize, usize) -> bool) -> Vec<BackendState> {
    let svc = &cfg.services[si];
    svc.backends
        .iter()
        .enumerate()
        .map(|(bi, b)| BackendState {
            zone: svc.backend_zone_index(cfg, b),
            failover: b.is_failover(),
            healthy: healthy(si, bi),
        })
        .collect()
}

/// Plan every service of a configuration. `healthy(service_idx, backend_idx)` is the current
/// health of a backend; Traffic Manager endpoints are routed by `probes`.
pub fn plan_config(
    cfg: &Config,
    healthy: &dyn Fn(usize, usize) -> bool,
    probes: &tm::ProbeStatuses,
) -> Vec<ServicePlan> {
    (0..cfg.services.len()).map(|si| plan(cfg, si, healthy, probes)).collect()
}

/// Plan service `si`.
pub fn plan(
    cfg: &Config,
    si: usize,
    healthy: &dyn Fn(usize, usize) -> bool,
    probes: &tm::ProbeStatuses,
) -> ServicePlan {
    match Routing::of(&cfg.services[si]) {
        Routing::Zonal(policy) => {
            ServicePlan::Zonal(plan_service(&policy, &backend_states(cfg, si, healthy), cfg.zones.len()))
        }
        Routing::TrafficManager(_) => ServicePlan::TrafficManager(tm::compile_service(cfg, si, probes)),
    }
}

/// One eligible member of a class: a backend of the service or, through a nested Traffic
/// Manager endpoint, of a child service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub service: usize,
    pub backend: usize,
    pub address: IpAddr,
    pub weight: u32,
    /// Counts as healthy (zonal: the health verdict; Traffic Manager: routable).
    pub healthy: bool,
}

/// One client class of a service, whichever method made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RoutedClass {
    /// Class id: the value its client prefixes map to (`CLASS_NONE` = matched none).
    pub class: u32,
    /// Zonal affinity picked this set for the clients of one zone.
    pub zonal: bool,
    /// Empty = new connections are dropped.
    pub members: Vec<Member>,
    /// The method has no answer for these clients (a Traffic Manager NODATA class): counted
    /// as unroutable rather than as an ordinary drop.
    pub unroutable: bool,
}

/// A backend of the service that the data plane holds a record of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Index into the service's backends.
    pub backend: usize,
    pub healthy: bool,
    /// Class id of the backend's zone (`CLASS_NONE` = none).
    pub zone_class: u32,
}

/// A service routed for the data plane: the same shape for every routing method.
#[derive(Clone, Debug, PartialEq)]
pub struct Routed {
    /// Its own backends with records (a nested endpoint has none: its child's leaves do).
    pub endpoints: Vec<Endpoint>,
    /// (client prefix, class id).
    pub prefixes: Vec<(IpNet, u32)>,
    /// Sorted by class id.
    pub classes: Vec<RoutedClass>,
    /// The plan the classes come from, with its reasons (for status, explain, `lb plan`).
    pub plan: ServicePlan,
}

/// Class id of zone index `z` (class [`lb_common::maps::CLASS_NONE`] is the non-compatible class).
pub fn zone_class(z: usize) -> u32 {
    z as u32 + 1
}

/// Plans service `si` (see [`plan`]) and routes it: the health verdicts, and the Traffic
/// Manager probe statuses.
pub fn route_service(
    cfg: &Config,
    si: usize,
    healthy: &dyn Fn(usize, usize) -> bool,
    probes: &tm::ProbeStatuses,
) -> Routed {
    let svc = &cfg.services[si];
    match plan(cfg, si, healthy, probes) {
        ServicePlan::Zonal(plan) => {
            // A zonal backend always has an address (no nested endpoints).
            let member = |bi: usize| {
                Some(Member {
                    service: si,
                    backend: bi,
                    address: svc.backends[bi].address()?,
                    weight: svc.backends[bi].weight,
                    healthy: healthy(si, bi),
                })
            };
            let mut classes: Vec<RoutedClass> = plan
                .classes
                .iter()
                .map(|cp| RoutedClass {
                    class: cp.client_zone.map(zone_class).unwrap_or(lb_common::maps::CLASS_NONE),
                    zonal: cp.client_zone.is_some(),
                    members: cp.eligible.iter().filter_map(|&bi| member(bi)).collect(),
                    unroutable: false,
                })
                .collect();
            classes.sort_by_key(|c| c.class);
            Routed {
                endpoints: (0..svc.backends.len())
                    .map(|bi| Endpoint {
                        backend: bi,
                        healthy: healthy(si, bi),
                        zone_class: svc
                            .backend_zone_index(cfg, &svc.backends[bi])
                            .map(zone_class)
                            .unwrap_or(lb_common::maps::CLASS_NONE),
                    })
                    .collect(),
                prefixes: zone_prefixes(cfg).collect(),
                classes,
                plan: ServicePlan::Zonal(plan),
            }
        }
        ServicePlan::TrafficManager(plan) => {
            let st = tm::Statuses::new(cfg, probes);
            // HEALTHY (read by connection persistence) = routable without the all-degraded
            // rule: Online, CheckingEndpoint or Unmonitored.
            let routable = |s: usize, b: usize| tm::status::is_routable(st.endpoint_status(s, b));
            let classes = plan
                .classes
                .iter()
                .map(|c| RoutedClass {
                    class: c.id as u32,
                    zonal: false,
                    unroutable: c.eligible.is_empty(),
                    members: c
                        .eligible
                        .iter()
                        .map(|e| Member {
                            service: e.service,
                            backend: e.backend,
                            address: e.address,
                            weight: e.weight,
                            healthy: routable(e.service, e.backend),
                        })
                        .collect(),
                })
                .collect();
            Routed {
                endpoints: (0..svc.backends.len())
                    .filter(|&bi| !svc.backends[bi].is_nested())
                    .map(|bi| Endpoint {
                        backend: bi,
                        healthy: routable(si, bi),
                        zone_class: lb_common::maps::CLASS_NONE,
                    })
                    .collect(),
                prefixes: plan.prefixes.iter().map(|(net, c)| (*net, *c as u32)).collect(),
                classes,
                plan: ServicePlan::TrafficManager(plan),
            }
        }
    }
}

/// Every zone's client prefixes with its class id (what a zonal service installs).
fn zone_prefixes(cfg: &Config) -> impl Iterator<Item = (IpNet, u32)> + '_ {
    cfg.zones.iter().enumerate().flat_map(|(z, zone)| zone.client_prefixes.iter().map(move |p| (*p, zone_class(z))))
}

/// Client classes and client prefixes service `si` installs. Depends on the configuration only
/// (not on health), so the data plane can be sized from it.
pub fn class_layout(cfg: &Config, si: usize) -> (u32, u32) {
    match Routing::of(&cfg.services[si]) {
        Routing::Zonal(_) => (cfg.zones.len() as u32 + 1, zone_prefixes(cfg).count() as u32),
        Routing::TrafficManager(_) => {
            let map = tm::compile_classes(cfg, si);
            (map.classes.len() as u32, map.prefixes.len() as u32)
        }
    }
}

/// Whether backend `addr` of `svc` is switched off by its routing method's own status: a
/// Traffic Manager endpoint or profile Disabled. Zonal backends never are.
pub fn endpoint_disabled(svc: &Service, addr: IpAddr) -> bool {
    match Routing::of(svc) {
        Routing::Zonal(_) => false,
        Routing::TrafficManager(_) => tm::monitor::endpoint_disabled(svc, addr),
    }
}

/// The endpoints of `svc` its routing method monitors, with their probe settings: a Traffic
/// Manager profile's enabled endpoints (health checks are configured apart, `health_check`).
pub fn monitored_endpoints(svc: &Service) -> Vec<(IpAddr, tm::MonitorSettings)> {
    match Routing::of(svc) {
        Routing::Zonal(_) => Vec::new(),
        Routing::TrafficManager(_) => tm::monitor::monitored_endpoints(svc),
    }
}
