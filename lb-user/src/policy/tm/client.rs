//! What the routing methods know about a client (spec §2 intro): its location address (the
//! EDNS Client Subnet if present, else the resolver's or packet's source), the regions it
//! measures nearest first (`[[latency]]`) and its most specific region code (`[[geo]]`).

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

impl Client {
    /// Locates a client from its location address using the configured inputs.
    pub fn locate(cfg: &Config, addr: IpAddr) -> Client {
        Client {
            addr: Some(addr),
            latency: latency_entry(cfg, addr).map(|i| cfg.latency[i].regions.clone()).unwrap_or_default(),
            geo: geo_entry(cfg, addr).map(|i| cfg.geo[i].region.clone()),
        }
    }
}
