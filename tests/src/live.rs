//! Live traffic through the balancer against nftables DNAT, in one topology (`live_bench`,
//! `cargo xtask bench --live`; method and figures: BENCHMARKS.md, "Live traffic").
//!
//! ```text
//!   GEN ns eth0 ── veth ── eth0  LB ns  eth1 ── veth ── eth0 SINK ns (backends' addresses)
//!   frames from BPF_PROG_TEST_RUN     `lb` (XDP) or nftables DNAT     XDP_DROP, counted by veth
//! ```
//! The generator is an XDP program run in live-frames mode on GEN's eth0: every frame it
//! returns XDP_TX for is sent to LB's eth0 as a received frame would be (an xdp_frame, as from
//! a NIC). It rewrites the client address and port per frame from a counter: flow `i mod n` for
//! `n` established flows, or a new flow per frame. The sink drops every frame in XDP, so the
//! backends are never the bottleneck; veth counts the drops (`ethtool -S`: `xdp_drops`).
//! A veth delivers an xdp_frame only to a peer in NAPI mode, which an XDP program gives: on the
//! nftables side LB's eth0 therefore runs an XDP_PASS program.

use crate::e2e::Daemon;
use crate::netns::{sh, Netns};
use crate::packet::{checksum, ethernet, tcp4, udp4, TCP_ACK, TCP_SYN, V4};
use crate::rawbpf::{self, insn, op, Insn};
use anyhow::{bail, Context, Result};
use std::net::Ipv4Addr;
use std::os::fd::OwnedFd;
use std::process::Command;
use std::time::{Duration, Instant};

/// The service's address (port 80, TCP and UDP).
pub const VIP: Ipv4Addr = Ipv4Addr::new(198, 19, 100, 1);
const GEN_ADDR: &str = "198.19.0.2/24";
const LB_IN_ADDR: &str = "198.19.0.1/24";
/// LB's address towards the backends: the outer source of its IPIP packets.
const LB_OUT: Ipv4Addr = Ipv4Addr::new(198, 19, 1, 1);
/// Clients: 198.18.0.0/16, the generator varies the low 16 bits and the source port.
const CLIENT_BASE: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 0);
/// Source ports 1024 .. 1024 + PORTS; flow `i` uses port 1024 + i % PORTS, client i / PORTS.
const PORTS: i32 = 64000;
const FIRST_PORT: i32 = 1024;
/// Generated frames are the Ethernet minimum (UDP with 18 bytes of payload; TCP padded).
const FRAME_LEN: usize = 60;

pub fn backend_addr(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 19, 1, 10 + i as u8)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Udp,
    Tcp,
}

/// Which flows the frames belong to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flows {
    /// `n` flows, frame `k` belongs to flow `k mod n` (TCP: ACK segments).
    Established(u32),
    /// Every frame a flow never seen (TCP: SYN).
    New,
}

#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub proto: Proto,
    pub flows: Flows,
}

impl Case {
    pub fn name(&self) -> String {
        let p = match self.proto {
            Proto::Udp => "udp",
            Proto::Tcp => "tcp",
        };
        match self.flows {
            Flows::Established(n) if n >= 1_000_000 && n % 1_000_000 == 0 => format!("{p} {}M flows", n / 1_000_000),
            Flows::Established(n) if n >= 1000 && n % 1000 == 0 => format!("{p} {}k flows", n / 1000),
            Flows::Established(n) => format!("{p} {n} flows"),
            Flows::New => format!("{p} new flow/pkt"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum System {
    /// The `lb` daemon's production XDP program, IPIP to the backends.
    Lb,
    /// No balancer program: nftables DNAT as kube-proxy's nftables mode writes it, forwarding,
    /// conntrack.
    Nft,
    /// A trivial XDP forwarder (parse the Ethernet header, rewrite the MACs, redirect to the
    /// sink: `rawbpf::forwarder`): what any XDP program that forwards costs, `lb`'s floor.
    Fwd,
}

impl System {
    pub fn name(&self) -> &'static str {
        match self {
            System::Lb => "lb",
            System::Nft => "nft",
            System::Fwd => "fwd",
        }
    }
}

/// The three namespaces, with the XDP_DROP sink attached; deleted on drop.
pub struct LiveTopology {
    prefix: String,
    backends: usize,
    gen_mac: [u8; 6],
    lb_mac: [u8; 6],
    /// MACs of the balancer's `eth1` and of the sink's `eth0` (the forwarder's rewrite).
    lb_out_mac: [u8; 6],
    sink_mac: [u8; 6],
    // Closing the link detaches the sink (deleting the namespace would too).
    _sink_link: OwnedFd,
    pub gen: Netns,
    pub lb: Netns,
    pub sink: Netns,
}

fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let mut m = [0u8; 6];
    let parts: Vec<&str> = s.trim().split(':').collect();
    if parts.len() != 6 {
        bail!("not a MAC address: {s:?}");
    }
    for (b, p) in m.iter_mut().zip(parts) {
        *b = u8::from_str_radix(p, 16)?;
    }
    Ok(m)
}

fn mac_of(ns: &Netns, dev: &str) -> Result<[u8; 6]> {
    parse_mac(&ns.exec(&["cat", &format!("/sys/class/net/{dev}/address")])?)
}

/// The index of `dev` in the calling thread's network namespace.
fn ifindex(dev: &str) -> Result<u32> {
    let name = std::ffi::CString::new(dev)?;
    // SAFETY: a valid NUL-terminated name.
    match unsafe { libc::if_nametoindex(name.as_ptr()) } {
        0 => bail!("no interface {dev}: {}", std::io::Error::last_os_error()),
        i => Ok(i),
    }
}

/// Attach a constant-verdict XDP program to `dev` of `ns`; the link lives as long as the fd.
fn attach_constant(ns: &Netns, dev: &'static str, verdict: i32) -> Result<OwnedFd> {
    ns.run(move || -> Result<OwnedFd> {
        let prog = rawbpf::load_xdp(&rawbpf::constant(verdict))?;
        rawbpf::attach_xdp(&prog, ifindex(dev)?)
    })?
}

/// `nft` must be installed for the nftables side.
pub fn require_nft() -> Result<()> {
    match Command::new("nft").arg("--version").output() {
        Ok(o) if o.status.success() => Ok(()),
        _ => {
            bail!("`nft` not found: the live bench needs the Debian package `nftables` (cargo xtask setup installs it)")
        }
    }
}

impl LiveTopology {
    /// `prefix`: short unique prefix of the namespace names; `backends` sink addresses.
    pub fn build(prefix: &str, backends: usize) -> Result<Self> {
        require_nft()?;
        let gen = Netns::new(&format!("{prefix}-gen"))?;
        let lb = Netns::new(&format!("{prefix}-lb"))?;
        let sink = Netns::new(&format!("{prefix}-sink"))?;
        gen.ip(&["link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", lb.name()])?;
        lb.ip(&["link", "add", "eth1", "type", "veth", "peer", "name", "eth0", "netns", sink.name()])?;
        gen.ip(&["addr", "add", GEN_ADDR, "dev", "eth0"])?;
        lb.ip(&["addr", "add", LB_IN_ADDR, "dev", "eth0"])?;
        lb.ip(&["addr", "add", &format!("{LB_OUT}/24"), "dev", "eth1"])?;
        for i in 0..backends {
            sink.ip(&["addr", "add", &format!("{}/24", backend_addr(i)), "dev", "eth0"])?;
        }
        for (ns, dev) in [(&gen, "eth0"), (&lb, "eth0"), (&lb, "eth1"), (&sink, "eth0")] {
            // No IPv6 chatter (router solicitations, MLD) reaching the counting sink.
            ns.exec(&["sysctl", "-qw", &format!("net.ipv6.conf.{dev}.disable_ipv6=1")])?;
            ns.ip(&["link", "set", dev, "up"])?;
        }
        for s in [
            "net.ipv4.conf.all.forwarding=1",
            "net.ipv4.conf.all.rp_filter=0",
            "net.ipv4.conf.eth0.rp_filter=0",
            // Frames from the generator carry no checksum verdict (CHECKSUM_NONE), so conntrack
            // would verify every TCP checksum in software; a NIC's receive offload spares real
            // hosts that, so it is off here (the checksums are valid anyway).
            "net.netfilter.nf_conntrack_checksum=0",
        ] {
            lb.exec(&["sysctl", "-qw", s])?;
        }
        let sink_mac = mac_of(&sink, "eth0")?;
        let sink_mac_s = sink_mac.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(":");
        for i in 0..backends {
            let a = backend_addr(i).to_string();
            lb.ip(&["neigh", "replace", &a, "lladdr", &sink_mac_s, "dev", "eth1", "nud", "permanent"])?;
        }
        let sink_link = attach_constant(&sink, "eth0", rawbpf::XDP_DROP).context("attaching the XDP_DROP sink")?;
        Ok(Self {
            prefix: prefix.to_owned(),
            backends,
            gen_mac: mac_of(&gen, "eth0")?,
            lb_mac: mac_of(&lb, "eth0")?,
            lb_out_mac: mac_of(&lb, "eth1")?,
            sink_mac,
            _sink_link: sink_link,
            gen,
            lb,
            sink,
        })
    }

    /// Frames the sink has dropped (counted by the veth driver), all queues.
    pub fn sink_count(&self) -> Result<u64> {
        let out = self.sink.exec(&["ethtool", "-S", "eth0"])?;
        let mut total = None;
        for l in out.lines() {
            if let Some((k, v)) = l.trim().split_once(':') {
                if k.starts_with("rx_queue_") && k.ends_with("_xdp_drops") {
                    *total.get_or_insert(0) += v.trim().parse::<u64>()?;
                }
            }
        }
        total.ok_or_else(|| anyhow::anyhow!("no xdp_drops in `ethtool -S eth0` of the sink:\n{out}"))
    }

    /// The `lb` configuration: one VIP, a UDP and a TCP service on port 80, IPIP to every sink
    /// address (no health checks: the sinks answer nothing, and backends start healthy).
    pub fn lb_config(&self) -> String {
        let mut s = format!("[dataplane]\nencap_source_v4 = \"{LB_OUT}\"\n\n");
        for proto in ["UDP", "TCP"] {
            s += &format!(
                "[[service]]\nname = \"{}\"\nvip = \"{VIP}\"\nprotocol = \"{proto}\"\nports = [80]\n\n",
                proto.to_lowercase()
            );
            for i in 0..self.backends {
                s += &format!("[[service.backend]]\naddress = \"{}\"\n\n", backend_addr(i));
            }
        }
        s
    }

    /// kube-proxy's nftables mode for the same service: a verdict map from (address, protocol,
    /// port) to the service's chain, `numgen random mod N` to an endpoint chain, `dnat to` the
    /// endpoint; a forward filter dropping what conntrack finds invalid.
    pub fn nft_ruleset(&self) -> String {
        let n = self.backends;
        let mut s = String::from("table ip lb-live {\n");
        s += &format!(
            "  map service-ips {{\n    type ipv4_addr . inet_proto . inet_service : verdict\n    elements = {{ \
             {VIP} . udp . 80 : goto service-udp, {VIP} . tcp . 80 : goto service-tcp }}\n  }}\n"
        );
        s += "  chain nat-prerouting {\n    type nat hook prerouting priority dstnat; policy accept;\n    \
              ip daddr . meta l4proto . th dport vmap @service-ips\n  }\n";
        s += "  chain filter-forward {\n    type filter hook forward priority filter; policy accept;\n    \
              ct state invalid drop\n  }\n";
        for proto in ["udp", "tcp"] {
            let arms: Vec<String> = (0..n).map(|i| format!("{i} : goto endpoint-{proto}-{i}")).collect();
            s += &format!(
                "  chain service-{proto} {{\n    numgen random mod {n} vmap {{ {} }}\n  }}\n",
                arms.join(", ")
            );
            for i in 0..n {
                s += &format!(
                    "  chain endpoint-{proto}-{i} {{\n    meta l4proto {proto} dnat to {}:80\n  }}\n",
                    backend_addr(i)
                );
            }
        }
        s + "}\n"
    }

    /// Put `system` in place on the balancer; it stays until the guard drops.
    pub fn start(&self, system: System) -> Result<Running> {
        match system {
            System::Lb => {
                Ok(Running::Lb(Daemon::start_in(&self.lb, &format!("{}-d", self.prefix), &self.lb_config())?))
            }
            System::Nft => {
                let link = attach_constant(&self.lb, "eth0", rawbpf::XDP_PASS).context("XDP_PASS on the balancer")?;
                let path = std::env::temp_dir().join(format!("{}-ruleset.nft", self.prefix));
                std::fs::write(&path, self.nft_ruleset())?;
                let loaded = self.lb.exec(&["nft", "-f", path.to_str().unwrap()]);
                let _ = std::fs::remove_file(&path);
                loaded.context("loading the nftables ruleset")?;
                Ok(Running::Nft { ns: self.lb.name().to_owned(), _link: link })
            }
            System::Fwd => {
                let (dst, src) = (self.sink_mac, self.lb_out_mac);
                let link = self.lb.run(move || -> Result<OwnedFd> {
                    let prog = rawbpf::load_xdp(&rawbpf::forwarder(dst, src, ifindex("eth1")?))?;
                    rawbpf::attach_xdp(&prog, ifindex("eth0")?)
                })??;
                Ok(Running::Fwd { _link: link })
            }
        }
    }

    /// A generator for `case`: its frame template and the program that varies it.
    pub fn generator(&self, case: Case) -> Result<Generator> {
        Generator::new(case, self.lb_mac, self.gen_mac)
    }

    /// Send `n` frames (at least) from the generator; returns what it measured.
    pub fn send(&self, g: &Generator, n: u64) -> Result<Sent> {
        self.send_until(g, Some(n), None)
    }

    /// Send for `secs` seconds.
    pub fn send_for(&self, g: &Generator, secs: f64) -> Result<Sent> {
        self.send_until(g, None, Some(Duration::from_secs_f64(secs)))
    }

    fn send_until(&self, g: &Generator, count: Option<u64>, time: Option<Duration>) -> Result<Sent> {
        let prog = g.prog.try_clone()?;
        let frame = g.frame.clone();
        self.gen.run(move || -> Result<Sent> {
            let ifindex = ifindex("eth0")?;
            pin_to_cpu(0)?;
            let (rusage0, start) = (thread_cpu_ns(), Instant::now());
            let mut sent = 0u64;
            loop {
                let chunk = count.map_or(CHUNK, |c| (c - sent).min(CHUNK));
                if chunk == 0 {
                    break;
                }
                rawbpf::run_live(&prog, &frame, ifindex, chunk as u32)?;
                sent += chunk;
                if time.is_some_and(|t| start.elapsed() >= t) {
                    break;
                }
            }
            Ok(Sent { frames: sent, secs: start.elapsed().as_secs_f64(), thread_ns: thread_cpu_ns() - rusage0 })
        })?
    }
}

/// Frames per `BPF_PROG_TEST_RUN` call (the kernel sends them in batches of 64).
const CHUNK: u64 = 1 << 16;

/// What one send measured in the generator's thread.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub frames: u64,
    pub secs: f64,
    /// The generator thread's CPU time (user + system), softirq work that ran in its context
    /// included (this kernel has no IRQ time accounting).
    pub thread_ns: u64,
}

/// The system running on the balancer; dropping it removes it.
pub enum Running {
    Lb(Daemon),
    Nft { ns: String, _link: OwnedFd },
    Fwd { _link: OwnedFd },
}

impl Running {
    /// `lb stats --json`'s global counters (lb only).
    pub fn lb_counters(&self) -> Result<Option<serde_json::Value>> {
        match self {
            Running::Lb(d) => {
                let v: serde_json::Value = serde_json::from_str(&d.cli(&["stats", "--json"])?)?;
                Ok(Some(v["global"].clone()))
            }
            Running::Nft { .. } | Running::Fwd { .. } => Ok(None),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Running::Nft { ns, .. } = self {
            let _ = sh(Command::new("ip").args(["netns", "exec", ns, "nft", "delete", "table", "ip", "lb-live"]));
        }
    }
}

/// The generator: an XDP program with its counter map, and the frame it rewrites.
pub struct Generator {
    prog: OwnedFd,
    _counter: OwnedFd,
    frame: Vec<u8>,
}

impl Generator {
    fn new(case: Case, dst_mac: [u8; 6], src_mac: [u8; 6]) -> Result<Self> {
        let counter = rawbpf::counter_map()?;
        let frame = template(case, dst_mac, src_mac);
        let prog = rawbpf::load_xdp(&generator_program(case, &counter, &frame)).context("loading the generator")?;
        Ok(Self { prog, _counter: counter, frame })
    }
}

/// The frame of flow 0: client 198.18.0.0, port 1024. The program rewrites the client's low
/// 16 bits `w` and port `p` and keeps every checksum valid without computing one: the IPv4
/// identification holds `0xffff - w` (the header's sum stays the same), TCP's urgent pointer
/// (ignored: URG is not set) `0xffff - (w + p) mod 0xffff` (the segment's sum with the pseudo
/// header stays the same). UDP goes without checksum (0, allowed over IPv4).
fn template(case: Case, dst_mac: [u8; 6], src_mac: [u8; 6]) -> Vec<u8> {
    let mut v4 = V4::new(CLIENT_BASE, VIP, if case.proto == Proto::Tcp { 6 } else { 17 });
    v4.id = 0xffff;
    let l4 = match case.proto {
        Proto::Udp => {
            let mut u = udp4(CLIENT_BASE, VIP, FIRST_PORT as u16, 80, &[0u8; 18]);
            u[6..8].copy_from_slice(&[0, 0]);
            u
        }
        Proto::Tcp => {
            let flags = if case.flows == Flows::New { TCP_SYN } else { TCP_ACK };
            let mut t = tcp4(CLIENT_BASE, VIP, FIRST_PORT as u16, 80, flags, &[]);
            let urg = 0xffff - FIRST_PORT as u16;
            t[18..20].copy_from_slice(&urg.to_be_bytes());
            // Add the urgent pointer into the checksum: ~(~c + urg).
            let old = u16::from_be_bytes([t[16], t[17]]);
            let sum = checksum(&[(!old).to_be_bytes(), urg.to_be_bytes()].concat());
            t[16..18].copy_from_slice(&sum.to_be_bytes());
            t
        }
    };
    let mut f = ethernet(dst_mac, src_mac, 0x0800, &v4.build(&l4));
    assert!(f.len() <= FRAME_LEN);
    f.resize(FRAME_LEN, 0);
    f
}

/// The generator's instructions: count the frame, derive its flow, write the whole template
/// `frame`, then its client address, identification, port (and TCP urgent pointer), XDP_TX.
/// The whole frame each time: live-frames mode initialises a page's data only when the page
/// is first allocated, and pages come back recycled from the balancer and the sinks with the
/// headers they wrote (encapsulation, DNAT, MACs).
fn generator_program(case: Case, counter: &OwnedFd, frame: &[u8]) -> Vec<Insn> {
    let mut p = vec![
        insn(op::MOV_X, 6, 1, 0, 0),
        insn(op::ST_W, 10, 0, -4, 0),
        insn(op::MOV_X, 2, 10, 0, 0),
        insn(op::ADD_K, 2, 0, 0, -4),
    ];
    p.extend(rawbpf::ld_map(1, counter));
    p.push(insn(op::CALL, 0, 0, 0, 1)); // bpf_map_lookup_elem
    let null_check = p.len();
    p.push(insn(op::JEQ_K, 0, 0, 0, 0)); // -> drop, patched below
    p.extend([
        insn(op::LDX_DW, 7, 0, 0, 0),
        insn(op::MOV_X, 1, 7, 0, 0),
        insn(op::ADD_K, 1, 0, 0, 1),
        insn(op::STX_DW, 0, 1, 0, 0),
    ]);
    if let Flows::Established(n) = case.flows {
        p.push(insn(op::MOD_K, 7, 0, 0, n as i32));
    }
    p.extend([
        // r8 = port, r9 = w
        insn(op::MOV_X, 8, 7, 0, 0),
        insn(op::MOD_K, 8, 0, 0, PORTS),
        insn(op::ADD_K, 8, 0, 0, FIRST_PORT),
        insn(op::MOV_X, 9, 7, 0, 0),
        insn(op::DIV_K, 9, 0, 0, PORTS),
        insn(op::AND_K, 9, 0, 0, 0xffff),
        // r2 = urgent pointer, r3 = identification
        insn(op::MOV_X, 1, 9, 0, 0),
        insn(op::ADD_X, 1, 8, 0, 0),
        insn(op::MOD_K, 1, 0, 0, 0xffff),
        insn(op::MOV_K, 2, 0, 0, 0xffff),
        insn(op::SUB_X, 2, 1, 0, 0),
        insn(op::MOV_K, 3, 0, 0, 0xffff),
        insn(op::SUB_X, 3, 9, 0, 0),
        // bounds: data + FRAME_LEN <= data_end
        insn(op::LDX_W, 4, 6, 0, 0),
        insn(op::LDX_W, 5, 6, 4, 0),
        insn(op::MOV_X, 0, 4, 0, 0),
        insn(op::ADD_K, 0, 0, 0, FRAME_LEN as i32),
    ]);
    let bounds_check = p.len();
    p.push(insn(op::JGT_X, 0, 5, 0, 0)); // -> drop, patched below
    for (i, word) in frame.chunks_exact(4).enumerate() {
        let imm = i32::from_ne_bytes(word.try_into().expect("4 bytes"));
        p.push(insn(op::ST_W, 4, 0, 4 * i as i16, imm));
    }
    p.extend([
        insn(op::TO_BE, 9, 0, 0, 16),
        insn(op::STX_H, 4, 9, 28, 0),
        insn(op::TO_BE, 3, 0, 0, 16),
        insn(op::STX_H, 4, 3, 18, 0),
        insn(op::TO_BE, 8, 0, 0, 16),
        insn(op::STX_H, 4, 8, 34, 0),
    ]);
    if case.proto == Proto::Tcp {
        p.extend([insn(op::TO_BE, 2, 0, 0, 16), insn(op::STX_H, 4, 2, 52, 0)]);
    }
    p.extend([insn(op::MOV_K, 0, 0, 0, rawbpf::XDP_TX), insn(op::EXIT, 0, 0, 0, 0)]);
    let drop = p.len();
    p.extend(rawbpf::constant(rawbpf::XDP_DROP));
    for at in [null_check, bounds_check] {
        p[at] = Insn::with_off(p[at], (drop - at - 1) as i16);
    }
    p
}

/// Pin the calling thread to `cpu`: the generator and the softirq work its frames cause then
/// share one CPU, the other stays free for the rest of the machine.
fn pin_to_cpu(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_setaffinity(0) is this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
            bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The calling thread's CPU time (user + system), ns.
fn thread_cpu_ns() -> u64 {
    // SAFETY: getrusage fills the zeroed struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_THREAD, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Machine-wide CPU time from /proc/stat, ns: (softirq, all non-idle).
pub fn cpu_times() -> Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().filter(|l| l.starts_with("cpu ")).context("no cpu line in /proc/stat")?;
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().unwrap_or(0)).collect();
    // user nice system idle iowait irq softirq steal
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    let ns = |t: u64| t * 1_000_000_000 / hz;
    let busy = f[0] + f[1] + f[2] + f[5] + f[6];
    Ok((ns(f[6]), ns(busy)))
}

/// The host's (initial namespace's) conntrack limit raised to at least `max` while it lives, so
/// a namespace may set as much: a namespace cannot exceed the host's. Restored on drop.
pub struct ConntrackMax {
    old: Option<String>,
}

const CT_MAX: &str = "/proc/sys/net/netfilter/nf_conntrack_max";

impl ConntrackMax {
    pub fn raise(lb: &Netns, max: u64) -> Result<Self> {
        let old = std::fs::read_to_string(CT_MAX).context("reading nf_conntrack_max")?;
        let raised = old.trim().parse::<u64>()? < max;
        if raised {
            std::fs::write(CT_MAX, max.to_string()).context("raising the host's nf_conntrack_max")?;
        }
        let guard = Self { old: raised.then_some(old) };
        lb.exec(&["sysctl", "-qw", &format!("net.netfilter.nf_conntrack_max={max}")])?;
        Ok(guard)
    }
}

impl Drop for ConntrackMax {
    fn drop(&mut self) {
        if let Some(old) = &self.old {
            let _ = std::fs::write(CT_MAX, old.trim());
        }
    }
}

/// One measured round of one system.
#[derive(Clone, Debug)]
pub struct Round {
    pub system: System,
    pub sent: Sent,
    /// Frames the sinks counted during the measured send.
    pub forwarded: u64,
    /// Machine-wide softirq time during the send (and a short settling time after it).
    pub softirq_ns: u64,
    /// Machine-wide non-idle time, the other jobs on the machine included.
    pub busy_ns: u64,
    /// `lb`'s global counters after the round (lb only).
    pub lb_counters: Option<serde_json::Value>,
}

impl Round {
    pub fn pps(&self) -> f64 {
        self.forwarded as f64 / self.sent.secs
    }

    /// Softirq CPU time per forwarded frame, ns.
    pub fn cpu_ns(&self) -> f64 {
        self.softirq_ns as f64 / self.forwarded.max(1) as f64
    }
}

/// One round: put `system` in place, establish the case's flows (each sent once), measure
/// `secs` of sending, remove the system.
pub fn round(topo: &LiveTopology, g: &Generator, case: Case, system: System, secs: f64) -> Result<Round> {
    let running = topo.start(system)?;
    if let Flows::Established(n) = case.flows {
        topo.send(g, n as u64)?;
    }
    std::thread::sleep(SETTLE);
    let (sink0, (soft0, busy0)) = (topo.sink_count()?, cpu_times()?);
    let sent = topo.send_for(g, secs)?;
    // Frames still queued between the veths reach the sink within the settling time.
    std::thread::sleep(SETTLE);
    let (sink1, (soft1, busy1)) = (topo.sink_count()?, cpu_times()?);
    Ok(Round {
        system,
        sent,
        forwarded: sink1 - sink0,
        softirq_ns: soft1 - soft0,
        busy_ns: busy1 - busy0,
        lb_counters: running.lb_counters()?,
    })
}

const SETTLE: Duration = Duration::from_millis(200);
