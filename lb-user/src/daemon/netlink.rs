//! rtnetlink, hand-written over a raw NETLINK_ROUTE socket: the daemon needs a handful of
//! fixed-layout messages (link events in `links`, a route query and a neighbour entry in
//! `neighbours`), which a few helpers here cover without a netlink crate.

use anyhow::{bail, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// `struct nlmsghdr`.
pub const NLMSG_HDRLEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
pub const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_CREATE: u16 = 0x400;

/// Netlink messages and attributes are padded to 4 bytes.
fn align(len: usize) -> usize {
    len.div_ceil(4) * 4
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
}

/// One message of a datagram.
pub struct Message<'a> {
    pub kind: u16,
    pub seq: u32,
    /// After the header: the fixed part (`struct ifinfomsg`, ...), then attributes.
    pub payload: &'a [u8],
}

/// The messages of one netlink datagram; a truncated message ends the walk.
pub fn messages(mut buf: &[u8]) -> impl Iterator<Item = Message<'_>> {
    std::iter::from_fn(move || {
        if buf.len() < NLMSG_HDRLEN {
            return None;
        }
        let len = u32_at(buf, 0) as usize;
        if len < NLMSG_HDRLEN || len > buf.len() {
            return None;
        }
        let msg = Message { kind: u16_at(buf, 4), seq: u32_at(buf, 8), payload: &buf[NLMSG_HDRLEN..len] };
        buf = &buf[align(len).min(buf.len())..];
        Some(msg)
    })
}

/// The attributes (`struct rtattr`: length, type, value) after a message's fixed header, as
/// (type, value); a malformed one ends the walk.
pub fn attrs(mut buf: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        if buf.len() < 4 {
            return None;
        }
        let len = u16_at(buf, 0) as usize;
        if len < 4 || len > buf.len() {
            return None;
        }
        let attr = (u16_at(buf, 2), &buf[4..len]);
        buf = &buf[align(len).min(buf.len())..];
        Some(attr)
    })
}

/// A request being built: fixed header, then attributes.
pub struct Request(Vec<u8>);

impl Request {
    /// Message `kind` with `flags` (NLM_F_REQUEST and NLM_F_ACK are added) and the fixed
    /// header `header` (`struct rtmsg`, `struct ndmsg`, ...).
    pub fn new(kind: u16, flags: u16, header: &[u8]) -> Self {
        let mut b = vec![0u8; NLMSG_HDRLEN];
        b[4..6].copy_from_slice(&kind.to_ne_bytes());
        b[6..8].copy_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        b.extend_from_slice(header);
        b.resize(align(b.len()), 0);
        Self(b)
    }

    pub fn attr(mut self, kind: u16, value: &[u8]) -> Self {
        self.0.extend_from_slice(&((4 + value.len()) as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(value);
        self.0.resize(align(self.0.len()), 0);
        self
    }
}

/// A NETLINK_ROUTE socket of the calling thread's network namespace, subscribed to `groups`
/// (0: none), with `flags` (`SOCK_NONBLOCK`) added to SOCK_RAW | SOCK_CLOEXEC.
pub fn open(groups: u32, flags: i32) -> Result<OwnedFd> {
    // SAFETY: plain socket(2); the fd is owned right away.
    let fd =
        unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC | flags, libc::NETLINK_ROUTE) };
    if fd < 0 {
        bail!("socket(NETLINK_ROUTE): {}", std::io::Error::last_os_error());
    }
    // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: sockaddr_nl is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    addr.nl_groups = groups;
    // SAFETY: binding our socket to an address struct of the size given.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc != 0 {
        bail!("binding the rtnetlink socket (groups {groups:#x}): {}", std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Sends `req` on the blocking socket `fd` and returns the payloads of the messages of type
/// `reply` the kernel answered with, once it acknowledged the request; the kernel's error
/// (ENOENT, ENETUNREACH, ...) as an `io::Error`.
pub fn request(fd: &OwnedFd, req: Request, reply: u16, seq: u32) -> std::io::Result<Vec<Vec<u8>>> {
    let mut msg = req.0;
    let len = msg.len() as u32;
    msg[0..4].copy_from_slice(&len.to_ne_bytes());
    msg[8..12].copy_from_slice(&seq.to_ne_bytes());
    // SAFETY: send from a buffer we own, of its length.
    if unsafe { libc::send(fd.as_raw_fd(), msg.as_ptr() as *const libc::c_void, msg.len(), 0) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut buf = vec![0u8; 32 * 1024];
    let mut out = Vec::new();
    loop {
        // SAFETY: recv into a buffer we own, of its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr() as *mut libc::c_void, buf.len(), 0) };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        // (A reply with another sequence number answers an earlier request: skipped.)
        for Message { kind, seq: msg_seq, payload } in messages(&buf[..n as usize]) {
            if msg_seq != seq {
                continue;
            }
            if kind == NLMSG_ERROR && payload.len() >= 4 {
                let code = i32::from_ne_bytes(payload[0..4].try_into().unwrap());
                return if code == 0 { Ok(out) } else { Err(std::io::Error::from_raw_os_error(-code)) };
            }
            if kind == reply {
                out.push(payload.to_vec());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_padded_and_its_attributes_walk_back() {
        let r = Request::new(26, NLM_F_CREATE, &[1, 2, 3]).attr(1, &[10, 0, 0, 1]).attr(15, &[7]);
        assert_eq!(r.0.len(), NLMSG_HDRLEN + 4 + 8 + 8);
        assert_eq!(u16_at(&r.0, 6), NLM_F_CREATE | NLM_F_REQUEST | NLM_F_ACK);
        let got: Vec<_> = attrs(&r.0[NLMSG_HDRLEN + 4..]).collect();
        assert_eq!(got, vec![(1, &[10, 0, 0, 1][..]), (15, &[7][..])]);
    }
}
