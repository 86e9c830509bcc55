//! The daemon's life: start (load or adopt the pinned data plane, write the tables, attach,
//! start the DNS front and the metrics endpoint), the state file, and shutdown.

use super::*;
use crate::dataplane::DataplaneSizes;

/// What a start found in the pin directory: what its clean-up after a failure may remove.
#[derive(Clone, Copy)]
pub(super) enum Found {
    /// No pins: everything there is this start's.
    Nothing,
    /// Pins of other sizes or layout, whose maps it unpinned; its own map pins are its.
    Discarded,
    /// A data plane it adopted: left as it is.
    Adopted,
    /// Failed before it knew: nothing is removed.
    Unknown,
}

/// Why a start failed, and what it had found (what its clean-up may remove).
pub(super) type StartError = (anyhow::Error, Found);

/// What [`start`] hands the loop besides the daemon: the DNS and metrics tasks (kept while
/// the daemon runs), and the receivers of health events, metrics scrapes and finished compiles.
pub(super) struct Started {
    _tasks: Vec<JoinHandle<()>>,
    pub(super) receivers: Receivers,
}

impl Found {
    /// After a failed start: what this start made goes (still under the lock); what it found
    /// stays: an adopted data plane keeps running, and so does the program of a discarded one,
    /// still attached through its pinned link.
    pub(super) fn clean_up(self, args: &RunArgs) {
        match self {
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
    }
}

/// Loads (or adopts) the data plane, writes the tables, attaches and starts the DNS front and
/// the metrics endpoint. On error also says whether it had adopted a pinned data plane (which
/// is then left running).
pub(super) async fn start(args: RunArgs, cfg: Config) -> std::result::Result<(Daemon, Started), StartError> {
    // More descriptors for probes and the DNS front, whose TCP share leaves a reserve.
    let nofile = match limits::raise_nofile() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("cannot raise RLIMIT_NOFILE: {e}");
            1024
        }
    };
    let sizes = crate::compile::sizes::sizes_for(&cfg);
    sizes.check_memory().map_err(|e| (e, Found::Unknown))?;
    let mut ctl = Controller::new(cfg);
    // The host's own addresses stay the host's inside a routed next-hop prefix.
    match crate::config::HostAddrs::current() {
        Ok(host) => {
            ctl.set_local_addresses(host.addresses());
        }
        Err(e) => tracing::warn!(
            "cannot list this host's addresses ({e}): next-hop routes will not exempt them (its own traffic \
             inside a routed prefix would be balanced)"
        ),
    }
    // The endpoints given by DNS name: their first answers (a few seconds at most) go into the
    // first tables; later ones come to the loop.
    let (name_events, mut names_rx) = mpsc::channel(256);
    let mut names = names::Names::new(name_events);
    first_resolutions(&mut ctl, &mut names, &mut names_rx).await;
    let (found, carried) = adopt(&args, &mut ctl, &sizes)?;
    let fail = |e: anyhow::Error| (e, found);
    let (mut dp, initial) = load_tables(&args, &mut ctl, sizes, found, carried).map_err(fail)?;
    attach_all(&mut dp, &args).map_err(fail)?;
    // Only once this start's interfaces are attached: until then a failed start leaves the
    // adopted data plane as it found it.
    let unlisted = links::detach_unlisted(&args.pin_dir, &args.interfaces);
    let (health_events, health_rx) = mpsc::channel(1024);
    let (compiled, compiled_rx) = mpsc::unbounded_channel();
    let (dns_view, dns_rx) =
        tokio::sync::watch::channel(std::sync::Arc::new(crate::daemon::dns::RoutingView::of(&ctl)));
    let counts = metrics::Metrics::default();
    counts.tables_swapped(initial.tables_written);
    let (tasks, snapshot_rx) = serve_fronts(&ctl, nofile, dns_rx, &counts).await.map_err(fail)?;
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
        maintain_error: None,
        trace_until: None,
        events: health_events,
        dns_view,
        metrics: counts,
        lock: None,
        announcer,
        drain_deadline: None,
        neighbours: neighbours::spawn(),
        links: LinkWatch { unlisted, ..Default::default() },
        compiles: CompileSchedule { epoch: 0, running: false, again: false, done: compiled },
        reloads,
        geoip: Default::default(),
        names,
    };
    d.announce();
    d.keep_neighbours();
    d.save_state();
    d.start_checkers();
    let receivers = Receivers {
        health: health_rx,
        snapshots: snapshot_rx,
        compiled: compiled_rx,
        reloads: reload_rx,
        names: names_rx,
    };
    Ok((d, Started { _tasks: tasks, receivers }))
}

/// How long a start waits for the first answers of the endpoints given by DNS name.
const FIRST_RESOLUTIONS: std::time::Duration = std::time::Duration::from_secs(3);

/// Starts resolving the endpoints given by DNS name and takes their first answers into `ctl`
/// (for [`FIRST_RESOLUTIONS`] at most: a name that has none by then has no address in the
/// first tables, and gets its addresses when its answer comes).
async fn first_resolutions(ctl: &mut Controller, names: &mut names::Names, rx: &mut mpsc::Receiver<names::NameEvent>) {
    let wanted = ctl.endpoint_names();
    if wanted.is_empty() {
        return;
    }
    names.follow(&wanted, &ctl.config().resolver);
    let mut pending: BTreeSet<_> = wanted.into_iter().collect();
    let deadline = tokio::time::Instant::now() + FIRST_RESOLUTIONS;
    while !pending.is_empty() {
        let Ok(Some(ev)) = tokio::time::timeout_at(deadline, rx.recv()).await else { break };
        pending.remove(&ev.name);
        names::log_result(&ev);
        ctl.set_resolved(&ev.name, ev.resolved);
    }
    for name in pending {
        tracing::warn!("endpoint name {name}: no answer yet; its endpoints get addresses when it resolves");
    }
}

/// What the pin directory holds for a data plane of `sizes`: adopted as it is (with the state
/// file), discarded with what the new maps take over, or nothing.
fn adopt(
    args: &RunArgs,
    ctl: &mut Controller,
    sizes: &DataplaneSizes,
) -> std::result::Result<(Found, Option<Box<dataplane::Carried>>), StartError> {
    let reuse = pinning::prepare_reuse(&args.pin_dir, sizes).map_err(|e| (e, Found::Unknown))?;
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
            restore_state(args, ctl).map_err(fail)?;
        }
        PinState::Discarded { why, carried: None } => {
            tracing::warn!(
                "the pinned data plane has other sizes or layout ({why}); starting fresh, tracked connections are lost"
            );
        }
        PinState::Discarded { why, carried: Some(old) } => {
            tracing::warn!("the pinned data plane has other sizes or layout ({why}); loading new maps, tracked connections are carried over");
            restore_state(args, ctl).map_err(fail)?;
            carried = Some(old);
        }
    }
    Ok((found, carried))
}

/// Loads the data plane on the pins (new maps, or the adopted ones), takes over what a
/// predecessor left (its backend records and connection tables, what its configuration had
/// and this one does not) and writes the initial tables.
fn load_tables(
    args: &RunArgs,
    ctl: &mut Controller,
    sizes: DataplaneSizes,
    found: Found,
    carried: Option<Box<dataplane::Carried>>,
) -> Result<(Dataplane, crate::controller::ReconcileReport)> {
    let mut dp = Dataplane::load_with(sizes, Some(&args.pin_dir))?;
    // An older version's maps: the program that still uses them keeps them alive until it is
    // replaced below; the pins themselves would only leak.
    pinning::remove_legacy_pins(&args.pin_dir)?;
    if let Some(old) = &carried {
        dp.carry_backends(old).context("copying the backend records of the discarded maps")?;
    }
    // Maps taken over (adopted, or the connection tables carried into new ones) hold flows
    // of the previous daemon's backend ids: the ids are restored, and those the configuration
    // dropped drain.
    let adopted_at = if matches!(found, Found::Adopted) || carried.is_some() {
        // What the predecessor's configuration had and this one does not: removed first, so
        // that it neither stays live nor takes room the new tables need.
        let now = dp.now_ns()?;
        ctl.depart_unconfigured(now);
        let next = ctl.preview(now)?;
        let (keys, prefixes, tables) =
            dp.sweep_unowned(&next.demand(None)).context("removing what the previous configuration left")?;
        if keys + prefixes + tables > 0 {
            tracing::info!("removed what the previous configuration left: {keys} service keys, {prefixes} client prefixes, {tables} tables");
        }
        Some(now)
    } else {
        None
    };
    // Tables first, then attach: the first packet already finds them.
    let initial = ctl.reconcile(&mut dp).context("writing the initial tables")?;
    if let Some(now) = adopted_at {
        let applied = ctl.applied().expect("written just above");
        let backends = dp
            .depart_unused_backends(&applied.demand(None), now, &|id| ctl.drain_ns_of(id))
            .context("flagging backends the configuration dropped")?;
        if backends > 0 {
            tracing::info!("{backends} backends the configuration no longer has are draining");
        }
    }
    // Last before the program is swapped: the old one adds flows until then.
    if let Some(old) = carried {
        let (copied, lost) = dp.carry_conntrack(&old).context("copying the connection tables into the new maps")?;
        let lost = if lost > 0 { format!(" ({lost} did not fit and are lost)") } else { String::new() };
        tracing::info!("{copied} tracked connections carried over into the new connection tables{lost}");
    }
    Ok((dp, initial))
}

/// Attaches the balancer to every interface of `--interface` (through a pinned link).
fn attach_all(dp: &mut Dataplane, args: &RunArgs) -> Result<()> {
    for ifname in &args.interfaces {
        warn_if_forwarding_disabled(ifname);
        let how = dp.attach_pinned(ifname, Program::Lb, &pinning::link_pin(&args.pin_dir, ifname))?;
        match how.mode() {
            Some(aya::programs::XdpMode::Skb) => tracing::warn!("{ifname}: {how}"),
            _ => tracing::info!("{ifname}: {how}"),
        }
    }
    Ok(())
}

/// Starts the DNS front (`[dns]`) and the metrics endpoint (`[metrics]`): their tasks, and the
/// receiver of metrics scrapes. The listen addresses are read at start only (a reload that
/// changes `[dns]` or `[metrics]` is refused).
async fn serve_fronts(
    ctl: &Controller,
    nofile: u64,
    dns_rx: tokio::sync::watch::Receiver<std::sync::Arc<crate::daemon::dns::RoutingView>>,
    counts: &metrics::Metrics,
) -> Result<(Vec<JoinHandle<()>>, mpsc::Receiver<metrics::SnapshotRequest>)> {
    let mut tasks = match ctl.config().dns.clone() {
        Some(front) => {
            let limits = dns::TcpLimits {
                total: limits::dns_tcp_budget(nofile, health::probes_for(ctl.config()).len()),
                per_source: limits::DNS_TCP_PER_SOURCE,
            };
            let (addr, tasks) = crate::daemon::dns::serve(front.listen, dns_rx, limits, counts.clone())
                .await
                .with_context(|| format!("[dns] listen = {}", front.listen))?;
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
            .with_context(|| format!("[metrics] listen = {}", m.listen))?;
        tracing::info!("metrics on http://{addr}/metrics");
        tasks.push(task);
    }
    Ok((tasks, snapshot_rx))
}

/// Resumes from the previous daemon's state file (ids, generations, health, overrides,
/// drains), when there is one. One it cannot read (truncated, wrong shape) is moved aside and
/// the daemon starts with fresh state: refusing to start would leave the adopted program
/// forwarding with frozen health.
pub(super) fn restore_state(args: &RunArgs, ctl: &mut Controller) -> Result<()> {
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

/// bpf_fib_lookup, which finds the IPIP next hop, fails (FWD_DISABLED) on an interface without
/// forwarding; the drops would show only as `drop_fib` in `lb stats`, so say it up front.
/// (L2_DSR then sends every frame back out of the ingress device, whatever the route.)
pub(super) fn warn_if_forwarding_disabled(ifname: &str) {
    for (family, path) in [
        ("ipv4", format!("/proc/sys/net/ipv4/conf/{ifname}/forwarding")),
        ("ipv6", format!("/proc/sys/net/ipv6/conf/{ifname}/forwarding")),
    ] {
        if std::fs::read_to_string(&path).map(|v| v.trim() == "0").unwrap_or(false) {
            tracing::warn!("{family} forwarding is off on {ifname}; IPIP forwarding needs it for the next-hop lookup, and L2_DSR to reach backends routed via another device (sysctl -w net.{family}.conf.{ifname}.forwarding=1)");
        }
    }
}

pub(super) fn state_path(args: &RunArgs) -> PathBuf {
    state::path_for(&args.socket)
}

/// Logs the settings of `cfg` that have no effect (`config::notices`), as the file has them
/// (before defaults are filled in).
pub(super) fn warn_notices(path: &Path, cfg: &Config) {
    for n in cfg.notices() {
        tracing::warn!("{}: {n}", path.display());
    }
}

impl Daemon {
    pub(super) fn save_state(&self) {
        if let Err(e) = self.try_save_state() {
            faults::count(faults::Fault::StateSaveFailed);
            tracing::error!("{e:#}; a restart now would lose the changes since the last save");
        }
    }

    pub(super) fn try_save_state(&self) -> Result<()> {
        let path = state_path(&self.args);
        let text = serde_json::to_string(&self.ctl.persistent_state())?;
        state::save(&path, &text).with_context(|| format!("cannot save state to {}", path.display()))
    }

    /// Saves the state after an operator's change to the controller; when it cannot be saved,
    /// `undo` puts the change back and the action is refused: an accepted action must survive
    /// a restart.
    pub(super) fn make_durable(&mut self, undo: impl FnOnce(&mut Controller) -> Result<()>) -> Result<()> {
        if let Err(e) = self.try_save_state() {
            faults::count(faults::Fault::StateSaveFailed);
            if let Err(u) = undo(&mut self.ctl) {
                tracing::error!("cannot take back an operator change that was not saved: {u:#}");
            }
            return Err(e.context("not applied: the change could not be made durable (a restart would lose it)"));
        }
        Ok(())
    }

    pub(super) fn shutdown(mut self) -> Result<()> {
        // A kept data plane goes on with the balancer's own program, not the traced one.
        if let Err(e) = self.trace_stop("exiting") {
            tracing::error!("attaching lb again on exit: {e:#}");
        }
        // Withdraw first: the routers stop sending before the data plane goes.
        drop(self.announcer.take());
        for (_, h, _) in self.checkers.drain(..) {
            h.abort();
        }
        super::probe_path::tear_down();
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
