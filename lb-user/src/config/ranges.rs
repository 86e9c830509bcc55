//! Address ranges: SUBNET endpoint ranges (`10.0.0.0/8`, `192.168.1.10-192.168.1.20`, spec
//! §2.4) and the integer view used to split ranges into CIDR blocks for the LPM trie.

use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An inclusive range of addresses of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AddrRange {
    pub first: IpAddr,
    pub last: IpAddr,
}

/// Address family tag used with the integer view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    pub fn of(addr: &IpAddr) -> Family {
        if addr.is_ipv4() {
            Family::V4
        } else {
            Family::V6
        }
    }

    pub fn bits(self) -> u32 {
        match self {
            Family::V4 => 32,
            Family::V6 => 128,
        }
    }

    /// The highest address of the family as an integer.
    pub fn max(self) -> u128 {
        match self {
            Family::V4 => u128::from(u32::MAX),
            Family::V6 => u128::MAX,
        }
    }
}

/// An address as an integer (v4 in the low 32 bits).
pub fn to_int(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// The inverse of [`to_int`] (v4 values are truncated to 32 bits).
pub fn from_int(family: Family, value: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(value as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(value)),
    }
}

impl AddrRange {
    pub fn family(&self) -> Family {
        Family::of(&self.first)
    }

    pub fn of_net(net: &IpNet) -> AddrRange {
        AddrRange { first: net.network(), last: net.broadcast() }
    }

    pub fn contains(&self, addr: IpAddr) -> bool {
        Family::of(&addr) == self.family() && to_int(self.first) <= to_int(addr) && to_int(addr) <= to_int(self.last)
    }

    pub fn overlaps(&self, other: &AddrRange) -> bool {
        self.family() == other.family()
            && to_int(self.first) <= to_int(other.last)
            && to_int(other.first) <= to_int(self.last)
    }

    /// The smallest list of CIDR blocks covering exactly this range.
    pub fn to_cidrs(&self) -> Vec<IpNet> {
        int_range_to_cidrs(self.family(), to_int(self.first), to_int(self.last))
    }
}

impl fmt::Display for AddrRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

/// Host-bit mask of a block with `host_bits` free bits.
fn mask(host_bits: u32) -> u128 {
    if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    }
}

/// Splits `[first, last]` (integers of `family`, first <= last) into aligned CIDR blocks.
pub fn int_range_to_cidrs(family: Family, first: u128, last: u128) -> Vec<IpNet> {
    let bits = family.bits();
    let mut out = Vec::new();
    let mut cur = first;
    loop {
        let mut host_bits = if cur == 0 { bits } else { cur.trailing_zeros().min(bits) };
        while host_bits > 0 && cur | mask(host_bits) > last {
            host_bits -= 1;
        }
        let block_last = cur | mask(host_bits);
        let prefix_len = (bits - host_bits) as u8;
        // The prefix length is in range by construction.
        if let Ok(net) = IpNet::new(from_int(family, cur), prefix_len) {
            out.push(net);
        }
        if block_last >= last {
            return out;
        }
        cur = block_last + 1;
    }
}

/// Parses one SUBNET range: a CIDR block whose address is the block start, `first-last` with
/// first <= last in one family, or a single address.
pub fn parse_subnet(text: &str) -> Result<AddrRange, String> {
    let t = text.trim();
    if t.contains('/') {
        let net: IpNet = t
            .parse()
            .map_err(|_| format!("{text:?} is not a CIDR block: expected address/length, e.g. \"10.0.0.0/8\""))?;
        if net.trunc() != net {
            return Err(format!("{text:?}: the address before '/' must be the block start (here {})", net.trunc()));
        }
        return Ok(AddrRange::of_net(&net));
    }
    if let Some((a, b)) = t.split_once('-') {
        let parse = |s: &str| {
            s.trim().parse::<IpAddr>().map_err(|_| {
                format!(
                    "{text:?} is not a range: expected first-last addresses, e.g. \
                     \"192.168.1.10-192.168.1.20\""
                )
            })
        };
        let (first, last) = (parse(a)?, parse(b)?);
        if Family::of(&first) != Family::of(&last) {
            return Err(format!("{text:?}: first and last must be of the same address family"));
        }
        if to_int(first) > to_int(last) {
            return Err(format!("{text:?}: first must not be above last"));
        }
        return Ok(AddrRange { first, last });
    }
    let addr: IpAddr = t.parse().map_err(|_| {
        format!(
            "{text:?} is not a subnet: expected a CIDR block (\"10.0.0.0/8\"), a range \
             (\"192.168.1.10-192.168.1.20\") or an address"
        )
    })?;
    Ok(AddrRange { first: addr, last: addr })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(v: &[IpNet]) -> Vec<String> {
        v.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn ranges_split_into_minimal_cidrs() {
        let r = parse_subnet("192.168.1.10-192.168.1.20").unwrap();
        assert_eq!(nets(&r.to_cidrs()), ["192.168.1.10/31", "192.168.1.12/30", "192.168.1.16/30", "192.168.1.20/32"]);
        let whole = AddrRange { first: "0.0.0.0".parse().unwrap(), last: "255.255.255.255".parse().unwrap() };
        assert_eq!(nets(&whole.to_cidrs()), ["0.0.0.0/0"]);
        let whole6 = AddrRange {
            first: "::".parse().unwrap(),
            last: "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff".parse().unwrap(),
        };
        assert_eq!(nets(&whole6.to_cidrs()), ["::/0"]);
        assert_eq!(nets(&parse_subnet("10.0.0.0/8").unwrap().to_cidrs()), ["10.0.0.0/8"]);
        assert_eq!(nets(&parse_subnet("1.2.3.4").unwrap().to_cidrs()), ["1.2.3.4/32"]);
    }

    #[test]
    fn malformed_ranges_are_rejected() {
        for bad in ["1.2.3.4/24", "5.6.7.8-1.2.3.4", "1.2.3.4-::1", "x", "1.2.3.0/33", "a-b"] {
            assert!(parse_subnet(bad).is_err(), "{bad}");
        }
        assert!(parse_subnet("192.168.1.15-192.168.1.15").is_ok());
    }
}
