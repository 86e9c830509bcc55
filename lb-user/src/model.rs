//! Enumerations of the configuration contract. Serialized names are the Google Cloud API's own
//! strings (`sessionAffinity`, `trackingMode`, ...), so `gcloud` users recognise them.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! api_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, schemars::JsonSchema)]
        pub enum $name {
            $($(#[$vm])* #[serde(rename = $text)] $variant),+
        }

        impl $name {
            /// Every accepted spelling, for error messages.
            pub const ALLOWED: &'static [&'static str] = &[$($text),+];

            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok(Self::$variant),)+
                    _ => Err(format!("unknown value {s:?}, allowed: {}", Self::ALLOWED.join(", "))),
                }
            }
        }
    };
}

api_enum!(
    /// Service protocol (`backendService.protocol` of a passthrough NLB).
    Protocol { Tcp = "TCP", Udp = "UDP", L3Default = "L3_DEFAULT" }
);

api_enum!(
    /// `sessionAffinity` (spec §1.3 table S).
    #[derive(Default)]
    SessionAffinity {
        #[default] None = "NONE",
        ClientIpPortProto = "CLIENT_IP_PORT_PROTO",
        ClientIpProto = "CLIENT_IP_PROTO",
        ClientIp = "CLIENT_IP",
        ClientIpNoDestination = "CLIENT_IP_NO_DESTINATION",
    }
);

api_enum!(
    /// How packets reach the backend.
    #[derive(Default)]
    Forwarding { #[default] Ipip = "IPIP", L2Dsr = "L2_DSR" }
);

api_enum!(
    /// `zonalAffinity.spillover` (spec §1.5).
    #[derive(Default)]
    Spillover {
        #[default] Disabled = "ZONAL_AFFINITY_DISABLED",
        StayWithinZone = "ZONAL_AFFINITY_STAY_WITHIN_ZONE",
        SpillCrossZone = "ZONAL_AFFINITY_SPILL_CROSS_ZONE",
    }
);

api_enum!(
    /// A health check's `portSpecification`: its own `port`, a named port (instance groups'),
    /// or the service's port.
    PortSpecification {
        UseFixedPort = "USE_FIXED_PORT",
        UseNamedPort = "USE_NAMED_PORT",
        UseServingPort = "USE_SERVING_PORT",
    }
);

api_enum!(
    /// A health check's `proxyHeader`: a PROXY protocol v1 line sent before the probe's data.
    #[derive(Default)]
    ProxyHeader { #[default] None = "NONE", ProxyV1 = "PROXY_V1" }
);

api_enum!(
    /// `connectionTrackingPolicy.trackingMode`.
    #[derive(Default)]
    TrackingMode { #[default] PerConnection = "PER_CONNECTION", PerSession = "PER_SESSION" }
);

api_enum!(
    /// `connectionTrackingPolicy.connectionPersistenceOnUnhealthyBackends` (spec §1.4).
    #[derive(Default)]
    Persistence {
        #[default] DefaultForProtocol = "DEFAULT_FOR_PROTOCOL",
        NeverPersist = "NEVER_PERSIST",
        AlwaysPersist = "ALWAYS_PERSIST",
    }
);

api_enum!(
    /// `subsetting.policy` (spec §1.0). The balancer always uses every backend: validation
    /// refuses CONSISTENT_HASH_SUBSETTING (it is parsed so that the message can say why).
    #[derive(Default)]
    Subsetting { #[default] None = "NONE", ConsistentHashSubsetting = "CONSISTENT_HASH_SUBSETTING" }
);

api_enum!(
    /// Health check protocol.
    #[derive(Default)]
    HealthProtocol {
        #[default] Tcp = "TCP",
        Ssl = "SSL",
        Http = "HTTP",
        Https = "HTTPS",
        Http2 = "HTTP2",
        Grpc = "GRPC",
        GrpcWithTls = "GRPC_WITH_TLS",
    }
);

api_enum!(
    /// Where a health check's probes go: `VIP` = to the VIP, delivered to the one backend
    /// checked the way its client packets are (encapsulated or MAC-rewritten), so a backend
    /// that does not serve the VIP fails; `DIRECT` = to the backend's own address.
    HealthPath { Vip = "VIP", Direct = "DIRECT" }
);

// ---------------------------------------------------------------- Azure Traffic Manager (spec §2)
// Serialized names are Traffic Manager's own strings, except the routing-method selector, which
// follows this file's upper-case style because it also names the Google Cloud pipeline (ZONAL).

/// `RoutingMethod` and `TmMethod` from one list of the Traffic Manager methods: the second is
/// the first without ZONAL, so Traffic Manager code never has a zonal case to handle.
macro_rules! routing_methods {
    ($($variant:ident = $text:literal),+ $(,)?) => {
        api_enum!(
            /// How a service picks backends: ZONAL is the Google Cloud pipeline (spec §1); the others
            /// are Traffic Manager routing methods (spec §2.4).
            #[derive(Default)]
            RoutingMethod { #[default] Zonal = "ZONAL", $($variant = $text),+ }
        );

        api_enum!(
            /// A Traffic Manager routing method (spec §2.4): `routing_method` of a service that
            /// is not ZONAL.
            TmMethod { $($variant = $text),+ }
        );

        impl RoutingMethod {
            /// The Traffic Manager method; None for ZONAL.
            pub fn tm_method(self) -> Option<TmMethod> {
                match self {
                    Self::Zonal => None,
                    $(Self::$variant => Some(TmMethod::$variant)),+
                }
            }
        }

        impl From<TmMethod> for RoutingMethod {
            fn from(m: TmMethod) -> Self {
                match m {
                    $(TmMethod::$variant => Self::$variant),+
                }
            }
        }
    };
}

routing_methods!(
    Priority = "PRIORITY",
    Weighted = "WEIGHTED",
    Performance = "PERFORMANCE",
    Geographic = "GEOGRAPHIC",
    MultiValue = "MULTIVALUE",
    Subnet = "SUBNET",
);

api_enum!(
    /// `endpointStatus` / `profileStatus`: an administrative switch.
    #[derive(Default)]
    AdminStatus { #[default] Enabled = "Enabled", Disabled = "Disabled" }
);

impl HealthProtocol {
    /// HTTP over plain TCP or TLS (HTTP/2: over TLS, ALPN h2): a `GET request_path` judged by
    /// its status (and body).
    pub fn is_http(self) -> bool {
        matches!(self, Self::Http | Self::Https | Self::Http2)
    }

    /// `grpc.health.v1.Health/Check`, over plain HTTP/2 or TLS.
    pub fn is_grpc(self) -> bool {
        matches!(self, Self::Grpc | Self::GrpcWithTls)
    }
}

api_enum!(
    /// `monitorConfig.protocol` (spec §2.3).
    #[derive(Default)]
    MonitorProtocol { #[default] Http = "HTTP", Https = "HTTPS", Tcp = "TCP" }
);

api_enum!(
    /// Endpoint monitor status (spec §2.2, §2.3).
    MonitorStatus {
        CheckingEndpoint = "CheckingEndpoint",
        Online = "Online",
        Degraded = "Degraded",
        Disabled = "Disabled",
        Inactive = "Inactive",
        Stopped = "Stopped",
        Unmonitored = "Unmonitored",
    }
);

api_enum!(
    /// Profile monitor status (spec §2.3), derived from the endpoints'.
    ProfileMonitorStatus {
        Disabled = "Disabled",
        Degraded = "Degraded",
        Online = "Online",
        CheckingEndpoints = "CheckingEndpoints",
        Inactive = "Inactive",
    }
);

impl RoutingMethod {
    /// True for the Traffic Manager methods (everything but ZONAL).
    pub fn is_traffic_manager(self) -> bool {
        self != Self::Zonal
    }
}

/// A MAC address, written `aa:bb:cc:dd:ee:ff`: exactly six two-digit hex octets. The type of
/// the configuration's `mac` fields, parsed once when the file is read (a malformed one is a
/// load error naming the field and the form) and written back in the same form.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MacAddr(pub [u8; 6]);

impl TryFrom<String> for MacAddr {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        text.parse().map_err(|()| {
            format!("mac {text:?} is malformed: must be six hex octets separated by ':' (e.g. \"02:00:c6:12:0b:01\")")
        })
    }
}

impl From<MacAddr> for String {
    fn from(mac: MacAddr) -> Self {
        mac.to_string()
    }
}

/// The configuration's schema of a MAC: a string of the form `FromStr` accepts.
impl schemars::JsonSchema for MacAddr {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "MacAddr".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": "^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}$",
            "description": "Six two-digit hex octets separated by ':', e.g. \"02:00:c6:12:0b:01\"."
        })
    }
}

impl std::str::FromStr for MacAddr {
    type Err = ();

    fn from_str(text: &str) -> Result<Self, ()> {
        let mut mac = [0u8; 6];
        let mut octets = text.split(':');
        for byte in &mut mac {
            let o = octets.next().ok_or(())?;
            if o.len() != 2 || !o.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(());
            }
            *byte = u8::from_str_radix(o, 16).map_err(|_| ())?;
        }
        match octets.next() {
            None => Ok(Self(mac)),
            Some(_) => Err(()),
        }
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

#[cfg(test)]
mod tests {
    use super::MacAddr;

    #[test]
    fn macs() {
        let is_valid_mac = |text: &str| text.parse::<MacAddr>().is_ok();
        assert!(is_valid_mac("02:00:c6:12:0b:01") && is_valid_mac("AA:BB:CC:DD:EE:FF"));
        for bad in
            ["", "02:00:c6:12:0b", "02:00:c6:12:0b:01:02", "02-00-c6-12-0b-01", "2:00:c6:12:0b:01", "0g:00:c6:12:0b:01"]
        {
            assert!(!is_valid_mac(bad), "{bad}");
        }
    }
}

/// A backend as the controller keys its ids, health verdicts, overrides and drains: its
/// service's name and its address. Serialized as the pair `[service, address]`, the form the
/// persistent state (`state.json`) has always stored these keys in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(from = "(String, std::net::IpAddr)", into = "(String, std::net::IpAddr)")]
pub struct BackendKey {
    pub service: String,
    pub address: std::net::IpAddr,
}

impl BackendKey {
    pub fn new(service: &str, address: std::net::IpAddr) -> Self {
        Self { service: service.to_owned(), address }
    }
}

impl From<(String, std::net::IpAddr)> for BackendKey {
    fn from((service, address): (String, std::net::IpAddr)) -> Self {
        Self { service, address }
    }
}

impl From<BackendKey> for (String, std::net::IpAddr) {
    fn from(k: BackendKey) -> Self {
        (k.service, k.address)
    }
}

/// Serde form of a list of (backend, value) as flat triples `[service, address, value]`, the
/// form `state.json` stores verdicts and ids in (`#[serde(with = "keyed_triples")]`).
pub mod keyed_triples {
    use super::BackendKey;
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::net::IpAddr;

    pub fn serialize<S: Serializer, V: Serialize>(list: &[(BackendKey, V)], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(list.iter().map(|(k, v)| (&k.service, k.address, v)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>, V: Deserialize<'de>>(d: D) -> Result<Vec<(BackendKey, V)>, D::Error> {
        let triples = Vec::<(String, IpAddr, V)>::deserialize(d)?;
        Ok(triples.into_iter().map(|(service, address, v)| (BackendKey { service, address }, v)).collect())
    }
}
