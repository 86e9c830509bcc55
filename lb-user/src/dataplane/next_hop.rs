//! Next-hop routes: the `NEXT_HOP_ROUTES` trie, destination prefix -> route (longest prefix
//! wins), which the data plane consults for packets no VIP service took. A route is the
//! address word of the next-hop service keys (`FAMILY_NEXT_HOP`) that balance its packets;
//! `NEXT_HOP_UNTOUCHED` exempts a prefix inside a routed one (the host's own addresses, VIPs).

use anyhow::{Context, Result};
use aya::maps::lpm_trie::Key as LpmKey;
use ipnet::IpNet;
use lb_common::maps::{addr_words, NextHopKey, FAMILY_V4, NEXT_HOP_FAMILY_BITS};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::Dataplane;

/// The trie key of a destination prefix.
fn route_key(prefix: IpNet) -> LpmKey<NextHopKey> {
    let net = prefix.trunc();
    let (addr, family) = addr_words(net.network());
    LpmKey::new(NEXT_HOP_FAMILY_BITS + net.prefix_len() as u32, NextHopKey { family_be: (family as u32).to_be(), addr })
}

/// The destination prefix of a trie key (inverse of [`route_key`]).
fn route_prefix(key: &LpmKey<NextHopKey>) -> IpNet {
    let NextHopKey { family_be, addr } = key.data();
    let len = key.prefix_len().saturating_sub(NEXT_HOP_FAMILY_BITS) as u8;
    let bytes: Vec<u8> = addr.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let ip = if u32::from_be(family_be) == FAMILY_V4 as u32 {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    } else {
        IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(bytes.as_slice()).unwrap_or([0; 16])))
    };
    IpNet::new(ip, len).unwrap_or_else(|_| IpNet::from(ip))
}

impl Dataplane {
    /// Routes destinations in `prefix` to `route` (or exempts them: `NEXT_HOP_UNTOUCHED`).
    pub fn set_next_hop_route(&mut self, prefix: IpNet, route: u32) -> Result<()> {
        self.next_hop_routes
            .insert(&route_key(prefix), route, 0)
            .with_context(|| format!("routing {prefix} in NEXT_HOP_ROUTES (full?)"))
    }

    /// Removes `prefix` (exact) from the routes; Ok if it was not there.
    pub fn remove_next_hop_route(&mut self, prefix: IpNet) -> Result<()> {
        match self.next_hop_routes.remove(&route_key(prefix)) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {prefix} from NEXT_HOP_ROUTES")),
        }
    }

    /// Every (prefix, route) in the trie.
    pub fn next_hop_routes(&self) -> Result<Vec<(IpNet, u32)>> {
        let mut routes = Vec::new();
        for key in self.next_hop_routes.keys() {
            let key = key.context("reading NEXT_HOP_ROUTES")?;
            let route = self.next_hop_routes.get(&key, 0).context("reading NEXT_HOP_ROUTES")?;
            routes.push((route_prefix(&key), route));
        }
        routes.sort();
        Ok(routes)
    }
}
