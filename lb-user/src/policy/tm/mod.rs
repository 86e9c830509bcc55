//! Azure Traffic Manager routing methods (spec §2): pure-Rust semantics, no BPF.
//!
//! - `monitor`: probe result -> endpoint status, profile and nested status (the probe settings
//!   are configuration: `config::monitor`);
//! - `status`: effective endpoint status from probe inputs + configuration, availability rule;
//! - `methods`: per-method selection with a DNS view (`resolve_dns`) and a packet view
//!   (`eligible`);
//! - `classes`: compilation into disjoint client prefixes + per-class eligible sets;
//! - `client`, `rng`: client
//!   location inputs and a seeded generator for per-query random choices; `regions` and
//!   `ranges` (the region hierarchy, address ranges) are re-exported from `config`, whose
//!   validation uses them too, and `rng` from the crate root (the data plane's tests use it).

pub use crate::config::{ranges, regions};
pub use crate::rng;

pub mod classes;
pub mod client;
pub mod methods;
pub mod monitor;
pub mod status;

pub use classes::{compile_classes, compile_service, ClassMap, TmClass, TmServicePlan, DEFAULT_CLASS};
pub use client::{location_address, Client};
pub use methods::{
    effective_priorities, eligible, resolve_dns, select, CnameRecord, DnsAnswer, Eligible, EligibleBackend, QueryType,
    Record, Selection,
};
pub use monitor::{nested_endpoint_status, profile_monitor_status, EndpointMonitor, MonitorSettings, ProbeOutcome};
pub use regions::RegionTree;
pub use rng::{Rng, SplitMix64};
pub use status::{ProbeStatuses, Statuses, MAX_NESTING_DEPTH};
