//! The TOML configuration contract (DESIGN.md §5): parsing and validation.
//!
//! `load`/`parse` return a `Config` only if every check passed; errors name the service, the
//! field and the allowed values. Nothing downstream ever sees an invalid configuration, so a bad
//! reload cannot touch the running tables.

mod error;
mod prefix;
mod validate;

pub use error::{ConfigError, ConfigErrorKind, Scope, Violation};
pub use validate::{
    MAX_BACKENDS_PER_SERVICE, MAX_DRAINING_TIMEOUT_SEC, MAX_IDLE_TIMEOUT_SEC,
    MAX_MAGLEV_TABLE_SIZE, MAX_WEIGHT, MIN_IDLE_TIMEOUT_SEC, MIN_MAGLEV_TABLE_SIZE,
};

use crate::model::*;
use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::Path;

/// Default Maglev table size: prime, fine for up to ~160 backends per table (M >= 100 N).
pub const DEFAULT_MAGLEV_TABLE_SIZE: u32 = 16381;
/// Default connection-table capacity.
pub const DEFAULT_CONNTRACK_ENTRIES: u32 = 1 << 20;
/// Default conntrack idle timeout (spec §1.4).
pub const DEFAULT_IDLE_TIMEOUT_SEC: u32 = 600;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub dataplane: Dataplane,
    #[serde(default, rename = "zone")]
    pub zones: Vec<Zone>,
    #[serde(default, rename = "service")]
    pub services: Vec<Service>,
}

/// Data-plane sizing and addressing, fixed at load time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dataplane {
    /// Maglev table size M; must be prime.
    pub maglev_table_size: u32,
    /// Capacity of the connection-tracking LRU map.
    pub conntrack_entries: u32,
    /// Outer source of IPIP packets: an address, or a prefix whose host bits vary by flow hash.
    /// A bare address is read as a host prefix (/32).
    #[serde(deserialize_with = "prefix::opt_prefix")]
    pub encap_source_v4: Option<IpNet>,
    /// Outer source of IP6IP6 packets (a bare address is read as /128).
    #[serde(deserialize_with = "prefix::opt_prefix")]
    pub encap_source_v6: Option<IpNet>,
}

impl Default for Dataplane {
    fn default() -> Self {
        Self {
            maglev_table_size: DEFAULT_MAGLEV_TABLE_SIZE,
            conntrack_entries: DEFAULT_CONNTRACK_ENTRIES,
            encap_source_v4: None,
            encap_source_v6: None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Zone {
    pub name: String,
    /// Client sources in these prefixes are in this zone (IPv4 and IPv6). Must be canonical
    /// (no host bits set) and must not overlap any other prefix of any zone.
    #[serde(default, deserialize_with = "prefix::prefix_list")]
    pub client_prefixes: Vec<IpNet>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    pub name: String,
    pub vip: IpAddr,
    pub protocol: Protocol,
    /// Empty = all ports.
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub session_affinity: SessionAffinity,
    #[serde(default)]
    pub forwarding: Forwarding,
    #[serde(default)]
    pub zonal_affinity: ZonalAffinity,
    /// Present = a failover policy is configured.
    #[serde(default)]
    pub failover_policy: Option<FailoverPolicy>,
    #[serde(default)]
    pub connection_tracking: ConnectionTracking,
    #[serde(default)]
    pub connection_draining: ConnectionDraining,
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    /// `subsetting.policy`; CONSISTENT_HASH_SUBSETTING is incompatible with zonal affinity.
    #[serde(default)]
    pub subsetting: Subsetting,
    #[serde(default, rename = "backend")]
    pub backends: Vec<Backend>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ZonalAffinity {
    pub spillover: Spillover,
    pub spillover_ratio: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverPolicy {
    pub failover_ratio: f64,
    pub drop_traffic_if_unhealthy: bool,
    pub disable_connection_drain_on_failover: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionTracking {
    pub tracking_mode: TrackingMode,
    pub connection_persistence_on_unhealthy_backends: Persistence,
    /// Only with PER_SESSION and a coarse affinity; see `Service::idle_timeout_sec`.
    pub idle_timeout_sec: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionDraining {
    /// 0..=3600; 0 = no draining.
    pub draining_timeout_sec: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    #[serde(default)]
    pub protocol: HealthProtocol,
    /// Defaults to the service's first port.
    #[serde(default)]
    pub port: Option<u16>,
    /// HTTP only; default "/".
    #[serde(default)]
    pub request_path: Option<String>,
    /// HTTP only; default 200.
    #[serde(default)]
    pub expected_status: Option<u16>,
    #[serde(default = "default_5")]
    pub check_interval_sec: u32,
    #[serde(default = "default_5")]
    pub timeout_sec: u32,
    #[serde(default = "default_2")]
    pub healthy_threshold: u32,
    #[serde(default = "default_2")]
    pub unhealthy_threshold: u32,
}

fn default_5() -> u32 {
    5
}
fn default_2() -> u32 {
    2
}
fn default_weight() -> u32 {
    1
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    pub address: IpAddr,
    /// Name of a `[[zone]]`; absent = the backend is in no client zone.
    #[serde(default)]
    pub zone: Option<String>,
    /// true = failover backend (only with a failover policy).
    #[serde(default)]
    pub failover: bool,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Destination MAC for L2_DSR forwarding ("aa:bb:cc:dd:ee:ff").
    #[serde(default)]
    pub mac: Option<String>,
}

impl Service {
    /// The effective conntrack idle timeout (default 600 s).
    pub fn idle_timeout_sec(&self) -> u32 {
        self.connection_tracking
            .idle_timeout_sec
            .unwrap_or(DEFAULT_IDLE_TIMEOUT_SEC)
    }

    /// Index of a backend's zone in `Config::zones`.
    pub fn backend_zone_index(&self, cfg: &Config, b: &Backend) -> Option<usize> {
        let z = b.zone.as_deref()?;
        cfg.zones.iter().position(|zone| zone.name == z)
    }

    /// The port the health check probes: its own `port`, else the service's first port
    /// (validation guarantees one of them exists when a health check is configured).
    pub fn health_check_port(&self) -> Option<u16> {
        let hc = self.health_check.as_ref()?;
        hc.port.or_else(|| self.ports.first().copied())
    }
}

impl Config {
    /// Read, parse and validate a configuration file. Every error names the file.
    /// The error is a [`ConfigError`] (downcast to inspect the individual violations).
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        let in_file = |kind| ConfigError {
            file: Some(path.to_path_buf()),
            kind,
        };
        let text = std::fs::read_to_string(path).map_err(|e| in_file(ConfigErrorKind::Read(e)))?;
        Self::parse_text(&text).map_err(|kind| in_file(kind).into())
    }

    /// Parse and validate configuration text. The error is a [`ConfigError`] without a file.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        Self::parse_text(text).map_err(|kind| ConfigError { file: None, kind }.into())
    }

    fn parse_text(text: &str) -> Result<Config, ConfigErrorKind> {
        let cfg: Config = toml::from_str(text).map_err(ConfigErrorKind::Syntax)?;
        let violations = cfg.violations();
        if violations.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigErrorKind::Invalid(violations))
        }
    }

    /// Every check of DESIGN.md §5 and the spec. All violations are reported at once, so a user
    /// fixes a file in one pass.
    pub fn validate(&self) -> anyhow::Result<()> {
        let violations = self.violations();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ConfigError {
                file: None,
                kind: ConfigErrorKind::Invalid(violations),
            }
            .into())
        }
    }

    /// The list of violations (empty = valid), in file order.
    pub fn violations(&self) -> Vec<Violation> {
        validate::check(self)
    }
}
