//! The tunnel's outer source when `[dataplane] encap_source_v4` / `encap_source_v6` is unset:
//! the primary address of that family of the interface the balancer sends on (the first
//! `--interface` that has one), as the kernel's own tunnels pick it. Without it the outer
//! source would be 0.0.0.0 / ::, which routers drop as a martian. A configured address or
//! prefix still wins; an IPIP service of a family with neither is refused at start and reload.

use std::net::IpAddr;

use anyhow::{bail, Result};
use ipnet::IpNet;

use crate::config::Config;
use crate::model::Forwarding;

/// The primary (first listed, global) address of `family` (`v6`) of interface `ifname`.
/// IPv4 lists an interface's primary address before its secondaries; IPv6 link-local
/// addresses are skipped (a tunnel to a backend is never link-local).
pub fn primary_address(ifname: &str, v6: bool) -> Option<IpAddr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list freed below with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut p = head;
    while !p.is_null() && found.is_none() {
        // SAFETY: `p` is an element of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        // SAFETY: ifa_name is the entry's NUL-terminated interface name.
        if ifa.ifa_addr.is_null() || unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_bytes() != ifname.as_bytes() {
            continue;
        }
        // SAFETY: the family says which sockaddr type `ifa_addr` points to.
        found = match (unsafe { (*ifa.ifa_addr).sa_family } as i32, v6) {
            (libc::AF_INET, false) => {
                // SAFETY: AF_INET: the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                Some(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()))
            }
            (libc::AF_INET6, true) => {
                // SAFETY: AF_INET6: the sockaddr is a sockaddr_in6.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                let a = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                (a.segments()[0] & 0xffc0 != 0xfe80).then_some(IpAddr::V6(a))
            }
            _ => None,
        };
    }
    // SAFETY: the list from getifaddrs above, freed once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// Sets each unset `encap_source_v4/_v6` of `cfg` that an IPIP service of that family needs
/// to `address(interface, v6)` of the first of `interfaces` that has one (`primary_address`
/// on a host). Returns what it chose, one line per family, for the log.
pub fn fill_defaults(
    cfg: &mut Config,
    interfaces: &[String],
    address: impl Fn(&str, bool) -> Option<IpAddr>,
) -> Result<Vec<String>> {
    let mut chosen = Vec::new();
    for v6 in [false, true] {
        let (field, slot) = if v6 {
            ("dataplane.encap_source_v6", &mut cfg.dataplane.encap_source_v6)
        } else {
            ("dataplane.encap_source_v4", &mut cfg.dataplane.encap_source_v4)
        };
        let needed =
            cfg.services.iter().any(|s| s.forwarding == Forwarding::Ipip && s.vip().is_some_and(|v| v.is_ipv6() == v6));
        if slot.is_some() || !needed {
            continue;
        }
        let Some((ifname, addr)) = interfaces.iter().find_map(|i| address(i, v6).map(|a| (i, a))) else {
            bail!(
                "{field} is unset and no interface of {interfaces:?} has an {} address to default to: set it to the \
                 address (or prefix) the tunnels to the backends leave from",
                if v6 { "IPv6" } else { "IPv4" }
            );
        };
        *slot = Some(IpNet::from(addr));
        chosen.push(format!("tunnel source {addr}: the primary address of {ifname} ({field} unset)"));
    }
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(encap_v4: &str) -> Config {
        let text = format!(
            "[dataplane]\n{encap_v4}\n[[service]]\nname = \"a\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\n\
             [[service.backend]]\naddress = \"198.18.11.1\"\n\
             [[service]]\nname = \"b\"\nvip = \"2001:db8::100\"\nprotocol = \"TCP\"\nforwarding = \"L2_DSR\"\n\
             [[service.backend]]\naddress = \"2001:db8::11\"\nmac = \"02:00:00:00:00:01\"\n"
        );
        Config::parse(&text).unwrap()
    }

    fn host(ifname: &str, v6: bool) -> Option<IpAddr> {
        match (ifname, v6) {
            ("eth1", false) => Some("192.0.2.7".parse().unwrap()),
            ("eth1", true) => Some("2001:db8::7".parse().unwrap()),
            _ => None,
        }
    }

    #[test]
    fn unset_source_defaults_to_the_first_interface_with_an_address() {
        let mut cfg = config("");
        let chosen = fill_defaults(&mut cfg, &["eth0".into(), "eth1".into()], host).unwrap();
        assert_eq!(cfg.dataplane.encap_source_v4, Some("192.0.2.7/32".parse().unwrap()));
        // Only L2 DSR on IPv6: no tunnel, nothing chosen.
        assert_eq!(cfg.dataplane.encap_source_v6, None);
        assert_eq!(chosen, ["tunnel source 192.0.2.7: the primary address of eth1 (dataplane.encap_source_v4 unset)"]);
    }

    #[test]
    fn a_configured_source_wins_and_no_address_is_an_error() {
        let mut cfg = config("encap_source_v4 = \"198.18.0.0/28\"");
        assert!(fill_defaults(&mut cfg, &["eth1".into()], host).unwrap().is_empty());
        assert_eq!(cfg.dataplane.encap_source_v4, Some("198.18.0.0/28".parse().unwrap()));
        let err = fill_defaults(&mut config(""), &["eth0".into()], host).unwrap_err().to_string();
        assert!(err.contains("dataplane.encap_source_v4 is unset") && err.contains("IPv4 address"), "{err}");
    }

    #[test]
    fn loopback_has_its_primary_address() {
        // Every network namespace has `lo`; its IPv4 address is 127.0.0.1 once it is up.
        if let Some(a) = primary_address("lo", false) {
            assert_eq!(a, IpAddr::from([127, 0, 0, 1]));
        }
        assert_eq!(primary_address("no-such-interface", false), None);
    }
}
