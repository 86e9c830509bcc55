//! The daemon's replies on the control socket, typed: the daemon builds them, the CLI renders
//! them (`cli::render`) or prints them as JSON (`--json`), and the tests read them. Each is the
//! `result` of an `api::Response`; the JSON field names are the wire format.

use crate::model::{Protocol, RoutingMethod};
use crate::policy::{EligibleKind, Rule};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;

pub use crate::compile::explain::{ClassFacts, Explanation};

/// A backend's health as an operator sets it (`lb backend --health`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HealthOverride {
    Healthy,
    Unhealthy,
    /// Back to the health checker's verdict.
    Auto,
}

/// `lb status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub config: String,
    pub interfaces: Vec<String>,
    /// Each `--interface`'s attachment: `attached`, `detached`, `detached (interface removed)`.
    pub links: Vec<LinkStatus>,
    /// The data plane's pins: `ok`, or `lost: <what>` when someone removed them.
    pub pins: String,
    pub services: Vec<ServiceStatus>,
    /// The VIP announcement (`[announce]`), if configured.
    pub announce: Option<AnnounceStatus>,
    /// Reloads since the daemon started (SIGHUP or `lb reload`).
    #[serde(default)]
    pub reloads: ReloadCounts,
    /// The daemon's survived failures by name (`daemon::faults`); absent from older daemons.
    #[serde(default)]
    pub faults: Counters,
    /// Each probed backend's last health-check or monitor probe.
    #[serde(default)]
    pub probes: Vec<ProbeStatus>,
    /// The last scan for clean Maglev slots (SYNs there need no connection-table entry);
    /// absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clean_slots: Option<CleanSlots>,
}

/// What the last scan of the connection table found (`Dataplane::scan_clean_slots`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CleanSlots {
    /// Maglev slots of the active tables with no live entry that names another backend.
    pub clean: u64,
    pub slots: u64,
    /// Live entries the scan read.
    pub entries: u64,
}

/// Reloads applied and refused, and why the last one was refused if no reload was applied
/// since (`lb status`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ReloadCounts {
    pub applied: u64,
    pub refused: u64,
    pub last_refusal: Option<String>,
}

/// One interface's XDP attachment (`lb status`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LinkStatus {
    pub interface: String,
    pub state: String,
    /// The interface's last MAC change and what the daemon did: `changed from A to B,
    /// followed`, or `not followed: <why>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// What the balancer announces (`lb status`, `[announce]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnnounceStatus {
    pub device: String,
    pub table: u32,
    /// A host drain withdrew the VIPs.
    pub draining: bool,
    pub announced: Vec<IpAddr>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    pub name: String,
    /// The VIP; None for a next-hop service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vip: Option<IpAddr>,
    /// A next-hop service's destinations; None for a VIP service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop: Option<NextHopView>,
    pub protocol: Protocol,
    pub ports: Vec<u16>,
    /// Zonal services: the §1.2 eligible kind, rule and active pool (None before the first
    /// tables, and for Traffic Manager services).
    pub eligible_kind: Option<EligibleKind>,
    pub rule: Option<Rule>,
    pub active_pool: Option<String>,
    pub backends: Vec<BackendStatus>,
    /// The eligible set per client zone (zonal services).
    pub zones: Vec<ZoneView>,
    pub routing_method: RoutingMethod,
    /// Traffic Manager services: the routing method's client classes; None for zonal ones.
    pub classes: Option<Vec<ClassView>>,
    /// The endpoints given by DNS name and what their name resolved to (absent: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<NameView>,
    /// The health check: protocol, port and where its probes go (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<String>,
}

/// An endpoint given by DNS name (`lb status`): its name's addresses (of the VIP's family) and
/// whether the name resolves.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NameView {
    /// The endpoint's label (`name`, else the DNS name).
    pub endpoint: String,
    pub target: String,
    pub addresses: Vec<IpAddr>,
    /// `pending` (no answer yet), `resolved`, `kept: <why>` (resolution fails, the last
    /// answer is in use), `failed: <why>` (no address: Degraded).
    pub resolution: String,
    /// The endpoint's monitor status (Traffic Manager's: Online, Degraded, ...).
    pub monitor_status: String,
}

/// What a next-hop service balances.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NextHopView {
    pub destinations: Vec<ipnet::IpNet>,
    pub symmetric: bool,
}

impl ServiceStatus {
    /// The VIP, or "next hop for" the destinations (as `config::Service::frontend_text`).
    pub fn frontend_text(&self) -> String {
        match (&self.vip, &self.next_hop) {
            (Some(vip), _) => vip.to_string(),
            (None, Some(n)) => {
                let list: Vec<String> = n.destinations.iter().map(|d| d.to_string()).collect();
                format!("next hop for {}", list.join(", "))
            }
            (None, None) => "-".to_owned(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    pub address: IpAddr,
    pub zone: Option<String>,
    pub role: Role,
    pub health: Health,
    pub health_source: HealthSource,
    pub weight: u32,
    pub draining: bool,
}

/// The last probe of one backend (`lb status`), apart from the services' state so that
/// comparing two statuses' services compares configuration and verdicts, not probe timings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeStatus {
    pub service: String,
    pub address: IpAddr,
    pub last: ProbeResult,
}

/// One probe's result (`lb status`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProbeResult {
    pub passed: bool,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// How long the probe took, in milliseconds.
    pub latency_ms: f64,
    /// How long ago it ran, in seconds.
    pub seconds_ago: u64,
}

/// A backend's role in its service's failover policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Primary,
    Failover,
}

/// A backend's health as the data plane uses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Health {
    Healthy,
    Unhealthy,
    /// Health-checked, no verdict yet: takes no new connections while a backend of its service
    /// is healthy.
    Unchecked,
}

/// Where a backend's health comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthSource {
    /// `lb backend set`.
    Override,
    HealthCheck,
    /// No health check: healthy from the start.
    Initial,
}

/// The wire names, for the human renderings too.
macro_rules! display_as_wire {
    ($($t:ty),+) => {$(
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let v = serde_json::to_value(self).map_err(|_| fmt::Error)?;
                f.write_str(v.as_str().unwrap_or_default())
            }
        }
    )+};
}
display_as_wire!(Role, Health, HealthSource);

/// One client zone's eligible set (None = the non-compatible clients).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ZoneView {
    pub client_zone: Option<String>,
    pub affinity: String,
    /// Empty = new flows are dropped.
    pub eligible: Vec<IpAddr>,
}

/// One Traffic Manager client class: its source prefixes (none = the default class) and set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassView {
    pub class: usize,
    pub client_prefixes: Vec<ipnet::IpNet>,
    pub eligible: Vec<IpAddr>,
    pub reason: String,
}

/// `lb stats`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Global counters, in the ABI's order (`lb_common::maps::stat::NAMES`).
    pub global: Counters,
    pub services: Vec<ServiceStats>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceStats {
    pub name: String,
    /// Its classes are a routing method's (labelled by number), not zones.
    pub traffic_manager: bool,
    pub classes: Vec<ClassStats>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClassStats {
    pub client_class: u32,
    pub client_zone: Option<String>,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub cross_zone_spills: u64,
}

/// Named counters in a fixed order; a JSON object on the wire (`{"name": value, ...}`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters(pub Vec<(String, u64)>);

impl Serialize for Counters {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(k, v)| (k, v)))
    }
}

impl<'de> Deserialize<'de> for Counters {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Counters;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object of counter names to numbers")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Counters, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = map.next_entry::<String, u64>()? {
                    out.push(entry);
                }
                Ok(Counters(out))
            }
        }
        d.deserialize_map(Visit)
    }
}

/// `lb backend set|drain|undrain`: what was changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BackendChange {
    pub service: String,
    pub address: IpAddr,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthOverride>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
}

/// `lb reload`: the file that was applied.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Reloaded {
    pub reloaded: String,
}

/// `lb backend drain --host`: the VIPs are withdrawn; the daemon stops in `stop_in_sec`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostDrain {
    pub host_draining: bool,
    pub stop_in_sec: u32,
}

/// `lb reload --dry-run`: what a reload of the file would change (nothing is applied).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReloadPlan {
    pub config: String,
    /// Services added, removed or changed, in the file's order (removed ones last).
    pub services: Vec<ServiceChange>,
    /// Maglev tables the reload would write, over all services.
    pub tables_to_write: usize,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Added,
    Removed,
    Changed,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ServiceChange {
    pub name: String,
    pub change: ChangeKind,
    pub backends_added: Vec<IpAddr>,
    pub backends_removed: Vec<IpAddr>,
    /// Client zones or classes whose eligible set changes.
    pub eligible: Vec<EligibleChange>,
    /// Maglev tables of this service that would be written.
    pub tables: usize,
}

/// One client zone's (or Traffic Manager class's) eligible set before and after; None where
/// the zone or class does not exist.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EligibleChange {
    pub client: String,
    pub before: Option<Vec<IpAddr>>,
    pub after: Option<Vec<IpAddr>>,
}

/// Any reply, as the daemon's loop sends it (the CLI reads the one it asked for).
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    Status(Status),
    Stats(Stats),
    Explain(Explanation),
    Backend(BackendChange),
    Reloaded(Reloaded),
    ReloadPlan(ReloadPlan),
    HostDrain(HostDrain),
    Trace(TraceState),
}

/// The daemon's answer to a trace request.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TraceState {
    /// Whether the traced program is attached now.
    pub tracing: bool,
    /// Seconds until the daemon stops the trace by itself.
    pub seconds_left: Option<u32>,
    /// The interfaces it is attached to.
    pub interfaces: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_keep_their_order_on_the_wire() {
        let c = Counters(vec![("zeta".into(), 1), ("alpha".into(), 2), ("mid".into(), 0)]);
        let text = serde_json::to_string(&c).unwrap();
        assert_eq!(text, r#"{"zeta":1,"alpha":2,"mid":0}"#);
        assert_eq!(serde_json::from_str::<Counters>(&text).unwrap(), c);
    }

    #[test]
    fn backend_change_wire_format() {
        let address = "198.18.11.1".parse().unwrap();
        let drain = BackendChange { service: "web".into(), address, health: None, draining: Some(true) };
        assert_eq!(
            serde_json::to_string(&drain).unwrap(),
            r#"{"service":"web","address":"198.18.11.1","draining":true}"#
        );
        let set = BackendChange { service: "web".into(), address, health: Some(HealthOverride::Auto), draining: None };
        assert_eq!(
            serde_json::to_string(&set).unwrap(),
            r#"{"service":"web","address":"198.18.11.1","health":"auto"}"#
        );
    }

    /// The typed fields keep the wire's strings (scripts read `lb status --json`).
    #[test]
    fn typed_status_fields_keep_their_wire_names() {
        let b = BackendStatus {
            address: "198.18.11.1".parse().unwrap(),
            zone: None,
            role: Role::Failover,
            health: Health::Unchecked,
            health_source: HealthSource::HealthCheck,
            weight: 1,
            draining: false,
        };
        let v = serde_json::to_value(&b).unwrap();
        assert_eq!(
            (&v["role"], &v["health"], &v["health_source"]),
            (&"failover".into(), &"unchecked".into(), &"health_check".into())
        );
        assert_eq!(b.health_source.to_string(), "health_check");
        let wire = |x: serde_json::Value| x.as_str().unwrap().to_owned();
        assert_eq!(wire(serde_json::to_value(Rule::E8).unwrap()), Rule::E8.id());
        assert_eq!(
            wire(serde_json::to_value(EligibleKind::HealthyFailover).unwrap()),
            EligibleKind::HealthyFailover.as_str()
        );
        assert_eq!(wire(serde_json::to_value(RoutingMethod::MultiValue).unwrap()), "MULTIVALUE");
        assert_eq!(wire(serde_json::to_value(Protocol::L3Default).unwrap()), Protocol::L3Default.as_str());
    }
}
