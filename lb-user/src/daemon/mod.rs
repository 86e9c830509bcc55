//! `lb run`: the daemon. Loads (or re-adopts) the pinned data plane, attaches the balancer,
//! and runs one reconcile loop that owns the desired state. Health events, control-API
//! requests and reloads (SIGHUP or `lb reload`) are handled one at a time by that loop, so
//! every table swap starts from a consistent picture.

pub mod announce;
pub mod api;
pub mod control_slots;
pub mod dns;
pub mod dry_run;
mod exported;
pub mod faults;
pub mod health;
pub mod limits;
pub mod links;
pub mod logging;
pub mod metrics;
pub mod neighbours;
mod netlink;
pub mod notify;
pub mod reload;
pub mod reply;
pub mod run_dir;
pub mod state;
pub mod trace;
pub mod tunnel_source;
pub mod views;

use crate::config::Config;
use crate::controller::{CompileOutput, Controller, PersistentState};
use crate::dataplane::pinning::{self, PinState};
use crate::dataplane::{self, Dataplane, DataplaneSizes, Program};
use announce::Announcer;
use anyhow::{bail, Context, Result};
use api::{HealthOverride, Proto, Request, Response};
use health::HealthEvent;
use reply::{
    BackendChange, BackendStatus, ClassStats, ClassView, Counters, LinkStatus, Reply, ServiceStats, ServiceStatus,
    ZoneView,
};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

#[derive(Clone, Debug, clap::Args)]
pub struct RunArgs {
    /// Configuration file.
    #[arg(long)]
    pub config: PathBuf,
    /// Interface to attach the balancer to (repeatable).
    #[arg(long = "interface")]
    pub interfaces: Vec<String>,
    /// Control socket.
    #[arg(long, default_value = api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// bpffs directory for the pinned maps and links.
    #[arg(long, default_value = pinning::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// On exit, leave the program attached and the maps pinned (for restarts and upgrades).
    #[arg(long)]
    pub keep_dataplane: bool,
}

/// Data-plane sizes for a configuration. Roomy powers of two, so that ordinary reloads fit and
/// a restart with a similar configuration can adopt the pinned maps.
pub fn sizes_for(cfg: &Config) -> DataplaneSizes {
    let services = cfg.services.len() as u32;
    let backends: u32 = cfg.services.iter().map(|s| s.backends.len() as u32).sum();
    let classes = crate::compile::classes_per_service(cfg);
    let classes_per_service = classes.max(8).next_power_of_two();
    // The service table holds 16 keys (ports) per service id and CLIENT_CLASS 16 prefixes per
    // (service, class): more ids than services when the configuration has more ports or
    // prefixes than that. (Only then: a configuration that fits keeps the sizes, so a restart
    // after an upgrade still adopts its pinned maps. A reload beyond the room is refused by
    // the data plane's admission check, asking for a restart.)
    let (keys, prefixes) = crate::compile::installed_counts(cfg);
    let mut max_services = (services * 2).max(16).next_power_of_two();
    while (max_services as u64 * 16) < keys as u64
        || (max_services as u64 * classes_per_service as u64 * 16) < prefixes as u64
    {
        max_services *= 2;
    }
    // Active tables plus a standby slot each, and some room for a reload that adds tables.
    // Each slot costs 8 * M bytes of kernel memory (array slots are 8 bytes wide).
    let table_slots = (2 * services * classes + 16).max(32).next_power_of_two();
    DataplaneSizes {
        table_size_m: cfg.dataplane.maglev_table_size,
        conntrack_entries: cfg.dataplane.conntrack_entries,
        max_services,
        classes_per_service,
        max_backends: (backends * 2).max(256).next_power_of_two(),
        table_slots,
    }
}

/// The most kernel memory the maps of one data plane may take together. The connection tables
/// at their largest (`dataplane.conntrack_entries` is capped at validation) fit with room for
/// the rest; beyond it the load would fail with ENOMEM, or take the host's memory.
pub const MAP_MEMORY_LIMIT_MIB: u64 = 4096;

/// The configuration settings that drive a map's size, for the message that refuses sizes
/// beyond [`MAP_MEMORY_LIMIT_MIB`].
fn driven_by(map: &str) -> &'static str {
    match map {
        "CONNTRACK" | "CONNTRACK4" => "dataplane.conntrack_entries",
        "TABLES" => "dataplane.maglev_table_size × (services × client classes)",
        "CLASS_STATS" | "TABLE_INDEX" | "CLIENT_CLASS" => {
            "services × client classes (zones, Traffic Manager classes, ports, prefixes)"
        }
        "BACKENDS" | "NEXT_HOPS" => "the number of backends",
        _ => "the number of services and ports",
    }
}

/// Refuses sizes whose maps would take more than [`MAP_MEMORY_LIMIT_MIB`] of kernel memory,
/// naming the largest maps and the settings behind them.
pub fn check_map_memory(sizes: &DataplaneSizes) -> Result<()> {
    let mut maps = sizes.map_bytes();
    let total: u64 = maps.iter().map(|(_, b)| b).sum();
    if total >> 20 <= MAP_MEMORY_LIMIT_MIB {
        return Ok(());
    }
    maps.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
    let largest: Vec<String> =
        maps.iter().take(3).map(|(name, b)| format!("{name} {} MiB ({})", b >> 20, driven_by(name))).collect();
    bail!(
        "this configuration needs {} MiB of BPF maps, above the limit of {MAP_MEMORY_LIMIT_MIB} MiB; the largest: {}",
        total >> 20,
        largest.join(", ")
    )
}

/// Whether a reloaded configuration `cfg` can replace the running one (`running`, on a data
/// plane loaded with `now`); otherwise the reload is refused (the running tables stay) and the
/// message says a restart is needed.
fn fits(now: &DataplaneSizes, running: &Config, cfg: &Config) -> Result<()> {
    let want = sizes_for(cfg);
    if want.table_size_m != now.table_size_m || want.conntrack_entries != now.conntrack_entries {
        bail!("dataplane.maglev_table_size and dataplane.conntrack_entries take effect only on restart");
    }
    // The DNS front's sockets are bound at start.
    if cfg.dns != running.dns {
        let show = |d: &Option<crate::config::DnsFront>| d.as_ref().map_or("none".to_owned(), |d| d.listen.to_string());
        bail!(
            "[dns] listen takes effect only on restart (running: {}, in the file: {})",
            show(&running.dns),
            show(&cfg.dns)
        );
    }
    if cfg.metrics != running.metrics {
        let show = |m: &Option<crate::config::Metrics>| m.as_ref().map_or("none".to_owned(), |m| m.listen.to_string());
        bail!(
            "[metrics] listen takes effect only on restart (running: {}, in the file: {})",
            show(&running.metrics),
            show(&cfg.metrics)
        );
    }
    // The TUN device and its table are made at start.
    let where_ = |c: &Config| c.announce.as_ref().map(|a| (a.table, a.device.clone()));
    if where_(cfg) != where_(running) {
        bail!("[announce] (present or not, table, device) takes effect only on restart");
    }
    let services = cfg.services.len() as u32;
    let classes = crate::compile::classes_per_service(cfg);
    let backends: u32 = cfg.services.iter().map(|s| s.backends.len() as u32).sum();
    if services > now.max_services
        || classes > now.classes_per_service
        || backends * 2 > now.max_backends
        || 2 * services * classes > now.table_slots
    {
        bail!(
            "the new configuration needs a larger data plane than was loaded at start; restart the daemon to apply it"
        );
    }
    Ok(())
}

/// bpf_fib_lookup, which finds the IPIP next hop, fails (FWD_DISABLED) on an interface without
/// forwarding; the drops would show only as `drop_fib` in `lb stats`, so say it up front.
/// (L2_DSR then sends every frame back out of the ingress device, whatever the route.)
fn warn_if_forwarding_disabled(ifname: &str) {
    for (family, path) in [
        ("ipv4", format!("/proc/sys/net/ipv4/conf/{ifname}/forwarding")),
        ("ipv6", format!("/proc/sys/net/ipv6/conf/{ifname}/forwarding")),
    ] {
        if std::fs::read_to_string(&path).map(|v| v.trim() == "0").unwrap_or(false) {
            tracing::warn!("{family} forwarding is off on {ifname}; IPIP forwarding needs it for the next-hop lookup, and L2_DSR to reach backends routed via another device (sysctl -w net.{family}.conf.{ifname}.forwarding=1)");
        }
    }
}

/// A zonal service's eligible set per client zone.
fn zone_views(cfg: &Config, c: &crate::compile::CompiledService) -> Vec<ZoneView> {
    c.plan
        .classes
        .iter()
        .map(|cp| ZoneView {
            client_zone: cp.client_zone.map(|z| cfg.zones[z].name.clone()),
            affinity: cp.outcome.as_str().to_owned(),
            eligible: cp.eligible.iter().map(|&i| c.backend_addrs[i]).collect(),
        })
        .collect()
}

/// A Traffic Manager service's client classes (None for a zonal service).
fn class_views(c: &crate::compile::CompiledService) -> Option<Vec<ClassView>> {
    let tm = c.tm.as_ref()?;
    let view = |cl: &crate::policy::tm::classes::TmClass| ClassView {
        class: cl.id,
        client_prefixes: tm.prefixes.iter().filter(|(_, c)| *c == cl.id).map(|(n, _)| *n).collect(),
        eligible: cl.eligible.iter().map(|e| e.address).collect(),
        reason: cl.reason.clone(),
    };
    Some(tm.classes.iter().map(view).collect())
}

struct Daemon {
    args: RunArgs,
    ctl: Controller,
    dp: Dataplane,
    /// The probe tasks running, with what each one probes and its number.
    checkers: Vec<(health::Probe, JoinHandle<()>, u64)>,
    /// The number the next probe task gets.
    next_probe: u64,
    /// The last error of the tick's reconcile (logged once).
    tick_error: Option<String>,
    events: mpsc::Sender<HealthEvent>,
    /// The DNS front's view, republished after every reconcile (`[dns]`, see `dns`).
    dns_view: crate::daemon::dns::ViewSender,
    /// Event counters of the metrics endpoint (counted also without `[metrics]`).
    metrics: metrics::Metrics,
    /// Held while running: one daemon per pin directory (`pinning::lock_pin_dir`).
    lock: Option<std::fs::File>,
    /// `[announce]`: the VIP routes the routing daemon exports.
    announcer: Option<Announcer>,
    /// A host drain (`lb backend drain --host`): when the daemon stops.
    drain_deadline: Option<tokio::time::Instant>,
    /// The backends whose next hops `neighbours` keeps resolved.
    neighbours: neighbours::Keeper,
    /// Interfaces known to be gone (logged once), until they return and are attached again.
    detached: BTreeSet<String>,
    /// While `lb trace` runs: when the daemon attaches `lb` again by itself.
    trace_until: Option<std::time::Instant>,
    /// Pins found missing from the pin directory (logged once), see [`Daemon::check_pins`].
    pins_lost: Vec<String>,
    /// The MAC changes of the interfaces, followed into `LOCAL_MACS`.
    macs: links::MacFollower,
    /// Interfaces a previous daemon was attached to that this one is not: detached at start.
    unlisted: Vec<LinkStatus>,
    /// Compiles for health changes run off the loop ([`Daemon::reconcile_soon`]): the number
    /// of the state they started from (bumped by every reconcile on the loop, which makes a
    /// running compile's result stale), whether one runs, and whether another change came in
    /// since it started.
    epoch: u64,
    compiling: bool,
    again: bool,
    compiled: mpsc::UnboundedSender<(u64, CompileOutput)>,
    /// Reloads waiting for their read of the configuration file, off the loop (`reload`).
    reloads: reload::Reloads,
}

fn state_path(args: &RunArgs) -> PathBuf {
    state::path_for(&args.socket)
}

/// Logs the settings of `cfg` that have no effect (`config::notices`), as the file has them
/// (before defaults are filled in).
fn warn_notices(path: &Path, cfg: &Config) {
    for n in cfg.notices() {
        tracing::warn!("{}: {n}", path.display());
    }
}

pub async fn run(args: RunArgs) -> Result<()> {
    // Read off the loop as a reload's is: a FIFO or a hung mount fails the start, not hangs it.
    let text = reload::read_once(&args.config).await;
    let mut cfg = reload::parse(&args.config, &text)?;
    warn_notices(&args.config, &cfg);
    for line in tunnel_source::fill_defaults(&mut cfg, &args.interfaces, tunnel_source::primary_address)? {
        tracing::info!("{line}");
    }
    // Signals first: a SIGINT or SIGTERM during start-up waits for the loop below, which
    // shuts down cleanly, instead of killing the process half set up.
    let hup = signal(SignalKind::hangup())?;
    let term = signal(SignalKind::terminate())?;
    let int = signal(SignalKind::interrupt())?;
    // A socket directory others can write (where the state file goes), another daemon on this
    // socket, or on this pin directory: refused before anything of its data plane is touched.
    state::check_dir(args.socket.parent().unwrap_or(Path::new("/run/lb")))?;
    let listener = api::bind(&args.socket)?;
    // Pins that must outlive this process must not go into a bpffs only it sees.
    let shared = |()| {
        if args.keep_dataplane {
            pinning::require_shared_bpffs(&args.pin_dir, "lb run --keep-dataplane")
        } else {
            Ok(())
        }
    };
    let lock = match pinning::ensure_pin_dir(&args.pin_dir)
        .and_then(shared)
        .and_then(|()| pinning::lock_pin_dir(&args.pin_dir))
    {
        Ok(lock) => lock,
        Err(e) => {
            let _ = std::fs::remove_file(&args.socket);
            return Err(e);
        }
    };
    let (mut d, (_tasks, health_rx, snapshot_rx, compiled_rx, reload_rx)) = match start(args.clone(), cfg).await {
        Ok(started) => started,
        Err((e, found)) => {
            let _ = std::fs::remove_file(&args.socket);
            // What this start made goes (still under the lock); what it found stays: an adopted
            // data plane keeps running, and so does the program of a discarded one, still
            // attached through its pinned link.
            match found {
                Found::Nothing => {
                    for ifname in &args.interfaces {
                        let _ = dataplane::detach_pinned(&pinning::link_pin(&args.pin_dir, ifname));
                    }
                    let _ = pinning::remove_map_pins(&args.pin_dir);
                    let _ = std::fs::remove_dir(&args.pin_dir);
                }
                Found::Discarded => {
                    let _ = pinning::remove_map_pins(&args.pin_dir);
                }
                Found::Adopted | Found::Unknown => {}
            }
            drop(lock);
            return Err(e);
        }
    };
    d.lock = Some(lock);
    serve(d, listener, (health_rx, snapshot_rx, compiled_rx, reload_rx), (hup, term, int)).await
}

/// What a start found in the pin directory: what its clean-up after a failure may remove.
#[derive(Clone, Copy)]
enum Found {
    /// No pins: everything there is this start's.
    Nothing,
    /// Pins of other sizes or layout, whose maps it unpinned; its own map pins are its.
    Discarded,
    /// A data plane it adopted: left as it is.
    Adopted,
    /// Failed before it knew: nothing is removed.
    Unknown,
}

/// What [`start`] hands the loop besides the daemon: the DNS and metrics tasks, and the
/// receivers of health events, metrics scrapes and finished compiles.
type Started = (
    Vec<JoinHandle<()>>,
    mpsc::Receiver<HealthEvent>,
    mpsc::Receiver<metrics::SnapshotRequest>,
    mpsc::UnboundedReceiver<(u64, CompileOutput)>,
    mpsc::UnboundedReceiver<reload::ConfigRead>,
);

/// Loads (or adopts) the data plane, writes the tables, attaches and starts the DNS front and
/// the metrics endpoint. On error also says whether it had adopted a pinned data plane (which
/// is then left running).
async fn start(args: RunArgs, cfg: Config) -> std::result::Result<(Daemon, Started), (anyhow::Error, Found)> {
    // More descriptors for probes and the DNS front, whose TCP share leaves a reserve.
    let nofile = match limits::raise_nofile() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("cannot raise RLIMIT_NOFILE: {e}");
            1024
        }
    };
    let sizes = sizes_for(&cfg);
    check_map_memory(&sizes).map_err(|e| (e, Found::Unknown))?;
    let mut ctl = Controller::new(cfg);
    let reuse = pinning::prepare_reuse(&args.pin_dir, &sizes).map_err(|e| (e, Found::Unknown))?;
    let found = match reuse {
        PinState::Fresh => Found::Nothing,
        PinState::Reused => Found::Adopted,
        PinState::Discarded { .. } => Found::Discarded,
    };
    let fail = |e: anyhow::Error| (e, found);
    // What the discarded maps had that the new ones take over: the connection tables, and the
    // backend records their entries point at (ids and generations come from the state file).
    let mut carried = None;
    match reuse {
        PinState::Fresh => {}
        PinState::Reused => {
            tracing::info!("adopting the pinned data plane in {} (connections are kept)", args.pin_dir.display());
            restore_state(&args, &mut ctl).map_err(fail)?;
        }
        PinState::Discarded { why, carried: None } => {
            tracing::warn!(
                "the pinned data plane has other sizes or layout ({why}); starting fresh, tracked connections are lost"
            );
        }
        PinState::Discarded { why, carried: Some(old) } => {
            tracing::warn!("the pinned data plane has other sizes or layout ({why}); loading new maps, tracked connections are carried over");
            restore_state(&args, &mut ctl).map_err(fail)?;
            carried = Some(old);
        }
    }
    let mut dp = Dataplane::load_with(sizes, Some(&args.pin_dir)).map_err(fail)?;
    // An older version's maps: the program that still uses them keeps them alive until it is
    // replaced below; the pins themselves would only leak.
    pinning::remove_legacy_pins(&args.pin_dir).map_err(fail)?;
    if let Some(old) = &carried {
        dp.carry_backends(old).context("copying the backend records of the discarded maps").map_err(fail)?;
    }
    // Maps taken over (adopted, or the connection tables carried into new ones) hold flows
    // of the previous daemon's backend ids: the ids are restored, and those the configuration
    // dropped drain.
    let adopted_at = if matches!(found, Found::Adopted) || carried.is_some() {
        // What the predecessor's configuration had and this one does not: removed first, so
        // that it neither stays live nor takes room the new tables need.
        let now = dp.now_ns().map_err(fail)?;
        ctl.depart_unconfigured(now);
        let next = ctl.preview(now).map_err(fail)?;
        let (keys, prefixes, tables) = dp
            .sweep_unowned(&next.demand(None))
            .context("removing what the previous configuration left")
            .map_err(fail)?;
        if keys + prefixes + tables > 0 {
            tracing::info!("removed what the previous configuration left: {keys} service keys, {prefixes} client prefixes, {tables} tables");
        }
        Some(now)
    } else {
        None
    };
    // Tables first, then attach: the first packet already finds them.
    let initial = ctl.reconcile(&mut dp).context("writing the initial tables").map_err(fail)?;
    if let Some(now) = adopted_at {
        let applied = ctl.applied().expect("written just above");
        let backends = dp
            .depart_unused_backends(&applied.demand(None), now, &|id| ctl.drain_ns_of(id))
            .context("flagging backends the configuration dropped")
            .map_err(fail)?;
        if backends > 0 {
            tracing::info!("{backends} backends the configuration no longer has are draining");
        }
    }
    // Last before the program is swapped: the old one adds flows until then.
    if let Some(old) = carried {
        let (copied, lost) =
            dp.carry_conntrack(&old).context("copying the connection tables into the new maps").map_err(fail)?;
        let lost = if lost > 0 { format!(" ({lost} did not fit and are lost)") } else { String::new() };
        tracing::info!("{copied} tracked connections carried over into the new connection tables{lost}");
    }
    for ifname in &args.interfaces {
        warn_if_forwarding_disabled(ifname);
        let how = dp.attach_pinned(ifname, Program::Lb, &pinning::link_pin(&args.pin_dir, ifname)).map_err(fail)?;
        match how.mode() {
            Some(aya::programs::XdpMode::Skb) => tracing::warn!("{ifname}: {how}"),
            _ => tracing::info!("{ifname}: {how}"),
        }
    }
    // Only once this start's interfaces are attached: until then a failed start leaves the
    // adopted data plane as it found it.
    let unlisted = links::detach_unlisted(&args.pin_dir, &args.interfaces);
    let (health_events, health_rx) = mpsc::channel(1024);
    let (compiled, compiled_rx) = mpsc::unbounded_channel();
    let (dns_view, dns_rx) =
        tokio::sync::watch::channel(std::sync::Arc::new(crate::daemon::dns::RoutingView::of(&ctl)));
    let counts = metrics::Metrics::default();
    counts.tables_swapped(initial.tables_written);
    // The listen addresses are read at start only (a reload that changes `[dns]` or `[metrics]`
    // is refused).
    let mut tasks = match ctl.config().dns.clone() {
        Some(front) => {
            let limits = dns::TcpLimits {
                total: limits::dns_tcp_budget(nofile, health::probes_for(ctl.config()).len()),
                per_source: limits::DNS_TCP_PER_SOURCE,
            };
            let (addr, tasks) = crate::daemon::dns::serve(front.listen, dns_rx, limits, counts.clone())
                .await
                .with_context(|| format!("[dns] listen = {}", front.listen))
                .map_err(fail)?;
            tracing::info!(
                "DNS front on {addr} (UDP and TCP, at most {} TCP connections, {} per source)",
                limits.total,
                limits.per_source
            );
            tasks
        }
        None => Vec::new(),
    };
    // Without `[metrics]` the sender goes: the loop's scrape branch then never fires.
    let (snapshots, snapshot_rx) = mpsc::channel(4);
    if let Some(m) = ctl.config().metrics.clone() {
        let (addr, task) = metrics::serve(m.listen, counts.clone(), snapshots)
            .await
            .with_context(|| format!("[metrics] listen = {}", m.listen))
            .map_err(fail)?;
        tracing::info!("metrics on http://{addr}/metrics");
        tasks.push(task);
    }
    // Attached and tables written: from here on the VIPs may be announced.
    let announcer = ctl.config().announce.as_ref().map(Announcer::open).transpose().map_err(fail)?;
    let (reloads, reload_rx) = reload::Reloads::new(&args.config);
    let mut d = Daemon {
        args,
        ctl,
        dp,
        checkers: Vec::new(),
        next_probe: 0,
        tick_error: None,
        trace_until: None,
        events: health_events,
        dns_view,
        metrics: counts,
        lock: None,
        announcer,
        drain_deadline: None,
        neighbours: neighbours::spawn(),
        detached: BTreeSet::new(),
        pins_lost: Vec::new(),
        macs: links::MacFollower::default(),
        unlisted,
        epoch: 0,
        compiling: false,
        again: false,
        compiled,
        reloads,
    };
    d.announce();
    d.keep_neighbours();
    d.save_state();
    d.start_checkers();
    Ok((d, (tasks, health_rx, snapshot_rx, compiled_rx, reload_rx)))
}

/// Resumes from the previous daemon's state file (ids, generations, health, overrides,
/// drains), when there is one. One it cannot read (truncated, wrong shape) is moved aside and
/// the daemon starts with fresh state: refusing to start would leave the adopted program
/// forwarding with frozen health.
fn restore_state(args: &RunArgs, ctl: &mut Controller) -> Result<()> {
    let path = state_path(args);
    if let Ok(text) = std::fs::read_to_string(&path) {
        match serde_json::from_str::<PersistentState>(&text) {
            Ok(st) => ctl.restore(&st),
            Err(e) => {
                faults::count(faults::Fault::StateQuarantined);
                let aside = match state::quarantine(&path) {
                    Ok(aside) => format!("moved it to {}", aside.display()),
                    Err(q) => format!("{q:#}; the next save replaces it"),
                };
                tracing::error!(
                    "cannot read the previous daemon's state {} ({e}); {aside}; starting with fresh state (health, overrides and drains are not carried over)",
                    path.display()
                );
            }
        }
    }
    Ok(())
}

/// The audit line of an operator action: `reload accepted (SIGHUP)`, `drain refused (service
/// web backend 198.18.11.1): no backend ...`.
fn audit<T>(verb: &str, what: &str, result: &Result<T>) {
    match result {
        Ok(_) => tracing::info!(target: "audit", "{verb} accepted ({what})"),
        Err(e) => tracing::warn!(target: "audit", "{verb} refused ({what}): {e:#}"),
    }
}

type Signals = (tokio::signal::unix::Signal, tokio::signal::unix::Signal, tokio::signal::unix::Signal);
type Events = (
    mpsc::Receiver<HealthEvent>,
    mpsc::Receiver<metrics::SnapshotRequest>,
    mpsc::UnboundedReceiver<(u64, CompileOutput)>,
    mpsc::UnboundedReceiver<reload::ConfigRead>,
);

/// The daemon's loop: health events, control requests and signals, until SIGTERM or SIGINT.
async fn serve(mut d: Daemon, listener: tokio::net::UnixListener, events: Events, signals: Signals) -> Result<()> {
    let (mut hup, mut term, mut int) = signals;
    let (mut health_rx, mut snapshot_rx, mut compiled_rx, mut reload_rx) = events;
    // Deadlines the data plane does not keep itself (the end of a pool-change drain) are
    // checked this often: within seconds of ten minutes is close enough.
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Connections are served by tasks of their own (`api::spawn_server`); only well-formed
    // requests reach this loop.
    let (requests, mut request_rx) = mpsc::channel(api::MAX_CONNECTIONS);
    let mut control = api::spawn_server(listener, requests.clone());
    // Interfaces that go and come back; without the watcher the tick still notices.
    let (mut link_rx, link_task) = match links::watch() {
        Ok((rx, task)) => (rx, Some(task)),
        Err(e) => {
            tracing::warn!("cannot watch interface events ({e:#}); interfaces are checked every few seconds instead");
            (mpsc::channel(1).1, None)
        }
    };
    tracing::info!("running; control socket {}", d.args.socket.display());
    // `start` has written the tables and attached: only now is the unit started.
    tracing::info!("ready: notifying the service manager");
    notify::ready(&d.summary());
    // Pinged from this loop, so that a loop that stops turning gets the daemon restarted.
    let mut watchdog = notify::watchdog_interval().map(tokio::time::interval);
    loop {
        tokio::select! {
            Some(ev) = health_rx.recv() => d.on_health(ev),
            Some((epoch, out)) = compiled_rx.recv() => d.on_compiled(epoch, out),
            Some(ev) = link_rx.recv() => d.on_link(ev),
            Some(reply) = snapshot_rx.recv() => {
                let snap = metrics::snapshot(&d.ctl, &d.dp).map(|s| s.with_status(&d.status()));
                let _ = reply.send(snap.map_err(|e| format!("{e:#}")));
            }
            _ = tick.tick() => {
                d.on_tick();
                d.check_links();
                d.check_pins();
                d.check_trace();
                if let Some(listener) = run_dir::recreate_if_gone(&d.args.socket) {
                    control.abort();
                    control = api::spawn_server(listener, requests.clone());
                    d.save_state();
                }
            }
            Some(pending) = request_rx.recv() => {
                if matches!(pending.request, Request::Reload | Request::ReloadDryRun) {
                    d.reloads.request(reload::Origin::Request(pending));
                } else {
                    let resp = d.handle(pending.request, None);
                    let _ = pending.reply.send(resp);
                }
            }
            _ = hup.recv() => {
                notify::reloading();
                d.reloads.request(reload::Origin::Signal);
            }
            Some(read) = reload_rx.recv() => d.on_config_read(&read),
            _ = async { if let Some(w) = watchdog.as_mut() { w.tick().await } else { std::future::pending().await } } => notify::watchdog(),
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = until(d.drain_deadline) => {
                tracing::info!("host drain: grace period over, stopping");
                break;
            }
        }
    }
    notify::stopping();
    control.abort();
    if let Some(task) = link_task {
        task.abort();
    }
    d.shutdown()
}

/// Sleeps until `deadline`, or forever without one.
async fn until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

impl Daemon {
    /// Brings the announced VIPs in line with what can be served now (a failure is retried at
    /// the next reconcile or tick).
    fn announce(&mut self) {
        let Some(a) = self.announcer.as_mut() else { return };
        let cfg = self.ctl.config();
        let applied: Vec<&str> =
            self.ctl.applied().map(|c| c.services.iter().map(|s| s.name.as_str()).collect()).unwrap_or_default();
        let require = cfg.announce.as_ref().is_some_and(|x| x.require_healthy_backend);
        let ctl = &self.ctl;
        let usable = |s: &str, b| ctl.healthy(s, b) && !ctl.is_drained(s, b);
        let want = announce::servable_vips(cfg, &applied, require, &usable, &|s, b| ctl.unchecked(s, b));
        if let Err(e) = a.set(&want) {
            tracing::warn!("announce: {e:#} (retried)");
        }
    }

    /// `lb backend drain --host`: withdraw every VIP now, keep forwarding what still arrives
    /// for the grace period, then stop as on SIGTERM.
    fn host_drain(&mut self, grace_sec: Option<u32>) -> Result<reply::HostDrain> {
        let grace = grace_sec
            .or(self.ctl.config().announce.as_ref().map(|a| a.drain_grace_sec))
            .unwrap_or(crate::config::DEFAULT_DRAIN_GRACE_SEC);
        if let Some(a) = self.announcer.as_mut() {
            a.drain()?;
        }
        let at = tokio::time::Instant::now() + std::time::Duration::from_secs(grace.into());
        self.drain_deadline = Some(self.drain_deadline.map_or(at, |d| d.min(at)));
        tracing::info!("host drain: VIPs withdrawn, stopping in {grace} s");
        Ok(reply::HostDrain { host_draining: true, stop_in_sec: grace })
    }

    /// Reconciles now, on the loop (operator actions, reloads, ends of pool drains: their
    /// answer says how it went). A compile still running off the loop is stale after it.
    fn reconcile(&mut self) -> Result<()> {
        self.supersede_compile();
        let result = self.ctl.reconcile(&mut self.dp);
        self.after_reconcile(result.as_ref().ok());
        result.map(|_| ())
    }

    /// A reconcile on the loop covers every change so far: a compile running off the loop is
    /// discarded when it ends, and none needs to follow it.
    fn supersede_compile(&mut self) {
        self.epoch += 1;
        self.again = false;
    }

    /// Reconciles for a health change with the compile (policy, Maglev tables) off the loop,
    /// so that health events, control requests and signals are served meanwhile. One compile
    /// runs at a time, in order: changes that come in while it runs are taken by one more
    /// compile after it (a newer one supersedes the pending ones).
    fn reconcile_soon(&mut self) {
        if self.compiling {
            self.again = true;
            return;
        }
        let now = match self.dp.now_ns() {
            Ok(now) => now,
            Err(e) => {
                tracing::error!("error applying a health change: {e:#}");
                return;
            }
        };
        let job = self.ctl.begin_compile(now);
        let (epoch, done) = (self.epoch, self.compiled.clone());
        self.compiling = true;
        tokio::task::spawn_blocking(move || {
            let _ = done.send((epoch, job.run()));
        });
    }

    /// A compile off the loop ended: written unless a reconcile on the loop came since; then
    /// the next one starts if changes came in meanwhile.
    fn on_compiled(&mut self, epoch: u64, out: CompileOutput) {
        self.compiling = false;
        if epoch == self.epoch {
            let result = self.ctl.finish_compile(out, &mut self.dp);
            self.after_reconcile(result.as_ref().ok());
            if let Err(e) = result {
                tracing::error!("error applying a health change: {e:#}");
            }
        }
        if std::mem::take(&mut self.again) {
            self.reconcile_soon();
        }
    }

    /// Republishes the DNS view, logs what was written and saves the state.
    fn after_reconcile(&mut self, report: Option<&crate::controller::ReconcileReport>) {
        self.dns_view.send_replace(std::sync::Arc::new(crate::daemon::dns::RoutingView::of(&self.ctl)));
        if let Some(report) = report {
            self.metrics.tables_swapped(report.tables_written);
        }
        self.announce();
        self.keep_neighbours();
        if let Some(report) = report.filter(|r| **r != Default::default()) {
            tracing::info!(
                "tables updated: {} backend records, {} tables, {} services, {} removed, {} departed",
                report.backends_written,
                report.tables_written,
                report.services_written,
                report.services_removed,
                report.backends_departed
            );
        }
        self.save_state();
    }

    /// Hands the configured backends to the neighbour keeper (see `neighbours`).
    fn keep_neighbours(&self) {
        let backends = self.ctl.config().services.iter().flat_map(|s| s.backends.iter().map(|b| b.address)).collect();
        self.neighbours.keep(backends);
    }

    fn save_state(&self) {
        if let Err(e) = self.try_save_state() {
            faults::count(faults::Fault::StateSaveFailed);
            tracing::error!("{e:#}; a restart now would lose the changes since the last save");
        }
    }

    fn try_save_state(&self) -> Result<()> {
        let path = state_path(&self.args);
        let text = serde_json::to_string(&self.ctl.persistent_state())?;
        state::save(&path, &text).with_context(|| format!("cannot save state to {}", path.display()))
    }

    /// Saves the state after an operator's change to the controller; when it cannot be saved,
    /// `undo` puts the change back and the action is refused: an accepted action must survive
    /// a restart.
    fn make_durable(&mut self, undo: impl FnOnce(&mut Controller) -> Result<()>) -> Result<()> {
        if let Err(e) = self.try_save_state() {
            faults::count(faults::Fault::StateSaveFailed);
            if let Err(u) = undo(&mut self.ctl) {
                tracing::error!("cannot take back an operator change that was not saved: {u:#}");
            }
            return Err(e.context("not applied: the change could not be made durable (a restart would lose it)"));
        }
        Ok(())
    }
    /// Runs the probes the configuration asks for: one that runs already with the same target
    /// and settings keeps running (a reload does not reset its streak of results); the others
    /// stop, and new ones start from the last verdict known.
    fn start_checkers(&mut self) {
        let wanted = health::probes_for(self.ctl.config());
        let mut running = std::mem::take(&mut self.checkers);
        running.retain(|(probe, task, _)| {
            let keep = !task.is_finished() && wanted.iter().any(|w| w.same_as(probe));
            if !keep {
                task.abort();
            }
            keep
        });
        for probe in wanted {
            if !running.iter().any(|(p, _, _)| p.same_as(&probe)) {
                let (service, backend) = probe.target();
                let id = self.next_probe;
                self.next_probe += 1;
                let task = probe.spawn(self.ctl.checker_verdict(service, backend), &self.events, id);
                running.push((probe, task, id));
            }
        }
        self.checkers = running;
    }

    /// A pool-change drain that has ended is written to the data plane. A failure is retried
    /// at every tick but logged once per distinct error.
    fn on_tick(&mut self) {
        self.announce();
        let Some(end) = self.ctl.next_pool_drain_end() else {
            self.tick_error = None;
            return;
        };
        if self.dp.now_ns().is_ok_and(|now| now >= end) {
            match self.reconcile() {
                Ok(()) => self.tick_error = None,
                Err(e) => {
                    let text = format!("{e:#}");
                    if self.tick_error.as_deref() != Some(text.as_str()) {
                        tracing::error!("error ending a pool-change drain (retried every few seconds): {text}");
                        self.tick_error = Some(text);
                    }
                }
            }
        }
    }

    /// An interface event: one of ours removed is logged (once) and shows as detached in
    /// `lb status`; when an interface of that name exists again, the balancer is attached to it.
    fn on_link(&mut self, ev: links::LinkEvent) {
        match ev {
            links::LinkEvent::Removed { ifname, .. } if self.args.interfaces.contains(&ifname) => {
                self.note_removed(&ifname)
            }
            links::LinkEvent::Present { ifname, .. } if self.args.interfaces.contains(&ifname) => {
                self.attach_again(&ifname);
                self.follow_mac(&ifname);
            }
            links::LinkEvent::Overrun => self.check_links(),
            _ => {}
        }
    }

    fn note_removed(&mut self, ifname: &str) {
        if self.detached.insert(ifname.to_owned()) {
            tracing::warn!("interface {ifname} was removed: the balancer is detached from it until an interface of that name returns");
        }
    }

    /// Attaches to `ifname` again if its link was severed (a new link replaces the pinned one).
    fn attach_again(&mut self, ifname: &str) {
        if self.dp.link_attached(ifname) {
            self.detached.remove(ifname);
            return;
        }
        match self.dp.attach_pinned(ifname, Program::Lb, &pinning::link_pin(&self.args.pin_dir, ifname)) {
            Ok(how) => {
                self.detached.remove(ifname);
                tracing::info!("interface {ifname} is back: {how}");
            }
            // Gone again by now: a link going away is first reported changed (down), then
            // removed; that is no failed return.
            Err(_) if !links::exists(ifname) => self.note_removed(ifname),
            Err(e) => tracing::error!("interface {ifname} is back, but attaching to it failed (retried at its next change and every few seconds): {e:#}"),
        }
    }

    /// Every interface's link, looked at again (after lost events, and at every tick).
    fn check_links(&mut self) {
        for ifname in self.args.interfaces.clone() {
            if self.dp.link_attached(&ifname) {
                self.follow_mac(&ifname);
                continue;
            }
            if links::exists(&ifname) {
                self.attach_again(&ifname);
            } else {
                self.note_removed(&ifname);
            }
        }
    }

    /// Registers `ifname`'s MAC again if it changed (a change event, and every tick).
    fn follow_mac(&mut self, ifname: &str) {
        if links::exists(ifname) {
            let outcome = self.dp.follow_mac(ifname);
            // A new MAC makes the kernel drop the interface's neighbour entries: the next hops
            // to the backends are resolved again at once, not at the keeper's next round (up
            // to 10 s of drop_no_neigh, long enough for an established TCP flow's
            // retransmissions to back off past its peer's patience).
            if matches!(outcome, Ok(Some(_))) {
                self.keep_neighbours();
            }
            self.macs.record(ifname, outcome);
        }
    }

    /// Pins removed from the pin directory (by hand, or the directory itself): the program
    /// stays attached while this daemon holds its link, but it stops when the daemon exits, and
    /// a restart could not adopt the maps. Logged once per loss; shown by `lb status`.
    fn check_pins(&mut self) {
        let missing = pinning::missing_pins(&self.args.pin_dir, &self.args.interfaces);
        if missing.is_empty() && !self.pins_lost.is_empty() {
            tracing::info!("the pins in {} are complete again", self.args.pin_dir.display());
        } else if !missing.is_empty() && missing != self.pins_lost {
            tracing::error!(
                "pins in {} were removed ({}): the balancer stays attached while this daemon runs, but it stops when the daemon exits and a restart cannot adopt its maps (tracked connections would be lost); restart the daemon to pin them again",
                self.args.pin_dir.display(),
                missing.join(", ")
            );
        }
        self.pins_lost = missing;
    }

    /// Each interface's attachment, for `lb status`.
    fn link_status(&self) -> Vec<LinkStatus> {
        self.args
            .interfaces
            .iter()
            .map(|ifname| {
                let state = if self.dp.link_attached(ifname) {
                    "attached"
                } else if links::exists(ifname) {
                    "detached"
                } else {
                    "detached (interface removed)"
                };
                LinkStatus { interface: ifname.clone(), state: state.to_owned(), mac: self.macs.note(ifname) }
            })
            .chain(self.unlisted.iter().cloned())
            .collect()
    }

    fn on_health(&mut self, ev: HealthEvent) {
        // A report of a probe stopped since (a reload changed it) is stale: its replacement
        // started from the verdict known then and reports changes from there.
        if !self.checkers.iter().any(|(_, _, id)| *id == ev.probe) {
            return;
        }
        let verdict = if ev.healthy { "healthy" } else { "unhealthy" };
        tracing::info!(target: "audit", "health: service {} backend {} is now {verdict} (last probe: {})", ev.service, ev.backend, ev.reason);
        self.metrics.health_change(&ev.service, ev.backend, ev.healthy);
        self.ctl.set_checked(&ev.service, ev.backend, ev.healthy);
        self.reconcile_soon();
    }

    /// One line for `systemctl status`.
    fn summary(&self) -> String {
        let services = self.ctl.config().services.len();
        format!(
            "{services} services on {}; control socket {}",
            self.args.interfaces.join(", "),
            self.args.socket.display()
        )
    }

    /// A read of the config file for reloads ended: each reload waiting for it is done (or
    /// refused) and answered.
    fn on_config_read(&mut self, read: &reload::ConfigRead) {
        for origin in self.reloads.finished() {
            match origin {
                reload::Origin::Signal => {
                    let result = self.reload(read);
                    audit("reload", "SIGHUP", &result);
                    notify::ready(&self.summary());
                }
                reload::Origin::Request(pending) => {
                    let resp = self.handle(pending.request, Some(read));
                    let _ = pending.reply.send(resp);
                }
            }
        }
    }

    /// Reload the config file (its text `read` off the loop): a config that cannot be read,
    /// fails validation or does not fit changes nothing.
    fn reload(&mut self, read: &reload::ConfigRead) -> Result<reply::Reloaded> {
        let result = self.try_reload(read);
        self.metrics.reload(result.is_ok());
        self.reloads.record(&result);
        result
    }

    fn try_reload(&mut self, read: &reload::ConfigRead) -> Result<reply::Reloaded> {
        let mut cfg = reload::parse(&self.args.config, read)?;
        warn_notices(&self.args.config, &cfg);
        for line in tunnel_source::fill_defaults(&mut cfg, &self.args.interfaces, tunnel_source::primary_address)? {
            tracing::debug!("{line}");
        }
        fits(self.dp.sizes(), self.ctl.config(), &cfg)?;
        self.supersede_compile();
        let result = self.ctl.reload(cfg, &mut self.dp);
        self.after_reconcile(result.as_ref().ok());
        result.context("applying the new configuration")?;
        self.start_checkers();
        tracing::info!("configuration reloaded from {}", self.args.config.display());
        Ok(reply::Reloaded { reloaded: self.args.config.display().to_string() })
    }

    /// What reloading the config file would change; refused as the reload would be.
    fn reload_dry_run(&mut self, read: &reload::ConfigRead) -> Result<reply::ReloadPlan> {
        let cfg = reload::parse(&self.args.config, read)?;
        fits(self.dp.sizes(), self.ctl.config(), &cfg)?;
        let now = self.dp.now_ns()?;
        let next = self.ctl.preview_config(cfg.clone(), now)?;
        self.dp.admit(&next.demand(self.ctl.applied()))?;
        Ok(dry_run::plan(&self.args.config, self.ctl.config(), self.ctl.applied(), &cfg, &next))
    }

    /// Answers a control request; `read` is the config file's text for a reload (read off the
    /// loop, see `reload`).
    fn handle(&mut self, req: Request, read: Option<&reload::ConfigRead>) -> Response {
        let unread = Err("internal error: reload without a read of the configuration".to_owned());
        let read = read.unwrap_or(&unread);
        // Operator actions are audited, accepted or refused.
        let action = match &req {
            Request::BackendSet { service, address, health } => {
                Some(("override", format!("service {service} backend {address} health {health:?}")))
            }
            Request::BackendDrain { service, address } => {
                Some(("drain", format!("service {service} backend {address}")))
            }
            Request::BackendUndrain { service, address } => {
                Some(("undrain", format!("service {service} backend {address}")))
            }
            Request::Reload => Some(("reload", "control socket".to_owned())),
            Request::HostDrain { grace_sec } => Some(("host drain", format!("grace {grace_sec:?} s"))),
            Request::TraceStart { spec, seconds } => Some(("trace start", format!("{spec:?} for {seconds} s"))),
            Request::TraceStop => Some(("trace stop", "control socket".to_owned())),
            Request::Status | Request::Stats | Request::Explain { .. } | Request::ReloadDryRun => None,
        };
        let result = match req {
            Request::Status => Ok(Reply::Status(self.status())),
            Request::Stats => self.stats().map(Reply::Stats),
            Request::Explain { service, client, sport, dport, proto } => {
                self.explain(&service, client, sport, dport, proto).map(Reply::Explain)
            }
            Request::BackendSet { service, address, health } => {
                let h = match health {
                    HealthOverride::Healthy => Some(true),
                    HealthOverride::Unhealthy => Some(false),
                    HealthOverride::Auto => None,
                };
                let before = self.ctl.override_of(&service, address);
                self.ctl
                    .set_override(&service, address, h)
                    .and_then(|_| self.make_durable(|c| c.set_override(&service, address, before)))
                    .and_then(|_| self.reconcile())
                    .map(|_| Reply::Backend(BackendChange { service, address, health: Some(health), draining: None }))
            }
            Request::BackendDrain { service, address } => {
                let was = self.ctl.is_drained(&service, address);
                self.ctl
                    .drain(&service, address)
                    .and_then(|_| self.make_durable(|c| if was { Ok(()) } else { c.undrain(&service, address) }))
                    .and_then(|_| self.reconcile())
                    .map(|_| Reply::Backend(BackendChange { service, address, health: None, draining: Some(true) }))
            }
            Request::BackendUndrain { service, address } => self
                .ctl
                .undrain(&service, address)
                .and_then(|_| self.make_durable(|c| c.drain(&service, address)))
                .and_then(|_| self.reconcile())
                .map(|_| Reply::Backend(BackendChange { service, address, health: None, draining: Some(false) })),
            Request::Reload => self.reload(read).map(Reply::Reloaded),
            Request::ReloadDryRun => self.reload_dry_run(read).map(Reply::ReloadPlan),
            Request::HostDrain { grace_sec } => self.host_drain(grace_sec).map(Reply::HostDrain),
            Request::TraceStart { spec, seconds } => self.trace_start(&spec, seconds).map(Reply::Trace),
            Request::TraceStop => self.trace_stop("lb trace stopped").map(Reply::Trace),
        };
        if let Some((verb, what)) = action {
            audit(verb, &what, &result);
        }
        match result {
            Ok(v) => Response::ok(v),
            Err(e) => Response::err(format!("{e:#}")),
        }
    }

    fn status(&self) -> reply::Status {
        let cfg = self.ctl.config();
        let applied = self.ctl.applied();
        let services = cfg
            .services
            .iter()
            .map(|svc| {
                let compiled = applied.and_then(|a| a.services.iter().find(|s| s.name == svc.name));
                let backends = svc
                    .backends
                    .iter()
                    .map(|b| {
                        let unchecked = self.ctl.unchecked(&svc.name, b.address);
                        let source = if self.ctl.override_of(&svc.name, b.address).is_some() {
                            "override"
                        } else if unchecked || self.ctl.checker_verdict(&svc.name, b.address).is_some() {
                            "health_check"
                        } else {
                            "initial"
                        };
                        let health = match (unchecked, self.ctl.healthy(&svc.name, b.address)) {
                            (true, _) => "unchecked",
                            (false, true) => "healthy",
                            (false, false) => "unhealthy",
                        };
                        BackendStatus {
                            address: b.address,
                            zone: b.zone.clone(),
                            role: if b.failover { "failover" } else { "primary" }.to_owned(),
                            health: health.to_owned(),
                            health_source: source.to_owned(),
                            weight: b.weight,
                            draining: self.ctl.is_drained(&svc.name, b.address),
                        }
                    })
                    .collect();
                ServiceStatus {
                    name: svc.name.clone(),
                    vip: svc.vip,
                    protocol: svc.protocol.as_str().to_owned(),
                    ports: svc.ports.clone(),
                    eligible_kind: compiled.map(|c| c.plan.kind.as_str().to_owned()),
                    rule: compiled.map(|c| c.plan.rule.id().to_owned()),
                    active_pool: compiled.map(|c| c.plan.active_pool.as_str().to_owned()),
                    backends,
                    zones: compiled.map(|c| zone_views(cfg, c)).unwrap_or_default(),
                    routing_method: svc.routing_method.as_str().to_owned(),
                    // Traffic Manager services: the routing method's client classes.
                    classes: compiled.and_then(class_views),
                }
            })
            .collect();
        let announce = self.announcer.as_ref().map(|a| reply::AnnounceStatus {
            device: a.device().to_owned(),
            table: a.table(),
            draining: a.draining(),
            announced: a.announced().iter().copied().collect(),
        });
        let pins =
            if self.pins_lost.is_empty() { "ok".to_owned() } else { format!("lost: {}", self.pins_lost.join(", ")) };
        reply::Status {
            config: self.args.config.display().to_string(),
            interfaces: self.args.interfaces.clone(),
            links: self.link_status(),
            pins,
            services,
            announce,
            reloads: self.reloads.counts().clone(),
            faults: faults::snapshot(),
        }
    }

    fn stats(&self) -> Result<reply::Stats> {
        let st = self.dp.stats()?;
        let global = Counters(
            lb_common::maps::stat::NAMES.iter().enumerate().map(|(i, n)| (n.to_string(), st.get(i as u32))).collect(),
        );
        let cfg = self.ctl.config();
        let applied = self.ctl.applied();
        let services = applied
            .map(|a| {
                a.services
                    .iter()
                    .map(|s| {
                        let classes = s
                            .tables
                            .iter()
                            .map(|t| {
                                let c = st.class(s.id, t.class);
                                // A Traffic Manager service's classes are its routing method's,
                                // not zones (`lb status` lists their prefixes).
                                let zone = metrics::class_zone(cfg, s, t.class);
                                ClassStats {
                                    client_class: t.class,
                                    client_zone: zone,
                                    packets: c.packets,
                                    bytes: c.bytes,
                                    new_flows: c.new_flows,
                                    cross_zone_spills: c.spills,
                                }
                            })
                            .collect();
                        ServiceStats { name: s.name.clone(), traffic_manager: s.tm.is_some(), classes }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(reply::Stats { global, services })
    }

    fn explain(
        &self,
        service: &str,
        client: std::net::IpAddr,
        sport: Option<u16>,
        dport: Option<u16>,
        proto: Option<Proto>,
    ) -> Result<reply::Explanation> {
        let applied = self.ctl.applied().ok_or_else(|| anyhow::anyhow!("no tables yet"))?;
        views::explain(self.ctl.config(), applied, service, client, sport, dport, proto)
    }

    /// `lb trace`: the filter written, the traced program attached for `seconds`.
    fn trace_start(&mut self, spec: &trace::TraceSpec, seconds: u32) -> Result<trace::TraceState> {
        if !(1..=trace::MAX_SECONDS).contains(&seconds) {
            bail!("seconds {seconds}: allowed values are 1..={}", trace::MAX_SECONDS);
        }
        let filter = spec.filter()?;
        let pin_dir = self.args.pin_dir.clone();
        self.dp.set_tracing(Some(&filter), |ifname| pinning::link_pin(&pin_dir, ifname))?;
        self.trace_until = Some(std::time::Instant::now() + std::time::Duration::from_secs(seconds.into()));
        tracing::info!("tracing packets ({spec:?}) for {seconds} s: lb_traced attached");
        Ok(self.trace_state())
    }

    /// Attaches `lb` again (a trace stopped or over); `why` goes to the log.
    fn trace_stop(&mut self, why: &str) -> Result<trace::TraceState> {
        if self.dp.tracing() {
            let pin_dir = self.args.pin_dir.clone();
            self.dp.set_tracing(None, |ifname| pinning::link_pin(&pin_dir, ifname))?;
            tracing::info!("{why}: lb attached again");
        }
        self.trace_until = None;
        Ok(self.trace_state())
    }

    fn trace_state(&self) -> trace::TraceState {
        let left = self.trace_until.map(|t| t.saturating_duration_since(std::time::Instant::now()).as_secs() as u32);
        trace::TraceState { tracing: self.dp.tracing(), seconds_left: left, interfaces: self.args.interfaces.clone() }
    }

    /// A trace whose time is over stops (its client may have died).
    fn check_trace(&mut self) {
        if self.trace_until.is_some_and(|t| std::time::Instant::now() >= t) {
            if let Err(e) = self.trace_stop("the trace's time is over") {
                tracing::error!("stopping the trace: {e:#}");
            }
        }
    }

    fn shutdown(mut self) -> Result<()> {
        // A kept data plane goes on with the balancer's own program, not the traced one.
        if let Err(e) = self.trace_stop("exiting") {
            tracing::error!("attaching lb again on exit: {e:#}");
        }
        // Withdraw first: the routers stop sending before the data plane goes.
        drop(self.announcer.take());
        for (_, h, _) in self.checkers.drain(..) {
            h.abort();
        }
        let _ = std::fs::remove_file(&self.args.socket);
        if self.args.keep_dataplane {
            self.save_state();
            let missing = pinning::missing_pins(&self.args.pin_dir, &self.args.interfaces);
            if missing.is_empty() {
                tracing::info!("exiting; the data plane keeps running (pinned in {})", self.args.pin_dir.display());
            } else {
                tracing::error!(
                    "exiting; pins in {} were removed ({}): the data plane stops with this daemon",
                    self.args.pin_dir.display(),
                    missing.join(", ")
                );
            }
            return Ok(());
        }
        for ifname in &self.args.interfaces {
            dataplane::detach_pinned(&pinning::link_pin(&self.args.pin_dir, ifname))?;
        }
        pinning::remove_map_pins(&self.args.pin_dir)?;
        let _ = std::fs::remove_file(state_path(&self.args));
        let _ = std::fs::remove_dir(&self.args.pin_dir);
        tracing::info!("detached and unpinned; bye");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(ports: usize) -> String {
        named_service(0, ports)
    }

    fn named_service(n: usize, ports: usize) -> String {
        let list: Vec<String> = (1..=ports).map(|p| p.to_string()).collect();
        format!(
            "[[service]]\nname = \"web{n}\"\nvip = \"198.18.0.{}\"\nprotocol = \"TCP\"\nports = [{}]\n[[service.backend]]\naddress = \"198.18.11.1\"\n",
            100 + n,
            list.join(", ")
        )
    }

    #[test]
    fn reload_refuses_restart_only_changes() {
        let running = Config::parse(&service(1)).unwrap();
        let sizes = sizes_for(&running);
        assert!(fits(&sizes, &running, &Config::parse(&service(2)).unwrap()).is_ok());
        let with_dns = Config::parse(&format!("[dns]\nlisten = \"127.0.0.1:5353\"\n{}", service(1))).unwrap();
        let err = fits(&sizes, &running, &with_dns).unwrap_err().to_string();
        assert!(err.contains("[dns] listen") && err.contains("restart") && err.contains("127.0.0.1:5353"), "{err}");
        assert!(fits(&sizes, &with_dns, &with_dns).is_ok());
        let with_metrics = Config::parse(&format!("[metrics]\nlisten = \"127.0.0.1:9405\"\n{}", service(1))).unwrap();
        let err = fits(&sizes, &running, &with_metrics).unwrap_err().to_string();
        assert!(err.contains("[metrics] listen") && err.contains("restart") && err.contains("127.0.0.1:9405"), "{err}");
        assert!(fits(&sizes, &with_metrics, &with_metrics).is_ok());
        let bigger_m = Config::parse(&format!("[dataplane]\nmaglev_table_size = 65537\n{}", service(1))).unwrap();
        assert!(fits(&sizes, &running, &bigger_m).unwrap_err().to_string().contains("maglev_table_size"));
    }

    #[test]
    fn sizes_beyond_the_map_memory_limit_are_refused_naming_what_drives_them() {
        let cfg = Config::parse(&service(1)).unwrap();
        assert!(check_map_memory(&sizes_for(&cfg)).is_ok());
        // The largest connection tables validation allows still fit.
        let most = Config::parse(&format!(
            "[dataplane]\nconntrack_entries = {}\n{}",
            crate::config::MAX_CONNTRACK_ENTRIES,
            service(1)
        ))
        .unwrap();
        assert!(check_map_memory(&sizes_for(&most)).is_ok(), "{:?}", check_map_memory(&sizes_for(&most)));
        // 8192 tables of M = 65537 (8 bytes per cell): 4 GiB of TABLES alone.
        let big = DataplaneSizes { table_slots: 8192, table_size_m: 65537, ..sizes_for(&cfg) };
        let err = check_map_memory(&big).unwrap_err().to_string();
        assert!(
            err.contains("MiB") && err.contains("TABLES 4096 MiB") && err.contains("dataplane.maglev_table_size"),
            "{err}"
        );
    }

    #[test]
    fn sizes_hold_every_port_and_class_prefix_with_room() {
        let cfg = Config::parse(&service(1)).unwrap();
        assert_eq!(sizes_for(&cfg).max_services, 16);
        // 256 keys fit the 16 service ids' 16 keys each: the sizes stay (pinned maps of a
        // version before this rule are still adopted); 300 do not, and the table grows.
        assert_eq!(sizes_for(&Config::parse(&service(256)).unwrap()).max_services, 16);
        let cfg = Config::parse(&service(300)).unwrap();
        let s = sizes_for(&cfg);
        assert!(s.max_services * 16 >= 300, "{s:?}");
        assert!(crate::dataplane::service_table::slots_for(s.max_services) / 2 >= 300);
        // 2 zones of 130 prefixes each, installed for each of 8 services: 2080 prefixes.
        let zones: String = (0..2)
            .map(|z| {
                let p: Vec<String> = (0..130).map(|i| format!("\"198.{}.{i}.0/24\"", 18 + z)).collect();
                format!("[[zone]]\nname = \"z{z}\"\nclient_prefixes = [{}]\n", p.join(", "))
            })
            .collect();
        let services: String = (0..8).map(|n| named_service(n, 1)).collect();
        let cfg = Config::parse(&(zones + &services)).unwrap();
        let s = sizes_for(&cfg);
        let prefixes = s.map_max_entries().iter().find(|(n, _)| *n == "CLIENT_CLASS").unwrap().1;
        assert!(prefixes >= 2080, "{s:?}: CLIENT_CLASS holds {prefixes}");
    }
}
