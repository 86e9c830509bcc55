//! Health probes through the data path (`[service.health_check] path = "VIP"`, the default of a
//! VIP service): a probe connects to the VIP and the service's (or the check's) port, and its
//! packets reach one named backend the way that backend's client packets do (IPIP / IP6IP6
//! from the service's outer source, or L2 rewrite to the backend's MAC). The backend answers
//! from the VIP straight to the probe's socket (direct server return). So a backend that does
//! not hold the VIP, cannot decapsulate or is not on the segment fails its check, where a probe
//! of its own address would pass while every client packet is lost.
//!
//! How a packet gets there, without touching the host's own routing:
//! - each probe task owns a *lane*: a socket mark `probe::MARK_BASE | slot` and the entry
//!   `PROBE_TARGETS[mark]` (backend, outer source, device towards the backend);
//! - a policy rule sends marked packets to a routing table of ours whose default route is the
//!   probe device `lb-probe` (one end of a veth pair, ARP off: no neighbour to resolve);
//! - `lb_probe`, a TC egress program on that device, encapsulates (or leaves) the packet, clears
//!   the mark and hands it to the kernel's neighbour layer on the backend's device
//!   (`bpf_redirect_neigh`). It leaves by the egress path: the balancer's XDP program, on
//!   ingress, never chooses for it.
//!
//! The lane lives as long as its probe task, so late packets of a probe (the last ACK, a FIN)
//! still find their backend. The table also holds an unreachable route of the lowest
//! priority: with the device gone, a marked probe fails instead of going to the VIP by the
//! host's routes (where any balancer, this one included, would choose its backend).

use super::iproute::ip;
use super::{neighbours, netlink};
use crate::dataplane::{self, addr_words, take};
use anyhow::{anyhow, Context, Result};
use aya::maps::{HashMap, MapData, PerCpuArray};
use aya::programs::{tc, SchedClassifier, TcAttachType};
use aya::Ebpf;
use lb_common::maps::{probe, GlobalStats, ProbeTarget};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tokio::net::{TcpSocket, TcpStream};

/// The prober's TC object (built by `build.rs`): `lb_probe` and its maps.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_PROBE_OBJ"));

/// The probe device (its veth peer is `lb-probe-peer`).
pub const DEVICE: &str = "lb-probe";
const PEER: &str = "lb-probe-peer";
/// The routing table of marked probes and the priority of the rule that leads to it (before
/// the main table's 32766). "LB" = 0x4c42.
pub const TABLE: u32 = 0x4c42;
const RULE_PRIORITY: u32 = 0x4c42;

/// How a probe reaches its backend, as the service's client packets do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// IPIP / IP6IP6 from this outer source.
    Encap { outer_source: IpAddr },
    /// The packet as it is, to the backend's MAC (L2 DSR).
    L2,
}

/// The probe device, its program and policy route: set up at the first lane, for the
/// daemon's life; torn down when the process ends cleanly.
pub struct ProbePath {
    _ebpf: Ebpf,
    targets: Mutex<HashMap<MapData, u32, ProbeTarget>>,
    stats: PerCpuArray<MapData, GlobalStats>,
    /// Free slots (a stack); a lane takes one and gives it back when it drops.
    free: Mutex<Vec<u32>>,
    /// For route lookups towards backends.
    netlink: Mutex<(OwnedFd, u32)>,
}

/// The one [`ProbePath`] of this process, once set up; or the last failed set-up (when, why).
#[derive(Default)]
enum Shared {
    #[default]
    None,
    Ready(Arc<ProbePath>),
    Failed(Instant, String),
}

static SHARED: OnceLock<Mutex<Shared>> = OnceLock::new();

/// A failed set-up is tried again after this long, not at every lane (a reload starting a
/// thousand probe tasks would run `ip` thousands of times on the event loop).
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// The [`ProbePath`], set up on first use. A failed set-up is reported to every probe that
/// needed it, and tried again once `RETRY_AFTER` has passed.
fn shared() -> Result<Arc<ProbePath>> {
    let mut slot = SHARED.get_or_init(Default::default).lock().map_err(|_| anyhow!("probe path lock poisoned"))?;
    match &*slot {
        Shared::Ready(path) => return Ok(path.clone()),
        Shared::Failed(at, why) if at.elapsed() < RETRY_AFTER => return Err(anyhow!("{why}")),
        _ => {}
    }
    match ProbePath::install() {
        Ok(path) => {
            let path = Arc::new(path);
            *slot = Shared::Ready(path.clone());
            Ok(path)
        }
        Err(e) => {
            let why = format!("{e:#}");
            tracing::error!("{why}");
            *slot = Shared::Failed(Instant::now(), why);
            Err(e)
        }
    }
}

/// Adds the probe program's counters (`probe_sent`, `drop_probe_*`, summed over CPUs) to the
/// balancer's `global` ones, if the probe path is set up (reading them never sets it up).
pub fn add_counters(global: &mut [u64]) {
    let Some(path) = SHARED.get().and_then(|s| match &*s.lock().ok()? {
        Shared::Ready(path) => Some(path.clone()),
        _ => None,
    }) else {
        return;
    };
    match dataplane::global_counters(&path.stats) {
        Ok(ours) => global.iter_mut().zip(ours).for_each(|(sum, v)| *sum += v),
        Err(e) => tracing::warn!("reading the probe program's counters: {e:#}"),
    }
}

/// A clean stop: takes the rule, the table's routes and the device away (the program goes
/// with the device), if this process set them up.
pub fn tear_down() {
    let Some(Ok(mut slot)) = SHARED.get().map(|s| s.lock()) else { return };
    if matches!(std::mem::take(&mut *slot), Shared::Ready(_)) {
        remove_setup();
    }
}

/// `lb unload` with the daemon stopped: removes a probe device, rule and routes that a daemon
/// which did not stop cleanly left. Whether there was a device.
pub fn remove_leftovers() -> bool {
    let present = ip(&["link", "show", "dev", DEVICE]).is_ok();
    if present {
        remove_setup();
    }
    present
}

fn remove_setup() {
    let (table, priority) = (TABLE.to_string(), RULE_PRIORITY.to_string());
    for family in ["-4", "-6"] {
        let _ = ip(&[family, "rule", "del", "priority", &priority]);
        let _ = ip(&[family, "route", "del", "default", "dev", DEVICE, "table", &table]);
        // By name: `ip -6 route flush` leaves unreachable routes.
        let _ = ip(&[family, "route", "del", "unreachable", "default", "table", &table, "metric", "4294967295"]);
    }
    let _ = ip(&["link", "del", "dev", DEVICE]);
}

impl ProbePath {
    fn install() -> Result<Self> {
        let what = "setting up probes through the data path (set `path = \"DIRECT\"` in \
                    [service.health_check] to probe backends at their own address instead)";
        Self::setup().context(what)
    }

    fn setup() -> Result<Self> {
        // A device left by a process that did not end cleanly goes first.
        let _ = ip(&["link", "del", "dev", DEVICE]);
        ip(&["link", "add", DEVICE, "type", "veth", "peer", "name", PEER])?;
        // No IPv6 link-local address either: the device stays quiet (no DAD, RS or MLD).
        for end in [DEVICE, PEER] {
            let _ = ip(&["link", "set", "dev", end, "addrgenmode", "none"]);
        }
        ip(&["link", "set", "dev", DEVICE, "arp", "off", "up"])?;
        ip(&["link", "set", "dev", PEER, "up"])?;
        let mut ebpf = aya::EbpfLoader::new()
            .load(EBPF_OBJECT)
            .context("loading the probe program (root, or CAP_BPF + CAP_NET_ADMIN, is required)")?;
        let program: &mut SchedClassifier = ebpf
            .program_mut("lb_probe")
            .ok_or_else(|| anyhow!("program lb_probe missing from the probe object"))?
            .try_into()?;
        program.load().context("verifying lb_probe")?;
        if program.attach(DEVICE, TcAttachType::Egress).is_err() {
            // Kernels before 6.6 (no TCX): through a clsact qdisc.
            let _ = tc::qdisc_add_clsact(DEVICE);
            program.attach(DEVICE, TcAttachType::Egress).context("attaching lb_probe to lb-probe's egress")?;
        }
        let targets = take(&mut ebpf, "PROBE_TARGETS")?;
        let stats = take(&mut ebpf, "STATS")?;
        let (table, priority, mark) =
            (TABLE.to_string(), RULE_PRIORITY.to_string(), format!("{:#x}/{:#x}", probe::MARK_BASE, probe::MARK_MASK));
        for family in ["-4", "-6"] {
            let routed = || -> Result<()> {
                // Rules left by an earlier run first (deleting one that is not there fails).
                while ip(&[family, "rule", "del", "priority", &priority]).is_ok() {}
                ip(&[family, "rule", "add", "priority", &priority, "fwmark", &mark, "lookup", &table])?;
                ip(&[family, "route", "replace", "default", "dev", DEVICE, "table", &table])?;
                ip(&[family, "route", "replace", "unreachable", "default", "table", &table, "metric", "4294967295"])
            };
            match routed() {
                Ok(()) => {}
                // A host without IPv6 has no IPv6 service to probe: IPv4 goes on.
                Err(e) if family == "-6" => tracing::warn!("IPv6 probes through the data path unavailable: {e:#}"),
                Err(e) => return Err(e),
            }
        }
        let (fd, seq) = (netlink::open(0, 0)?, 0);
        tracing::info!(
            "health probes through the data path: device {DEVICE}, rule fwmark {mark} lookup {table} \
             (priority {priority})"
        );
        Ok(Self {
            _ebpf: ebpf,
            targets: Mutex::new(targets),
            stats,
            free: Mutex::new((0..probe::SLOTS).rev().collect()),
            netlink: Mutex::new((fd, seq)),
        })
    }

    /// The device towards `backend` and the source address the kernel would use for it.
    fn route_to(&self, backend: IpAddr) -> std::io::Result<(u32, Option<IpAddr>)> {
        let mut guard = self.netlink.lock().map_err(|_| std::io::Error::other("netlink lock poisoned"))?;
        guard.1 = guard.1.wrapping_add(1);
        let routes = neighbours::route_get(&guard.0, backend, guard.1)?;
        let route = routes.first().ok_or_else(|| no_route(backend))?;
        let (_, ifindex) = neighbours::next_hop(route, backend).ok_or_else(|| no_route(backend))?;
        Ok((ifindex, neighbours::preferred_source(route)))
    }
}

fn no_route(backend: IpAddr) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::NetworkUnreachable, format!("no route to backend {backend}"))
}

/// One probe task's way to its backend through the data path: a mark and its target entry,
/// for the task's life.
#[derive(Debug)]
pub struct Lane {
    path: Arc<ProbePath>,
    slot: u32,
    vip: IpAddr,
    backend: IpAddr,
    delivery: Delivery,
    /// The entry last written (rewritten when the route to the backend moves).
    written: Mutex<Option<ProbeTarget>>,
}

impl std::fmt::Debug for ProbePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProbePath")
    }
}

impl Lane {
    /// A lane to `backend` of a service at `vip` (the same family), delivered as `delivery`.
    pub fn new(vip: IpAddr, backend: IpAddr, delivery: Delivery) -> Result<Self> {
        if vip.is_ipv4() != backend.is_ipv4() {
            return Err(anyhow!("backend {backend} is not of the VIP {vip}'s family"));
        }
        let path = shared()?;
        let slot = path
            .free
            .lock()
            .map_err(|_| anyhow!("probe slots lock poisoned"))?
            .pop()
            .ok_or_else(|| anyhow!("all {} probe slots are in use", probe::SLOTS))?;
        Ok(Self { path, slot, vip, backend, delivery, written: Mutex::new(None) })
    }

    fn mark(&self) -> u32 {
        probe::MARK_BASE | self.slot
    }

    /// Connects to the VIP at `port` through this lane. Errors are the kernel's (no route to
    /// the backend, refused, unreachable...).
    pub async fn connect(&self, port: u16) -> std::io::Result<TcpStream> {
        let (ifindex, source) = self.path.route_to(self.backend)?;
        self.write(ifindex)?;
        let socket = if self.vip.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        // Closed with a reset, leaving no TIME_WAIT: the bind below takes its port for as long
        // as the socket lives, and every probe of every lane shares the source address, so at
        // 1,000 probes a second 60 s of TIME_WAIT would want 60,000 of the 28,232 ephemeral
        // ports (binds slow down, then fail). A probe is over when it closes: nothing is lost.
        socket.set_zero_linger()?;
        let mark = self.mark();
        // SAFETY: setsockopt reads one u32 of the size given from a live local.
        let rc = unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                &mark as *const u32 as *const libc::c_void,
                std::mem::size_of::<u32>() as u32,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // The source the backend's answer comes back to: the host's address towards it.
        if let Some(source) = source.filter(|s| s.is_ipv4() == self.vip.is_ipv4()) {
            socket.bind(SocketAddr::new(source, 0))?;
        }
        socket.connect(SocketAddr::new(self.vip, port)).await
    }

    /// Writes this lane's target entry if it changed.
    fn write(&self, ifindex: u32) -> std::io::Result<()> {
        let (backend, family) = addr_words(self.backend);
        let (forward, outer_source) = match self.delivery {
            Delivery::Encap { outer_source } => (probe::FORWARD_ENCAP, addr_words(outer_source).0),
            Delivery::L2 => (probe::FORWARD_L2, [0; 4]),
        };
        let target = ProbeTarget { backend, outer_source, ifindex, family, forward, _pad: [0; 2] };
        let mut written = self.written.lock().map_err(|_| std::io::Error::other("lane lock poisoned"))?;
        if *written != Some(target) {
            let mut targets = self.path.targets.lock().map_err(|_| std::io::Error::other("probe map lock poisoned"))?;
            targets.insert(self.mark(), target, 0).map_err(|e| std::io::Error::other(format!("PROBE_TARGETS: {e}")))?;
            *written = Some(target);
        }
        Ok(())
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        if let Ok(mut targets) = self.path.targets.lock() {
            let _ = targets.remove(&self.mark());
        }
        if let Ok(mut free) = self.path.free.lock() {
            free.push(self.slot);
        }
    }
}
