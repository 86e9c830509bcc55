//! What the routing methods know about a client (spec §2 intro): its location address (the
//! EDNS Client Subnet if present, else the resolver's or packet's source), the regions it
//! measures nearest first (`[[latency]]`) and its most specific region code (`[[geo]]`, else
//! `[dns] geoip_database`).

use crate::config::geoip::Located;
use crate::config::Config;
use ipnet::IpNet;
use std::net::IpAddr;

/// The location inputs of one client. `Default` is a client nothing is known about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Client {
    /// Location address (SUBNET, and the spread inside a PERFORMANCE region).
    pub addr: Option<IpAddr>,
    /// Region names in ascending round-trip time (PERFORMANCE).
    pub latency: Vec<String>,
    /// Most specific region code (GEOGRAPHIC).
    pub geo: Option<String>,
}

/// Spec §2 / vector N4: the EDNS Client Subnet address wins over the resolver's address.
pub fn location_address(resolver: IpAddr, ecs: Option<IpNet>) -> IpAddr {
    ecs.map(|n| n.network()).unwrap_or(resolver)
}

/// Longest-prefix match over entries that each carry a list of prefixes: the index of the
/// entry with the longest prefix containing `addr` (the first such entry on a tie).
pub fn longest_match<'a>(entries: impl IntoIterator<Item = (usize, &'a [IpNet])>, addr: IpAddr) -> Option<usize> {
    let mut best: Option<(u8, usize)> = None;
    for (i, prefixes) in entries {
        for net in prefixes {
            if net.contains(&addr) && best.is_none_or(|(len, _)| net.prefix_len() > len) {
                best = Some((net.prefix_len(), i));
            }
        }
    }
    best.map(|(_, i)| i)
}

/// The `[[latency]]` entry for an address (longest prefix wins).
pub fn latency_entry(cfg: &Config, addr: IpAddr) -> Option<usize> {
    longest_match(cfg.latency.iter().enumerate().map(|(i, e)| (i, e.client_prefixes.as_slice())), addr)
}

/// The `[[geo]]` entry for an address (longest prefix wins).
pub fn geo_entry(cfg: &Config, addr: IpAddr) -> Option<usize> {
    longest_match(cfg.geo.iter().enumerate().map(|(i, e)| (i, e.client_prefixes.as_slice())), addr)
}

/// What located a client for GEOGRAPHIC routing (`lb plan --client`, `lb explain`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GeoSource {
    /// The `index`-th `[[geo]]` entry, by its longest matching prefix.
    Prefix { index: usize, prefix: IpNet },
    /// `[dns] geoip_database`: the network that matched and the record's codes.
    Database(Located),
}

impl std::fmt::Display for GeoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Prefix { index, prefix } => write!(f, "[[geo]] entry {index}, prefix {prefix}"),
            Self::Database(l) => {
                write!(f, "GeoIP database, network {}, country {}", l.network, l.country)?;
                match &l.subdivision {
                    Some(s) => write!(f, ", subdivision {s}"),
                    None => Ok(()),
                }
            }
        }
    }
}

/// Where service `svc`'s GEOGRAPHIC routing (its own, or a nested child's) locates `addr`,
/// and what said so, e.g. `US-CA (GeoIP database, network 198.18.64.0/18, country US,
/// subdivision CA)`; None when the service does not route by geography.
pub fn geo_location(cfg: &Config, svc: usize, addr: IpAddr) -> Option<String> {
    let geographic = super::classes::reachable_services(cfg, svc)
        .into_iter()
        .any(|s| cfg.services[s].tm().is_some_and(|t| t.method == crate::model::TmMethod::Geographic));
    if !geographic {
        return None;
    }
    Some(match geo_of(cfg, addr) {
        Some((region, source)) => format!("{region} ({source})"),
        None => "unknown (no [[geo]] prefix or GeoIP record)".into(),
    })
}

/// A client's GEOGRAPHIC region and what located it: a `[[geo]]` prefix wins where one matches,
/// else the GeoIP database.
pub fn geo_of(cfg: &Config, addr: IpAddr) -> Option<(String, GeoSource)> {
    if let Some(index) = geo_entry(cfg, addr) {
        let entry = &cfg.geo[index];
        let prefix = entry.client_prefixes.iter().filter(|p| p.contains(&addr)).max_by_key(|p| p.prefix_len())?;
        return Some((entry.region.clone(), GeoSource::Prefix { index, prefix: *prefix }));
    }
    let located = cfg.geoip.as_ref()?.locate(addr)?;
    Some((located.region.clone(), GeoSource::Database(located)))
}

impl Client {
    /// Locates a client from its location address using the configured inputs.
    pub fn locate(cfg: &Config, addr: IpAddr) -> Client {
        Client {
            addr: Some(addr),
            latency: latency_entry(cfg, addr).map(|i| cfg.latency[i].regions.clone()).unwrap_or_default(),
            geo: geo_of(cfg, addr).map(|(region, _)| region),
        }
    }
}
