//! A private network namespace per test, so that `bpf_fib_lookup` inside `BPF_PROG_TEST_RUN`
//! resolves against a known route and a permanent neighbour entry.
//!
//! `in_netns` runs a closure on a fresh thread that has unshared its network namespace; every
//! `ip`/`sysctl` command started from that thread inherits it, and the namespace disappears
//! with the thread. Needs root: failures panic loudly, nothing is skipped.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::process::Command;

/// MAC of the balancer's interface `lbv0` (and source MAC of encapsulated frames sent on it).
pub const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
/// MAC of the next hop 198.18.0.2 / 2001:db8::2 on `lbv0`.
pub const GW_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
/// MAC of `lbv2`, and of its next hop 198.18.2.2 / 2001:db8:2::2.
pub const LB2_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x03];
pub const GW2_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x04];

/// Backend prefixes: reached via lbv0 (same device as ingress: XDP_TX) ...
pub const BACKEND_NET_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 10, 0);
pub const BACKEND_NET_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 0);
/// ... and via lbv2 (another device: XDP_REDIRECT).
pub const FAR_NET_V4: Ipv4Addr = Ipv4Addr::new(198, 19, 20, 0);
pub const FAR_NET_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 0);

/// Interface indexes of the namespace's topology.
#[derive(Clone, Copy, Debug)]
pub struct Topology {
    pub lbv0: u32,
    pub lbv2: u32,
}

fn run(args: &[&str]) {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("running {args:?}: {e}"));
    if !out.status.success() {
        panic!("{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
}

fn ifindex(name: &str) -> u32 {
    let path = format!("/sys/class/net/{name}/ifindex");
    // /sys shows the mounting process's namespace; ask `ip` in ours instead.
    let out = Command::new("ip").args(["-o", "link", "show", "dev", name]).output().expect("ip link show");
    assert!(out.status.success(), "no interface {name} ({path})");
    let text = String::from_utf8_lossy(&out.stdout);
    text.split(':')
        .next()
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("parsing ifindex of {name}: {text}"))
}

fn mac(m: [u8; 6]) -> String {
    m.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":")
}

fn build_topology() -> Topology {
    run(&["ip", "link", "set", "lo", "up"]);
    run(&["sysctl", "-qw", "net.ipv4.conf.all.forwarding=1"]);
    run(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
    for (a, b, amac, bmac, v4, v6, gw4, gw6, gwmac, net4, net6) in [
        (
            "lbv0",
            "lbv1",
            LB_MAC,
            GW_MAC,
            "198.18.0.1/24",
            "2001:db8::1/64",
            "198.18.0.2",
            "2001:db8::2",
            GW_MAC,
            "198.19.10.0/24",
            "2001:db8:10::/64",
        ),
        (
            "lbv2",
            "lbv3",
            LB2_MAC,
            GW2_MAC,
            "198.18.2.1/24",
            "2001:db8:2::1/64",
            "198.18.2.2",
            "2001:db8:2::2",
            GW2_MAC,
            "198.19.20.0/24",
            "2001:db8:20::/64",
        ),
    ] {
        run(&["ip", "link", "add", a, "address", &mac(amac), "type", "veth", "peer", "name", b, "address", &mac(bmac)]);
        run(&["sysctl", "-qw", &format!("net.ipv6.conf.{a}.forwarding=1")]);
        run(&["ip", "link", "set", a, "up"]);
        run(&["ip", "link", "set", b, "up"]);
        run(&["ip", "addr", "add", v4, "dev", a]);
        run(&["ip", "-6", "addr", "add", v6, "dev", a, "nodad"]);
        run(&["ip", "neigh", "replace", gw4, "lladdr", &mac(gwmac), "dev", a, "nud", "permanent"]);
        run(&["ip", "-6", "neigh", "replace", gw6, "lladdr", &mac(gwmac), "dev", a, "nud", "permanent"]);
        run(&["ip", "route", "add", net4, "via", gw4, "dev", a]);
        run(&["ip", "-6", "route", "add", net6, "via", gw6, "dev", a]);
    }
    Topology { lbv0: ifindex("lbv0"), lbv2: ifindex("lbv2") }
}

/// Runs `f` in a new network namespace holding the test topology; panics propagate.
pub fn in_netns<T: Send + 'static>(f: impl FnOnce(Topology) -> T + Send + 'static) -> T {
    let handle = std::thread::spawn(move || {
        // SAFETY: unshare only affects this thread's namespaces.
        let rc = unsafe { libc::unshare(libc::CLONE_NEWNET) };
        if rc != 0 {
            panic!("unshare(CLONE_NEWNET) failed (tests need root): {}", std::io::Error::last_os_error());
        }
        let topo = build_topology();
        f(topo)
    });
    match handle.join() {
        Ok(v) => v,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// Moves the calling thread (a test's own thread) into a new network namespace in which every
/// test address (198.18.0.0/15, 2001:db8::/32) is routed out of `lo`, with forwarding on.
/// `BPF_PROG_TEST_RUN` without an ingress device runs on `lo`, so there the L2 DSR route lookup
/// finds the ingress device (XDP_TX), and fixtures do not depend on the host's routes. The
/// namespace goes away with the thread.
pub fn enter_lo_routed_netns() {
    // SAFETY: unshare only affects this thread's namespaces.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
        panic!("unshare(CLONE_NEWNET) failed (tests need root): {}", std::io::Error::last_os_error());
    }
    run(&["ip", "link", "set", "lo", "up"]);
    sysctl("net.ipv4.conf.all.forwarding=1");
    sysctl("net.ipv4.conf.lo.forwarding=1");
    sysctl("net.ipv6.conf.all.forwarding=1");
    sysctl("net.ipv6.conf.lo.forwarding=1");
    run(&["ip", "route", "add", "198.18.0.0/15", "dev", "lo"]);
    run(&["ip", "-6", "route", "add", "2001:db8::/32", "dev", "lo"]);
}

/// `sysctl -w SETTING` in the calling thread's namespace.
pub fn sysctl(setting: &str) {
    run(&["sysctl", "-qw", setting]);
}

/// Adds a permanent neighbour entry in the calling thread's namespace (`dev` is a name).
pub fn add_neighbour(addr: std::net::IpAddr, lladdr: [u8; 6], dev: &str) {
    run(&["ip", "neigh", "replace", &addr.to_string(), "lladdr", &mac(lladdr), "dev", dev, "nud", "permanent"]);
}
