//! Next hops kept resolved: `bpf_fib_lookup` does not resolve a neighbour, it fails with
//! NO_NEIGH (`drop_no_neigh`) until something else talks to the next hop. So for every backend
//! (IPIP next hops, and L2_DSR backends, whose MAC without `mac` is this entry's) the daemon
//! asks the kernel for the next hop it routes the backend through (RTM_GETROUTE) and keeps a
//! managed neighbour entry for it (RTM_NEWNEIGH with NTF_EXT_MANAGED, Linux 5.16): the kernel
//! resolves such an entry at once and keeps it reachable, without traffic. An entry the
//! operator made permanent is left as it is. Runs on a thread of its own (blocking netlink
//! requests); the set is re-applied on every change and every `RECHECK` (routes change), and at
//! once when the kernel deletes the entry of a next hop it keeps: a MAC change of the device
//! (`ip link set DEV address`, a bond or VRRP taking over) flushes every neighbour entry of the
//! device, permanent and managed ones included, and until the entry is back every backend
//! behind it is NO_NEIGH as soon as the data plane's cached next hop (1 s) runs out; a second
//! thread watches the deletions (RTMGRP_NEIGH).

use super::netlink::{self, attrs, messages, Message, Request, NLM_F_CREATE, NLM_F_REPLACE};
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// How often the whole set is applied again when it does not change.
const RECHECK: Duration = Duration::from_secs(10);
/// How often the watcher of deletions looks whether the keeper's handle is gone.
const WATCH_POLL: Duration = Duration::from_secs(5);

const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;
/// The multicast group of neighbour entry changes.
const RTMGRP_NEIGH: u32 = 4;
/// `struct rtmsg` and `struct ndmsg`.
const RTMSG_LEN: usize = 12;
const NDMSG_LEN: usize = 12;
const RTN_UNICAST: u8 = 1;
const RTA_DST: u16 = 1;
const RTA_OIF: u16 = 4;
const RTA_GATEWAY: u16 = 5;
const RTA_PREFSRC: u16 = 7;
/// `struct rtvia`: an IPv6 gateway of an IPv4 route.
const RTA_VIA: u16 = 18;
const NDA_DST: u16 = 1;
const NDA_FLAGS_EXT: u16 = 15;
const NTF_EXT_MANAGED: u32 = 1;
const NUD_NONE: u16 = 0;
const NUD_PERMANENT: u16 = 0x80;

/// What wakes the keeper.
enum Wake {
    /// The backends to keep (after every reconcile).
    Backends(BTreeSet<IpAddr>),
    /// The kernel deleted the neighbour entry of this address (on some device).
    Deleted(IpAddr),
    /// Deletions may have been missed (the watching socket overran, or cannot be read).
    Lost,
}

/// The neighbour keeper's handle: hand it the backends after every reconcile. Both threads end
/// when it is dropped (the watcher within `WATCH_POLL`).
pub struct Keeper(Arc<Sender<Wake>>);

impl Keeper {
    /// Keeps the next hops of `backends` resolved (replacing the previous set).
    pub fn keep(&self, backends: BTreeSet<IpAddr>) {
        let _ = self.0.send(Wake::Backends(backends));
    }
}

/// Starts the keeper and the watcher of neighbour deletions.
pub fn spawn() -> Keeper {
    let (tx, rx) = channel::<Wake>();
    let tx = Arc::new(tx);
    match netlink::open(RTMGRP_NEIGH, 0).and_then(|socket| {
        set_receive_timeout(&socket, WATCH_POLL)?;
        Ok(socket)
    }) {
        Ok(socket) => {
            let tx = Arc::downgrade(&tx);
            std::thread::spawn(move || watch_deletions(&socket, &tx));
        }
        Err(e) => tracing::warn!(
            "cannot watch neighbour entries ({e:#}): a backend's entry the kernel deletes (a MAC change of its device) is made again only within {}s",
            RECHECK.as_secs()
        ),
    }
    std::thread::spawn(move || keep_all(&rx));
    Keeper(tx)
}

/// The keeper: applies the set on every change, every `RECHECK`, and when the entry of a next
/// hop it keeps was deleted (all wakes queued meanwhile answered by one pass).
fn keep_all(rx: &Receiver<Wake>) {
    let mut backends = BTreeSet::new();
    // The next hops of the last pass, whose deletion calls for a pass at once.
    let mut hops = BTreeSet::new();
    let mut failed = BTreeSet::new();
    let mut seq = 0u32;
    loop {
        let mut pass = false;
        let mut wake = match rx.recv_timeout(RECHECK) {
            Ok(w) => Some(w),
            Err(RecvTimeoutError::Timeout) => {
                pass = true;
                None
            }
            Err(RecvTimeoutError::Disconnected) => return,
        };
        while let Some(w) = wake {
            match w {
                Wake::Backends(set) => {
                    backends = set;
                    pass = true;
                }
                Wake::Deleted(addr) => pass |= hops.contains(&addr),
                Wake::Lost => pass = true,
            }
            wake = rx.try_recv().ok();
        }
        if !pass {
            continue;
        }
        hops.clear();
        // A socket per pass: a request that failed midway leaves nothing behind.
        let fd = netlink::open(0, 0);
        for b in &backends {
            let kept = fd.as_ref().map_err(|e| anyhow::anyhow!("{e:#}")).and_then(|fd| keep(fd, *b, &mut seq));
            match kept {
                Ok(hop) => {
                    hops.extend(hop);
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
}

/// Reports every neighbour entry the kernel deletes to the keeper, until its handle is gone.
/// `socket` has a receive timeout (`WATCH_POLL`), after which the handle is looked at again.
fn watch_deletions(socket: &OwnedFd, tx: &Weak<Sender<Wake>>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        // SAFETY: recv into a buffer we own, of its length.
        let n = unsafe { libc::recv(socket.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        let wakes = if n < 0 {
            let err = std::io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN) if tx.strong_count() > 0 => continue,
                Some(libc::EAGAIN) => return,
                Some(libc::ENOBUFS) => vec![Wake::Lost],
                _ => {
                    tracing::warn!(
                        "reading neighbour events: {err}; a backend's deleted entry is made again only within {}s",
                        RECHECK.as_secs()
                    );
                    if let Some(tx) = tx.upgrade() {
                        let _ = tx.send(Wake::Lost);
                    }
                    return;
                }
            }
        } else {
            deleted(&buf[..n as usize]).into_iter().map(Wake::Deleted).collect()
        };
        let Some(tx) = tx.upgrade() else { return };
        for w in wakes {
            if tx.send(w).is_err() {
                return;
            }
        }
    }
}

/// SO_RCVTIMEO of a blocking socket.
fn set_receive_timeout(socket: &OwnedFd, t: Duration) -> Result<()> {
    let tv = libc::timeval { tv_sec: t.as_secs() as libc::time_t, tv_usec: t.subsec_micros() as libc::suseconds_t };
    // SAFETY: setsockopt with a timeval of the size given.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            &tv as *const libc::timeval as *const libc::c_void,
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        anyhow::bail!("setting a receive timeout on the rtnetlink socket: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// The addresses of the neighbour entries an RTMGRP_NEIGH datagram reports deleted.
fn deleted(buf: &[u8]) -> Vec<IpAddr> {
    messages(buf)
        .filter(|Message { kind, payload, .. }| *kind == RTM_DELNEIGH && payload.len() >= NDMSG_LEN)
        .filter_map(|Message { payload, .. }| {
            let (_, dst) = attrs(&payload[NDMSG_LEN..]).find(|(kind, _)| *kind == NDA_DST)?;
            ip_from(payload[0], dst)
        })
        .collect()
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

/// The kernel's route to `addr` (RTM_GETROUTE on `fd`, request number `seq`): the RTM_NEWROUTE
/// payloads it answered with.
pub fn route_get(fd: &OwnedFd, addr: IpAddr, seq: u32) -> std::io::Result<Vec<Vec<u8>>> {
    let (family, dst) = family_and_bytes(addr);
    let mut rtmsg = [0u8; RTMSG_LEN];
    (rtmsg[0], rtmsg[1]) = (family, dst.len() as u8 * 8);
    netlink::request(fd, Request::new(RTM_GETROUTE, 0, &rtmsg).attr(RTA_DST, &dst), RTM_NEWROUTE, seq)
}

/// The source address the kernel would use on a route (`route`, as [`next_hop`] takes it).
pub fn preferred_source(route: &[u8]) -> Option<IpAddr> {
    if route.len() < RTMSG_LEN {
        return None;
    }
    attrs(&route[RTMSG_LEN..]).find(|(kind, _)| *kind == RTA_PREFSRC).and_then(|(_, v)| ip_from(route[0], v))
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

/// Makes sure the next hop of backend `addr` has a managed (or permanent) neighbour entry;
/// returns that next hop (None: no unicast route).
fn keep(fd: &OwnedFd, addr: IpAddr, seq: &mut u32) -> Result<Option<IpAddr>> {
    let mut next_seq = || {
        *seq = seq.wrapping_add(1);
        *seq
    };
    let routes = route_get(fd, addr, next_seq()).with_context(|| format!("route to {addr}"))?;
    let Some((nh, ifindex)) = routes.first().and_then(|r| next_hop(r, addr)) else {
        return Ok(None);
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
        Ok(entries) if entries.iter().any(|e| permanent_or_managed(e)) => return Ok(Some(nh)),
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
    Ok(Some(nh))
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

    /// An RTM_*NEIGH message of `family` for `dst` on ifindex 2.
    fn neigh_message(kind: u16, family: i32, dst: &str) -> Vec<u8> {
        let mut payload = vec![0u8; NDMSG_LEN];
        payload[0] = family as u8;
        payload[4..8].copy_from_slice(&2u32.to_ne_bytes());
        // NDA_LLADDR before the address.
        payload.extend_from_slice(&10u16.to_ne_bytes());
        payload.extend_from_slice(&2u16.to_ne_bytes());
        payload.extend_from_slice(&[2, 0, 0, 0, 0, 1, 0, 0]);
        let a = ip(dst);
        payload.extend_from_slice(&((4 + a.len()) as u16).to_ne_bytes());
        payload.extend_from_slice(&NDA_DST.to_ne_bytes());
        payload.extend(a);
        let mut m = Vec::new();
        m.extend_from_slice(&((netlink::NLMSG_HDRLEN + payload.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend(payload);
        m
    }

    #[test]
    fn deleted_entries_are_read_from_neighbour_events() {
        let mut buf = neigh_message(RTM_DELNEIGH, libc::AF_INET, "198.18.10.1");
        // A new or changed entry is no deletion.
        buf.extend(neigh_message(RTM_NEWNEIGH, libc::AF_INET, "198.18.10.2"));
        buf.extend(neigh_message(RTM_DELNEIGH, libc::AF_INET6, "2001:db8:0:11::1"));
        assert_eq!(deleted(&buf), vec!["198.18.10.1".parse::<IpAddr>().unwrap(), "2001:db8:0:11::1".parse().unwrap()]);
        assert!(deleted(&buf[..20]).is_empty());
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
