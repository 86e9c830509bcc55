//! The next-hop scene (issue 29) of the end-to-end test and the demo: the balancer as the next
//! hop of the routes between a client network A and a server network B, with stateful
//! firewalls behind it.
//!
//! ```text
//!   A 198.18.10.2   (route 198.18.20.0/24 via the balancer 198.18.10.1)
//!   B 198.18.20.5   (route 198.18.10.0/24 via the balancer 198.18.20.1)   one bridge: every
//!   balancer        (eth0, XDP; 198.18.10.1, 198.18.20.1)                 namespace on one
//!   fw1..fwN        (198.18.10.1x, 198.18.20.1x; forwarding on)           segment
//! ```
//! and the same in IPv6: 2001:db8:10::/64 for A's side, 2001:db8:20::/64 for B's.
//! The balancer sends each packet, unchanged, to a firewall's MAC; the firewall routes it on
//! to A or B directly (both are on its links). Each firewall is an nftables stateful firewall:
//! `ct state established,related` accepted, `ct state new` only from A, `ct state invalid`
//! dropped, and mid-stream pick-up off (`nf_conntrack_tcp_loose = 0`), so a reply that reaches
//! a firewall which did not see its connection open is dropped. Its set `seen` records every
//! flow (addresses, protocol, ports) in each direction it forwarded.

use crate::e2e::Session;
use crate::netns::{sh, Netns};
use crate::topology::{napi_peer, plug, Host, PinDir};
use anyhow::{Context, Result};
use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;

pub const A: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 2);
pub const B: Ipv4Addr = Ipv4Addr::new(198, 18, 20, 5);
pub const LB_A: Ipv4Addr = Ipv4Addr::new(198, 18, 10, 1);
pub const LB_B: Ipv4Addr = Ipv4Addr::new(198, 18, 20, 1);
pub const A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 2);
pub const B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 5);
pub const LB_A6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 1);
pub const LB_B6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 1);
/// The port B's server (and every firewall's health-check answerer) listens on.
pub const PORT: u16 = 8080;

/// Firewall `i`'s (1-based) address on A's side: what the balancer's configuration names.
pub fn fw_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, 10, 10 + i as u8)
}

/// One direction of one flow a firewall forwarded: (source, destination, protocol, source port,
/// destination port).
pub type Seen = (IpAddr, IpAddr, u8, u16, u16);

const RULES: &str = "table inet fw {
  set seen { type ipv4_addr . ipv4_addr . inet_proto . inet_service . inet_service; flags dynamic; size 65536; }
  set seen6 { type ipv6_addr . ipv6_addr . inet_proto . inet_service . inet_service; flags dynamic; size 65536; }
  chain forward {
    type filter hook forward priority 0; policy drop;
    ct state invalid counter drop
    ct state established,related meta nfproto ipv4 meta l4proto { tcp, udp } add @seen { ip saddr . ip daddr . meta l4proto . th sport . th dport }
    ct state established,related meta nfproto ipv6 meta l4proto { tcp, udp } add @seen6 { ip6 saddr . ip6 daddr . meta l4proto . th sport . th dport }
    ct state established,related accept
    ct state new ip saddr 198.18.10.0/24 meta l4proto { tcp, udp } add @seen { ip saddr . ip daddr . meta l4proto . th sport . th dport }
    ct state new ip saddr 198.18.10.0/24 accept
    ct state new ip6 saddr 2001:db8:10::/64 meta l4proto { tcp, udp } add @seen6 { ip6 saddr . ip6 daddr . meta l4proto . th sport . th dport }
    ct state new ip6 saddr 2001:db8:10::/64 accept
  }
  chain output {
    type filter hook output priority 0; policy accept;
    # IPv6 has no send_redirects switch: a redirect would teach A or B to bypass the balancer.
    icmpv6 type nd-redirect drop
  }
}
";

pub struct Scene {
    pub a: Host,
    pub b: Host,
    pub lb: Host,
    pub fws: Vec<Host>,
    /// `lb-testsrv` on B and on each firewall (health checks): killed with their namespaces.
    _servers: Vec<crate::netns::ChildGuard>,
    prefix: String,
    port: usize,
    // Dropped last: the hosts' veth peers live here.
    pub switch: Netns,
    _peer_pins: PinDir,
}

impl Scene {
    /// The scene with `firewalls` firewalls; `prefix` (≤ 5 chars) names its namespaces.
    pub fn build(prefix: &str, firewalls: usize) -> Result<Scene> {
        let switch = Netns::new(&format!("{prefix}-sw"))?;
        switch.ip(&["link", "add", "br0", "type", "bridge"])?;
        switch.ip(&["link", "set", "br0", "type", "bridge", "forward_delay", "0", "stp_state", "0"])?;
        switch.ip(&["link", "set", "br0", "up"])?;
        let host = |name: &str, port: usize, addrs: &[IpAddr]| -> Result<Host> {
            let list: Vec<String> =
                addrs.iter().map(|a| if a.is_ipv4() { format!("{a}/24") } else { format!("{a}/64") }).collect();
            let (ns, mac) = plug(&switch, "br0", &format!("{prefix}-{name}"), &format!("{prefix}p{port}"), &list)?;
            let v4 = addrs.iter().find_map(|a| match a {
                IpAddr::V4(v) => Some(*v),
                _ => None,
            });
            let v6 = addrs.iter().find_map(|a| match a {
                IpAddr::V6(v) => Some(*v),
                _ => None,
            });
            Ok(Host { ns, name: name.to_owned(), zone: 0, v4: v4.unwrap(), v6: v6.unwrap(), mac })
        };
        let lb = host("lb", 1, &[LB_A.into(), LB_B.into(), LB_A6.into(), LB_B6.into()])?;
        let peer_pins = PinDir(PathBuf::from(format!("/sys/fs/bpf/lb-topo-{prefix}")));
        let _ = std::fs::remove_dir_all(&peer_pins.0);
        napi_peer(&switch, &format!("{prefix}p1"), &peer_pins.0)?;
        lb.ns.exec(&["sysctl", "-qw", "net.ipv4.conf.all.forwarding=1"])?;
        lb.ns.exec(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"])?;
        let a = host("a", 2, &[A.into(), A6.into()])?;
        let b = host("b", 3, &[B.into(), B6.into()])?;
        for (h, net, via, net6, via6) in [
            (&a, "198.18.20.0/24", LB_A, "2001:db8:20::/64", LB_A6),
            (&b, "198.18.10.0/24", LB_B, "2001:db8:10::/64", LB_B6),
        ] {
            // Full checksums, as a real NIC delivers them (a veth leaves them partial).
            h.ns.exec(&["ethtool", "-K", "eth0", "tx", "off"])?;
            h.ns.ip(&["route", "add", net, "via", &via.to_string()])?;
            h.ns.ip(&["-6", "route", "add", net6, "via", &via6.to_string()])?;
            for s in ["net.ipv4.conf.all.accept_redirects=0", "net.ipv6.conf.all.accept_redirects=0"] {
                h.ns.exec(&["sysctl", "-qw", s])?;
            }
        }
        let srv = crate::e2e::bin("lb-testsrv");
        let mut servers =
            vec![b.ns.spawn(&[srv.to_str().unwrap(), "B", &format!("{B}:{PORT}"), &format!("[{B6}]:{PORT}")])?];
        let mut scene = Scene {
            a,
            b,
            lb,
            fws: Vec::new(),
            _servers: Vec::new(),
            prefix: prefix.to_owned(),
            port: 3,
            switch,
            _peer_pins: peer_pins,
        };
        for _ in 0..firewalls {
            servers.push(scene.add_firewall()?);
        }
        scene._servers = servers;
        Ok(scene)
    }

    /// One more firewall, `fw{N}`; returns its health-check answerer.
    pub fn add_firewall(&mut self) -> Result<crate::netns::ChildGuard> {
        let i = self.fws.len() + 1;
        self.port += 1;
        let (a_side, b_side) = (fw_addr(i), Ipv4Addr::new(198, 18, 20, 10 + i as u8));
        let (a_side6, b_side6) = (
            Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, 0x10 + i as u16),
            Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 0x10 + i as u16),
        );
        let list = [format!("{a_side}/24"), format!("{b_side}/24"), format!("{a_side6}/64"), format!("{b_side6}/64")];
        let name = format!("fw{i}");
        let (ns, mac) = plug(
            &self.switch,
            "br0",
            &format!("{}-{name}", self.prefix),
            &format!("{}p{}", self.prefix, self.port),
            &list,
        )?;
        for s in [
            "net.ipv4.conf.all.forwarding=1",
            "net.ipv6.conf.all.forwarding=1",
            // It forwards out of the interface it received on: no redirect may tell A or B to
            // bypass the balancer.
            "net.ipv4.conf.all.send_redirects=0",
            "net.ipv4.conf.eth0.send_redirects=0",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.eth0.rp_filter=0",
        ] {
            ns.exec(&["sysctl", "-qw", s])?;
        }
        let rules = std::env::temp_dir().join(format!("{}-{name}.nft", self.prefix));
        std::fs::write(&rules, RULES)?;
        ns.exec(&["nft", "-f", rules.to_str().unwrap()]).context("loading the firewall's nftables rules")?;
        let _ = std::fs::remove_file(&rules);
        // Strictly stateful: no mid-stream pick-up of a connection it did not see open (loaded
        // with conntrack by the rules above).
        ns.exec(&["sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_loose=0"])?;
        let srv = crate::e2e::bin("lb-testsrv");
        let server = ns.spawn(&[srv.to_str().unwrap(), &name, &format!("{a_side}:{PORT}")])?;
        self.fws.push(Host { ns, name, zone: 0, v4: a_side, v6: a_side6, mac });
        Ok(server)
    }

    /// The balancer's configuration: one next-hop service for every destination, the
    /// firewalls (the first `count`) as its backends by MAC, TCP health checks every second.
    pub fn config(&self, count: usize, symmetric: bool) -> String {
        let mut text = format!(
            "[[service]]\nname = \"firewalls\"\nprotocol = \"L3_DEFAULT\"\n\
             [service.next_hop]\ndestinations = [\"0.0.0.0/0\", \"::/0\"]\nsymmetric = {symmetric}\n\
             [service.health_check]\nprotocol = \"TCP\"\nport = {PORT}\ncheck_interval_sec = 1\ntimeout_sec = 1\n\
             healthy_threshold = 1\nunhealthy_threshold = 2\n"
        );
        for fw in &self.fws[..count] {
            text += &format!("[[service.backend]]\naddress = \"{}\"\nmac = \"{}\"\n", fw.v4, fw.mac);
        }
        text
    }

    /// The flows firewall `i` (0-based) forwarded, each direction apart.
    pub fn seen(&self, i: usize) -> Result<BTreeSet<Seen>> {
        let mut seen = BTreeSet::new();
        for set in ["seen", "seen6"] {
            let out = self.fws[i].ns.exec(&["nft", "-n", "list", "set", "inet", "fw", set])?;
            Self::parse_seen(&out, &mut seen)?;
        }
        Ok(seen)
    }

    fn parse_seen(out: &str, seen: &mut BTreeSet<Seen>) -> Result<()> {
        // `elements = { E, E, ... }`, over several lines when long.
        let body = out.split_once("elements = {").and_then(|(_, b)| b.split('}').next()).unwrap_or("");
        for element in body.split(',') {
            let parts: Vec<&str> = element.split(" . ").map(str::trim).collect();
            if parts.len() != 5 {
                continue;
            }
            let proto = match parts[2] {
                "tcp" | "6" => 6,
                "udp" | "17" => 17,
                other => other.parse().with_context(|| format!("protocol {other:?} in {out}"))?,
            };
            seen.insert((parts[0].parse()?, parts[1].parse()?, proto, parts[3].parse()?, parts[4].parse()?));
        }
        Ok(())
    }

    /// The firewall (0-based) that forwarded both directions of the flow from A's port
    /// `sport` (protocol `proto`) to B, or why there is none: every flow must have crossed
    /// exactly one firewall, both ways.
    pub fn firewall_of(seen: &[BTreeSet<Seen>], proto: u8, sport: u16) -> Result<usize, String> {
        Self::firewall_of_flow(seen, (A.into(), B.into()), proto, sport)
    }

    /// [`Scene::firewall_of`] for the flow from `ends.0`:`sport` to `ends.1`:`PORT`.
    pub fn firewall_of_flow(
        seen: &[BTreeSet<Seen>],
        ends: (IpAddr, IpAddr),
        proto: u8,
        sport: u16,
    ) -> Result<usize, String> {
        let (a, b) = ends;
        let there: Seen = (a, b, proto, sport, PORT);
        let back: Seen = (b, a, proto, PORT, sport);
        let holders: Vec<usize> =
            (0..seen.len()).filter(|&i| seen[i].contains(&there) || seen[i].contains(&back)).collect();
        match holders[..] {
            [i] if seen[i].contains(&there) && seen[i].contains(&back) => Ok(i),
            [i] => Err(format!("only one direction of port {sport} crossed fw{}", i + 1)),
            [] => Err(format!("no firewall saw port {sport}")),
            _ => Err(format!("port {sport} crossed several firewalls: {holders:?}")),
        }
    }

    /// `lb explain` of a flow from A to B's server (and, a next hop's, of its reverse).
    pub fn explain_args() -> Vec<&'static str> {
        vec!["explain", "--service", "firewalls", "--client", "198.18.10.2", "--dst", "198.18.20.5", "--dport", "8080"]
    }

    /// `lb-testsrv`'s address on B.
    pub fn target(&self) -> std::net::SocketAddr {
        (IpAddr::V4(B), PORT).into()
    }

    /// `lb-testsrv`'s IPv6 address on B.
    pub fn target6(&self) -> std::net::SocketAddr {
        (IpAddr::V6(B6), PORT).into()
    }

    /// Stops firewall `i` (0-based): its link goes down.
    pub fn stop_firewall(&self, i: usize) -> Result<()> {
        self.fws[i].ns.ip(&["link", "set", "eth0", "down"])?;
        Ok(())
    }

    /// Starts firewall `i` (0-based) again: its link comes up.
    pub fn start_firewall(&self, i: usize) -> Result<()> {
        self.fws[i].ns.ip(&["link", "set", "eth0", "up"])?;
        Ok(())
    }

    /// An active/standby pair: fw1 the primary, fw2 the failover backend (`[service.failover_policy]`).
    pub fn config_active_standby(&self) -> String {
        let pair = self.config(2, true);
        let (head, backends) = pair.split_once("[[service.backend]]").expect("backends");
        let standby = format!("address = \"{}\"", self.fws[1].v4);
        format!(
            "{head}[service.failover_policy]\n[[service.backend]]{}",
            backends.replace(&standby, &format!("{standby}\nfailover = true"))
        )
    }
}

/// `n` connections from A to B opened at once; each is a session or why it failed.
pub fn open(a: &Host, target: SocketAddr, n: usize) -> Vec<anyhow::Result<Session>> {
    let mut all = Vec::new();
    for chunk in (0..n).collect::<Vec<_>>().chunks(50) {
        let opened: Vec<anyhow::Result<Session>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunk.iter().map(|_| s.spawn(|| Session::open(a, target))).collect();
            handles.into_iter().map(|h| h.join().expect("opening thread")).collect()
        });
        all.extend(opened);
    }
    all
}

/// Asks on every session at once: which answered (`B`) and which did not.
pub fn ask_all(sessions: &mut [Session], line: &str) -> Vec<bool> {
    std::thread::scope(|s| {
        let handles: Vec<_> =
            sessions.iter_mut().map(|sess| s.spawn(move || sess.ask(line).is_ok_and(|n| n == "B"))).collect();
        handles.into_iter().map(|h| h.join().expect("asking thread")).collect()
    })
}

/// `nft` is needed: fail with what to install rather than skip.
pub fn require_nft() -> Result<()> {
    sh(std::process::Command::new("nft").arg("--version"))
        .map(|_| ())
        .context("the next-hop scene's firewalls need nftables (`apt-get install nftables`, or `cargo xtask setup`)")
}
