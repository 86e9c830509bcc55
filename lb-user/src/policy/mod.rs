//! Backend-selection policy: for every service and every client class, the set of backends a new
//! connection may be hashed onto, and why (spec §1.2 and §1.5). Pure Rust, no BPF, no I/O.
//!
//! The computation has two stages, one submodule each:
//!
//! 1. [`eligible`] — step 2.1, the service-wide decision table E-1..E-9 (health, failover
//!    policy). Its result, [`BaseSet`], does not depend on the client.
//! 2. A *class router* turns the base set into one [`ClassPlan`] per client class. The class
//!    router is chosen per service by [`ServicePolicy::routing`]; today the only one is
//!    [`Routing::Zonal`] ([`zonal`], step 2.2: one class per configured zone plus the
//!    non-compatible class).
//!
//! # Adding a routing method
//!
//! The Traffic Manager methods (priority, weighted, performance, geographic, multivalue, subnet)
//! plug in beside zonal affinity. Each compiles to "client classes defined by source prefixes,
//! each with an eligible set", which is exactly what the data plane consumes (`CLIENT_CLASS`
//! LPM → class id → Maglev table). To add one:
//!
//! - write a submodule with a function `plan_classes(params, base: &BaseSet, backends:
//!   &[BackendState], ...) -> Vec<ClassPlan>` that returns the classes in a fixed order, the last
//!   one being the catch-all class of clients that match no prefix;
//! - add a variant carrying its parameters to [`Routing`] and a match arm in [`plan_service`];
//! - if its classes are not zones, generalise `ClassPlan::client_zone` into a class key (the
//!   index of the prefix group the method defines) — the data-plane writer only needs "class i
//!   ↔ prefixes of group i, last class ↔ no match".
//!
//! Weights are not applied here: `eligible` is a set, Maglev weighs its members later.

pub mod eligible;
pub mod zonal;

use crate::config::{Config, Service};
use crate::model::Spillover;

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

/// How a service's base set becomes per-client-class sets. One variant per routing method.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Routing {
    /// GCP zonal affinity: one class per configured zone, then the non-compatible class.
    Zonal(ZonalParams),
}

/// The selection-relevant part of a service, independent of the TOML structs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServicePolicy {
    /// `None` = no failover policy configured.
    pub failover: Option<FailoverParams>,
    pub routing: Routing,
}

impl ServicePolicy {
    /// Shorthand for the zonal routing method.
    pub fn zonal(
        failover: Option<FailoverParams>,
        spillover: Spillover,
        spillover_ratio: f64,
    ) -> Self {
        Self {
            failover,
            routing: Routing::Zonal(ZonalParams {
                spillover,
                spillover_ratio,
            }),
        }
    }

    pub fn from_service(svc: &Service) -> Self {
        let failover = svc.failover_policy.as_ref().map(|fp| FailoverParams {
            failover_ratio: fp.failover_ratio,
            drop_traffic_if_unhealthy: fp.drop_traffic_if_unhealthy,
        });
        Self::zonal(
            failover,
            svc.zonal_affinity.spillover,
            svc.zonal_affinity.spillover_ratio,
        )
    }
}

/// The original eligible set of §1.2, before any per-class refinement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
        matches!(
            self,
            Self::AllHealthy | Self::HealthyPrimary | Self::HealthyFailover
        )
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
}

/// Everything the data plane needs to know about one service's selection state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServicePlan {
    pub kind: EligibleKind,
    /// The row of the §1.2 decision table that matched (the "why" of `kind`).
    pub rule: Rule,
    pub active_pool: Pool,
    /// One per client class: every zone in config order, then the non-compatible class.
    pub classes: Vec<ClassPlan>,
}

/// Plan one service. `zones` is the number of configured client zones.
pub fn plan_service(
    params: &ServicePolicy,
    backends: &[BackendState],
    zones: usize,
) -> ServicePlan {
    let base = base_set(params.failover.as_ref(), backends);
    let classes = match &params.routing {
        Routing::Zonal(z) => zonal::plan_classes(z, &base, backends, zones),
    };
    ServicePlan {
        kind: base.kind(),
        rule: base.rule,
        active_pool: base.pool(),
        classes,
    }
}

/// Plan every service of a configuration. `healthy(service_idx, backend_idx)` is the current
/// health of a backend.
pub fn plan_config(cfg: &Config, healthy: &dyn Fn(usize, usize) -> bool) -> Vec<ServicePlan> {
    cfg.services
        .iter()
        .enumerate()
        .map(|(si, svc)| {
            let backends: Vec<BackendState> = svc
                .backends
                .iter()
                .enumerate()
                .map(|(bi, b)| BackendState {
                    zone: svc.backend_zone_index(cfg, b),
                    failover: b.failover,
                    healthy: healthy(si, bi),
                })
                .collect();
            plan_service(
                &ServicePolicy::from_service(svc),
                &backends,
                cfg.zones.len(),
            )
        })
        .collect()
}
