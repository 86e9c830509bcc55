//! VIP announcement (`[announce]`): `lb` decides which VIPs this host announces, a routing
//! daemon (BIRD) speaks BGP.
//!
//! Integration: the daemon creates a TUN device (`[announce] device`, default `lb-vips`) that
//! is NOT persistent: the kernel deletes it when the last file descriptor closes, which happens
//! when the process exits, however it exits (SIGKILL and panics included). For every VIP it can
//! serve, the daemon puts a host route through that device into a routing table of its own
//! (`[announce] table`, default 100): `ip route replace VIP/32 dev lb-vips table 100 proto
//! static`. No `ip rule` points at that table, so the host's own routing is unchanged, and the
//! VIPs are never local addresses (the host stack would answer for ports without a service).
//! BIRD imports the table (`protocol kernel { kernel table 100; learn; }`) and exports it to
//! its BGP peers. Withdrawals:
//! - a VIP that cannot be served, a host drain, a clean stop: the route is deleted;
//! - a crash: the device vanishes with the process and with it every route through it; BIRD
//!   rescans the kernel table at once when one of its interfaces goes down (its `krt_if_notify`),
//!   and within its `scan time` otherwise, then sends the BGP withdrawal.
//!
//! Why not a BIRD include file plus `birdc configure`: a crashed daemon could not take its
//! routes back (a liveness timer would have to), and the daemon would need BIRD's control
//! socket. Kernel routes need nothing from BIRD, and survive a BIRD restart.

use super::iproute::ip;
use crate::config::{Announce, Config};
use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::net::IpAddr;
use std::os::fd::AsRawFd;

/// The VIPs this host can serve now: of the services whose tables are written (`applied`),
/// those with a `usable` backend (passed its health check or has none, not drained); without
/// `require_healthy_backend` also those whose first round of checks is over (no backend
/// `unchecked`), healthy or not. So a balancer that (re)starts announces nothing before its
/// checks have spoken: behind ECMP it would take its share of new connections to backends
/// it cannot reach. A VIP shared by several services (other ports) is announced if any of
/// them qualifies.
pub fn servable_vips(
    cfg: &Config,
    applied: &[&str],
    require_healthy_backend: bool,
    usable: &dyn Fn(&str, IpAddr) -> bool,
    unchecked: &dyn Fn(&str, IpAddr) -> bool,
) -> BTreeSet<IpAddr> {
    let checked = |s: &crate::config::Service| {
        !s.backends.iter().flat_map(|b| b.addresses().iter().copied()).any(|a| unchecked(&s.name, a))
    };
    cfg.services
        .iter()
        .filter(|s| applied.contains(&s.name.as_str()))
        .filter(|s| {
            s.backends.iter().flat_map(|b| b.addresses().iter().copied()).any(|a| usable(&s.name, a))
                || (!require_healthy_backend && checked(s))
        })
        // A next-hop service has no VIP: routers send it traffic by their routes.
        .filter_map(|s| s.vip())
        .collect()
}

/// The TUN device and the routes through it.
pub struct Announcer {
    table: u32,
    device: String,
    /// Holding it keeps the device; closing it (exit, crash) deletes device and routes.
    _tun: std::fs::File,
    announced: BTreeSet<IpAddr>,
    /// A host drain: nothing is announced any more, whatever the services' state.
    draining: bool,
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const IFF_PERSIST: libc::c_short = 0x0800;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

impl Announcer {
    /// Create the device (it must not exist as another daemon's, or as a persistent one) and
    /// bring it up. `cfg` is validated (the name fits IFNAMSIZ).
    pub fn open(cfg: &Announce) -> Result<Self> {
        let tun = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/net/tun")
            .context("opening /dev/net/tun for [announce]")?;
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: IFF_TUN | IFF_NO_PI, _pad: [0; 22] };
        req.name[..cfg.device.len()].copy_from_slice(cfg.device.as_bytes());
        // SAFETY: TUNSETIFF reads and writes one struct ifreq, which `req` is laid out as.
        if unsafe { libc::ioctl(tun.as_raw_fd(), TUNSETIFF as _, &mut req) } != 0 {
            // EBUSY: another process (another lb daemon) holds it; EINVAL: not a TUN device.
            bail!(
                "creating the TUN device {:?}: {} (is another lb daemon running here?)",
                cfg.device,
                std::io::Error::last_os_error()
            );
        }
        // An existing persistent device would be attached to, and outlive this process with
        // its routes: a crash would then withdraw nothing.
        // SAFETY: TUNGETIFF writes one struct ifreq.
        if unsafe { libc::ioctl(tun.as_raw_fd(), TUNGETIFF as _, &mut req) } != 0 || req.flags & IFF_PERSIST != 0 {
            bail!("[announce] device {:?} is a persistent TUN device: delete it (ip tuntap del {} mode tun) or choose another name", cfg.device, cfg.device);
        }
        ip(&["link", "set", "dev", &cfg.device, "up"])?;
        Ok(Self {
            table: cfg.table,
            device: cfg.device.clone(),
            _tun: tun,
            announced: BTreeSet::new(),
            draining: false,
        })
    }

    /// Announce exactly `want` (nothing while draining). On an error the routes done so far
    /// are kept track of, and the next call retries the rest.
    pub fn set(&mut self, want: &BTreeSet<IpAddr>) -> Result<()> {
        let want = if self.draining { BTreeSet::new() } else { want.clone() };
        for vip in self.announced.difference(&want).copied().collect::<Vec<_>>() {
            self.route("del", vip)?;
            self.announced.remove(&vip);
            tracing::info!("announce: withdrew {vip}");
        }
        for vip in want.difference(&self.announced).copied().collect::<Vec<_>>() {
            self.route("replace", vip)?;
            self.announced.insert(vip);
            tracing::info!("announce: announced {vip}");
        }
        Ok(())
    }

    /// A host drain: withdraw everything, for good.
    pub fn drain(&mut self) -> Result<()> {
        self.draining = true;
        self.set(&BTreeSet::new())
    }

    pub fn announced(&self) -> &BTreeSet<IpAddr> {
        &self.announced
    }

    pub fn draining(&self) -> bool {
        self.draining
    }

    pub fn device(&self) -> &str {
        &self.device
    }

    pub fn table(&self) -> u32 {
        self.table
    }

    fn route(&self, op: &str, vip: IpAddr) -> Result<()> {
        let (family, len) = if vip.is_ipv4() { ("-4", 32) } else { ("-6", 128) };
        let table = self.table.to_string();
        ip(&[family, "route", op, &format!("{vip}/{len}"), "dev", &self.device, "table", &table, "proto", "static"])
    }
}

impl Drop for Announcer {
    /// A clean stop withdraws before the data plane goes; the device goes with the descriptor.
    fn drop(&mut self) {
        if let Err(e) = self.drain() {
            tracing::warn!("announce: withdrawing on stop: {e:#} (the routes go with the device)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = "[[service]]\nname = \"a\"\nvip = \"198.51.100.1\"\nprotocol = \"TCP\"\nports = [80]\n\
        [[service.backend]]\naddress = \"10.0.0.1\"\n\
        [[service]]\nname = \"a443\"\nvip = \"198.51.100.1\"\nprotocol = \"TCP\"\nports = [443]\n\
        [[service.backend]]\naddress = \"10.0.0.2\"\n\
        [[service]]\nname = \"b\"\nvip = \"2001:db8::b\"\nprotocol = \"UDP\"\nports = [53]\n\
        [[service.backend]]\naddress = \"2001:db8::1\"\n";

    fn vips(set: BTreeSet<IpAddr>) -> Vec<String> {
        set.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn only_written_services_with_a_usable_backend() {
        let cfg = Config::parse(CFG).unwrap();
        let all: &dyn Fn(&str, IpAddr) -> bool = &|_, _| true;
        let none: &dyn Fn(&str, IpAddr) -> bool = &|_, _| false;
        assert_eq!(vips(servable_vips(&cfg, &["a", "a443", "b"], true, all, none)), ["198.51.100.1", "2001:db8::b"]);
        // Tables not written yet: not announced.
        assert_eq!(vips(servable_vips(&cfg, &["b"], true, all, none)), ["2001:db8::b"]);
        // One of two services on the VIP can serve: the VIP stays.
        let only_second: &dyn Fn(&str, IpAddr) -> bool = &|s, _| s == "a443";
        assert_eq!(vips(servable_vips(&cfg, &["a", "a443", "b"], true, only_second, none)), ["198.51.100.1"]);
        // Nothing usable: nothing announced, unless the check is off.
        assert!(servable_vips(&cfg, &["a", "a443", "b"], true, none, none).is_empty());
        assert_eq!(servable_vips(&cfg, &["a", "a443", "b"], false, none, none).len(), 2);
    }

    /// Before the first round of checks is over nothing is announced, even with the check
    /// off; a backend that passed announces its VIP at once.
    #[test]
    fn nothing_before_the_first_verdicts() {
        let cfg = Config::parse(CFG).unwrap();
        let none: &dyn Fn(&str, IpAddr) -> bool = &|_, _| false;
        let all: &dyn Fn(&str, IpAddr) -> bool = &|_, _| true;
        let applied = ["a", "a443", "b"];
        assert!(servable_vips(&cfg, &applied, true, none, all).is_empty());
        assert!(
            servable_vips(&cfg, &applied, false, none, all).is_empty(),
            "no verdict yet: not even without the check"
        );
        // b's backend failed its first probe, a's are still unchecked.
        let in_a: &dyn Fn(&str, IpAddr) -> bool = &|s, _| s != "b";
        assert_eq!(vips(servable_vips(&cfg, &applied, false, none, in_a)), ["2001:db8::b"]);
        assert!(servable_vips(&cfg, &applied, true, none, in_a).is_empty());
        // a443's backend passed: its VIP is announced while a's is still unchecked.
        let passed: &dyn Fn(&str, IpAddr) -> bool = &|s, _| s == "a443";
        assert_eq!(vips(servable_vips(&cfg, &applied, true, passed, in_a)), ["198.51.100.1"]);
    }
}
