//! The TOML configuration contract (docs/config.md): parsing and validation.
//!
//! `load`/`parse` return a `Config` only if every check passed; errors name the service, the
//! field and the allowed values. Nothing downstream ever sees an invalid configuration, so a bad
//! reload cannot touch the running tables.

mod announce;
mod error;
pub mod file;
mod host;
pub mod monitor;
mod notices;
mod prefix;
pub mod ranges;
mod recover;
pub mod regions;
mod tm_validate;
mod validate;

pub use announce::{Announce, DEFAULT_DRAIN_GRACE_SEC};
pub use error::{ConfigError, ConfigErrorKind, Scope, Violation, MAX_VIOLATIONS};
pub use host::HostAddrs;
pub use tm_validate::{canonical_dns_name, check_dns_name, MAX_NESTING_DEPTH};
pub use validate::{
    MAX_BACKENDS_PER_SERVICE, MAX_CONNTRACK_ENTRIES, MAX_DRAINING_TIMEOUT_SEC, MAX_IDLE_TIMEOUT_SEC,
    MAX_MAGLEV_TABLE_SIZE, MAX_WEIGHT, MIN_IDLE_TIMEOUT_SEC, MIN_MAGLEV_TABLE_SIZE,
};

use crate::model::*;
use ipnet::IpNet;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::Path;

/// Default Maglev table size: prime, fine for up to ~160 backends per table (M >= 100 N).
pub const DEFAULT_MAGLEV_TABLE_SIZE: u32 = 16381;
/// Default connection-table capacity.
pub const DEFAULT_CONNTRACK_ENTRIES: u32 = 1 << 20;
/// Default conntrack idle timeout (spec §1.4).
pub const DEFAULT_IDLE_TIMEOUT_SEC: u32 = 600;
/// Spec §2.4 MultiValue: `maxReturn` default.
pub const DEFAULT_MAX_RETURN: u32 = 2;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub dataplane: Dataplane,
    #[serde(default, rename = "zone")]
    pub zones: Vec<Zone>,
    #[serde(default, rename = "service")]
    pub services: Vec<Service>,
    /// Traffic Manager PERFORMANCE input: client prefix -> regions in ascending RTT.
    #[serde(default, rename = "latency")]
    pub latency: Vec<LatencyEntry>,
    /// Traffic Manager GEOGRAPHIC input: client prefix -> most specific region code.
    #[serde(default, rename = "geo")]
    pub geo: Vec<GeoEntry>,
    /// `[dns]`: the DNS front answering for the services' `dns_name`s (Traffic Manager).
    #[serde(default)]
    pub dns: Option<DnsFront>,
    /// `[announce]`: the VIP routes a BGP daemon announces (`crate::daemon::announce`).
    #[serde(default)]
    pub announce: Option<Announce>,
    /// `[metrics]`: the Prometheus endpoint; off without the section.
    #[serde(default)]
    pub metrics: Option<Metrics>,
}

/// `[metrics]`: where the daemon serves its Prometheus metrics (`GET /metrics`, HTTP/1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Metrics {
    /// "ADDR:PORT", e.g. "127.0.0.1:9405".
    pub listen: std::net::SocketAddr,
}

/// `[dns]`: where the daemon answers A/AAAA queries for the Traffic Manager services'
/// `dns_name`s with the same routing engine as the data plane.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DnsFront {
    /// "ADDR:PORT", UDP and TCP.
    pub listen: std::net::SocketAddr,
}

/// `[[latency]]`: clients in these prefixes measure these regions nearest first (spec §2.4
/// Performance). Prefixes may nest; the longest match wins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LatencyEntry {
    #[serde(deserialize_with = "prefix::prefix_list")]
    #[schemars(with = "Vec<String>")]
    pub client_prefixes: Vec<IpNet>,
    /// Region names (e.g. "westeurope") in ascending round-trip time.
    pub regions: Vec<String>,
}

/// `[[geo]]`: clients in these prefixes are located in `region` (a code of the built-in
/// hierarchy, as specific as known: "US-CA", "IE", ...). Prefixes may nest; the longest wins.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GeoEntry {
    #[serde(deserialize_with = "prefix::prefix_list")]
    #[schemars(with = "Vec<String>")]
    pub client_prefixes: Vec<IpNet>,
    pub region: String,
}

/// `[service.monitor]`: Traffic Manager endpoint monitoring (spec §2.3). Defaults are resolved
/// by `monitor::MonitorSettings::from_config`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Monitor {
    #[serde(default)]
    pub protocol: MonitorProtocol,
    /// Required.
    #[serde(default)]
    pub port: Option<u16>,
    /// Required for HTTP/HTTPS, forbidden with TCP.
    #[serde(default)]
    pub path: Option<String>,
    /// 30 (normal) or 10 (fast).
    #[serde(default = "default_30")]
    pub interval_sec: u32,
    /// interval 30: 5..=10, default 10; interval 10: 5..=9, default 9.
    #[serde(default)]
    pub timeout_sec: Option<u32>,
    /// 0..=9, default 3.
    #[serde(default = "default_3")]
    pub tolerated_failures: u32,
    /// At most 8 "min-max" (or single "code") ranges; default 200 only. HTTP/HTTPS only.
    #[serde(default)]
    pub expected_status_ranges: Vec<String>,
    /// At most 8 "name:value" pairs sent with HTTP/HTTPS probes.
    #[serde(default)]
    pub custom_headers: Vec<String>,
}

/// Data-plane sizing and addressing, fixed at load time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Dataplane {
    /// Maglev table size M; must be prime.
    pub maglev_table_size: u32,
    /// Active flows each connection table is sized for (IPv4 and IPv6 flows have one table
    /// each): 2 to 4 slots per flow, a power of two buckets of 8 (`lb_common::ct_table`).
    /// A new flow whose two buckets are full evicts the least recently seen of their flows.
    pub conntrack_entries: u32,
    /// Outer source of IPIP packets: an address, or a prefix whose host bits vary by flow hash.
    /// A bare address is read as a host prefix (/32).
    #[serde(deserialize_with = "prefix::opt_prefix")]
    #[schemars(with = "Option<String>")]
    pub encap_source_v4: Option<IpNet>,
    /// Outer source of IP6IP6 packets (a bare address is read as /128).
    #[serde(deserialize_with = "prefix::opt_prefix")]
    #[schemars(with = "Option<String>")]
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Zone {
    pub name: String,
    /// Client sources in these prefixes are in this zone (IPv4 and IPv6). Must be canonical
    /// (no host bits set) and must not overlap any other prefix of any zone.
    #[serde(default, deserialize_with = "prefix::prefix_list")]
    #[schemars(with = "Vec<String>")]
    pub client_prefixes: Vec<IpNet>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
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
    /// `subsetting.policy`; only NONE: CONSISTENT_HASH_SUBSETTING is refused (not supported).
    #[serde(default)]
    pub subsetting: Subsetting,
    #[serde(default, rename = "backend")]
    pub backends: Vec<Backend>,
    /// ZONAL (default: the Google Cloud pipeline) or a Traffic Manager method.
    #[serde(default)]
    pub routing_method: RoutingMethod,
    /// Traffic Manager `profileStatus` (default Enabled); Disabled = NXDOMAIN, no traffic.
    #[serde(default)]
    pub profile_status: Option<AdminStatus>,
    /// Traffic Manager DNS TTL in seconds (0..=2147483647).
    #[serde(default)]
    pub ttl: Option<u32>,
    /// MULTIVALUE only: records per answer, 1..=10, default 2.
    #[serde(default)]
    pub max_return: Option<u32>,
    /// Traffic Manager endpoint monitoring.
    #[serde(default)]
    pub monitor: Option<Monitor>,
    /// Traffic Manager: the name the DNS front (`[dns]`) answers for this service.
    #[serde(default)]
    pub dns_name: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ZonalAffinity {
    pub spillover: Spillover,
    pub spillover_ratio: f64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FailoverPolicy {
    pub failover_ratio: f64,
    pub drop_traffic_if_unhealthy: bool,
    pub disable_connection_drain_on_failover: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionTracking {
    pub tracking_mode: TrackingMode,
    pub connection_persistence_on_unhealthy_backends: Persistence,
    /// Only with PER_SESSION and a coarse affinity; see `Service::idle_timeout_sec`.
    pub idle_timeout_sec: Option<u32>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionDraining {
    /// 0..=3600; 0 = no draining.
    pub draining_timeout_sec: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
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
fn default_30() -> u32 {
    30
}
fn default_3() -> u32 {
    3
}
/// A nested endpoint has no address of its own; the unspecified address stands for "absent"
/// (validation rejects it on every other backend).
fn unspecified_address() -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Required, except on a nested endpoint (`target_service`), which must omit it.
    #[serde(default = "unspecified_address")]
    // The unspecified address stands for "absent": no default to offer in the schema.
    #[schemars(extend("default" = null))]
    pub address: IpAddr,
    /// Name of a `[[zone]]`; absent = the backend is in no client zone.
    #[serde(default)]
    pub zone: Option<String>,
    /// true = failover backend (only with a failover policy).
    #[serde(default)]
    pub failover: bool,
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// Destination MAC for L2_DSR forwarding ("aa:bb:cc:dd:ee:ff"), parsed when the file is read;
    /// an override: absent, the host's neighbour entry for the backend's address gives it.
    #[serde(default)]
    pub mac: Option<MacAddr>,
    // ---- Traffic Manager endpoint fields (spec §2.1); only with a Traffic Manager method.
    /// Endpoint name for messages and status inputs; unique in the service. Default: address.
    #[serde(default)]
    pub name: Option<String>,
    /// `endpointStatus`: Disabled endpoints are never returned and not probed.
    #[serde(default)]
    pub endpoint_status: AdminStatus,
    /// 1..=1000, unique; set on all endpoints or none (default: 1, 2, ... in file order).
    #[serde(default)]
    pub priority: Option<u32>,
    /// `endpointLocation`: a region name of `[[latency]]`; required under PERFORMANCE.
    #[serde(default)]
    pub location: Option<String>,
    /// Region codes served by this endpoint (GEOGRAPHIC); each mapped once per service.
    #[serde(default)]
    pub geo_mapping: Vec<String>,
    /// Client ranges (SUBNET): "10.0.0.0/8" or "192.168.1.10-192.168.1.20"; none = fallback.
    #[serde(default)]
    pub subnets: Vec<String>,
    /// Nested endpoint: the name of a child service (a Traffic Manager method).
    #[serde(default)]
    pub target_service: Option<String>,
    /// Nested only: Online child endpoints needed for this endpoint to be Online (default 1).
    #[serde(default)]
    pub min_child_endpoints: Option<u32>,
    /// Nested only: the same test counting IPv4 child endpoints (A queries).
    #[serde(default)]
    pub min_child_endpoints_ipv4: Option<u32>,
    /// Nested only: the same test counting IPv6 child endpoints (AAAA queries).
    #[serde(default)]
    pub min_child_endpoints_ipv6: Option<u32>,
    /// `alwaysServe`: never probed, monitor status Unmonitored (counted as Online).
    #[serde(default)]
    pub always_serve: bool,
    /// Endpoint-level monitor headers ("name:value", at most 8): added to the profile's
    /// `[service.monitor] custom_headers`, replacing one of the same name (endpoint wins).
    #[serde(default)]
    pub custom_headers: Vec<String>,
}

impl Backend {
    /// True for a nested endpoint (its traffic goes to a child service).
    pub fn is_nested(&self) -> bool {
        self.target_service.is_some()
    }

    /// The name used in messages and status inputs: `name`, else the address.
    pub fn label(&self) -> String {
        match (&self.name, &self.target_service) {
            (Some(n), _) => n.clone(),
            (None, Some(t)) => format!("->{t}"),
            (None, None) => self.address.to_string(),
        }
    }
}

impl Service {
    /// Traffic Manager `profileStatus` (default Enabled).
    pub fn profile_status(&self) -> AdminStatus {
        self.profile_status.unwrap_or_default()
    }

    /// MULTIVALUE records per answer (default 2).
    pub fn max_return(&self) -> u32 {
        self.max_return.unwrap_or(DEFAULT_MAX_RETURN)
    }

    /// Index of the backend with this label (see `Backend::label`).
    pub fn backend_index(&self, label: &str) -> Option<usize> {
        self.backends.iter().position(|b| b.label() == label)
    }

    /// The effective conntrack idle timeout (default 600 s).
    pub fn idle_timeout_sec(&self) -> u32 {
        self.connection_tracking.idle_timeout_sec.unwrap_or(DEFAULT_IDLE_TIMEOUT_SEC)
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
    /// Index of the service with this name.
    pub fn service_index(&self, name: &str) -> Option<usize> {
        self.services.iter().position(|s| s.name == name)
    }

    /// Whether the service `key.service` has a backend at `key.address`.
    pub fn has_backend(&self, key: &BackendKey) -> bool {
        self.services.iter().any(|s| s.name == key.service && s.backends.iter().any(|b| b.address == key.address))
    }

    /// Read, parse and validate a configuration file. Every error names the file.
    /// The error is a [`ConfigError`] (downcast to inspect the individual violations).
    /// Only a regular file of at most [`file::MAX_CONFIG_BYTES`] is read.
    pub fn load(path: &Path) -> anyhow::Result<Config> {
        Self::load_on(path, None)
    }

    /// [`Config::load`]; with `host`, no VIP may be one of its addresses.
    pub fn load_on(path: &Path, host: Option<&HostAddrs>) -> anyhow::Result<Config> {
        let text = file::read(path)
            .map_err(|e| ConfigError { file: Some(path.to_path_buf()), kind: ConfigErrorKind::Read(e) })?;
        Self::parse_file_text(path, &text, host)
    }

    /// Parse and validate the text read from `path` (errors name the file, as `load`'s do);
    /// with `host`, no VIP may be one of its addresses (`lb validate`, `lb run`, reloads).
    pub fn parse_file_text(path: &Path, text: &str, host: Option<&HostAddrs>) -> anyhow::Result<Config> {
        Self::parse_text_on(text, host).map_err(|kind| ConfigError { file: Some(path.to_path_buf()), kind }.into())
    }

    /// Parse and validate configuration text. The error is a [`ConfigError`] without a file.
    pub fn parse(text: &str) -> anyhow::Result<Config> {
        Self::parse_text(text).map_err(|kind| ConfigError { file: None, kind }.into())
    }

    fn parse_text(text: &str) -> Result<Config, ConfigErrorKind> {
        Self::parse_text_on(text, None)
    }

    fn parse_text_on(text: &str, host: Option<&HostAddrs>) -> Result<Config, ConfigErrorKind> {
        let cfg: Config =
            toml::from_str(text).map_err(|first| ConfigErrorKind::Syntax(recover::all_errors(text, first)))?;
        let violations = validate::check(&cfg, host);
        if violations.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigErrorKind::Invalid(violations))
        }
    }

    /// Every check of the configuration contract (docs/config.md) and the spec. All violations are reported at once, so a user
    /// fixes a file in one pass.
    pub fn validate(&self) -> anyhow::Result<()> {
        let violations = self.violations();
        if violations.is_empty() {
            Ok(())
        } else {
            Err(ConfigError { file: None, kind: ConfigErrorKind::Invalid(violations) }.into())
        }
    }

    /// The settings that have no effect in this configuration (warnings, see `notices`).
    pub fn notices(&self) -> Vec<Violation> {
        notices::notices(self)
    }

    /// The list of violations (empty = valid), in file order.
    pub fn violations(&self) -> Vec<Violation> {
        validate::check(self, None)
    }
}
