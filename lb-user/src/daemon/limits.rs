//! The daemon's file descriptors: the soft RLIMIT_NOFILE is raised to the hard limit at start,
//! and the DNS front's TCP connections get a share of it that leaves a reserve for health
//! probes, the control socket and the data plane, so that a connection flood cannot starve
//! them (a probe failing for want of a descriptor would look like a backend failure).

use std::io;

/// Descriptors kept out of the DNS front's share: control connections
/// (`api::MAX_CONNECTIONS`), maps, links, the log, the runtime; the probes come on top.
pub const RESERVE: u64 = 256;
/// DNS-over-TCP connections open at once, at most (RFC 7766 §6.2.2 asks for limits).
pub const DNS_TCP_MAX: usize = 512;
/// DNS-over-TCP connections open at once from one source address.
pub const DNS_TCP_PER_SOURCE: usize = 32;

/// Raises the soft RLIMIT_NOFILE to the hard limit; returns the soft limit now in force.
pub fn raise_nofile() -> io::Result<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit of this process, with a valid struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return Err(io::Error::last_os_error());
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) != 0 {
                return Err(io::Error::last_os_error());
            }
            lim.rlim_cur = lim.rlim_max;
        }
    }
    Ok(lim.rlim_cur)
}

/// How many DNS-over-TCP connections may be open at once with `nofile` descriptors and
/// `probes` probe tasks (each holds at most one socket), leaving [`RESERVE`] besides; at
/// least a few, so that the front still answers over TCP on a tiny limit.
pub fn dns_tcp_budget(nofile: u64, probes: usize) -> usize {
    let left = nofile.saturating_sub(RESERVE + probes as u64);
    (left.min(DNS_TCP_MAX as u64) as usize).max(8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dns_front_leaves_a_reserve() {
        assert_eq!(dns_tcp_budget(1 << 20, 10), DNS_TCP_MAX);
        assert_eq!(dns_tcp_budget(700, 100), 700 - 256 - 100);
        assert_eq!(dns_tcp_budget(256, 10), 8);
        let soft = raise_nofile().unwrap();
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: reads this process's limit.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!((soft, lim.rlim_cur), (lim.rlim_max, lim.rlim_max));
    }
}
