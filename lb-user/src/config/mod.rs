//! The TOML configuration contract (docs/config.md): parsing and validation.
//!
//! `load`/`parse` return a `Config` only if every check passed; errors name the service, the
//! field and the allowed values. Nothing downstream ever sees an invalid configuration, so a bad
//! reload cannot touch the running tables.

mod announce;
mod error;
pub mod file;
pub mod geoip;
mod host;
pub mod monitor;
mod notices;
mod prefix;
pub mod ranges;
pub mod raw;
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
    /// A MaxMind DB (GeoLite2/GeoIP2 Country or City) locating clients for GEOGRAPHIC routing
    /// (DNS answers and the per-packet path) where no `[[geo]]` prefix does. Read at start, on
    /// every reload and when the file changes; a bad file refuses the reload (the one in use
    /// stays).
    #[serde(default)]
    pub geoip_database: Option<std::path::PathBuf>,
}

/// `[resolver]`: how the daemon resolves the Traffic Manager endpoints given by DNS name
/// (`target`) for the per-packet path and the monitors. The DNS front does not resolve them: it
/// answers a CNAME.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Resolver {
    /// DNS servers asked, "ADDR" (port 53) or "ADDR:PORT"; empty: the host's (`/etc/resolv.conf`).
    #[serde(deserialize_with = "resolver_servers")]
    #[schemars(with = "Vec<String>")]
    pub servers: Vec<std::net::SocketAddr>,
    /// The shortest time an answer is kept before the name is resolved again (a smaller TTL is
    /// raised to it).
    pub min_ttl_sec: u32,
    /// The longest time an answer is kept (a larger TTL is lowered to it).
    pub max_ttl_sec: u32,
    /// How long the last good answer stays in use while resolution fails; after it the
    /// endpoint has no address and is Degraded.
    pub keep_last_answer_sec: u32,
}

/// `[resolver] min_ttl_sec` default.
pub const DEFAULT_RESOLVER_MIN_TTL_SEC: u32 = 5;
/// `[resolver] max_ttl_sec` default.
pub const DEFAULT_RESOLVER_MAX_TTL_SEC: u32 = 3600;
/// `[resolver] keep_last_answer_sec` default.
pub const DEFAULT_KEEP_LAST_ANSWER_SEC: u32 = 300;

impl Default for Resolver {
    fn default() -> Self {
        Self {
            servers: Vec::new(),
            min_ttl_sec: DEFAULT_RESOLVER_MIN_TTL_SEC,
            max_ttl_sec: DEFAULT_RESOLVER_MAX_TTL_SEC,
            keep_last_answer_sec: DEFAULT_KEEP_LAST_ANSWER_SEC,
        }
    }
}

/// `[resolver] servers`: "ADDR" (port 53) or "ADDR:PORT" (`[v6]:PORT`).
fn resolver_servers<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<std::net::SocketAddr>, D::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    texts
        .iter()
        .map(|t| {
            t.parse::<std::net::SocketAddr>().or_else(|_| t.parse::<IpAddr>().map(|a| (a, 53).into())).map_err(|_| {
                serde::de::Error::custom(format!(
                    "{t:?} is not a server address: allowed \"ADDR\" (port 53) or \"ADDR:PORT\", e.g. \"198.18.0.53\" or \"[2001:db8::53]:53\""
                ))
            })
        })
        .collect()
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
    /// `USE_FIXED_PORT` (`port`) or `USE_SERVING_PORT` (the service's first port); absent: the
    /// first if `port` is set, else the second. `USE_NAMED_PORT` is refused.
    #[serde(default)]
    pub port_specification: Option<PortSpecification>,
    /// HTTP only; default "/".
    #[serde(default)]
    pub request_path: Option<String>,
    /// HTTP and HTTPS only; default 200.
    #[serde(default)]
    pub expected_status: Option<u16>,
    /// TCP and SSL: sent once connected (and the TLS handshake done).
    #[serde(default)]
    pub request: Option<String>,
    /// TCP and SSL: what the answer must start with; HTTP and HTTPS: what the body must start
    /// with. Absent: any answer (or none) passes.
    #[serde(default)]
    pub response: Option<String>,
    /// HTTP and HTTPS: the Host header (and the TLS name); default the backend's address.
    #[serde(default)]
    pub host: Option<String>,
    /// GRPC and GRPC_WITH_TLS: the service whose health `grpc.health.v1.Health/Check` asks
    /// for; absent: the server's overall health (the empty name).
    #[serde(default)]
    pub grpc_service_name: Option<String>,
    /// `PROXY_V1`: a PROXY protocol v1 line (the probe's own addresses) before anything else,
    /// for backends behind which a proxy expects one.
    #[serde(default)]
    pub proxy_header: ProxyHeader,
    /// `VIP` (the default of a VIP service): probes are addressed to the VIP and delivered to
    /// the backend checked the way its client packets are, so a backend that does not hold
    /// the VIP or cannot decapsulate fails. `DIRECT`: to the backend's own address (the only
    /// choice, and the default, of a next-hop service).
    #[serde(default)]
    pub path: Option<HealthPath>,
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

/// The configuration `lb` runs: a valid file ([`raw`]) converted once, at load, into types in
/// which a wrong combination cannot be written: a service is zonal or a Traffic Manager profile
/// ([`ServiceKind`]), a backend an address or a nested profile ([`Endpoint`]) with its product's
/// fields ([`BackendRole`]), and every string with structure (ranges, headers, status ranges)
/// parsed.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    pub dataplane: Dataplane,
    pub zones: Vec<Zone>,
    pub services: Vec<Service>,
    /// Traffic Manager PERFORMANCE input: client prefix -> regions in ascending RTT.
    pub latency: Vec<LatencyEntry>,
    /// Traffic Manager GEOGRAPHIC input: client prefix -> most specific region code.
    pub geo: Vec<GeoEntry>,
    /// `[dns]`: the DNS front answering for the services' `dns_name`s (Traffic Manager).
    pub dns: Option<DnsFront>,
    /// `[announce]`: the VIP routes a BGP daemon announces (`crate::daemon::announce`).
    pub announce: Option<Announce>,
    /// `[metrics]`: the Prometheus endpoint; off without the section.
    pub metrics: Option<Metrics>,
    /// `[resolver]`: how endpoints given by DNS name are resolved.
    pub resolver: Resolver,
    /// `[dns] geoip_database`, loaded.
    pub geoip: Option<std::sync::Arc<geoip::GeoIp>>,
}

/// One `[[service]]`: what every product has (the listener, affinity, forwarding, tracking,
/// draining and the backends), and its product's own settings.
#[derive(Clone, Debug, PartialEq)]
pub struct Service {
    pub name: String,
    pub frontend: Frontend,
    pub protocol: Protocol,
    /// Empty = all ports.
    pub ports: Vec<u16>,
    pub session_affinity: SessionAffinity,
    pub forwarding: Forwarding,
    pub connection_tracking: ConnectionTracking,
    pub connection_draining: ConnectionDraining,
    /// Backends (Traffic Manager: endpoints) in file order.
    pub backends: Vec<Backend>,
    pub kind: ServiceKind,
}

/// Which packets a service balances.
#[derive(Clone, Debug, PartialEq)]
pub enum Frontend {
    /// Packets to this address.
    Vip(IpAddr),
    /// Packets routed to the balancer (as a route's next hop) for a destination in these
    /// prefixes, where no VIP service takes them.
    NextHop(NextHop),
}

/// A next-hop service's frontend.
#[derive(Clone, Debug, PartialEq)]
pub struct NextHop {
    pub destinations: Vec<IpNet>,
    /// Direction-free hash and tracking key (`service_flags::SYMMETRIC`).
    pub symmetric: bool,
    /// Only packets arriving on these interfaces (empty: any).
    pub interfaces: Vec<String>,
}

impl Service {
    /// The VIP; None for a next-hop service.
    pub fn vip(&self) -> Option<IpAddr> {
        match &self.frontend {
            Frontend::Vip(vip) => Some(*vip),
            Frontend::NextHop(_) => None,
        }
    }

    /// The next-hop frontend; None for a VIP service.
    pub fn next_hop(&self) -> Option<&NextHop> {
        match &self.frontend {
            Frontend::NextHop(n) => Some(n),
            Frontend::Vip(_) => None,
        }
    }

    /// What the service balances, for messages and status: its VIP, or "next hop for" its
    /// destinations.
    pub fn frontend_text(&self) -> String {
        match &self.frontend {
            Frontend::Vip(vip) => vip.to_string(),
            Frontend::NextHop(n) => {
                let list: Vec<String> = n.destinations.iter().map(|d| d.to_string()).collect();
                format!("next hop for {}", list.join(", "))
            }
        }
    }
}

/// Which product routes a service's clients.
#[derive(Clone, Debug, PartialEq)]
pub enum ServiceKind {
    /// `routing_method = "ZONAL"` (the default): Google Cloud's pipeline.
    Zonal(ZonalSpec),
    /// A Traffic Manager routing method.
    TrafficManager(TmSpec),
}

/// The Google Cloud pipeline's settings of a service.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ZonalSpec {
    pub zonal_affinity: ZonalAffinity,
    /// Present = a failover policy is configured.
    pub failover_policy: Option<FailoverPolicy>,
    pub health_check: Option<HealthCheck>,
}

/// A Traffic Manager profile's settings (spec §2), defaults applied.
#[derive(Clone, Debug, PartialEq)]
pub struct TmSpec {
    pub method: TmMethod,
    /// `profileStatus`: Disabled = NXDOMAIN, no traffic.
    pub profile_status: AdminStatus,
    /// DNS TTL in seconds (only with `dns_name`).
    pub ttl: Option<u32>,
    /// MULTIVALUE: records per answer (default 2).
    pub max_return: u32,
    /// Endpoint monitoring, resolved with its defaults; None = endpoints are not probed.
    pub monitor: Option<monitor::MonitorSettings>,
    /// The name the DNS front (`[dns]`) answers for this service.
    pub dns_name: Option<String>,
}

/// One `[[service.backend]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Backend {
    pub endpoint: Endpoint,
    pub weight: u32,
    /// Destination MAC for L2_DSR forwarding (an override of the neighbour entry).
    pub mac: Option<MacAddr>,
    pub role: BackendRole,
}

/// Where a backend's traffic goes.
#[derive(Clone, Debug, PartialEq)]
pub enum Endpoint {
    Address(IpAddr),
    /// A Traffic Manager endpoint whose traffic goes to a child profile (spec §2.5).
    Nested(Nested),
    /// A Traffic Manager external endpoint given by DNS name (`target`): the DNS front answers
    /// a CNAME to it; the per-packet path forwards to the addresses the daemon resolved.
    Name(NameTarget),
}

/// A valid host name (`check_dns_name`), in canonical form: lower case, no trailing dot.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DnsName(String);

impl DnsName {
    /// Checks `name` (see [`check_dns_name`]) and keeps its canonical form.
    pub fn parse(name: &str) -> Result<Self, String> {
        check_dns_name(name)?;
        Ok(Self(canonical_dns_name(name)))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for DnsName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The most addresses of one resolved name that become backends (the rest are left out, and
/// logged): what the data plane's sizing counts for a name endpoint.
pub const MAX_NAME_ADDRESSES: usize = 16;

/// An endpoint given by DNS name, with what the daemon's resolver last found for it.
#[derive(Clone, Debug, PartialEq)]
pub struct NameTarget {
    pub name: DnsName,
    pub resolved: Resolved,
}

/// What resolving a name endpoint gave: its addresses (of the service's VIP family, at most
/// [`MAX_NAME_ADDRESSES`]) and whether they can be trusted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resolved {
    pub addresses: Vec<IpAddr>,
    pub state: Resolution,
}

/// Where the resolution of a name endpoint stands.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Resolution {
    /// Not resolved yet (and outside the daemon, never): no address, CheckingEndpoint.
    #[default]
    Pending,
    /// The last answer, current.
    Answered,
    /// Resolution fails (why), and the last good answer is kept in use: for at most
    /// `[resolver] keep_last_answer_sec` from the first failure.
    Kept(String),
    /// Resolution failed for longer than `keep_last_answer_sec` (or failed from the start):
    /// no address, the endpoint is Degraded. Why.
    Failed(String),
}

/// A nested endpoint: the child service and its Online thresholds.
#[derive(Clone, Debug, PartialEq)]
pub struct Nested {
    pub service: String,
    /// Online child endpoints needed for this endpoint to be Online (default 1).
    pub min_child_endpoints: Option<u32>,
    /// The same test counting IPv4 child endpoints (A queries).
    pub min_child_endpoints_ipv4: Option<u32>,
    /// The same test counting IPv6 child endpoints (AAAA queries).
    pub min_child_endpoints_ipv6: Option<u32>,
}

/// A backend's product-specific fields.
#[derive(Clone, Debug, PartialEq)]
pub enum BackendRole {
    Zonal {
        /// Name of a `[[zone]]`; None = in no client zone.
        zone: Option<String>,
        /// A failover backend (only with a failover policy).
        failover: bool,
    },
    TrafficManager(TmEndpoint),
}

/// A Traffic Manager endpoint's fields (spec §2.1), parsed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TmEndpoint {
    /// Name for messages and status inputs; unique in the service (default: the address).
    pub name: Option<String>,
    /// `endpointStatus`: Disabled endpoints are never returned and not probed.
    pub endpoint_status: AdminStatus,
    /// 1..=1000, unique in the service (None: file order).
    pub priority: Option<u32>,
    /// `endpointLocation`: a region name of `[[latency]]`.
    pub location: Option<String>,
    /// Region codes served (GEOGRAPHIC).
    pub geo_mapping: Vec<String>,
    /// Client ranges (SUBNET); none = the fallback endpoint.
    pub subnets: Vec<ranges::AddrRange>,
    /// `alwaysServe`: never probed, Unmonitored (counted as Online).
    pub always_serve: bool,
    /// Endpoint-level monitor headers, added to the profile's (endpoint wins).
    pub custom_headers: Vec<(String, String)>,
}

impl Backend {
    /// The backend's address; None for a nested endpoint or one given by DNS name (see
    /// [`Backend::addresses`]).
    pub fn address(&self) -> Option<IpAddr> {
        match &self.endpoint {
            Endpoint::Address(a) => Some(*a),
            Endpoint::Nested(_) | Endpoint::Name(_) => None,
        }
    }

    /// Every address the backend's traffic goes to: its own, or its name's resolved ones (none
    /// for a nested endpoint: its child's backends have them).
    pub fn addresses(&self) -> &[IpAddr] {
        match &self.endpoint {
            Endpoint::Address(a) => std::slice::from_ref(a),
            Endpoint::Nested(_) => &[],
            Endpoint::Name(t) => &t.resolved.addresses,
        }
    }

    /// Whether `addr` is one of [`Backend::addresses`].
    pub fn has_address(&self, addr: IpAddr) -> bool {
        self.addresses().contains(&addr)
    }

    /// The data plane records the backend may need: one per address it can have.
    pub fn record_room(&self) -> u32 {
        match &self.endpoint {
            Endpoint::Name(_) => MAX_NAME_ADDRESSES as u32,
            Endpoint::Address(_) | Endpoint::Nested(_) => 1,
        }
    }

    /// True for a nested endpoint (its traffic goes to a child service).
    pub fn is_nested(&self) -> bool {
        matches!(self.endpoint, Endpoint::Nested(_))
    }

    /// The nested endpoint's child, if this is one.
    pub fn nested(&self) -> Option<&Nested> {
        match &self.endpoint {
            Endpoint::Nested(n) => Some(n),
            Endpoint::Address(_) | Endpoint::Name(_) => None,
        }
    }

    /// The endpoint given by DNS name, if this is one.
    pub fn name_target(&self) -> Option<&NameTarget> {
        match &self.endpoint {
            Endpoint::Name(t) => Some(t),
            Endpoint::Address(_) | Endpoint::Nested(_) => None,
        }
    }

    /// The client zone of a zonal backend.
    pub fn zone(&self) -> Option<&str> {
        match &self.role {
            BackendRole::Zonal { zone, .. } => zone.as_deref(),
            BackendRole::TrafficManager(_) => None,
        }
    }

    /// A zonal failover backend.
    pub fn is_failover(&self) -> bool {
        matches!(self.role, BackendRole::Zonal { failover: true, .. })
    }

    /// A Traffic Manager endpoint's fields.
    pub fn tm(&self) -> Option<&TmEndpoint> {
        match &self.role {
            BackendRole::TrafficManager(t) => Some(t),
            BackendRole::Zonal { .. } => None,
        }
    }

    pub fn tm_mut(&mut self) -> Option<&mut TmEndpoint> {
        match &mut self.role {
            BackendRole::TrafficManager(t) => Some(t),
            BackendRole::Zonal { .. } => None,
        }
    }

    /// `endpointStatus` (zonal backends are always Enabled).
    pub fn endpoint_status(&self) -> AdminStatus {
        self.tm().map(|t| t.endpoint_status).unwrap_or_default()
    }

    /// The name used in messages and status inputs: `name`, else the address.
    pub fn label(&self) -> String {
        match (self.tm().and_then(|t| t.name.as_ref()), &self.endpoint) {
            (Some(n), _) => n.clone(),
            (None, Endpoint::Nested(n)) => format!("->{}", n.service),
            (None, Endpoint::Address(a)) => a.to_string(),
            (None, Endpoint::Name(t)) => t.name.to_string(),
        }
    }
}

impl Service {
    /// The zonal pipeline's settings; None for a Traffic Manager service.
    pub fn zonal(&self) -> Option<&ZonalSpec> {
        match &self.kind {
            ServiceKind::Zonal(z) => Some(z),
            ServiceKind::TrafficManager(_) => None,
        }
    }

    /// The Traffic Manager profile's settings; None for a zonal service.
    pub fn tm(&self) -> Option<&TmSpec> {
        match &self.kind {
            ServiceKind::Zonal(_) => None,
            ServiceKind::TrafficManager(t) => Some(t),
        }
    }

    pub fn tm_mut(&mut self) -> Option<&mut TmSpec> {
        match &mut self.kind {
            ServiceKind::Zonal(_) => None,
            ServiceKind::TrafficManager(t) => Some(t),
        }
    }

    /// `routing_method` as the file has it (ZONAL or the Traffic Manager method).
    pub fn routing_method(&self) -> RoutingMethod {
        self.tm().map_or(RoutingMethod::Zonal, |t| t.method.into())
    }

    /// The health check of a zonal service.
    pub fn health_check(&self) -> Option<&HealthCheck> {
        self.zonal().and_then(|z| z.health_check.as_ref())
    }

    /// Traffic Manager `profileStatus` (Enabled for zonal services).
    pub fn profile_status(&self) -> AdminStatus {
        self.tm().map(|t| t.profile_status).unwrap_or_default()
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
        let z = b.zone()?;
        cfg.zones.iter().position(|zone| zone.name == z)
    }

    /// The port the health check probes: its own `port`, else the service's first port
    /// (validation guarantees one of them exists when a health check is configured).
    pub fn health_check_port(&self) -> Option<u16> {
        let hc = self.health_check()?;
        hc.port.or_else(|| self.ports.first().copied())
    }
}

/// A file that passed validation, into the typed model. Every parse below succeeded in
/// validation already (`validate`, `tm_validate`): a failure here is a bug, not bad input.
impl From<raw::Config> for Config {
    fn from(raw: raw::Config) -> Self {
        Config {
            dataplane: raw.dataplane,
            zones: raw.zones,
            services: raw.services.into_iter().map(Service::from).collect(),
            latency: raw.latency,
            geo: raw.geo,
            dns: raw.dns,
            announce: raw.announce,
            metrics: raw.metrics,
            resolver: raw.resolver,
            geoip: None,
        }
    }
}

impl From<raw::Service> for Service {
    fn from(s: raw::Service) -> Self {
        let kind = match s.routing_method.tm_method() {
            None => ServiceKind::Zonal(ZonalSpec {
                zonal_affinity: s.zonal_affinity.clone(),
                failover_policy: s.failover_policy.clone(),
                health_check: s.health_check.clone(),
            }),
            Some(method) => ServiceKind::TrafficManager(TmSpec {
                method,
                profile_status: s.profile_status(),
                ttl: s.ttl,
                max_return: s.max_return(),
                monitor: s
                    .monitor
                    .as_ref()
                    .map(|m| monitor::MonitorSettings::from_config(m).expect("validated: [service.monitor]")),
                dns_name: s.dns_name.clone(),
            }),
        };
        let tm = matches!(kind, ServiceKind::TrafficManager(_));
        let next_hop = s.next_hop.is_some();
        Service {
            backends: s.backends.into_iter().map(|b| Backend::from_raw(b, tm)).collect(),
            name: s.name,
            frontend: match (s.next_hop, s.vip) {
                (Some(n), _) => Frontend::NextHop(NextHop {
                    destinations: n.destinations,
                    symmetric: n.symmetric,
                    interfaces: n.interfaces,
                }),
                (None, vip) => Frontend::Vip(vip.expect("validated: vip or next_hop")),
            },
            protocol: s.protocol,
            ports: s.ports,
            session_affinity: s.session_affinity,
            forwarding: s.forwarding.unwrap_or(if next_hop { Forwarding::L2Dsr } else { Forwarding::Ipip }),
            connection_tracking: s.connection_tracking,
            connection_draining: s.connection_draining,
            kind,
        }
    }
}

impl Backend {
    fn from_raw(b: raw::Backend, tm: bool) -> Self {
        let endpoint = match (b.target_service, &b.target) {
            (Some(service), _) => Endpoint::Nested(Nested {
                service,
                min_child_endpoints: b.min_child_endpoints,
                min_child_endpoints_ipv4: b.min_child_endpoints_ipv4,
                min_child_endpoints_ipv6: b.min_child_endpoints_ipv6,
            }),
            (None, Some(name)) => Endpoint::Name(NameTarget {
                name: DnsName::parse(name).expect("validated: target"),
                resolved: Resolved::default(),
            }),
            (None, None) => Endpoint::Address(b.address),
        };
        let role = if tm {
            BackendRole::TrafficManager(TmEndpoint {
                name: b.name,
                endpoint_status: b.endpoint_status,
                priority: b.priority,
                location: b.location,
                geo_mapping: b.geo_mapping,
                subnets: b.subnets.iter().map(|t| ranges::parse_subnet(t).expect("validated: subnets")).collect(),
                always_serve: b.always_serve,
                custom_headers: monitor::parse_custom_headers(&b.custom_headers).expect("validated: custom_headers"),
            })
        } else {
            BackendRole::Zonal { zone: b.zone, failover: b.failover }
        };
        Backend { endpoint, weight: b.weight, mac: b.mac, role }
    }
}

impl Config {
    /// Index of the service with this name.
    pub fn service_index(&self, name: &str) -> Option<usize> {
        self.services.iter().position(|s| s.name == name)
    }

    /// Whether the service `key.service` has a backend at `key.address`.
    pub fn has_backend(&self, key: &BackendKey) -> bool {
        self.services.iter().any(|s| s.name == key.service && s.backends.iter().any(|b| b.has_address(key.address)))
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
        let raw = raw::Config::read_text(text)?;
        let violations = validate::check(&raw, host);
        if !violations.is_empty() {
            return Err(ConfigErrorKind::Invalid(violations));
        }
        let database = raw.dns.as_ref().and_then(|d| d.geoip_database.clone());
        let mut cfg = Config::from(raw);
        if let Some(path) = database {
            let db = geoip::GeoIp::load(&path).map_err(|problem| {
                ConfigErrorKind::Invalid(vec![Violation {
                    scope: Scope::Dns,
                    field: "dns.geoip_database".into(),
                    problem: format!("{problem}: must be a MaxMind DB (GeoLite2/GeoIP2 Country or City)"),
                }])
            })?;
            cfg.geoip = Some(std::sync::Arc::new(db));
        }
        Ok(cfg)
    }

    /// The settings that have no effect in this configuration (warnings, see `notices`).
    pub fn notices(&self) -> Vec<Violation> {
        notices::notices(self)
    }
}
