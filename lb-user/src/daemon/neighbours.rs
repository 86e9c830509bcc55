//! Next hops kept resolved: `bpf_fib_lookup` does not resolve a neighbour, it fails with
//! NO_NEIGH (`drop_no_neigh`) until something else talks to the next hop. So for every backend
//! (IPIP next hops, and L2_DSR backends, whose MAC without `mac` is this entry's) the daemon
//! asks the kernel for the next hop it routes the backend through (RTM_GETROUTE) and keeps a
//! managed neighbour entry for it (RTM_NEWNEIGH with NTF_EXT_MANAGED, Linux 5.16): the kernel
//! resolves such an entry at once and keeps it reachable, without traffic. An entry the
//! operator made permanent is left as it is. Runs on a thread of its own (blocking netlink
//! requests); the set is re-applied on every change and every `RECHECK` (routes change).

use super::netlink::{self, attrs, Request, NLM_F_CREATE, NLM_F_REPLACE};
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::OwnedFd;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

/// How often the whole set is applied again when it does not change.
const RECHECK: Duration = Duration::from_secs(10);

const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_GETNEIGH: u16 = 30;
/// `struct rtmsg` and `struct ndmsg`.
const RTMSG_LEN: usize = 12;
const NDMSG_LEN: usize = 12;
const RTN_UNICAST: u8 = 1;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
/// `struct rtvia`: an IPv6 gateway of an IPv4 route.
const RTA_VIA: u16 = 18;
const NDA_DST: u16 = 1;
const NDA_FLAGS_EXT: u16 = 15;
const NTF_EXT_MANAGED: u32 = 1;
const NUD_NONE: u16 = 0;
const NUD_PERMANENT: u16 = 0x80;

/// Starts the keeper; send it the backends' addresses after every reconcile.
pub fn spawn() -> Sender<BTreeSet<IpAddr>> {
    let (tx, rx) = channel::<BTreeSet<IpAddr>>();
    std::thread::spawn(move || {
        let mut backends = BTreeSet::new();
        let mut failed = BTreeSet::new();
        let mut seq = 0u32;
        loop {
            match rx.recv_timeout(RECHECK) {
                Ok(set) => backends = set,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            // A socket per pass: a request that failed midway leaves nothing behind.
            let fd = netlink::open(0, 0);
            for b in &backends {
                let kept = fd.as_ref().map_err(|e| anyhow::anyhow!("{e:#}")).and_then(|fd| keep(fd, *b, &mut seq));
                match kept {
                    Ok(()) => {
                        failed.remove(b);
                    }
                    Err(e) => {
                        // Logged once per backend until it works again.
                        if failed.insert(*b) {
                            tracing::warn!("cannot keep a neighbour entry for backend {b}: {e:#}");
                        }
                    }
                }
            }
        }
    });
    tx
}

/// Address family and bytes of `a`, as netlink carries them.
fn family_and_bytes(a: IpAddr) -> (u8, Vec<u8>) {
    match a {
        IpAddr::V4(v4) => (libc::AF_INET as u8, v4.octets().to_vec()),
        IpAddr::V6(v6) => (libc::AF_INET6 as u8, v6.octets().to_vec()),
    }
}

fn ip_from(family: u8, b: &[u8]) -> Option<IpAddr> {
    match (family as i32, b.len()) {
        (libc::AF_INET, 4) => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(b).ok()?))),
        (libc::AF_INET6, 16) => Some(IpAddr::V6(Ipv6Addr::from(<[u8; 16]>::try_from(b).ok()?))),
        _ => None,
    }
}

/// The next hop of `addr` and its device from the kernel's RTM_NEWROUTE answer (`route`, after
/// the netlink header): the gateway, or the address itself on a connected network. None for a
/// local, unreachable, blackhole or prohibit route.
pub fn next_hop(route: &[u8], addr: IpAddr) -> Option<(IpAddr, u32)> {
    if route.len() < RTMSG_LEN || route[7] != RTN_UNICAST {
        return None;
    }
    let (mut oif, mut via) = (None, None);
    for (kind, v) in attrs(&route[RTMSG_LEN..]) {
        match kind {
            RTA_OIF if v.len() == 4 => oif = Some(u32::from_ne_bytes(v.try_into().unwrap())),
            RTA_GATEWAY => via = ip_from(route[0], v),
            RTA_VIA if v.len() > 2 => via = ip_from(u16::from_ne_bytes([v[0], v[1]]) as u8, &v[2..]),
            _ => {}
        }
    }
    Some((via.unwrap_or(addr), oif?))
}

/// Whether a neighbour entry (RTM_NEWNEIGH payload) is permanent or managed already.
fn permanent_or_managed(entry: &[u8]) -> bool {
    entry.len() >= NDMSG_LEN
        && (u16::from_ne_bytes([entry[8], entry[9]]) & NUD_PERMANENT != 0
            || attrs(&entry[NDMSG_LEN..]).any(|(kind, v)| {
                kind == NDA_FLAGS_EXT
                    && v.len() == 4
                    && u32::from_ne_bytes(v.try_into().unwrap()) & NTF_EXT_MANAGED != 0
            }))
}

/// Makes sure the next hop of backend `addr` has a managed (or permanent) neighbour entry.
fn keep(fd: &OwnedFd, addr: IpAddr, seq: &mut u32) -> Result<()> {
    let mut next_seq = || {
        *seq = seq.wrapping_add(1);
        *seq
    };
    let (family, dst) = family_and_bytes(addr);
    let mut rtmsg = [0u8; RTMSG_LEN];
    (rtmsg[0], rtmsg[1]) = (family, dst.len() as u8 * 8);
    let get = Request::new(RTM_GETROUTE, 0, &rtmsg).attr(RTA_DST, &dst);
    let routes = netlink::request(fd, get, RTM_NEWROUTE, next_seq()).with_context(|| format!("route to {addr}"))?;
    let Some((nh, ifindex)) = routes.first().and_then(|r| next_hop(r, addr)) else {
        return Ok(());
    };
    let (family, dst) = family_and_bytes(nh);
    let ndmsg = |state: u16| {
        let mut h = [0u8; NDMSG_LEN];
        h[0] = family;
        h[4..8].copy_from_slice(&ifindex.to_ne_bytes());
        h[8..10].copy_from_slice(&state.to_ne_bytes());
        h
    };
    let get = Request::new(RTM_GETNEIGH, 0, &ndmsg(NUD_NONE)).attr(NDA_DST, &dst);
    match netlink::request(fd, get, RTM_NEWNEIGH, next_seq()) {
        Ok(entries) if entries.iter().any(|e| permanent_or_managed(e)) => return Ok(()),
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
        Err(e) => return Err(e).with_context(|| format!("neighbour entry of {nh} (ifindex {ifindex})")),
    }
    // NUD_NONE with the managed flag, as `ip neigh replace NH dev DEV managed` sends it.
    let add = Request::new(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE, &ndmsg(NUD_NONE))
        .attr(NDA_DST, &dst)
        .attr(NDA_FLAGS_EXT, &NTF_EXT_MANAGED.to_ne_bytes());
    netlink::request(fd, add, RTM_NEWNEIGH, next_seq())
        .with_context(|| format!("managed neighbour entry for {nh} (ifindex {ifindex})"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An RTM_NEWROUTE payload: `struct rtmsg` of `family` and `rtype`, then attributes.
    fn route(family: i32, rtype: u8, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
        let mut m = vec![0u8; RTMSG_LEN];
        (m[0], m[7]) = (family as u8, rtype);
        for (kind, v) in attrs {
            m.extend_from_slice(&((4 + v.len()) as u16).to_ne_bytes());
            m.extend_from_slice(&kind.to_ne_bytes());
            m.extend_from_slice(v);
            m.resize(m.len().div_ceil(4) * 4, 0);
        }
        m
    }

    fn oif(i: u32) -> (u16, Vec<u8>) {
        (RTA_OIF, i.to_ne_bytes().to_vec())
    }

    fn ip(a: &str) -> Vec<u8> {
        family_and_bytes(a.parse().unwrap()).1
    }

    #[test]
    fn next_hop_is_the_gateway_or_the_address_itself() {
        let (v4, v6) = (libc::AF_INET, libc::AF_INET6);
        let b: IpAddr = "198.19.10.3".parse().unwrap();
        let dst = (RTA_DST, ip("198.19.10.3"));
        assert_eq!(
            next_hop(&route(v4, RTN_UNICAST, &[dst.clone(), (RTA_GATEWAY, ip("198.18.0.2")), oif(2)]), b),
            Some(("198.18.0.2".parse().unwrap(), 2))
        );
        assert_eq!(next_hop(&route(v4, RTN_UNICAST, &[dst.clone(), oif(3)]), b), Some((b, 3)));
        let b6: IpAddr = "2001:db8:10::3".parse().unwrap();
        assert_eq!(
            next_hop(
                &route(v6, RTN_UNICAST, &[(RTA_DST, ip("2001:db8:10::3")), (RTA_GATEWAY, ip("fe80::1")), oif(2)]),
                b6
            ),
            Some(("fe80::1".parse().unwrap(), 2))
        );
        // `via inet6 fe80::1`: struct rtvia, family then address.
        let mut via = (v6 as u16).to_ne_bytes().to_vec();
        via.extend(ip("fe80::1"));
        assert_eq!(
            next_hop(&route(v4, RTN_UNICAST, &[dst.clone(), (RTA_VIA, via), oif(2)]), b),
            Some(("fe80::1".parse().unwrap(), 2))
        );
        // RTN_LOCAL, RTN_UNREACHABLE: nothing to keep.
        assert_eq!(next_hop(&route(v4, 2, &[dst.clone(), oif(1)]), b), None);
        assert_eq!(next_hop(&route(v4, 7, &[dst]), b), None);
    }

    #[test]
    fn permanent_and_managed_entries_are_left_alone() {
        let entry = |state: u16, ext: Option<u32>| {
            let mut e = vec![0u8; NDMSG_LEN];
            e[8..10].copy_from_slice(&state.to_ne_bytes());
            if let Some(x) = ext {
                e.extend_from_slice(&8u16.to_ne_bytes());
                e.extend_from_slice(&NDA_FLAGS_EXT.to_ne_bytes());
                e.extend_from_slice(&x.to_ne_bytes());
            }
            e
        };
        assert!(permanent_or_managed(&entry(NUD_PERMANENT, None)));
        assert!(permanent_or_managed(&entry(0x02, Some(NTF_EXT_MANAGED))));
        // REACHABLE, learnt from traffic: replaced by a managed one.
        assert!(!permanent_or_managed(&entry(0x02, None)));
        assert!(!permanent_or_managed(&entry(0x02, Some(0))));
    }
}
