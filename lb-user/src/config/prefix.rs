//! Deserializers for address prefixes that also accept a bare address as a host prefix
//! (`198.18.0.1` = `198.18.0.1/32`), since "an address" is a natural thing to write.

use ipnet::IpNet;
use serde::{Deserialize, Deserializer};
use std::net::IpAddr;

fn parse(text: &str) -> Result<IpNet, String> {
    if let Ok(net) = text.parse::<IpNet>() {
        return Ok(net);
    }
    match text.parse::<IpAddr>() {
        Ok(addr) => Ok(IpNet::from(addr)),
        Err(_) => Err(format!(
            "invalid prefix {text:?}: expected an IP address or address/length \
             (e.g. \"198.18.1.0/24\", \"2001:db8:1::/64\")"
        )),
    }
}

/// A list of client prefixes. An IPv4-mapped IPv6 prefix (`::ffff:198.19.0.0/112`) is read as
/// the IPv4 prefix it covers (`198.19.0.0/16`): IPv4 clients are matched as IPv4 addresses,
/// and the data plane keys both spellings the same way.
pub(super) fn prefix_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    texts.iter().map(|t| parse(t).map(unmap).map_err(serde::de::Error::custom)).collect()
}

fn unmap(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(n) if n.prefix_len() >= 96 => match n.network().to_ipv4_mapped() {
            Some(v4) => IpNet::V4(ipnet::Ipv4Net::new(v4, n.prefix_len() - 96).expect("at most 32 bits")),
            None => net,
        },
        _ => net,
    }
}

pub(super) fn opt_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpNet>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(t) => parse(&t).map(Some).map_err(serde::de::Error::custom),
    }
}
