//! The namespace topology of the end-to-end tests and the demo.
//!
//! ```text
//!   client namespaces (per zone, plus "outside" clients in no zone)
//!   backend namespaces (per zone)        ── veth ──  switch namespace (bridge br0)
//!   balancer namespace (eth0, XDP)
//! ```
//! One flat segment: 198.18.0.0/16 and 2001:db8::/48. Clients route the VIP through the
//! balancer; backends hold the VIP on `lo` (arp_ignore/arp_announce so they never claim it on the
//! segment) and answer clients directly (direct server return). The switch-side peer of the
//! balancer's veth has GRO on, because frames sent with XDP_TX out of a veth reach the peer only
//! in NAPI mode. Every namespace is deleted when the `Topology` drops.

use crate::netns::{sh, Netns};
use anyhow::Result;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

pub const VIP4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
pub const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
pub const LB4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
pub const LB6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

/// Zones and how many clients and backends each has. Zone numbers start at 1; zone 0 holds
/// clients outside every zone prefix (non-compatible clients).
#[derive(Clone, Debug)]
pub struct TopologySpec {
    /// Short unique prefix (≤ 5 chars) for namespace and interface names.
    pub prefix: String,
    /// (clients, backends) per zone 1..=n.
    pub zones: Vec<(usize, usize)>,
    /// Clients outside every zone.
    pub outside_clients: usize,
}

#[derive(Debug)]
pub struct Host {
    pub ns: Netns,
    pub name: String,
    /// 0 = outside every zone.
    pub zone: usize,
    pub v4: Ipv4Addr,
    pub v6: Ipv6Addr,
    pub mac: String,
}

impl Host {
    pub fn addr(&self, v6: bool) -> IpAddr {
        if v6 {
            IpAddr::V6(self.v6)
        } else {
            IpAddr::V4(self.v4)
        }
    }
}

#[derive(Debug)]
pub struct Topology {
    pub lb: Host,
    pub clients: Vec<Host>,
    pub backends: Vec<Host>,
    // Dropped last: the hosts' veth peers live here.
    pub switch: Netns,
    _peer_pins: PinDir,
}

/// A bpffs directory removed on drop (removing a link's pin detaches it).
#[derive(Debug)]
pub struct PinDir(pub PathBuf);

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Client prefix of zone `z` (for the configuration).
pub fn zone_prefixes(z: usize) -> (String, String) {
    (format!("198.18.{z}.0/24"), format!("2001:db8:0:{z}::/64"))
}

pub fn client_addrs(zone: usize, i: usize) -> (Ipv4Addr, Ipv6Addr) {
    // Zone 0 ("outside") clients live in 198.18.9.0/24, which no zone claims.
    let third = if zone == 0 { 9 } else { zone as u8 };
    (
        Ipv4Addr::new(198, 18, third, 10 + i as u8),
        Ipv6Addr::new(0x2001, 0xdb8, 0, third as u16, 0, 0, 0, 0x10 + i as u16),
    )
}

pub fn backend_addrs(zone: usize, i: usize) -> (Ipv4Addr, Ipv6Addr) {
    (
        Ipv4Addr::new(198, 18, 10 + zone as u8, 1 + i as u8),
        Ipv6Addr::new(0x2001, 0xdb8, 0, 0x10 + zone as u16, 0, 0, 0, 1 + i as u16),
    )
}

/// A new namespace `ns_name` whose `eth0` is plugged into `bridge` of `switch` (switch side
/// `peer`), with `addrs` ("ADDR/LEN"; IPv6 without duplicate address detection), up. Returns
/// the namespace and eth0's MAC.
pub fn plug(switch: &Netns, bridge: &str, ns_name: &str, peer: &str, addrs: &[String]) -> Result<(Netns, String)> {
    let ns = Netns::new(ns_name)?;
    ns.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", peer, "netns", switch.name()])?;
    switch.ip(&["link", "set", peer, "master", bridge, "up"])?;
    for a in addrs {
        if a.contains(':') {
            ns.ip(&["addr", "add", a, "dev", "eth0", "nodad"])?;
        } else {
            ns.ip(&["addr", "add", a, "dev", "eth0"])?;
        }
    }
    ns.ip(&["link", "set", "eth0", "up"])?;
    let mac = ns.exec(&["cat", "/sys/class/net/eth0/address"])?.trim().to_owned();
    Ok((ns, mac))
}

/// A balancer transmits with XDP_TX, and a veth delivers XDP_TX frames only to a peer in NAPI
/// mode: an XDP program on the switch-side `peer` gives that (lb_decap for an address nobody
/// uses passes every frame), pinned under `pins`.
pub fn napi_peer(switch: &Netns, peer: &str, pins: &std::path::Path) -> Result<()> {
    sh(switch
        .nsenter()
        .arg(crate::e2e::bin("lb"))
        .args(["decap", "attach", "--interface", peer, "--address", "198.19.255.254", "--pin-dir"])
        .arg(pins))
    .map(|_| ())
}

/// A backend: the VIPs on `lo`, never claimed on the segment (arp_ignore/arp_announce), and
/// packets from clients accepted whatever the route back (rp_filter off).
pub fn hold_vips(ns: &Netns) -> Result<()> {
    ns.ip(&["addr", "add", &format!("{VIP4}/32"), "dev", "lo"])?;
    ns.ip(&["addr", "add", &format!("{VIP6}/128"), "dev", "lo", "nodad"])?;
    for s in [
        "net.ipv4.conf.all.arp_ignore=1",
        "net.ipv4.conf.all.arp_announce=2",
        "net.ipv4.conf.all.rp_filter=0",
        "net.ipv4.conf.eth0.rp_filter=0",
    ] {
        ns.exec(&["sysctl", "-qw", s])?;
    }
    Ok(())
}

/// Every backend's MAC resolved on a balancer now, so the first forwarded packet finds its
/// neighbour (bpf_fib_lookup does not resolve; health checks keep entries fresh).
pub fn pin_neighbours(lb: &Netns, backends: &[Host]) -> Result<()> {
    for b in backends {
        lb.ip(&["neigh", "replace", &b.v4.to_string(), "lladdr", &b.mac, "dev", "eth0", "nud", "permanent"])?;
        lb.ip(&["-6", "neigh", "replace", &b.v6.to_string(), "lladdr", &b.mac, "dev", "eth0", "nud", "permanent"])?;
    }
    Ok(())
}

impl Topology {
    pub fn build(spec: &TopologySpec) -> Result<Topology> {
        let p = &spec.prefix;
        let switch = Netns::new(&format!("{p}-sw"))?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        // No STP/learning delays: forward at once.
        switch.ip(&["link", "set", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let mut port = 0usize;
        let mut host = |name: String, zone: usize, v4: Ipv4Addr, v6: Ipv6Addr| -> Result<Host> {
            port += 1;
            let (ns, mac) = plug(
                &switch,
                "br0",
                &format!("{p}-{name}"),
                &format!("{p}p{port}"),
                &[format!("{v4}/16"), format!("{v6}/48")],
            )?;
            Ok(Host { ns, name, zone, v4, v6, mac })
        };
        let lb = host("lb".into(), 0, LB4, LB6)?;
        // The balancer transmits with XDP_TX, and a veth delivers XDP_TX frames only to a peer
        // in NAPI mode. `ethtool -K gro on` did not give that on this kernel; an XDP program on
        // the peer does: lb_decap for an address nobody uses passes every frame.
        let peer_pins = PinDir(PathBuf::from(format!("/sys/fs/bpf/lb-topo-{p}")));
        let _ = std::fs::remove_dir_all(&peer_pins.0);
        napi_peer(&switch, &format!("{p}p1"), &peer_pins.0)?;
        // bpf_fib_lookup (IPIP next hop) answers only where forwarding is enabled.
        lb.ns.exec(&["sysctl", "-qw", "net.ipv4.conf.all.forwarding=1"])?;
        lb.ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        let mut clients = Vec::new();
        let mut backends = Vec::new();
        for (zi, (nc, nb)) in spec.zones.iter().enumerate() {
            let z = zi + 1;
            for i in 0..*nb {
                let (v4, v6) = backend_addrs(z, i);
                let b = host(format!("b{z}-{}", i + 1), z, v4, v6)?;
                hold_vips(&b.ns)?;
                backends.push(b);
            }
            for i in 0..*nc {
                let (v4, v6) = client_addrs(z, i);
                clients.push(host(format!("c{z}-{}", i + 1), z, v4, v6)?);
            }
        }
        for i in 0..spec.outside_clients {
            let (v4, v6) = client_addrs(0, i);
            clients.push(host(format!("c0-{}", i + 1), 0, v4, v6)?);
        }
        for c in &clients {
            // A veth hands on TCP/UDP with a partial checksum (offload); a frame the balancer
            // forwards from XDP would keep it. Real NICs deliver full checksums: so do clients.
            c.ns.exec(&["ethtool", "-K", "eth0", "tx", "off"])?;
            c.ns.ip(&["route", "add", &format!("{VIP4}/32"), "via", &LB4.to_string()])?;
            c.ns.ip(&["-6", "route", "add", &format!("{VIP6}/128"), "via", &LB6.to_string()])?;
        }
        // Resolve every backend's MAC on the balancer now, so the first forwarded packet finds
        // its neighbour (bpf_fib_lookup does not resolve; health checks keep entries fresh).
        pin_neighbours(&lb.ns, &backends)?;
        Ok(Topology { lb, clients, backends, switch, _peer_pins: peer_pins })
    }

    /// Deletes the balancer's eth0 (and its peer on the switch).
    pub fn delete_lb_link(&self) {
        self.lb.ns.ip(&["link", "del", "eth0"]).unwrap();
    }

    /// Creates the balancer's eth0 again as [`Topology::build`] made it (`prefix` of its spec;
    /// same MAC, so the clients' neighbour entries stay right): veth to the switch's bridge,
    /// addresses, neighbours, and `lb_decap` on the switch-side peer (XDP_TX needs a NAPI peer).
    pub fn recreate_lb_link(&self, prefix: &str) {
        let peer = format!("{prefix}p1");
        let ns = &self.lb.ns;
        ns.ip(&[
            "link",
            "add",
            "eth0",
            "address",
            &self.lb.mac,
            "type",
            "veth",
            "peer",
            "name",
            &peer,
            "netns",
            self.switch.name(),
        ])
        .unwrap();
        self.switch.ip(&["link", "set", &peer, "master", "br0", "up"]).unwrap();
        ns.ip(&["addr", "add", &format!("{}/16", self.lb.v4), "dev", "eth0"]).unwrap();
        ns.ip(&["addr", "add", &format!("{}/48", self.lb.v6), "dev", "eth0", "nodad"]).unwrap();
        ns.ip(&["link", "set", "eth0", "up"]).unwrap();
        for b in &self.backends {
            ns.ip(&["neigh", "replace", &b.v4.to_string(), "lladdr", &b.mac, "dev", "eth0", "nud", "permanent"])
                .unwrap();
        }
        // The peer's link pin is the one the topology made: severed now, and replaced.
        napi_peer(&self.switch, &peer, &self._peer_pins.0).unwrap();
    }

    pub fn clients_in_zone(&self, zone: usize) -> impl Iterator<Item = &Host> {
        self.clients.iter().filter(move |c| c.zone == zone)
    }

    pub fn backend(&self, name: &str) -> Option<&Host> {
        self.backends.iter().find(|b| b.name == name)
    }
}
