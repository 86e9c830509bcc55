//! The configuration file as written: the serde structs `lb.toml` deserializes into (and its
//! JSON Schema is generated from). The Google Cloud and Traffic Manager fields sit side by side
//! here, as the TOML format has them; `validate` checks every rule on these structs, and only a
//! valid file is converted, once, into the typed model of [`super`] that the rest of `lb` reads.

use super::Announce;
use super::{ConnectionDraining, ConnectionTracking, Dataplane, FailoverPolicy, HealthCheck, ZonalAffinity, Zone};
use super::{DnsFront, GeoEntry, LatencyEntry, Metrics, Resolver, DEFAULT_IDLE_TIMEOUT_SEC, DEFAULT_MAX_RETURN};
use crate::model::*;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

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
    /// `[resolver]`: how the daemon resolves the endpoints given by DNS name (`target`).
    #[serde(default)]
    pub resolver: Resolver,
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

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
// A VIP or a next hop: validation refuses a service with neither (and one with both).
#[schemars(extend("anyOf" = [{"required": ["vip"]}, {"required": ["next_hop"]}]))]
pub struct Service {
    pub name: String,
    /// The VIP: packets to this address are balanced. Exactly one of `vip` and `next_hop`.
    #[serde(default)]
    pub vip: Option<IpAddr>,
    /// The service as a route's next hop: packets routed to the balancer for these
    /// destinations are balanced instead of packets to a VIP.
    #[serde(default)]
    pub next_hop: Option<NextHop>,
    pub protocol: Protocol,
    /// Empty = all ports.
    #[serde(default)]
    pub ports: Vec<u16>,
    #[serde(default)]
    pub session_affinity: SessionAffinity,
    /// Default IPIP, and L2_DSR (the only one allowed) for a next-hop service.
    #[serde(default)]
    pub forwarding: Option<Forwarding>,
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

/// `[service.next_hop]`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NextHop {
    /// Destination prefixes whose packets the service balances (`0.0.0.0/0` and `::/0`
    /// included); a VIP service's address inside one still goes to that service.
    #[serde(deserialize_with = "super::prefix::prefix_list")]
    #[schemars(with = "Vec<String>")]
    pub destinations: Vec<ipnet::IpNet>,
    /// A flow and its reverse choose the same backend and share one tracking entry (default
    /// true): stateful appliances see both directions of every connection.
    #[serde(default = "default_true")]
    pub symmetric: bool,
    /// Only packets arriving on these interfaces (at most 4; default: any interface).
    #[serde(default)]
    pub interfaces: Vec<String>,
}

impl Service {
    /// The VIP for messages ("no vip" on a next-hop service, which validation reports apart).
    pub fn vip_text(&self) -> String {
        self.vip.map_or_else(|| "no vip".to_owned(), |v| v.to_string())
    }
}

fn default_true() -> bool {
    true
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

/// A nested endpoint and an endpoint given by DNS name (`target`) have no address of their own;
/// the unspecified address stands for "absent" (validation rejects it on every other backend).
fn unspecified_address() -> IpAddr {
    IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Backend {
    /// Required, except on a nested endpoint (`target_service`) or an endpoint given by DNS name
    /// (`target`), which must omit it.
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
    /// An external endpoint given by DNS name instead of an address (not with MULTIVALUE): the
    /// DNS front answers a CNAME to it, the per-packet path forwards to its resolved addresses.
    #[serde(default)]
    pub target: Option<String>,
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

    /// True for an endpoint without an address of its own: nested, or given by DNS name.
    pub fn addressless(&self) -> bool {
        self.target_service.is_some() || self.target.is_some()
    }

    /// The name used in messages and status inputs: `name`, else the address (the child
    /// service, the DNS name).
    pub fn label(&self) -> String {
        match (&self.name, &self.target_service, &self.target) {
            (Some(n), _, _) => n.clone(),
            (None, Some(t), _) => format!("->{t}"),
            (None, None, Some(t)) => super::canonical_dns_name(t),
            (None, None, None) => self.address.to_string(),
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
}
