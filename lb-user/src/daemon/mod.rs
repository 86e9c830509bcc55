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
mod geoip_watch;
pub mod health;
mod iproute;
mod lifecycle;
pub mod limits;
mod link_watch;
pub mod links;
pub mod logging;
pub mod metrics;
pub mod names;
pub mod neighbours;
mod netlink;
pub mod notify;
pub mod probe;
pub mod probe_grpc;
pub mod probe_path;
pub mod reload;
pub mod reply;
mod requests;
pub mod run_dir;
mod schedule;
pub mod state;
pub mod trace;
pub mod tunnel_source;
pub mod views;

use lifecycle::{start, warn_notices};

use crate::config::Config;
use crate::controller::{CompileOutput, Controller, PersistentState};
use crate::dataplane::pinning::{self, PinState};
use crate::dataplane::{self, Dataplane, Program};
use announce::Announcer;
use anyhow::{bail, Context, Result};
use api::{HealthOverride, Request, Response};
use probe::HealthEvent;
use reply::{BackendChange, LinkStatus, Reply};
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
    /// The last error of the table maintenance (logged once).
    maintain_error: Option<String>,
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
    /// While `lb trace` runs: when the daemon attaches `lb` again by itself.
    trace_until: Option<std::time::Instant>,
    /// What the daemon knows of its interfaces and pins (`link_watch`).
    links: LinkWatch,
    /// Compiles for health changes, off the loop (`schedule`).
    compiles: CompileSchedule,
    /// Reloads waiting for their read of the configuration file, off the loop (`reload`).
    reloads: reload::Reloads,
    /// Rewrites of the GeoIP database, which reload the configuration.
    geoip: geoip_watch::GeoIpWatch,
    /// The resolution of the endpoints given by DNS name (`names`).
    names: names::Names,
}

/// The interfaces and pins as the daemon last saw them (`link_watch`).
#[derive(Default)]
struct LinkWatch {
    /// Interfaces known to be gone (logged once), until they return and are attached again.
    detached: BTreeSet<String>,
    /// Pins found missing from the pin directory (logged once), see [`Daemon::check_pins`].
    pins_lost: Vec<String>,
    /// The MAC changes of the interfaces, followed into `LOCAL_MACS`.
    macs: links::MacFollower,
    /// Interfaces a previous daemon was attached to that this one is not: detached at start.
    unlisted: Vec<LinkStatus>,
}

/// Compiles for health changes run off the loop ([`Daemon::reconcile_soon`]).
struct CompileSchedule {
    /// The number of the state a compile starts from, bumped by every reconcile on the loop
    /// (which makes a running compile's result stale).
    epoch: u64,
    /// Whether a compile runs.
    running: bool,
    /// Whether another change came in since it started.
    again: bool,
    /// Where a finished compile reports, with the epoch it started from.
    done: mpsc::UnboundedSender<(u64, CompileOutput)>,
}

/// What the loop receives besides control requests: health events, metrics scrapes, finished
/// compiles and reads of the configuration file for reloads.
struct Receivers {
    health: mpsc::Receiver<HealthEvent>,
    snapshots: mpsc::Receiver<metrics::SnapshotRequest>,
    compiled: mpsc::UnboundedReceiver<(u64, CompileOutput)>,
    reloads: mpsc::UnboundedReceiver<reload::ConfigRead>,
    names: mpsc::Receiver<names::NameEvent>,
}

/// The signals the loop handles: SIGHUP reloads, SIGTERM and SIGINT stop.
struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
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
    let (mut d, started) = match start(args.clone(), cfg).await {
        Ok(started) => started,
        Err((e, found)) => {
            let _ = std::fs::remove_file(&args.socket);
            found.clean_up(&args);
            drop(lock);
            return Err(e);
        }
    };
    d.lock = Some(lock);
    serve(d, listener, started.receivers, Signals { hup, term, int }).await
}

/// The daemon's loop: health events, control requests and signals, until SIGTERM or SIGINT.
async fn serve(
    mut d: Daemon,
    listener: tokio::net::UnixListener,
    mut rx: Receivers,
    mut signals: Signals,
) -> Result<()> {
    // Deadlines the data plane does not keep itself (the end of a pool-change drain) are
    // checked this often: within seconds of ten minutes is close enough.
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(5));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    // Replaced tables whose handshake window ended are freed, and the connection table scanned
    // for clean Maglev slots, on this loop: serialized with every table change.
    let mut table_tick = tokio::time::interval(std::time::Duration::from_secs(1));
    table_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
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
            Some(ev) = rx.health.recv() => d.on_health(ev),
            Some(ev) = rx.names.recv() => d.on_name(ev),
            Some((epoch, out)) = rx.compiled.recv() => d.on_compiled(epoch, out),
            Some(ev) = link_rx.recv() => d.on_link(ev),
            Some(reply) = rx.snapshots.recv() => {
                let snap = metrics::snapshot(&d.ctl, &d.dp).map(|s| s.with_status(&d.status()));
                let _ = reply.send(snap.map_err(|e| format!("{e:#}")));
            }
            _ = table_tick.tick() => d.maintain_tables(),
            _ = tick.tick() => {
                d.on_tick();
                d.check_links();
                d.check_pins();
                d.check_trace();
                if d.geoip.changed(d.ctl.config()) {
                    d.reloads.request(reload::Origin::GeoIpChanged);
                }
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
            _ = signals.hup.recv() => {
                notify::reloading();
                d.reloads.request(reload::Origin::Signal);
            }
            Some(read) = rx.reloads.recv() => d.on_config_read(&read),
            _ = async { if let Some(w) = watchdog.as_mut() { w.tick().await } else { std::future::pending().await } } => notify::watchdog(),
            _ = signals.term.recv() => break,
            _ = signals.int.recv() => break,
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
