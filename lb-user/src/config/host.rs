//! The host's own addresses, which no VIP may be (issue #31-2): the XDP program would take the
//! host's own traffic to that address, so its services stop answering, and the health checks'
//! replies to the balancer would be balanced to the backends too, turning every one unhealthy.
//! `lb validate` checks against the host it runs on; the daemon against its network namespace,
//! at start and at every reload.

use super::error::Scope;
use super::error::{Report, Sink};
use super::raw::Config;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The addresses of every interface (up or down) in this network namespace, with the name of
/// the interface holding each.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostAddrs(Vec<(IpAddr, String)>);

impl HostAddrs {
    /// This network namespace's addresses (`getifaddrs`).
    pub fn current() -> std::io::Result<Self> {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `head` with a list freed below.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut out = Vec::new();
        let mut p = head;
        while !p.is_null() {
            // SAFETY: `p` is an element of the list getifaddrs returned, not yet freed; its
            // address is a sockaddr_in for AF_INET and a sockaddr_in6 for AF_INET6.
            let ifa = unsafe { &*p };
            let addr = if ifa.ifa_addr.is_null() {
                None
            } else {
                // SAFETY: a non-null ifa_addr points to a sockaddr of the list.
                match i32::from(unsafe { (*ifa.ifa_addr).sa_family }) {
                    libc::AF_INET => {
                        // SAFETY: AF_INET: the sockaddr is a sockaddr_in.
                        let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                        Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))))
                    }
                    libc::AF_INET6 => {
                        // SAFETY: AF_INET6: the sockaddr is a sockaddr_in6.
                        let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                        Some(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)))
                    }
                    _ => None,
                }
            };
            if let Some(addr) = addr {
                // SAFETY: ifa_name is a NUL-terminated string of the list.
                let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
                out.push((addr, name));
            }
            p = ifa.ifa_next;
        }
        // SAFETY: the list getifaddrs returned, no longer used.
        unsafe { libc::freeifaddrs(head) };
        Ok(Self(out))
    }

    /// Given addresses (address, interface), for tests and callers that know them.
    pub fn from_list(addrs: Vec<(IpAddr, String)>) -> Self {
        Self(addrs)
    }

    /// Every address.
    pub fn addresses(&self) -> Vec<IpAddr> {
        self.0.iter().map(|(a, _)| *a).collect()
    }

    /// The interface holding `addr`, if one does.
    pub fn interface_of(&self, addr: IpAddr) -> Option<&str> {
        self.0.iter().find(|(a, _)| *a == addr).map(|(_, name)| name.as_str())
    }
}

/// Every service whose VIP is one of `host`'s addresses, and every next-hop interface this host
/// does not have.
pub(super) fn check(cfg: &Config, host: &HostAddrs, out: &mut Sink) {
    for (index, svc) in cfg.services.iter().enumerate() {
        let names = svc.next_hop.as_ref().map(|n| n.interfaces.as_slice()).unwrap_or_default();
        for (i, name) in names.iter().enumerate() {
            // SAFETY: a NUL-terminated name, only read.
            let known =
                std::ffi::CString::new(name.as_str()).is_ok_and(|c| unsafe { libc::if_nametoindex(c.as_ptr()) } != 0);
            if !known {
                let mut r = Report { out: &mut *out, scope: Scope::Service { index, name: svc.name.clone() } };
                r.push(
                    format!("next_hop.interfaces[{i}]"),
                    format!("no interface {name} on this host (its network namespace): allowed: an existing interface"),
                );
            }
        }
    }
    for (index, svc) in cfg.services.iter().enumerate() {
        let Some((vip, ifname)) = svc.vip.and_then(|vip| Some((vip, host.interface_of(vip)?))) else { continue };
        let mut r = Report { out, scope: Scope::Service { index, name: svc.name.clone() } };
        r.push(
            "vip",
            format!(
                "{} is an address of this host (interface {ifname}): the balancer would take the host's \
                 own traffic to it, and the health checks' replies; allowed: an address that no \
                 interface of the balancer's host (its network namespace) holds",
                vip
            ),
        );
    }
}
