//! Interface events for the daemon's loop: an rtnetlink socket subscribed to `RTMGRP_LINK`
//! reports interfaces that appear (or change) and disappear, by name and index, so the daemon
//! can say that an interface it is attached to went away and attach again when it returns,
//! and follow a change of its MAC ([`MacFollower`]).

use super::netlink::{self, attrs, messages, Message};
use super::reply::LinkStatus;
use crate::dataplane::{self, pinning};
use crate::model::MacAddr;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::os::fd::AsRawFd;
use std::path::Path;
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;

/// What happened to an interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LinkEvent {
    /// `RTM_NEWLINK`: the interface exists (created, or one of its attributes changed).
    Present { ifname: String, ifindex: u32 },
    /// `RTM_DELLINK`: the interface is gone.
    Removed { ifname: String, ifindex: u32 },
    /// The kernel dropped messages (the socket's buffer overflowed): the receiver should look
    /// at its interfaces again instead of trusting the events it got.
    Overrun,
}

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTMGRP_LINK: u32 = 1;
const IFLA_IFNAME: u16 = 3;
/// `struct ifinfomsg`.
const IFINFOMSG_LEN: usize = 16;

/// The link events of one netlink datagram (several messages may share one).
pub fn parse(buf: &[u8]) -> Vec<LinkEvent> {
    let mut events = Vec::new();
    for Message { kind, payload: msg, .. } in messages(buf) {
        if (kind == RTM_NEWLINK || kind == RTM_DELLINK) && msg.len() >= IFINFOMSG_LEN {
            let ifindex = i32::from_ne_bytes(msg[4..8].try_into().unwrap()) as u32;
            if let Some(ifname) = ifname_attr(&msg[IFINFOMSG_LEN..]) {
                events.push(match kind {
                    RTM_NEWLINK => LinkEvent::Present { ifname, ifindex },
                    _ => LinkEvent::Removed { ifname, ifindex },
                });
            }
        }
    }
    events
}

/// `IFLA_IFNAME` among the attributes.
fn ifname_attr(buf: &[u8]) -> Option<String> {
    let (_, name) = attrs(buf).find(|(kind, _)| *kind == IFLA_IFNAME)?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Some(String::from_utf8_lossy(&name[..end]).into_owned())
}

/// Starts a task that sends every link event of this network namespace to the returned
/// receiver. The socket is subscribed before this returns: no event after it is missed
/// (except on an overrun, which is reported as such).
pub fn watch() -> Result<(mpsc::Receiver<LinkEvent>, tokio::task::JoinHandle<()>)> {
    // SAFETY: the descriptor is owned by the AsyncFd, which deregisters it before closing it.
    let socket = unsafe {
        AsyncFd::register_with_interest(netlink::open(RTMGRP_LINK, libc::SOCK_NONBLOCK)?, tokio::io::Interest::READABLE)
    }
    .map_err(std::io::Error::from)
    .context("registering the rtnetlink socket")?;
    let (tx, rx) = mpsc::channel(64);
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            let Ok(mut ready) = socket.readable().await else { return };
            // SAFETY: recv into a buffer we own, of its length.
            let n = unsafe {
                libc::recv(socket.get_ref().as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0)
            };
            let events = if n < 0 {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EAGAIN) => {
                        ready.clear_ready();
                        continue;
                    }
                    Some(libc::ENOBUFS) => vec![LinkEvent::Overrun],
                    Some(libc::EINTR) => continue,
                    _ => {
                        tracing::error!("reading interface events: {err}; interfaces are no longer watched");
                        return;
                    }
                }
            } else {
                parse(&buf[..n as usize])
            };
            for ev in events {
                if tx.send(ev).await.is_err() {
                    return;
                }
            }
        }
    });
    Ok((rx, task))
}

/// Whether an interface of this name exists in the calling thread's network namespace.
pub fn exists(ifname: &str) -> bool {
    let Ok(c) = std::ffi::CString::new(ifname) else { return false };
    // SAFETY: if_nametoindex reads a valid C string.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

/// Detaches the balancer from the interfaces whose links a previous daemon pinned in
/// `pin_dir` but `interfaces` (this command line) no longer names: a `--keep-dataplane` restart
/// with one interface fewer would otherwise leave the old program running there, unmanaged and
/// unreported. Each is logged; the returned entries show what became of them in `lb status`.
pub fn detach_unlisted(pin_dir: &Path, interfaces: &[String]) -> Vec<LinkStatus> {
    let unlisted = pinning::pinned_link_interfaces(pin_dir).into_iter().filter(|i| !interfaces.contains(i));
    unlisted
        .map(|ifname| {
            let state = match dataplane::detach_pinned(&pinning::link_pin(pin_dir, &ifname)) {
                Ok(_) => {
                    tracing::warn!("interface {ifname} is no longer listed (--interface), but the previous daemon's balancer was attached to it: detached, its pin removed");
                    "detached at start: no longer listed (--interface); the previous daemon's program was removed"
                        .to_owned()
                }
                Err(e) => {
                    tracing::error!("interface {ifname} is no longer listed (--interface), but detaching the previous daemon's balancer from it failed; it still runs there: {e:#}");
                    format!("no longer listed (--interface), but still attached: detaching failed: {e:#}")
                }
            };
            LinkStatus { interface: ifname, state, mac: None }
        })
        .collect()
}

/// What became of the MAC changes of the daemon's interfaces (`ip link set IF address`, a
/// replaced NIC, a bond or VRRP taking over): the balancer takes only frames sent to the MAC
/// it registered, so it must follow, or every frame passes to the stack (`pass_not_our_mac`).
/// Each change is logged once; the last one of each interface shows in `lb status`.
#[derive(Debug, Default)]
pub struct MacFollower {
    notes: BTreeMap<String, String>,
}

impl MacFollower {
    /// Records the outcome of [`crate::dataplane::Dataplane::follow_mac`] on `ifname`: a
    /// change followed, none, or an error (logged once until it changes).
    pub fn record(&mut self, ifname: &str, outcome: Result<Option<([u8; 6], [u8; 6])>>) {
        let note = match outcome {
            Ok(None) => {
                // A failure that cleared: the MAC the balancer holds is the interface's again.
                if self.notes.get(ifname).is_some_and(|n| n.starts_with("not followed")) {
                    tracing::info!("interface {ifname}: its MAC is registered again");
                    self.notes.remove(ifname);
                }
                return;
            }
            Ok(Some((old, new))) => {
                let (old, new) = (MacAddr(old), MacAddr(new));
                tracing::warn!("interface {ifname} changed its MAC from {old} to {new}: the balancer now takes frames sent to {new}");
                format!("changed from {old} to {new}, followed")
            }
            Err(e) => {
                let note = format!("not followed: {e:#}");
                if self.notes.get(ifname) != Some(&note) {
                    tracing::error!("interface {ifname}: cannot read or register its MAC (frames sent to a new MAC pass unbalanced; retried at its next change and every few seconds): {e:#}");
                }
                note
            }
        };
        self.notes.insert(ifname.to_owned(), note);
    }

    /// The last MAC change of `ifname` and what became of it, for `lb status`.
    pub fn note(&self, ifname: &str) -> Option<String> {
        self.notes.get(ifname).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::netlink::NLMSG_HDRLEN;

    /// One RTM_*LINK message for `name` (index `index`), with an attribute before the name.
    fn message(kind: u16, index: i32, name: &str) -> Vec<u8> {
        let mut attrs = Vec::new();
        // IFLA_MTU (4), 4 bytes of payload.
        attrs.extend_from_slice(&8u16.to_ne_bytes());
        attrs.extend_from_slice(&4u16.to_ne_bytes());
        attrs.extend_from_slice(&1500u32.to_ne_bytes());
        let name_len = 4 + name.len() + 1;
        attrs.extend_from_slice(&(name_len as u16).to_ne_bytes());
        attrs.extend_from_slice(&IFLA_IFNAME.to_ne_bytes());
        attrs.extend_from_slice(name.as_bytes());
        attrs.push(0);
        attrs.resize(attrs.len().div_ceil(4) * 4, 0);
        let mut ifinfo = vec![0u8; IFINFOMSG_LEN];
        ifinfo[4..8].copy_from_slice(&index.to_ne_bytes());
        let len = NLMSG_HDRLEN + ifinfo.len() + attrs.len();
        let mut m = Vec::new();
        m.extend_from_slice(&(len as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0u8; 10]);
        m.extend(ifinfo);
        m.extend(attrs);
        m
    }

    #[test]
    fn parses_new_and_removed_links_of_one_datagram() {
        let mut buf = message(RTM_DELLINK, 7, "eth0");
        buf.extend(message(RTM_NEWLINK, 9, "eth0"));
        // Another message type is skipped.
        buf.extend(message(20, 9, "ignored"));
        assert_eq!(
            parse(&buf),
            vec![
                LinkEvent::Removed { ifname: "eth0".into(), ifindex: 7 },
                LinkEvent::Present { ifname: "eth0".into(), ifindex: 9 },
            ]
        );
    }

    #[test]
    fn a_mac_change_is_noted_and_a_cleared_failure_forgotten() {
        let mut f = MacFollower::default();
        f.record("eth0", Ok(None));
        assert_eq!(f.note("eth0"), None);
        f.record("eth0", Ok(Some(([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 0xfe]))));
        assert_eq!(f.note("eth0").as_deref(), Some("changed from 02:00:00:00:00:01 to 02:00:00:00:00:fe, followed"));
        // Nothing new: the last change stays shown.
        f.record("eth0", Ok(None));
        assert!(f.note("eth0").is_some_and(|n| n.ends_with("followed")));
        f.record("eth0", Err(anyhow::anyhow!("no interface eth0")));
        assert_eq!(f.note("eth0").as_deref(), Some("not followed: no interface eth0"));
        f.record("eth0", Ok(None));
        assert_eq!(f.note("eth0"), None);
    }

    #[test]
    fn a_truncated_message_ends_the_parse() {
        let buf = message(RTM_NEWLINK, 3, "veth1");
        assert!(parse(&buf[..buf.len() - 8]).is_empty());
        assert!(parse(&buf[..10]).is_empty());
    }
}
