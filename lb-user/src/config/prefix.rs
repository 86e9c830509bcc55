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

pub(super) fn prefix_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<IpNet>, D::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    texts
        .iter()
        .map(|t| parse(t).map_err(serde::de::Error::custom))
        .collect()
}

pub(super) fn opt_prefix<'de, D: Deserializer<'de>>(d: D) -> Result<Option<IpNet>, D::Error> {
    match Option::<String>::deserialize(d)? {
        None => Ok(None),
        Some(t) => parse(&t).map(Some).map_err(serde::de::Error::custom),
    }
}
