//! The scale-out topology: N balancers behind a router's ECMP, each announcing the VIP over BGP
//! with its own BIRD (issue 18). Used by `tests/tests/e2e_scale_out.rs` and the demo.
//!
//! ```text
//!  clients (zone z: 198.18.z.10+i/24) ── brout ── router (198.18.z.254; BIRD AS 65000, ECMP)
//!                                                    │ 10.0.0.254
//!  balancers lb1..N (10.0.0.1..N; lb + BIRD AS 65001) ── brin ── backends (10.0.0.11.., VIP on lo)
//! ```
//! Both bridges live in one switch namespace. Each balancer's `lb run` keeps a route for the VIP
//! in kernel table 100 through its TUN device (`[announce]`); its BIRD learns that table and
//! announces it to the router, whose BIRD merges the balancers' routes into one multipath
//! kernel route, hashed on the 5-tuple (`fib_multipath_hash_policy=1`). Backends are L2 DSR
//! targets on the inner segment and answer clients through the router. Every namespace,
//! daemon and BIRD goes when the [`ScaleOut`] drops (also when a test fails).

use crate::e2e::{backends_toml_of, service_block, vip, zones_toml, Daemon, Session};
use crate::netns::{sh, ChildGuard, Netns};
use crate::topology::{client_addrs, hold_vips, napi_peer, pin_neighbours, plug, Host, PinDir, VIP4};
use anyhow::{bail, Context, Result};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub const ROUTER_AS: u32 = 65000;
pub const LB_AS: u32 = 65001;
/// The kernel table `lb` keeps the VIP routes in (`[announce] table`).
pub const VIP_TABLE: u32 = 100;
pub const ROUTER_IN: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 254);
/// The service port, also health-checked.
pub const PORT: u16 = 80;

pub fn balancer_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 0, 0, 1 + i as u8)
}

fn backend_addrs(i: usize) -> (Ipv4Addr, Ipv6Addr) {
    (Ipv4Addr::new(10, 0, 0, 11 + i as u8), Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 0x11 + i as u16))
}

/// The router's address on zone `z`'s client subnet.
fn gateway(z: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, z as u8, 254)
}

/// BIRD of the router: learns the VIPs from every balancer over eBGP (only host routes of the
/// VIP range) and installs one multipath route per VIP into the kernel.
pub fn router_bird_conf(balancers: &[Ipv4Addr]) -> String {
    let mut s = format!(
        "log stderr all;\n\
         router id {ROUTER_IN};\n\
         protocol device {{ scan time 1; }}\n\
         # One kernel route per VIP with a next hop per balancer (ECMP).\n\
         protocol kernel {{\n\
         \x20   merge paths on;\n\
         \x20   ipv4 {{ import none; export all; }};\n\
         }}\n\
         template bgp balancer {{\n\
         \x20   local {ROUTER_IN} as {ROUTER_AS};\n\
         \x20   hold time 3; keepalive time 1;\n\
         \x20   connect retry time 1; error wait time 1, 5;\n\
         \x20   ipv4 {{ import where net ~ [ 198.18.0.0/24{{32,32}} ]; export none; }};\n\
         }}\n"
    );
    for (i, b) in balancers.iter().enumerate() {
        s += &format!("protocol bgp lb{} from balancer {{ neighbor {b} as {LB_AS}; }}\n", i + 1);
    }
    s
}

/// BIRD of a balancer at `me`: learns the routes `lb` keeps in table [`VIP_TABLE`] and
/// announces them to the router.
pub fn balancer_bird_conf(me: Ipv4Addr) -> String {
    format!(
        "log stderr all;\n\
         router id {me};\n\
         protocol device {{ scan time 1; }}\n\
         # The VIPs lb can serve: host routes through its TUN device in table {VIP_TABLE}. They\n\
         # vanish with the lb process; an interface going down makes BIRD rescan at once.\n\
         protocol kernel vips {{\n\
         \x20   kernel table {VIP_TABLE};\n\
         \x20   learn;\n\
         \x20   scan time 1;\n\
         \x20   ipv4 {{ import all; export none; }};\n\
         }}\n\
         protocol bgp uplink {{\n\
         \x20   local {me} as {LB_AS};\n\
         \x20   neighbor {ROUTER_IN} as {ROUTER_AS};\n\
         \x20   hold time 3; keepalive time 1;\n\
         \x20   connect delay time 1; connect retry time 1; error wait time 1, 5;\n\
         \x20   ipv4 {{ import none; export where proto = \"vips\"; next hop self; }};\n\
         }}\n"
    )
}

/// ECMP on the 5-tuple, as a router hashes packets from the wire. Policy 1 (L4) would not do
/// here: for a packet that already carries an L4 hash it takes that hash, and a packet from a
/// client namespace carries its TCP socket's random `sk_txhash` across the veth, so the path
/// would depend on the socket, not on the flow, and `ip route get` could not tell it. Policy 3
/// with the 5-tuple fields (source and destination address, protocol, ports) dissects the
/// headers like policy 1 does on a real router.
pub fn l4_ecmp_hash(router: &Netns) -> Result<()> {
    router.exec(&["sysctl", "-qw", "net.ipv4.fib_multipath_hash_fields=0x0037"])?;
    router.exec(&["sysctl", "-qw", "net.ipv4.fib_multipath_hash_policy=3"])?;
    Ok(())
}

/// A program from /usr/sbin, which a non-login root shell's PATH may lack.
fn sbin(name: &str) -> PathBuf {
    ["/usr/sbin", "/sbin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// A BIRD running in a namespace, with its own control socket; killed on drop.
pub struct Bird {
    child: ChildGuard,
    pub socket: PathBuf,
    log: PathBuf,
}

impl Bird {
    /// Write `conf` to `DIR/NAME.conf` and run `bird -f` in `ns`; waits until it answers.
    pub fn start(ns: &Netns, dir: &Path, name: &str, conf: &str) -> Result<Self> {
        let conf_path = dir.join(format!("{name}.conf"));
        std::fs::write(&conf_path, conf)?;
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log)?;
        let socket = dir.join(format!("{name}.ctl"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns.name()])
            .arg(sbin("bird"))
            .arg("-f")
            .arg("-c")
            .arg(&conf_path)
            .arg("-s")
            .arg(&socket)
            .arg("-P")
            .arg(dir.join(format!("{name}.pid")))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting bird (is bird2 installed? cargo xtask setup)")?;
        let mut bird = Self { child: ChildGuard::new(child), socket, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        while bird.cli(&["show", "status"]).is_err() {
            if bird.child.exited() || Instant::now() > deadline {
                bail!("BIRD {name} did not start: {}", bird.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(bird)
    }

    /// `birdc -s SOCKET ARGS`.
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        sh(Command::new(sbin("birdc")).arg("-s").arg(&self.socket).args(args))
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

pub struct Balancer {
    pub host: Host,
    /// `lb run` (None while stopped).
    pub daemon: Option<Daemon>,
    pub bird: Bird,
    /// Daemon directories' prefix.
    pub id: String,
}

impl Balancer {
    pub fn start(&mut self, config: &str) -> Result<()> {
        self.daemon = Some(Daemon::start_in(&self.host.ns, &self.id, config)?);
        Ok(())
    }

    pub fn lb(&self) -> &Daemon {
        self.daemon.as_ref().expect("lb runs on this balancer")
    }

    pub fn lb_mut(&mut self) -> &mut Daemon {
        self.daemon.as_mut().expect("lb runs on this balancer")
    }
}

#[derive(Clone, Debug)]
pub struct ScaleOutSpec {
    /// Short unique prefix (≤ 5 chars) for namespace and interface names.
    pub prefix: String,
    pub balancers: usize,
    pub backends: usize,
    /// Clients per zone 1..=n.
    pub clients: Vec<usize>,
}

pub struct ScaleOut {
    // Dropped in this order: daemons and BIRDs first, the switch (veth peers) last.
    pub balancers: Vec<Balancer>,
    pub router_bird: Bird,
    pub servers: Vec<ChildGuard>,
    pub clients: Vec<Host>,
    pub backends: Vec<Host>,
    pub router: Netns,
    pub switch: Netns,
    pub zones: usize,
    _peer_pins: PinDir,
    _dir: PinDir,
}

impl ScaleOut {
    /// Namespaces, addresses, routes, BIRDs (sessions establish on their own) and a
    /// `lb-testsrv` on every backend; no `lb` runs yet ([`ScaleOut::start_all`]).
    pub fn build(spec: &ScaleOutSpec) -> Result<Self> {
        let p = &spec.prefix;
        // BIRD's files: configuration, control socket, pid and log per daemon.
        let dir = PinDir(std::env::temp_dir().join(format!("{p}-bird")));
        let _ = std::fs::remove_dir_all(&dir.0);
        std::fs::create_dir_all(&dir.0)?;
        let switch = Netns::new(&format!("{p}-sw"))?;
        for br in ["brin", "brout"] {
            switch.ip(&["link", "add", br, "type", "bridge"])?;
            switch.ip(&["link", "set", br, "type", "bridge", "forward_delay", "0", "stp_state", "0"])?;
            switch.ip(&["link", "set", br, "up"])?;
        }
        // The router: eth0 on the inner segment, eth1 on the clients' one.
        let (router, _) = plug(&switch, "brin", &format!("{p}-rt"), &format!("{p}r0"), &[format!("{ROUTER_IN}/24")])?;
        router.ip(&[
            "link",
            "add",
            "eth1",
            "type",
            "veth",
            "peer",
            "name",
            &format!("{p}r1"),
            "netns",
            switch.name(),
        ])?;
        switch.ip(&["link", "set", &format!("{p}r1"), "master", "brout", "up"])?;
        for z in 1..=spec.clients.len() {
            router.ip(&["addr", "add", &format!("{}/24", gateway(z)), "dev", "eth1"])?;
        }
        router.ip(&["link", "set", "eth1", "up"])?;
        for s in
            ["net.ipv4.conf.all.forwarding=1", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"]
        {
            router.exec(&["sysctl", "-qw", s])?;
        }
        l4_ecmp_hash(&router)?;
        let mut backends = Vec::new();
        for i in 0..spec.backends {
            let (v4, v6) = backend_addrs(i);
            let name = format!("b{}", i + 1);
            let (ns, mac) = plug(
                &switch,
                "brin",
                &format!("{p}-{name}"),
                &format!("{p}b{}", i + 1),
                &[format!("{v4}/24"), format!("{v6}/64")],
            )?;
            hold_vips(&ns)?;
            ns.ip(&["route", "add", "default", "via", &ROUTER_IN.to_string()])?;
            backends.push(Host { ns, name, zone: 1 + i % spec.clients.len().max(1), v4, v6, mac });
        }
        let servers = backends.iter().map(|b| crate::e2e::start_server(b, PORT)).collect::<Result<Vec<_>>>()?;
        let mut clients = Vec::new();
        for (zi, n) in spec.clients.iter().enumerate() {
            let z = zi + 1;
            for i in 0..*n {
                let (v4, v6) = client_addrs(z, i);
                let name = format!("c{z}-{}", i + 1);
                let (ns, mac) =
                    plug(&switch, "brout", &format!("{p}-{name}"), &format!("{p}c{z}{i}"), &[format!("{v4}/24")])?;
                // Frames the balancers forward keep the checksum state the client gave them.
                ns.exec(&["ethtool", "-K", "eth0", "tx", "off"])?;
                ns.ip(&["route", "add", "default", "via", &gateway(z).to_string()])?;
                clients.push(Host { ns, name, zone: z, v4, v6, mac });
            }
        }
        let addrs: Vec<Ipv4Addr> = (0..spec.balancers).map(balancer_addr).collect();
        let router_bird = Bird::start(&router, &dir.0, "router", &router_bird_conf(&addrs))?;
        let peer_pins = PinDir(PathBuf::from(format!("/sys/fs/bpf/lb-topo-{p}")));
        let _ = std::fs::remove_dir_all(&peer_pins.0);
        let mut balancers = Vec::new();
        for (i, &v4) in addrs.iter().enumerate() {
            let name = format!("lb{}", i + 1);
            let peer = format!("{p}l{}", i + 1);
            let (ns, mac) = plug(&switch, "brin", &format!("{p}-{name}"), &peer, &[format!("{v4}/24")])?;
            napi_peer(&switch, &peer, &peer_pins.0.join(&name))?;
            ns.exec(&["sysctl", "-qw", "net.ipv4.conf.all.forwarding=1"])?;
            pin_neighbours(&ns, &backends)?;
            let host = Host { ns, name: name.clone(), zone: 0, v4, v6: Ipv6Addr::UNSPECIFIED, mac };
            let bird = Bird::start(&host.ns, &dir.0, &name, &balancer_bird_conf(v4))?;
            balancers.push(Balancer { host, daemon: None, bird, id: format!("{p}-{name}") });
        }
        Ok(Self {
            balancers,
            router_bird,
            servers,
            clients,
            backends,
            router,
            switch,
            zones: spec.clients.len(),
            _peer_pins: peer_pins,
            _dir: dir,
        })
    }

    /// The balancers' `lb` configuration: the zones, `[announce]` (3 s host-drain grace) and
    /// one L2 DSR service on VIP:80 over every backend, health-checked every second.
    pub fn lb_config(&self) -> String {
        let service = service_block(
            "web",
            false,
            "forwarding = \"L2_DSR\"\n",
            "",
            PORT,
            &backends_toml_of(self.backends.iter(), false),
        );
        format!("{}[announce]\ntable = {VIP_TABLE}\ndrain_grace_sec = 3\n\n{service}", zones_toml(self.zones))
    }

    /// `lb run` on every balancer, then wait until the router has a path through each.
    pub fn start_all(&mut self, config: &str) -> Result<()> {
        for b in &mut self.balancers {
            b.start(config)?;
        }
        let n = self.balancers.len();
        self.wait_paths(
            &format!("the router to route the VIP over all {n} balancers"),
            Duration::from_secs(60),
            |hops| hops.len() == n,
        )
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", self.diagnostics()))?;
        Ok(())
    }

    /// The next hops of the router's route to the VIP (empty: no route).
    pub fn paths(&self) -> Result<Vec<Ipv4Addr>> {
        let out = self.router.ip(&["route", "show", "exact", &format!("{VIP4}/32")])?;
        Ok(vias(&out))
    }

    /// Poll the router's route every 10 ms until `ok(next hops)`; the time it took.
    pub fn wait_paths(&self, what: &str, timeout: Duration, ok: impl Fn(&[Ipv4Addr]) -> bool) -> Result<Duration> {
        let start = Instant::now();
        loop {
            if ok(&self.paths()?) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!("timed out after {timeout:?} waiting for {what}; router has {:?}", self.paths()?);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The balancer (index) the router's ECMP hash sends a TCP flow from `client:sport` to.
    pub fn ecmp_choice(&self, client: Ipv4Addr, sport: u16) -> Result<usize> {
        let out = self.router.ip(&[
            "route",
            "get",
            &VIP4.to_string(),
            "from",
            &client.to_string(),
            "iif",
            "eth1",
            "ipproto",
            "tcp",
            "sport",
            &sport.to_string(),
            "dport",
            &PORT.to_string(),
        ])?;
        let via = vias(&out).first().copied().ok_or_else(|| anyhow::anyhow!("no next hop in {out:?}"))?;
        self.balancers.iter().position(|b| b.host.v4 == via).ok_or_else(|| anyhow::anyhow!("{via} is no balancer"))
    }

    /// A per-class counter of the service (`packets`, `new_flows`, ...) in balancer `i`'s
    /// `lb stats`, summed over the client classes.
    pub fn counter(&self, i: usize, name: &str) -> Result<u64> {
        let v: serde_json::Value = serde_json::from_str(&self.balancers[i].lb().cli(&["stats", "--json"])?)?;
        Ok(v["services"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|s| s["classes"].as_array().into_iter().flatten())
            .filter_map(|c| c[name].as_u64())
            .sum())
    }

    /// The backend (address) `lb explain` on balancer `i` gives a TCP flow from `client:sport`.
    pub fn explain(&self, i: usize, client: Ipv4Addr, sport: u16) -> Result<String> {
        let out = self.balancers[i].lb().cli(&[
            "explain",
            "--service",
            "web",
            "--client",
            &client.to_string(),
            "--sport",
            &sport.to_string(),
            "--dport",
            &PORT.to_string(),
            "--json",
        ])?;
        let v: serde_json::Value = serde_json::from_str(&out)?;
        v["backend"].as_str().map(str::to_owned).ok_or_else(|| anyhow::anyhow!("no backend in {v}"))
    }

    /// A backend's address by its name (what `lb-testsrv` answers with).
    pub fn backend_addr(&self, name: &str) -> Option<String> {
        self.backends.iter().find(|b| b.name == name).map(|b| b.v4.to_string())
    }

    /// The router's and every balancer's BGP state, routes and logs, for failure messages.
    pub fn diagnostics(&self) -> String {
        let mut s = format!(
            "--- router: ip route ---\n{}\n--- router BIRD ---\n{}\n{}",
            self.router.ip(&["route"]).unwrap_or_default(),
            self.router_bird.cli(&["show", "protocols"]).unwrap_or_default(),
            self.router_bird.log()
        );
        for b in &self.balancers {
            s += &format!(
                "--- {}: table {VIP_TABLE} ---\n{}\n--- BIRD ---\n{}\n{}\n",
                b.host.name,
                b.host.ns.ip(&["route", "show", "table", &VIP_TABLE.to_string()]).unwrap_or_default(),
                b.bird.cli(&["show", "route", "all"]).unwrap_or_default(),
                b.bird.log()
            );
            if let Some(d) = &b.daemon {
                s += &d.diagnostics();
            }
        }
        s
    }
}

/// A long-lived connection of a client to the VIP.
pub struct Conn {
    pub session: Session,
    pub client: Ipv4Addr,
    pub sport: u16,
    /// The backend's name, from the greeting.
    pub backend: String,
}

impl ScaleOut {
    /// `n` long-lived connections, from the clients in turn.
    pub fn open_sessions(&self, n: usize) -> Result<Vec<Conn>> {
        (0..n)
            .map(|i| {
                let c = &self.clients[i % self.clients.len()];
                let session = Session::open(c, vip(false, PORT))?;
                let sport = session.local_addr()?.port();
                let backend = session.greeting.clone();
                Ok(Conn { session, client: c.v4, sport, backend })
            })
            .collect()
    }

    /// The balancer the router's hash sends each connection to now.
    pub fn choices(&self, conns: &[Conn]) -> Result<Vec<usize>> {
        conns.iter().map(|c| self.ecmp_choice(c.client, c.sport)).collect()
    }
}

/// Ask on every connection; the indices of those that failed (reset, timeout) or answered from
/// another backend.
pub fn broken(conns: &mut [Conn], what: &str) -> Vec<usize> {
    conns
        .iter_mut()
        .enumerate()
        .filter_map(|(i, c)| match c.session.ask(what) {
            Ok(name) if name == c.backend => None,
            _ => Some(i),
        })
        .collect()
}

/// The addresses after each `via` in `ip route` output.
fn vias(out: &str) -> Vec<Ipv4Addr> {
    let words: Vec<&str> = out.split_whitespace().collect();
    words.windows(2).filter(|w| w[0] == "via").filter_map(|w| w[1].parse().ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn next_hops_of_single_and_multipath_routes() {
        assert_eq!(vias("198.18.0.100 via 10.0.0.1 dev eth0 proto bird metric 32\n"), [balancer_addr(0)]);
        let multi = "198.18.0.100 proto bird metric 32 \n\tnexthop via 10.0.0.1 dev eth0 weight 1 \n\tnexthop via 10.0.0.3 dev eth0 weight 1 \n";
        assert_eq!(vias(multi), [balancer_addr(0), balancer_addr(2)]);
        assert!(vias("").is_empty());
    }
}

#[cfg(test)]
mod readme {
    use super::*;

    /// README's deployment section shows the BIRD configuration these tests run, verbatim.
    #[test]
    fn readme_shows_the_bird_configuration_of_the_tests() {
        let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
        let router = router_bird_conf(&[balancer_addr(0), balancer_addr(1), balancer_addr(2)]);
        let balancer = balancer_bird_conf(balancer_addr(0));
        println!("{router}\n----\n{balancer}");
        assert!(readme.contains(&router), "README lacks the router's BIRD configuration:\n{router}");
        assert!(readme.contains(&balancer), "README lacks the balancer's BIRD configuration:\n{balancer}");
    }
}
