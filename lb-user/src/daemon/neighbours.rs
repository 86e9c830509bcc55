//! Next hops kept resolved: `bpf_fib_lookup` does not resolve a neighbour, it fails with
//! NO_NEIGH (`drop_no_neigh`) until something else talks to the next hop. So for every backend
//! the daemon finds the next hop the kernel routes it through and keeps a managed neighbour
//! entry for it (`ip neigh replace NH dev DEV managed`, NTF_EXT_MANAGED, Linux 5.16): the
//! kernel resolves such an entry at once and keeps it reachable, without traffic. An entry the
//! operator made permanent is left as it is. Runs on a thread of its own (it starts `ip`);
//! the set is re-applied on every change and every `RECHECK` (routes change).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

/// How often the whole set is applied again when it does not change.
const RECHECK: Duration = Duration::from_secs(10);

/// Starts the keeper; send it the backends' addresses after every reconcile.
pub fn spawn() -> Sender<BTreeSet<IpAddr>> {
    let (tx, rx) = channel::<BTreeSet<IpAddr>>();
    std::thread::spawn(move || {
        let mut backends = BTreeSet::new();
        let mut failed = BTreeSet::new();
        loop {
            match rx.recv_timeout(RECHECK) {
                Ok(set) => backends = set,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
            for b in &backends {
                match keep(*b) {
                    Ok(()) => {
                        failed.remove(b);
                    }
                    Err(e) => {
                        // Logged once per backend until it works again.
                        if failed.insert(*b) {
                            tracing::warn!("cannot keep a neighbour entry for backend {b}: {e}");
                        }
                    }
                }
            }
        }
    });
    tx
}

/// The next hop of `addr` and its device, from `ip -o route get`: the gateway, or the address
/// itself on a connected network. None for a local or unreachable address.
pub fn next_hop(route_get: &str, addr: IpAddr) -> Option<(IpAddr, String)> {
    let words: Vec<&str> = route_get.split_whitespace().collect();
    if words.first().is_some_and(|w| matches!(*w, "local" | "unreachable" | "blackhole" | "prohibit")) {
        return None;
    }
    let after = |key: &str| words.windows(2).find(|w| w[0] == key).map(|w| w[1]);
    let dev = after("dev")?.to_owned();
    let via = match after("via") {
        // `via inet6 ADDR` for an IPv6 gateway of an IPv4 route.
        Some("inet" | "inet6") => words.windows(3).find(|w| w[0] == "via").and_then(|w| w[2].parse().ok())?,
        Some(gw) => gw.parse().ok()?,
        None => addr,
    };
    Some((via, dev))
}

fn ip(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        anyhow::bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Makes sure the next hop of backend `addr` has a managed (or permanent) neighbour entry.
fn keep(addr: IpAddr) -> anyhow::Result<()> {
    let a = addr.to_string();
    let Some((nh, dev)) = next_hop(&ip(&["-o", "route", "get", &a])?, addr) else {
        return Ok(());
    };
    let nh = nh.to_string();
    let current = ip(&["neigh", "show", "to", &nh, "dev", &dev])?;
    if current.contains("PERMANENT") || current.contains("managed") {
        return Ok(());
    }
    ip(&["neigh", "replace", &nh, "dev", &dev, "managed"]).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_hop_is_the_gateway_or_the_address_itself() {
        let b: IpAddr = "198.19.10.3".parse().unwrap();
        assert_eq!(
            next_hop("198.19.10.3 via 198.18.0.2 dev eth0 src 198.18.0.1 uid 0 \\    cache", b),
            Some(("198.18.0.2".parse().unwrap(), "eth0".into()))
        );
        assert_eq!(next_hop("198.19.10.3 dev eth1 src 198.19.10.1 uid 0 \\    cache", b), Some((b, "eth1".into())));
        let b6: IpAddr = "2001:db8:10::3".parse().unwrap();
        assert_eq!(
            next_hop(
                "2001:db8:10::3 from :: via fe80::1 dev eth0 proto static src 2001:db8::1 metric 1024 pref medium",
                b6
            ),
            Some(("fe80::1".parse().unwrap(), "eth0".into()))
        );
        assert_eq!(
            next_hop("198.19.10.3 via inet6 fe80::1 dev eth0 src 198.18.0.1", b),
            Some(("fe80::1".parse().unwrap(), "eth0".into()))
        );
        assert_eq!(next_hop("local 198.18.0.1 dev lo src 198.18.0.1 uid 0", b), None);
    }
}
