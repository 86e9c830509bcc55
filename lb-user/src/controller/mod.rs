//! The controller's desired state and its reconciliation into the data plane.
//!
//! Owns the configuration, the health verdicts, the operator's overrides and drains, and what
//! was last written. Every change (health event, override, drain, reload) recompiles and writes
//! only the difference through a [`Tables`] sink, in an order that never exposes a half state:
//! backend records first, then tables (standby slot + flip, inside the sink), then service keys,
//! then removals. Pure logic plus the sink: unit-testable without BPF.

use crate::compile::{self, tables_to_write, Compiled, CompiledService, Ids};
use crate::config::{Config, DnsName, Endpoint, Resolved};
use crate::dataplane::Tables;
use crate::model::{keyed_triples, BackendKey, MonitorStatus};
use crate::policy::tm::ProbeStatuses;
use crate::policy::Pool;
use ipnet::IpNet;
use lb_common::maps::{backend_flags, service_flags, Backend, ServiceInfo, ServiceKey};
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// How long entries made under the previous active pool stay valid after a pool change when
/// `disable_connection_drain_on_failover` is false: "a fixed 10-minute drain" (spec §1.2).
pub const POOL_CHANGE_DRAIN_NS: u64 = 600 * 1_000_000_000;

/// Pool generations wrap at 2^16 (`ServiceInfo::pool_gen`).
const POOL_GEN_MASK: u32 = 0xffff;

/// A pool change restored without its time (see `Controller::restore`).
const CHANGE_TIME_UNKNOWN: u64 = u64::MAX;

/// What the controller keeps across a daemon restart (the pinned maps keep the rest): the ids
/// that tracked flows refer to, the pool generations, the last health verdicts, and the
/// operator's overrides and drains (absent in an older daemon's state: none).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PersistentState {
    pub ids: crate::compile::IdsSnapshot,
    pub pools: Vec<(String, Pool, u32)>,
    #[serde(with = "keyed_triples")]
    pub checked: Vec<(BackendKey, bool)>,
    #[serde(default, with = "keyed_triples")]
    pub overrides: Vec<(BackendKey, bool)>,
    #[serde(default)]
    pub drained: Vec<BackendKey>,
    /// Data-plane clock of each service's last active-pool change (the clock survives a
    /// daemon restart; pinned maps do not survive a reboot either).
    #[serde(default)]
    pub pool_changed_ns: Vec<(String, u64)>,
    /// Set by daemons whose `checked` holds every verdict (a backend starts unchecked); an
    /// older daemon's `checked` left out backends healthy since their start.
    #[serde(default)]
    pub first_verdicts: bool,
}

/// A backend that left its service (drain or removal), kept until its drain deadline passes so
/// that its id is not reused while tracked flows may still point at it.
#[derive(Clone, Debug, PartialEq)]
struct Departed {
    id: u32,
    record: Backend,
    deadline_ns: u64,
}

/// What a compile reads, taken from the controller ([`Controller::begin_compile`]): it runs
/// on any thread.
pub struct PendingCompile {
    eff: Config,
    health: Vec<Vec<bool>>,
    probes: ProbeStatuses,
    ids: Ids,
    cache: compile::TableCache,
    now: u64,
}

impl PendingCompile {
    /// The pure step of a reconcile: policy and Maglev tables (the slow part of a large
    /// configuration).
    pub fn run(mut self) -> CompileOutput {
        let health = self.health;
        let result =
            compile::compile_cached(&self.eff, &|s, b| health[s][b], &self.probes, &mut self.ids, &mut self.cache);
        self.cache.sweep();
        CompileOutput { result, ids: self.ids, cache: self.cache, now: self.now }
    }
}

/// A compile's result, for [`Controller::finish_compile`].
pub struct CompileOutput {
    result: anyhow::Result<Compiled>,
    ids: Ids,
    cache: compile::TableCache,
    now: u64,
}

#[derive(Debug)]
pub struct Controller {
    cfg: Config,
    ids: Ids,
    /// Health checker verdicts; absent = not yet checked (see `healthy`).
    checked: BTreeMap<BackendKey, bool>,
    /// Operator overrides (`lb backend set --health`).
    overrides: BTreeMap<BackendKey, bool>,
    /// Backends drained by the operator: out of every eligible set.
    drained: BTreeSet<BackendKey>,
    departed: BTreeMap<BackendKey, Departed>,
    /// Active pool and generation per service (for FLUSH_ON_POOL_CHANGE).
    pools: BTreeMap<String, (Pool, u32)>,
    /// Data-plane clock at each service's last active-pool change (for POOL_DRAIN_OVER).
    pool_changed_ns: BTreeMap<String, u64>,
    applied: Option<Compiled>,
    table_cache: compile::TableCache,
    /// The host's own addresses: exempted from the next-hop routes (its BGP sessions, health
    /// check replies, control traffic), see [`Controller::set_local_addresses`].
    local_addrs: Vec<IpAddr>,
    /// The next-hop routes as last written (the host's exemptions included).
    routes_written: Vec<(IpNet, u32)>,
    /// What the daemon's resolver last found for each name of the endpoints given by DNS name
    /// (every family; each endpoint takes its VIP's), filled into `cfg` (`fill_resolutions`).
    resolutions: BTreeMap<DnsName, Resolved>,
}

impl Controller {
    pub fn new(cfg: Config) -> Self {
        Self {
            cfg,
            ids: Ids::default(),
            checked: BTreeMap::new(),
            overrides: BTreeMap::new(),
            drained: BTreeSet::new(),
            departed: BTreeMap::new(),
            pools: BTreeMap::new(),
            pool_changed_ns: BTreeMap::new(),
            applied: None,
            table_cache: compile::TableCache::default(),
            local_addrs: Vec::new(),
            routes_written: Vec::new(),
            resolutions: BTreeMap::new(),
        }
    }

    /// The names of the endpoints given by DNS name (each once), which the daemon resolves.
    pub fn endpoint_names(&self) -> Vec<DnsName> {
        let mut names: Vec<DnsName> = self
            .cfg
            .services
            .iter()
            .flat_map(|s| s.backends.iter().filter_map(|b| b.name_target().map(|t| t.name.clone())))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// What the resolver found for `name` now: its endpoints take the addresses of their VIP's
    /// family (a changed set is a table change at the next reconcile, as a reload's would be:
    /// the addresses that left depart with their service's draining time, their verdicts go).
    /// Whether any endpoint changed.
    pub fn set_resolved(&mut self, name: &DnsName, resolved: Resolved) -> bool {
        // A late result of a name a reload removed.
        if !self.endpoint_names().contains(name) {
            return false;
        }
        self.resolutions.insert(name.clone(), resolved);
        let mut cfg = self.cfg.clone();
        if !self.fill_resolutions(&mut cfg) {
            return false;
        }
        self.replace_config(cfg);
        true
    }

    /// Fills every endpoint given by DNS name in `cfg` from the last resolutions (of the
    /// endpoint's VIP family, at most `MAX_NAME_ADDRESSES`, sorted); a name not resolved yet
    /// is Pending. Whether anything changed.
    fn fill_resolutions(&self, cfg: &mut Config) -> bool {
        let mut changed = false;
        for svc in &mut cfg.services {
            let v4 = svc.vip().is_none_or(|v| v.is_ipv4());
            for b in &mut svc.backends {
                let Endpoint::Name(t) = &mut b.endpoint else { continue };
                let mut want = self.resolutions.get(&t.name).cloned().unwrap_or_default();
                want.addresses.retain(|a| a.is_ipv4() == v4);
                want.addresses.sort();
                want.addresses.dedup();
                want.addresses.truncate(crate::config::MAX_NAME_ADDRESSES);
                if t.resolved != want {
                    t.resolved = want;
                    changed = true;
                }
            }
        }
        changed
    }

    /// The host's own addresses, which the next-hop routes leave to the host (written with the
    /// next reconcile). The daemon sets them at start and follows them. Whether they changed.
    pub fn set_local_addresses(&mut self, mut addrs: Vec<IpAddr>) -> bool {
        addrs.sort();
        addrs.dedup();
        let changed = addrs != self.local_addrs;
        self.local_addrs = addrs;
        changed
    }

    /// Whether any service is a next hop (the host's addresses matter only then).
    pub fn has_next_hops(&self) -> bool {
        self.cfg.services.iter().any(|s| s.next_hop().is_some())
    }

    /// `routes` with the host's addresses exempted (none without routes).
    fn with_local_exemptions(&self, routes: &[(IpNet, u32)]) -> Vec<(IpNet, u32)> {
        if routes.is_empty() {
            return Vec::new();
        }
        let mut all = routes.to_vec();
        for a in &self.local_addrs {
            let host = IpNet::from(*a);
            if !all.iter().any(|(n, _)| *n == host) {
                all.push((host, lb_common::maps::NEXT_HOP_UNTOUCHED));
            }
        }
        all.sort();
        all
    }

    pub fn persistent_state(&self) -> PersistentState {
        PersistentState {
            ids: self.ids.snapshot(),
            pools: self.pools.iter().map(|(n, (p, g))| (n.clone(), *p, *g)).collect(),
            checked: self.checked.iter().map(|(k, h)| (k.clone(), *h)).collect(),
            overrides: self.overrides.iter().map(|(k, h)| (k.clone(), *h)).collect(),
            drained: self.drained.iter().cloned().collect(),
            pool_changed_ns: self.pool_changed_ns.iter().map(|(n, t)| (n.clone(), *t)).collect(),
            first_verdicts: true,
        }
    }

    /// Resume from a previous daemon's state (before the first reconcile).
    pub fn restore(&mut self, st: &PersistentState) {
        self.ids = Ids::from_snapshot(&st.ids);
        self.pools = st.pools.iter().map(|(n, p, g)| (n.clone(), (*p, *g))).collect();
        self.checked = st.checked.iter().cloned().collect();
        self.overrides = st.overrides.iter().cloned().collect();
        self.drained = st.drained.iter().cloned().collect();
        self.pool_changed_ns = st.pool_changed_ns.iter().cloned().collect();
        if !st.first_verdicts {
            // An older daemon counted a probed backend without a verdict as healthy: it keeps
            // that verdict instead of starting over unchecked.
            for svc in self.cfg.services.iter().filter(|s| s.health_check_port().is_some()) {
                for address in svc.backends.iter().filter_map(|b| b.address()) {
                    self.checked.entry(BackendKey::new(&svc.name, address)).or_insert(true);
                }
            }
        }
        // An older daemon's state has generations but no change times: a changed pool's drain
        // then counts from this daemon's first reconcile (not as over already).
        for (name, _, generation) in &st.pools {
            if *generation != 0 && !self.pool_changed_ns.contains_key(name) {
                self.pool_changed_ns.insert(name.clone(), CHANGE_TIME_UNKNOWN);
            }
        }
        // Of backends the (possibly changed) configuration still has.
        let cfg = self.cfg.clone();
        self.replace_config(cfg);
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// After a restart that adopted the pinned data plane (before the first reconcile): the
    /// backends the restored state has and the configuration no longer does are departing now,
    /// with their service's draining time, so their ids stay reserved (their flows may still
    /// run) until the drain ends, as for a backend a reload removes.
    pub fn depart_unconfigured(&mut self, now: u64) {
        let cfg = &self.cfg;
        let gone: Vec<(BackendKey, u32)> =
            self.ids.backends().filter(|(k, _)| !cfg.has_backend(k)).map(|(k, id)| (k.clone(), id)).collect();
        for (key, id) in gone {
            let deadline_ns = now + self.drain_ns_of(id);
            self.departed.insert(key, Departed { id, record: Backend::default(), deadline_ns });
        }
    }

    /// The draining time a backend id the restored state knew gets when it leaves now: its
    /// service's `draining_timeout_sec` if the configuration still has the service, else none.
    pub fn drain_ns_of(&self, id: u32) -> u64 {
        let Some(BackendKey { service, .. }) = self.ids.owner_of(id) else { return 0 };
        self.cfg
            .services
            .iter()
            .find(|s| &s.name == service)
            .map_or(0, |s| u64::from(s.connection_draining.draining_timeout_sec) * 1_000_000_000)
    }

    pub fn applied(&self) -> Option<&Compiled> {
        self.applied.as_ref()
    }

    /// A backend's health as the tables see it: override, else checker verdict, else healthy
    /// only if its service has no health check. A probed backend without a verdict yet (new,
    /// or after a fresh start) takes no new connections until it passes a probe: while no
    /// backend of its service has, the all-unhealthy rule (E-2, E-9) decides. A restart that
    /// adopts the data plane restores the verdicts, so it does not flap.
    pub fn healthy(&self, service: &str, addr: IpAddr) -> bool {
        self.health_in(service, addr, self.probed(service))
    }

    /// [`Controller::healthy`] of a backend of a service that is `probed` or not.
    fn health_in(&self, service: &str, addr: IpAddr, probed: bool) -> bool {
        let key = BackendKey::new(service, addr);
        self.overrides.get(&key).or_else(|| self.checked.get(&key)).map_or(!probed, |h| *h)
    }

    /// A health-checked backend waiting for its first verdict (and not overridden).
    pub fn unchecked(&self, service: &str, addr: IpAddr) -> bool {
        let key = BackendKey::new(service, addr);
        self.probed(service) && !self.overrides.contains_key(&key) && !self.checked.contains_key(&key)
    }

    /// Whether the service's backends are health-checked (`health::probes_for` probes them).
    fn probed(&self, service: &str) -> bool {
        self.cfg.services.iter().any(|s| s.name == service && s.health_check_port().is_some())
    }

    /// A Traffic Manager endpoint's probe-derived monitor status (spec §2.3): the probe runner
    /// reports Online as healthy and Degraded as unhealthy (`health::spawn_monitor`), an
    /// operator override pins one of the two, and an endpoint without any result yet is
    /// CheckingEndpoint. Endpoint Disabled, alwaysServe and nested statuses are derived from
    /// the configuration on top of this (`tm::Statuses`).
    pub fn monitor_status(&self, service: &str, addr: IpAddr) -> MonitorStatus {
        let key = BackendKey::new(service, addr);
        match self.overrides.get(&key).or_else(|| self.checked.get(&key)) {
            Some(true) => MonitorStatus::Online,
            Some(false) => MonitorStatus::Degraded,
            None => MonitorStatus::CheckingEndpoint,
        }
    }

    /// The monitor statuses of every endpoint of `cfg` (indexed like `cfg`). An endpoint given
    /// by DNS name is probed at each of its addresses: Online while one of them is, else
    /// CheckingEndpoint while one has no result yet, else Degraded (with none resolved yet:
    /// CheckingEndpoint; its resolution failing for good makes it Degraded, `tm::Statuses`).
    pub fn probe_statuses(&self, cfg: &Config) -> ProbeStatuses {
        let mut probes = ProbeStatuses::new(cfg, MonitorStatus::CheckingEndpoint);
        for (si, svc) in cfg.services.iter().enumerate() {
            // A nested endpoint's status is its child's (`tm::Statuses`): it has no probe.
            for (bi, b) in svc.backends.iter().enumerate() {
                let statuses: Vec<MonitorStatus> =
                    b.addresses().iter().map(|a| self.monitor_status(&svc.name, *a)).collect();
                let best = [MonitorStatus::Online, MonitorStatus::CheckingEndpoint, MonitorStatus::Degraded]
                    .into_iter()
                    .find(|s| statuses.contains(s));
                if let Some(status) = best {
                    probes.set_index(si, bi, status);
                }
            }
        }
        probes
    }

    /// What the DNS front answers from: the configuration the tables were compiled from
    /// (drained endpoints left out) and the endpoints' monitor statuses.
    pub fn routing_view(&self) -> (Config, ProbeStatuses) {
        let eff = self.effective_config();
        let probes = self.probe_statuses(&eff);
        (eff, probes)
    }

    pub fn override_of(&self, service: &str, addr: IpAddr) -> Option<bool> {
        self.overrides.get(&BackendKey::new(service, addr)).copied()
    }

    pub fn checker_verdict(&self, service: &str, addr: IpAddr) -> Option<bool> {
        self.checked.get(&BackendKey::new(service, addr)).copied()
    }

    pub fn is_drained(&self, service: &str, addr: IpAddr) -> bool {
        self.drained.contains(&BackendKey::new(service, addr))
    }

    fn require_backend(&self, service: &str, addr: IpAddr) -> anyhow::Result<()> {
        let svc = self
            .cfg
            .services
            .iter()
            .find(|s| s.name == service)
            .ok_or_else(|| anyhow::anyhow!("no service named {service:?}"))?;
        if !svc.backends.iter().any(|b| b.has_address(addr)) {
            anyhow::bail!("service {service:?} has no backend {addr}");
        }
        Ok(())
    }

    pub fn set_checked(&mut self, service: &str, addr: IpAddr, healthy: bool) {
        self.checked.insert(BackendKey::new(service, addr), healthy);
    }

    /// `Some(h)` pins the health, `None` returns to the checker's verdict.
    pub fn set_override(&mut self, service: &str, addr: IpAddr, health: Option<bool>) -> anyhow::Result<()> {
        self.require_backend(service, addr)?;
        let key = BackendKey::new(service, addr);
        match health {
            Some(h) => self.overrides.insert(key, h),
            None => self.overrides.remove(&key),
        };
        Ok(())
    }

    pub fn drain(&mut self, service: &str, addr: IpAddr) -> anyhow::Result<()> {
        self.require_backend(service, addr)?;
        self.drained.insert(BackendKey::new(service, addr));
        Ok(())
    }

    /// Applies a new configuration (already validated) as one change. If it does not fit the
    /// sink ([`Tables::admit`]) nothing is written and nothing changes here. If a write fails
    /// midway (a failed syscall), the previous configuration and every backend's health
    /// verdict, override and drain are put back and the previous state is reconciled again,
    /// which rewrites or removes whatever the failed change wrote (see `repair_picture`).
    pub fn reload(&mut self, cfg: Config, sink: &mut dyn Tables) -> anyhow::Result<ReconcileReport> {
        let saved = (self.cfg.clone(), self.checked.clone(), self.overrides.clone(), self.drained.clone());
        self.replace_config(cfg);
        match self.reconcile(sink) {
            Ok(report) => Ok(report),
            Err(e) => {
                (self.cfg, self.checked, self.overrides, self.drained) = saved;
                if let Err(repair) = self.reconcile(sink) {
                    return Err(
                        e.context(format!("the previous configuration could not be rewritten either: {repair:#}"))
                    );
                }
                Err(e)
            }
        }
    }

    /// Ends an operator drain: the backend is a member again (same id and generation, so its
    /// tracked flows stay valid).
    pub fn undrain(&mut self, service: &str, addr: IpAddr) -> anyhow::Result<()> {
        self.require_backend(service, addr)?;
        if !self.drained.remove(&BackendKey::new(service, addr)) {
            anyhow::bail!("backend {addr} of service {service:?} is not drained");
        }
        Ok(())
    }

    /// Replace the configuration (already validated). State of backends that remain is kept,
    /// except the probe verdict of a Traffic Manager endpoint that was Disabled (itself or its
    /// profile) and is enabled now: it starts over as CheckingEndpoint (spec §2.3, "new/just
    /// enabled endpoints are CheckingEndpoint until the first result"). Endpoints given by DNS
    /// name keep the addresses their name resolved to.
    pub fn replace_config(&mut self, mut cfg: Config) {
        self.fill_resolutions(&mut cfg);
        let names: std::collections::BTreeSet<&DnsName> = cfg
            .services
            .iter()
            .flat_map(|s| s.backends.iter().filter_map(|b| b.name_target().map(|t| &t.name)))
            .collect();
        self.resolutions.retain(|n, _| names.contains(n));
        let still = |k: &BackendKey| cfg.has_backend(k);
        let disabled = |c: &Config, k: &BackendKey| {
            c.services
                .iter()
                .find(|x| x.name == k.service)
                .is_some_and(|x| crate::policy::endpoint_disabled(x, k.address))
        };
        let old = &self.cfg;
        self.checked.retain(|k, _| still(k) && (!disabled(old, k) || disabled(&cfg, k)));
        self.overrides.retain(|k, _| still(k));
        self.drained.retain(|k| still(k));
        self.cfg = cfg;
    }

    /// The configuration the policy sees: drained backends are no longer members. Of an
    /// endpoint given by DNS name, drained addresses are left out, and so are the Degraded ones
    /// while another address is Online or not checked yet (the endpoint's status is its best
    /// address's; its traffic goes to those).
    fn effective_config(&self) -> Config {
        let mut cfg = self.cfg.clone();
        for svc in &mut cfg.services {
            let name = svc.name.clone();
            svc.backends.retain(|b| b.address().is_none_or(|a| !self.drained.contains(&BackendKey::new(&name, a))));
            for b in &mut svc.backends {
                let Endpoint::Name(t) = &mut b.endpoint else { continue };
                let addrs = &mut t.resolved.addresses;
                addrs.retain(|a| !self.drained.contains(&BackendKey::new(&name, *a)));
                let routable = |a: &IpAddr| self.monitor_status(&name, *a) != MonitorStatus::Degraded;
                if addrs.iter().any(routable) {
                    addrs.retain(routable);
                }
            }
        }
        cfg
    }

    /// Recompute everything and write what changed. A change the sink does not admit writes
    /// nothing. A write error midway leaves part of the change live (each table still whole
    /// and atomic); the next reconcile repairs it (see `repair_picture`).
    pub fn reconcile(&mut self, sink: &mut dyn Tables) -> anyhow::Result<ReconcileReport> {
        let now = sink.now_ns()?;
        let out = self.begin_compile(now).run();
        self.finish_compile(out, sink)
    }

    /// Writes what [`PendingCompile::run`] compiled, as [`Controller::reconcile`] does. The
    /// result is the state as of [`Controller::begin_compile`]: a caller that reconciled in
    /// between drops it instead.
    pub fn finish_compile(&mut self, out: CompileOutput, sink: &mut dyn Tables) -> anyhow::Result<ReconcileReport> {
        self.table_cache = out.cache;
        let mut new = out.result?;
        let (pools, pool_changed_ns) = self.pool_generations(&mut new, out.now);
        sink.admit(&new.demand(self.applied.as_ref()))?;
        self.write_next(new, out.ids, pools, pool_changed_ns, out.now, sink)
    }

    /// What the next reconcile at `now` would write (nothing is committed). A daemon that
    /// adopted a pinned data plane sweeps against it before its first reconcile.
    pub fn preview(&mut self, now: u64) -> anyhow::Result<Compiled> {
        let (mut new, _) = self.next_state(now)?;
        let _ = self.pool_generations(&mut new, now);
        Ok(new)
    }

    /// What a reload to `cfg` (already validated) at `now` would write, as [`Self::preview`];
    /// nothing changes here (`lb reload --dry-run`).
    pub fn preview_config(&mut self, cfg: Config, now: u64) -> anyhow::Result<Compiled> {
        let saved = (self.cfg.clone(), self.checked.clone(), self.overrides.clone(), self.drained.clone());
        self.replace_config(cfg);
        let next = self.preview(now);
        (self.cfg, self.checked, self.overrides, self.drained) = saved;
        next
    }

    /// The compiled state for the current configuration and health, and the ids it uses.
    fn next_state(&mut self, now: u64) -> anyhow::Result<(Compiled, Ids)> {
        let out = self.begin_compile(now).run();
        self.table_cache = out.cache;
        Ok((out.result?, out.ids))
    }

    /// The first step of a reconcile in two, for a caller that runs the pure one elsewhere
    /// (the daemon, off its event loop): what the compile reads at `now`.
    /// [`PendingCompile::run`] compiles; [`Controller::finish_compile`] writes.
    pub fn begin_compile(&mut self, now: u64) -> PendingCompile {
        let eff = self.effective_config();
        let health: Vec<Vec<bool>> = eff
            .services
            .iter()
            .map(|s| {
                let probed = s.health_check_port().is_some();
                s.backends.iter().map(|b| b.address().is_none_or(|a| self.health_in(&s.name, a, probed))).collect()
            })
            .collect();
        // Ids of departed backends stay reserved until their deadline.
        self.departed.retain(|_, d| d.deadline_ns > now);
        let mut ids = self.ids.clone();
        let applied = self.applied.as_ref();
        let departed = &self.departed;
        // Ids stay reserved while flows may point at them: backends of the last applied state
        // (they become `departed` below) and departed ones until their deadline.
        ids.retain(&self.cfg, &|k| {
            departed.contains_key(k)
                || applied.is_some_and(|c| {
                    c.services.iter().any(|x| x.name == k.service && x.backend_addrs.contains(&k.address))
                })
        });
        let probes = self.probe_statuses(&eff);
        // Lent to the compile; a reconcile meanwhile builds its tables afresh.
        let cache = std::mem::take(&mut self.table_cache);
        PendingCompile { eff, health, probes, ids, cache, now }
    }

    fn write_next(
        &mut self,
        new: Compiled,
        ids: Ids,
        pools: BTreeMap<String, (Pool, u32)>,
        pool_changed_ns: BTreeMap<String, u64>,
        now: u64,
        sink: &mut dyn Tables,
    ) -> anyhow::Result<ReconcileReport> {
        let mut report = ReconcileReport::default();
        let old = self.applied.take();
        let result = self.write_diff(old.as_ref(), &new, now, sink, &mut report);
        match result {
            Ok(()) => {
                self.ids = ids;
                self.pools = pools;
                self.pool_changed_ns = pool_changed_ns;
                self.applied = Some(new);
                Ok(report)
            }
            Err(e) => {
                // Part of `new` may be live over `old`: the next reconcile diffs against a
                // picture of both that differs from any target, so it rewrites or removes all of
                // it. Ids handed out here stay reserved (with their bumped generations) while
                // the repair departs their backends: flows may have been made for them.
                self.applied = Some(repair_picture(old.as_ref(), &new));
                self.ids.absorb(&ids);
                Err(e)
            }
        }
    }

    /// The pool generations and change times after `new` (kept only once it is written): a
    /// service's generation is bumped when its active pool changes (failover/failback), so
    /// that FLUSH_ON_POOL_CHANGE voids entries made under the other pool at once; without it,
    /// POOL_DRAIN_OVER voids them once [`POOL_CHANGE_DRAIN_NS`] have passed since the last
    /// change (an entry made two changes ago, on a backend that is active again, goes too:
    /// the generation does not say which pool it was made in).
    fn pool_generations(&self, new: &mut Compiled, now: u64) -> (BTreeMap<String, (Pool, u32)>, BTreeMap<String, u64>) {
        let mut pools = self.pools.clone();
        let mut changed = self.pool_changed_ns.clone();
        for svc in &mut new.services {
            let pool = svc.plan.active_pool();
            let entry = pools.entry(svc.name.clone()).or_insert((pool, 0));
            if entry.0 != pool {
                entry.0 = pool;
                entry.1 = entry.1.wrapping_add(1);
                changed.insert(svc.name.clone(), now);
            }
            // Below 2^16: a connection-table entry keeps 16 bits of it (`ct_table::PackedEntry`;
            // a state file of an older version may hold more).
            entry.1 &= POOL_GEN_MASK;
            svc.info.pool_gen = entry.1;
            if let Some(t) = changed.get_mut(&svc.name).filter(|t| **t == CHANGE_TIME_UNKNOWN) {
                *t = now;
            }
            let drain_over = changed.get(&svc.name).is_none_or(|&t| now >= t.saturating_add(POOL_CHANGE_DRAIN_NS));
            if svc.info.flags & service_flags::FLUSH_ON_POOL_CHANGE == 0 && drain_over {
                svc.info.flags |= service_flags::POOL_DRAIN_OVER;
            }
        }
        (pools, changed)
    }

    /// When the next pool-change drain ends (data-plane clock): the daemon reconciles then,
    /// so that the data plane learns it (POOL_DRAIN_OVER). None if no drain is running.
    pub fn next_pool_drain_end(&self) -> Option<u64> {
        let applied = self.applied.as_ref()?;
        applied
            .services
            .iter()
            .filter(|s| s.info.flags & (service_flags::FLUSH_ON_POOL_CHANGE | service_flags::POOL_DRAIN_OVER) == 0)
            .filter_map(|s| self.pool_changed_ns.get(&s.name).map(|t| t.saturating_add(POOL_CHANGE_DRAIN_NS)))
            .min()
    }

    fn write_diff(
        &mut self,
        old: Option<&Compiled>,
        new: &Compiled,
        now: u64,
        sink: &mut dyn Tables,
        report: &mut ReconcileReport,
    ) -> anyhow::Result<()> {
        let old_backends: BTreeMap<u32, Backend> =
            old.map(|o| o.backends.iter().copied().collect()).unwrap_or_default();
        let new_backends: BTreeMap<u32, Backend> = new.backends.iter().copied().collect();
        // 1. Backend records (new ids must exist before a table points at them).
        for (id, b) in &new_backends {
            if old_backends.get(id) != Some(b) {
                sink.set_backend(*id, b)?;
                report.backends_written += 1;
            }
        }
        // 2. Tables and class prefixes, then service keys (all services' keys in one change).
        let old_services: BTreeMap<&str, &CompiledService> =
            old.map(|o| o.services.iter().map(|s| (s.name.as_str(), s)).collect()).unwrap_or_default();
        let mut set_keys: Vec<(&[ServiceKey], &ServiceInfo)> = Vec::new();
        let mut remove_keys: Vec<ServiceKey> = Vec::new();
        for (svc, t) in tables_to_write(old, new) {
            sink.write_table(svc.id, t.class, t.flags, &t.entries)?;
            report.tables_written += 1;
        }
        for svc in &new.services {
            let prev = old_services.get(svc.name.as_str()).copied();
            let old_prefixes: &[(IpNet, u32)] = prev.map(|p| p.class_prefixes.as_slice()).unwrap_or(&[]);
            if old_prefixes != svc.class_prefixes.as_slice() {
                sink.set_class_prefixes(svc.id, old_prefixes, &svc.class_prefixes)?;
            }
            if prev.map(|p| &p.backend_addrs) != Some(&svc.backend_addrs) {
                sink.set_backend_sources(svc.id, &svc.backend_addrs)?;
            }
            if prev.map(|p| (&p.keys, &p.info)) != Some((&svc.keys, &svc.info)) {
                set_keys.push((&svc.keys, &svc.info));
                report.services_written += 1;
                if let Some(p) = prev {
                    remove_keys.extend(p.keys.iter().filter(|k| !svc.keys.contains(k)));
                }
            }
        }
        // 3. Removed services: their keys go in the same change, their tables after it.
        let removed: Vec<&CompiledService> = old_services
            .iter()
            .filter(|(name, _)| !new.services.iter().any(|s| &s.name == *name))
            .map(|(_, p)| *p)
            .collect();
        // (The sink removes before it installs, so a key that moved to another service stays.)
        for p in &removed {
            remove_keys.extend(&p.keys);
        }
        if !set_keys.is_empty() || !remove_keys.is_empty() {
            sink.update_services(&set_keys, &remove_keys)?;
        }
        // Next-hop routes after the services they name exist (and before removed services'
        // tables go): with the host's own addresses exempted.
        let new_routes = self.with_local_exemptions(&new.next_hop_routes);
        if old.is_none() || self.routes_written != new_routes {
            sink.set_next_hop_routes(&self.routes_written, &new_routes)?;
            self.routes_written = new_routes;
        }
        if old.is_none() {
            // A first write (after a start that may have adopted another configuration's maps).
            sink.keep_backend_sources(&new.services.iter().map(|s| s.id).collect())?;
        }
        for p in removed {
            sink.set_backend_sources(p.id, &[])?;
            sink.set_class_prefixes(p.id, &p.class_prefixes, &[])?;
            sink.remove_tables(p.id, old.map(|o| o.classes_per_service).unwrap_or(1))?;
            report.services_removed += 1;
        }
        // 4. Backends that left a service: flagged REMOVED with their drain deadline; tracked
        //    flows continue until then (spec §1.4), and the kernel voids them afterwards.
        for (id, b) in &old_backends {
            if new_backends.contains_key(id) {
                continue;
            }
            let Some(key) = old.and_then(|o| find_backend(o, *id)) else { continue };
            let timeout_s = self
                .cfg
                .services
                .iter()
                .find(|s| s.name == key.service)
                .map(|s| s.connection_draining.draining_timeout_sec)
                .unwrap_or(0);
            let deadline_ns = now + timeout_s as u64 * 1_000_000_000;
            // HEALTHY stays as last seen: a removed backend's tracked flows keep going to it
            // until the deadline (spec §1.4, P9), whatever their protocol; only one that was
            // unhealthy already is subject to the persistence table as before.
            let record =
                Backend { flags: b.flags | backend_flags::REMOVED, drain_deadline_ns: deadline_ns, _pad: [0; 4], ..*b };
            sink.set_backend(*id, &record)?;
            report.backends_departed += 1;
            self.departed.insert(key, Departed { id: *id, record, deadline_ns });
        }
        // 5. A drained backend is still configured and probed: its health during the drain
        //    reaches its record (a flow that does not persist on an unhealthy backend leaves it).
        let health: Vec<(BackendKey, bool)> = self
            .departed
            .keys()
            .filter(|k| self.drained.contains(k))
            .map(|k| (k.clone(), self.healthy(&k.service, k.address)))
            .collect();
        for (key, healthy) in health {
            let d = self.departed.get_mut(&key).expect("listed above");
            let flags = if healthy {
                d.record.flags | backend_flags::HEALTHY
            } else {
                d.record.flags & !backend_flags::HEALTHY
            };
            if flags != d.record.flags && !new_backends.contains_key(&d.id) {
                d.record.flags = flags;
                sink.set_backend(d.id, &d.record)?;
                report.backends_written += 1;
            }
        }
        Ok(())
    }
}

/// What may be live after a write of `new` over `old` failed midway, for the next diff: the
/// services and backend records of both, every one of them marked so that it compares unequal
/// to anything a reconcile would write (the marks are never written): tables by flags no table
/// has, backend records by their padding, a service's value by its pool generation, prefixes
/// by their class. So the next reconcile rewrites everything it wants (a full rewrite, after a
/// rare failure) and removes the rest (keys and prefixes of both, services and backends that
/// only the failed change had).
fn repair_picture(old: Option<&Compiled>, new: &Compiled) -> Compiled {
    const MARK: u32 = 0x8000_0000;
    let mut picture = old.cloned().unwrap_or(Compiled {
        services: Vec::new(),
        backends: Vec::new(),
        classes_per_service: 0,
        next_hop_routes: Vec::new(),
    });
    // Every route of either, with a value no route has: the next write sets each one again.
    for (net, _) in &new.next_hop_routes {
        if !picture.next_hop_routes.iter().any(|(n, _)| n == net) {
            picture.next_hop_routes.push((*net, MARK));
        }
    }
    for (_, route) in &mut picture.next_hop_routes {
        *route = MARK;
    }
    // Tables of the larger class row are removed with a service.
    picture.classes_per_service = picture.classes_per_service.max(new.classes_per_service);
    for svc in &new.services {
        let Some(p) = picture.services.iter_mut().find(|p| p.name == svc.name) else {
            picture.services.push(svc.clone());
            continue;
        };
        for t in &svc.tables {
            if !p.tables.iter().any(|pt| pt.class == t.class) {
                p.tables.push(t.clone());
            }
        }
        for k in &svc.keys {
            if !p.keys.contains(k) {
                p.keys.push(*k);
            }
        }
        for pre in &svc.class_prefixes {
            if !p.class_prefixes.iter().any(|(n, _)| *n == pre.0) {
                p.class_prefixes.push(*pre);
            }
        }
        for (id, addr) in svc.backend_ids.iter().zip(&svc.backend_addrs) {
            if !p.backend_ids.contains(id) {
                p.backend_ids.push(*id);
                p.backend_addrs.push(*addr);
            }
        }
    }
    for (id, b) in &new.backends {
        if !picture.backends.iter().any(|(i, _)| i == id) {
            picture.backends.push((*id, *b));
        }
    }
    for p in &mut picture.services {
        p.info.pool_gen ^= MARK;
        for t in &mut p.tables {
            t.flags = u32::MAX;
        }
        for (_, class) in &mut p.class_prefixes {
            *class ^= MARK;
        }
    }
    for (_, b) in &mut picture.backends {
        b._pad = [0xff; 4];
    }
    picture
}

fn find_backend(c: &Compiled, id: u32) -> Option<BackendKey> {
    c.services
        .iter()
        .find_map(|s| s.backend_ids.iter().position(|b| *b == id).map(|i| BackendKey::new(&s.name, s.backend_addrs[i])))
}

/// What one reconcile wrote (for logs and tests).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    pub backends_written: usize,
    pub tables_written: usize,
    pub services_written: usize,
    pub services_removed: usize,
    pub backends_departed: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::Demand;
    use lb_common::maps::BACKEND_DROP;

    /// Records what the controller writes, like the BPF maps would hold it.
    #[derive(Default)]
    struct Recorder {
        backends: BTreeMap<u32, Backend>,
        tables: BTreeMap<(u32, u32), (u32, Vec<u32>)>,
        services: std::collections::HashMap<ServiceKey, ServiceInfo>,
        prefixes: BTreeMap<u32, Vec<(IpNet, u32)>>,
        writes: usize,
        now: u64,
        /// Service ids the recorder holds (`admit` refuses others); None = any.
        max_services: Option<u32>,
        /// (operation, how many of them succeed first): that operation then fails once (a
        /// failed syscall midway through a change).
        fail: Option<(&'static str, usize)>,
    }

    impl Recorder {
        fn maybe_fail(&mut self, op: &'static str) -> anyhow::Result<()> {
            if let Some((what, n)) = self.fail.as_mut().filter(|(what, _)| *what == op) {
                if *n == 0 {
                    let what = *what;
                    self.fail = None;
                    anyhow::bail!("injected failure of {what}");
                }
                *n -= 1;
            }
            Ok(())
        }
    }

    impl Tables for Recorder {
        fn set_backend(&mut self, id: u32, b: &Backend) -> anyhow::Result<()> {
            self.maybe_fail("set_backend")?;
            self.writes += 1;
            self.backends.insert(id, *b);
            Ok(())
        }
        fn write_table(&mut self, service: u32, class: u32, flags: u32, entries: &[u32]) -> anyhow::Result<()> {
            self.maybe_fail("write_table")?;
            self.writes += 1;
            self.tables.insert((service, class), (flags, entries.to_vec()));
            Ok(())
        }
        fn set_class_prefixes(
            &mut self,
            service: u32,
            _old: &[(IpNet, u32)],
            new: &[(IpNet, u32)],
        ) -> anyhow::Result<()> {
            self.writes += 1;
            self.prefixes.insert(service, new.to_vec());
            Ok(())
        }
        fn update_services(
            &mut self,
            set: &[(&[ServiceKey], &ServiceInfo)],
            remove: &[ServiceKey],
        ) -> anyhow::Result<()> {
            self.writes += 1;
            for k in remove {
                self.services.remove(k);
            }
            for (keys, info) in set {
                for k in keys.iter() {
                    self.services.insert(*k, **info);
                }
            }
            Ok(())
        }
        fn remove_tables(&mut self, service: u32, _classes: u32) -> anyhow::Result<()> {
            self.maybe_fail("remove_tables")?;
            self.tables.retain(|(s, _), _| *s != service);
            Ok(())
        }
        fn now_ns(&self) -> anyhow::Result<u64> {
            Ok(self.now)
        }
        fn admit(&self, demand: &Demand) -> anyhow::Result<()> {
            match (self.max_services, demand.services.iter().map(|s| s.id).max()) {
                (Some(max), Some(id)) if id >= max => anyhow::bail!("service id {id} out of range"),
                _ => Ok(()),
            }
        }
    }

    const CFG: &str = r#"
        [dataplane]
        maglev_table_size = 251
        [[zone]]
        name = "zone-a"
        client_prefixes = ["198.18.1.0/24"]
        [[zone]]
        name = "zone-b"
        client_prefixes = ["198.18.2.0/24"]
        [[service]]
        name = "web"
        vip = "198.18.0.100"
        protocol = "TCP"
        ports = [80]
        [service.zonal_affinity]
        spillover = "ZONAL_AFFINITY_STAY_WITHIN_ZONE"
        [service.connection_draining]
        draining_timeout_sec = 300
        [[service.backend]]
        address = "198.18.11.1"
        zone = "zone-a"
        [[service.backend]]
        address = "198.18.11.2"
        zone = "zone-a"
        [[service.backend]]
        address = "198.18.12.1"
        zone = "zone-b"
    "#;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Backend ids a class table uses.
    fn members(r: &Recorder, class: u32) -> BTreeSet<u32> {
        r.tables[&(0, class)].1.iter().copied().filter(|b| *b != BACKEND_DROP).collect()
    }

    #[test]
    fn first_reconcile_writes_everything_and_a_second_nothing() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder::default();
        let rep = c.reconcile(&mut r).unwrap();
        assert_eq!((rep.backends_written, rep.tables_written, rep.services_written), (3, 3, 1));
        assert_eq!(members(&r, 1), BTreeSet::from([0, 1]), "zone-a refined to its own backends");
        assert_eq!(members(&r, 2), BTreeSet::from([2]));
        assert_eq!(members(&r, 0), BTreeSet::from([0, 1, 2]), "non-compatible clients: all");
        let writes = r.writes;
        assert_eq!(c.reconcile(&mut r).unwrap(), ReconcileReport::default());
        assert_eq!(r.writes, writes, "nothing changed, nothing written");
    }

    #[test]
    fn a_compile_run_elsewhere_writes_the_state_it_began_from() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder::default();
        c.reconcile(&mut r).unwrap();
        // The daemon compiles off its loop; a verdict that comes in meanwhile is the next
        // compile's, not this one's.
        let job = c.begin_compile(0);
        c.set_checked("web", ip("198.18.11.2"), false);
        let out = std::thread::spawn(move || job.run()).join().unwrap();
        assert_eq!(
            c.finish_compile(out, &mut r).unwrap(),
            ReconcileReport::default(),
            "the state it began from was written already"
        );
        assert_eq!(members(&r, 1), BTreeSet::from([0, 1]));
        // The next one takes it, as one reconcile would have.
        let out = c.begin_compile(0).run();
        let rep = c.finish_compile(out, &mut r).unwrap();
        assert_eq!((rep.backends_written, rep.tables_written), (1, 2));
        assert_eq!(members(&r, 1), BTreeSet::from([0]));
    }

    #[test]
    fn health_change_rewrites_only_affected_tables() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder::default();
        c.reconcile(&mut r).unwrap();
        let zone_b = r.tables[&(0, 2)].clone();
        c.set_checked("web", ip("198.18.11.2"), false);
        let rep = c.reconcile(&mut r).unwrap();
        assert_eq!(rep.backends_written, 1, "only the health flag of one backend");
        assert_eq!(rep.tables_written, 2, "zone-a and the non-compatible class change, zone-b does not");
        assert_eq!(members(&r, 1), BTreeSet::from([0]));
        assert_eq!(r.tables[&(0, 2)], zone_b);
        assert_eq!(r.backends[&1].flags & backend_flags::HEALTHY, 0);
    }

    /// A probed backend takes new connections only after it passed a probe; until any backend
    /// of the service has, the all-unhealthy rule (E-2: all backends) decides.
    #[test]
    fn probed_backends_start_unchecked_and_join_after_a_pass() {
        let probed =
            CFG.replace("[service.connection_draining]", "[service.health_check]\n[service.connection_draining]");
        let mut c = Controller::new(Config::parse(&probed).unwrap());
        let mut r = Recorder::default();
        c.reconcile(&mut r).unwrap();
        assert!(c.unchecked("web", ip("198.18.11.1")) && !c.healthy("web", ip("198.18.11.1")));
        assert_eq!(members(&r, 0), BTreeSet::from([0, 1, 2]), "none passed yet: E-2, all backends");
        c.set_checked("web", ip("198.18.11.1"), true);
        c.reconcile(&mut r).unwrap();
        assert!(!c.unchecked("web", ip("198.18.11.1")));
        assert_eq!(members(&r, 0), BTreeSet::from([0]), "only the backend that passed");
        assert_eq!(r.backends[&1].flags & backend_flags::HEALTHY, 0, "unchecked is not healthy");
        // A backend a reload adds waits for its first pass too.
        let more = probed.replace(
            "        [[service.backend]]\n        address = \"198.18.12.1\"",
            "        [[service.backend]]\n        address = \"198.18.11.3\"\n        zone = \"zone-a\"\n        [[service.backend]]\n        address = \"198.18.12.1\"",
        );
        c.set_checked("web", ip("198.18.11.2"), true);
        c.set_checked("web", ip("198.18.12.1"), true);
        c.reload(Config::parse(&more).unwrap(), &mut r).unwrap();
        assert!(c.unchecked("web", ip("198.18.11.3")));
        assert_eq!(members(&r, 1).len(), 2, "zone-a: the two checked backends, not the new one");
        // Without a health check a backend is healthy at once.
        let plain = Controller::new(Config::parse(CFG).unwrap());
        assert!(plain.healthy("web", ip("198.18.11.1")) && !plain.unchecked("web", ip("198.18.11.1")));
    }

    /// A restart keeps the verdicts; an older daemon's state (which left out backends healthy
    /// since their start) counts a missing verdict as healthy, as that daemon did.
    #[test]
    fn a_restart_keeps_first_verdicts_and_reads_older_states_as_healthy() {
        let probed =
            CFG.replace("[service.connection_draining]", "[service.health_check]\n[service.connection_draining]");
        let mut c = Controller::new(Config::parse(&probed).unwrap());
        c.set_checked("web", ip("198.18.11.1"), true);
        let text = serde_json::to_string(&c.persistent_state()).unwrap();
        let mut next = Controller::new(Config::parse(&probed).unwrap());
        next.restore(&serde_json::from_str(&text).unwrap());
        assert!(next.healthy("web", ip("198.18.11.1")));
        assert!(next.unchecked("web", ip("198.18.11.2")), "no verdict before the restart, none after");
        let old: PersistentState = serde_json::from_str(
            r#"{"ids":{"services":[],"backends":[]},"pools":[],"checked":[["web","198.18.11.2",false]]}"#,
        )
        .unwrap();
        let mut next = Controller::new(Config::parse(&probed).unwrap());
        next.restore(&old);
        assert!(next.healthy("web", ip("198.18.11.1")) && !next.unchecked("web", ip("198.18.11.1")));
        assert!(!next.healthy("web", ip("198.18.11.2")));
    }

    #[test]
    fn override_beats_checker_and_auto_returns_to_it() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        c.set_checked("web", ip("198.18.11.1"), true);
        c.set_override("web", ip("198.18.11.1"), Some(false)).unwrap();
        assert!(!c.healthy("web", ip("198.18.11.1")));
        c.set_override("web", ip("198.18.11.1"), None).unwrap();
        assert!(c.healthy("web", ip("198.18.11.1")));
        let err = c.set_override("web", ip("198.18.99.9"), Some(true)).unwrap_err();
        assert_eq!(err.to_string(), "service \"web\" has no backend 198.18.99.9");
        let err = c.drain("api", ip("198.18.11.1")).unwrap_err();
        assert_eq!(err.to_string(), "no service named \"api\"");
    }

    #[test]
    fn drain_removes_from_tables_and_flags_with_deadline_keeping_the_id() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder { now: 1_000, ..Default::default() };
        c.reconcile(&mut r).unwrap();
        c.drain("web", ip("198.18.11.2")).unwrap();
        let rep = c.reconcile(&mut r).unwrap();
        assert_eq!(rep.backends_departed, 1);
        assert_eq!(members(&r, 1), BTreeSet::from([0]), "no new flows to the drained backend");
        let b = r.backends[&1];
        assert_eq!(
            b.flags,
            backend_flags::REMOVED | backend_flags::HEALTHY,
            "a healthy backend drains as healthy (P9 for every protocol)"
        );
        assert_eq!(b.drain_deadline_ns, 1_000 + 300 * 1_000_000_000);
        // Still probed while it drains: a failure reaches its record, a recovery too.
        c.set_checked("web", ip("198.18.11.2"), false);
        c.reconcile(&mut r).unwrap();
        assert_eq!(r.backends[&1].flags, backend_flags::REMOVED);
        c.set_checked("web", ip("198.18.11.2"), true);
        c.reconcile(&mut r).unwrap();
        assert_eq!(r.backends[&1].flags, backend_flags::REMOVED | backend_flags::HEALTHY);
        assert_eq!(r.backends[&1].drain_deadline_ns, 1_000 + 300 * 1_000_000_000, "the deadline stays");
        // One that was unhealthy when it left stays unhealthy (the persistence table applies).
        c.set_checked("web", ip("198.18.11.1"), false);
        c.reconcile(&mut r).unwrap();
        c.drain("web", ip("198.18.11.1")).unwrap();
        c.reconcile(&mut r).unwrap();
        assert_eq!(r.backends[&0].flags, backend_flags::REMOVED);
        // A backend added meanwhile must not reuse the drained one's id.
        let cfg = CFG.to_owned() + "\n[[service.backend]]\naddress = \"198.18.12.2\"\nzone = \"zone-b\"\n";
        c.replace_config(Config::parse(&cfg).unwrap());
        c.reconcile(&mut r).unwrap();
        assert_eq!(members(&r, 2), BTreeSet::from([2, 3]), "new backend got a fresh id");
        // Undrained: a member again under its id, no longer REMOVED, same generation.
        c.undrain("web", ip("198.18.11.2")).unwrap();
        c.reconcile(&mut r).unwrap();
        assert!(members(&r, 1).contains(&1));
        assert_eq!((r.backends[&1].flags, r.backends[&1].generation), (backend_flags::HEALTHY, b.generation));
        assert!(c.undrain("web", ip("198.18.11.2")).unwrap_err().to_string().contains("not drained"));
    }

    /// Issue #34-1: the addresses a name endpoint resolves to are its backends; a changed
    /// answer is a table change (the address that left departs with the draining time and
    /// keeps its id reserved; the one that stays keeps its id); the monitors' verdicts of the
    /// addresses leave the Degraded ones out while another is up; a name that stopped
    /// resolving has none.
    #[test]
    fn a_name_endpoint_forwards_to_its_resolved_addresses() {
        use crate::config::{Resolution, Resolved};
        let cfg = r#"
            [dataplane]
            maglev_table_size = 251
            [[service]]
            name = "ext"
            vip = "198.18.0.100"
            protocol = "TCP"
            ports = [80]
            routing_method = "PRIORITY"
            [service.connection_draining]
            draining_timeout_sec = 60
            [service.monitor]
            protocol = "TCP"
            port = 80
            [[service.backend]]
            target = "app.example.net"
        "#;
        let mut c = Controller::new(Config::parse(cfg).unwrap());
        let mut r = Recorder { now: 5, ..Default::default() };
        let name = crate::config::DnsName::parse("app.example.net").unwrap();
        assert_eq!(c.endpoint_names(), std::slice::from_ref(&name));
        c.reconcile(&mut r).unwrap();
        assert!(r.tables.values().all(|(_, e)| e.iter().all(|b| *b == BACKEND_DROP)), "nothing resolved yet");
        let answer =
            |addrs: &[&str]| Resolved { addresses: addrs.iter().map(|a| ip(a)).collect(), state: Resolution::Answered };
        // An IPv6 address of the name is not a backend of an IPv4 VIP.
        assert!(c.set_resolved(&name, answer(&["198.18.21.2", "198.18.21.1", "2001:db8::21"])));
        assert!(!c.set_resolved(&name, answer(&["198.18.21.1", "198.18.21.2"])), "same set: no change");
        c.reconcile(&mut r).unwrap();
        let id = |c: &Controller, a: &str| c.ids.backend_id("ext", ip(a)).unwrap();
        let (one, two) = (id(&c, "198.18.21.1"), id(&c, "198.18.21.2"));
        let table = |r: &Recorder| -> BTreeSet<u32> {
            r.tables.values().flat_map(|(_, e)| e.iter().copied()).filter(|b| *b != BACKEND_DROP).collect()
        };
        assert_eq!(table(&r), BTreeSet::from([one, two]));
        assert_eq!(r.backends[&one].addr[0], u32::from_be_bytes([198, 18, 21, 1]).to_be());
        // The answer changes: .1 departs (draining), .2 keeps its id, .3 is new.
        assert!(c.set_resolved(&name, answer(&["198.18.21.2", "198.18.21.3"])));
        let rep = c.reconcile(&mut r).unwrap();
        assert_eq!(rep.backends_departed, 1);
        let three = id(&c, "198.18.21.3");
        assert_eq!(id(&c, "198.18.21.2"), two);
        assert_eq!(table(&r), BTreeSet::from([two, three]));
        assert_eq!(r.backends[&one].flags & backend_flags::REMOVED, backend_flags::REMOVED);
        assert_eq!(r.backends[&one].drain_deadline_ns, 5 + 60 * 1_000_000_000);
        // Probed at each address: a Degraded one leaves while the other is Online.
        c.set_checked("ext", ip("198.18.21.2"), false);
        c.set_checked("ext", ip("198.18.21.3"), true);
        c.reconcile(&mut r).unwrap();
        assert_eq!(table(&r), BTreeSet::from([three]));
        let (eff, probes) = c.routing_view();
        assert_eq!(probes.get(0, 0), MonitorStatus::Online);
        assert_eq!(eff.services[0].backends[0].addresses(), [ip("198.18.21.3")]);
        // Both Degraded: the endpoint is Degraded, and best effort keeps both.
        c.set_checked("ext", ip("198.18.21.3"), false);
        c.reconcile(&mut r).unwrap();
        assert_eq!(table(&r), BTreeSet::from([two, three]));
        assert_eq!(c.routing_view().1.get(0, 0), MonitorStatus::Degraded);
        // The last answer kept while resolution fails: nothing changes in the tables.
        let kept = Resolved {
            addresses: vec![ip("198.18.21.2"), ip("198.18.21.3")],
            state: Resolution::Kept("SERVFAIL".into()),
        };
        assert!(c.set_resolved(&name, kept));
        assert_eq!(c.reconcile(&mut r).unwrap().tables_written, 0);
        // Then the name has no address: nothing to forward to; the verdicts of the addresses go.
        assert!(c.set_resolved(&name, Resolved { addresses: vec![], state: Resolution::Failed("SERVFAIL".into()) }));
        c.reconcile(&mut r).unwrap();
        assert!(table(&r).is_empty());
        assert_eq!(c.checker_verdict("ext", ip("198.18.21.2")), None);
        // A reload keeps what the name resolved to; one without the name forgets it.
        assert!(c.set_resolved(&name, answer(&["198.18.21.4"])));
        c.replace_config(
            Config::parse(&cfg.replace("draining_timeout_sec = 60", "draining_timeout_sec = 30")).unwrap(),
        );
        assert_eq!(c.config().services[0].backends[0].addresses(), [ip("198.18.21.4")]);
        c.replace_config(Config::parse(&cfg.replace("app.example.net", "other.example.net")).unwrap());
        assert!(c.config().services[0].backends[0].addresses().is_empty());
        assert!(!c.set_resolved(&name, answer(&["198.18.21.5"])), "a late answer for a name no longer configured");
    }

    #[test]
    fn reload_removing_a_backend_keeps_ids_of_the_others_stable() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder::default();
        c.reconcile(&mut r).unwrap();
        // Remove the first backend and reorder: ids follow addresses, not positions.
        let cfg = CFG.replace("address = \"198.18.11.1\"", "address = \"198.18.11.9\"");
        c.replace_config(Config::parse(&cfg).unwrap());
        let rep = c.reconcile(&mut r).unwrap();
        assert_eq!(rep.backends_departed, 1);
        assert_eq!(r.backends[&0].flags & backend_flags::REMOVED, backend_flags::REMOVED, "11.1 departed");
        assert_eq!(members(&r, 1), BTreeSet::from([1, 3]), "11.2 keeps id 1; 11.9 is new (3)");
    }

    #[test]
    fn reload_that_does_not_fit_changes_nothing() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder { max_services: Some(1), ..Default::default() };
        c.reconcile(&mut r).unwrap();
        c.set_checked("web", ip("198.18.11.2"), false);
        c.set_override("web", ip("198.18.12.1"), Some(true)).unwrap();
        c.drain("web", ip("198.18.11.1")).unwrap();
        c.reconcile(&mut r).unwrap();
        let (writes, tables, backends) = (r.writes, r.tables.clone(), r.backends.clone());
        let gens = c.persistent_state().pools;
        // A renamed service gets a new id while the old one's draining backend keeps id 0
        // reserved: id 1 is beyond what the recorder holds.
        let renamed = CFG.replace("name = \"web\"", "name = \"shop\"");
        let err = c.reload(Config::parse(&renamed).unwrap(), &mut r).unwrap_err();
        assert!(format!("{err:#}").contains("out of range"), "{err:#}");
        assert_eq!(r.writes, writes, "nothing written");
        assert_eq!((r.tables.clone(), r.backends.clone()), (tables, backends));
        assert_eq!(c.config().services[0].name, "web");
        assert_eq!(c.checker_verdict("web", ip("198.18.11.2")), Some(false), "health verdict kept");
        assert_eq!(c.override_of("web", ip("198.18.12.1")), Some(true), "override kept");
        assert!(c.is_drained("web", ip("198.18.11.1")), "drain kept");
        assert_eq!(c.persistent_state().pools, gens, "no pool generation bumped");
        // The refused change left the controller as it was: nothing more to write.
        assert_eq!(c.reconcile(&mut r).unwrap(), ReconcileReport::default());
    }

    #[test]
    fn a_reused_backend_id_gets_a_new_generation() {
        let mut c = Controller::new(
            Config::parse(&CFG.replace("draining_timeout_sec = 300", "draining_timeout_sec = 0")).unwrap(),
        );
        let mut r = Recorder { now: 1_000, ..Default::default() };
        c.reconcile(&mut r).unwrap();
        let first = r.backends[&1];
        // 11.2 leaves the configuration (no draining), 12.2 joins later.
        let without = CFG
            .replace("draining_timeout_sec = 300", "draining_timeout_sec = 0")
            .replace("address = \"198.18.11.2\"", "address = \"198.18.11.3\"");
        c.reload(Config::parse(&without).unwrap(), &mut r).unwrap();
        assert_eq!(r.backends[&1].generation, first.generation, "the departed record keeps its generation");
        assert_eq!(r.backends[&1].flags & backend_flags::REMOVED, backend_flags::REMOVED);
        let cfg = without.clone() + "\n[[service.backend]]\naddress = \"198.18.12.2\"\nzone = \"zone-b\"\n";
        c.reload(Config::parse(&cfg).unwrap(), &mut r).unwrap();
        assert_eq!(c.applied().unwrap().services[0].backend_ids, vec![0, 3, 2, 1], "12.2 reuses id 1");
        let second = r.backends[&1];
        assert_eq!(second.addr[0], u32::from_ne_bytes([198, 18, 12, 2]));
        assert_ne!(second.generation, first.generation, "entries made for 11.2 are not valid for 12.2");
        // Ids that stay keep their generation.
        assert_eq!(r.backends[&0].generation, 1);
        let restored = Ids::from_snapshot(&c.persistent_state().ids);
        assert_eq!(restored.backend_generation(1), second.generation, "generations survive a restart");
    }

    #[test]
    fn overrides_and_drains_survive_a_restart() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder::default();
        c.reconcile(&mut r).unwrap();
        c.set_override("web", ip("198.18.12.1"), Some(false)).unwrap();
        c.drain("web", ip("198.18.11.2")).unwrap();
        c.reconcile(&mut r).unwrap();
        let text = serde_json::to_string(&c.persistent_state()).unwrap();
        let mut next = Controller::new(Config::parse(CFG).unwrap());
        next.restore(&serde_json::from_str(&text).unwrap());
        assert_eq!(next.override_of("web", ip("198.18.12.1")), Some(false));
        assert!(next.is_drained("web", ip("198.18.11.2")));
        // A restart with a configuration that no longer has the drained backend forgets it.
        let mut fewer = Controller::new(
            Config::parse(&CFG.replace("address = \"198.18.11.2\"", "address = \"198.18.11.3\"")).unwrap(),
        );
        fewer.restore(&serde_json::from_str(&text).unwrap());
        assert!(!fewer.is_drained("web", ip("198.18.11.2")));
        // An older daemon's state has neither field.
        let old: PersistentState =
            serde_json::from_str(r#"{"ids":{"services":[],"backends":[]},"pools":[],"checked":[]}"#).unwrap();
        assert!(old.overrides.is_empty() && old.drained.is_empty() && old.ids.generations.is_empty());
        // Nor pool change times: a changed pool's drain counts from the first reconcile.
        let old: PersistentState =
            serde_json::from_str(r#"{"ids":{"services":[],"backends":[]},"pools":[["web","All",3]],"checked":[]}"#)
                .unwrap();
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        c.restore(&old);
        let mut r = Recorder { now: 7_000, ..Default::default() };
        c.reconcile(&mut r).unwrap();
        assert_eq!(c.next_pool_drain_end(), Some(7_000 + POOL_CHANGE_DRAIN_NS));
    }

    #[test]
    fn state_files_keep_backend_keys_as_arrays() {
        // What a daemon before `BackendKey` wrote: every backend key a flat JSON array.
        let text = r#"{"ids":{"services":[["web",0]],"backends":[["web","198.18.11.1",0],["web","198.18.11.2",1],["web","198.18.12.1",2]],"generations":[[0,1],[1,1],[2,1]]},"pools":[["web","All",0]],"checked":[["web","198.18.11.1",false]],"overrides":[["web","198.18.12.1",true]],"drained":[["web","198.18.11.2"]],"pool_changed_ns":[]}"#;
        let old: PersistentState = serde_json::from_str(text).unwrap();
        assert_eq!(old.checked, vec![(BackendKey::new("web", ip("198.18.11.1")), false)]);
        assert_eq!(old.ids.backends[1], (BackendKey::new("web", ip("198.18.11.2")), 1));
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        c.restore(&old);
        assert_eq!(c.checker_verdict("web", ip("198.18.11.1")), Some(false));
        assert_eq!(c.override_of("web", ip("198.18.12.1")), Some(true));
        assert!(c.is_drained("web", ip("198.18.11.2")));
        assert_eq!(c.ids.backend_id("web", ip("198.18.12.1")), Some(2));
        // And a state written now reads the same way (the wire format did not change; it only
        // says that its verdicts are complete).
        let mut again: serde_json::Value = serde_json::to_value(c.persistent_state()).unwrap();
        assert_eq!(again.as_object_mut().unwrap().remove("first_verdicts"), Some(true.into()));
        assert_eq!(again, serde_json::from_str::<serde_json::Value>(text).unwrap());
    }

    const FAILOVER: &str = r#"
        [dataplane]
        maglev_table_size = 251
        [[service]]
        name = "db"
        vip = "198.18.0.100"
        protocol = "TCP"
        ports = [5432]
        [[service.backend]]
        address = "198.18.11.1"
        [[service.backend]]
        address = "198.18.11.2"
        failover = true
        [service.failover_policy]
    "#;

    /// A connection-table entry keeps 16 bits of the pool generation: the generation the
    /// data plane is given wraps there, also one restored from an older daemon's state.
    #[test]
    fn pool_generations_wrap_at_2_16() {
        let mut c = Controller::new(Config::parse(FAILOVER).unwrap());
        let mut r = Recorder { now: 1_000, ..Default::default() };
        c.reconcile(&mut r).unwrap();
        let mut st = c.persistent_state();
        for p in &mut st.pools {
            p.2 = 0x1_fffe;
        }
        let mut c = Controller::new(Config::parse(FAILOVER).unwrap());
        c.restore(&st);
        c.reconcile(&mut r).unwrap();
        let info = |r: &Recorder| *r.services.values().next().unwrap();
        assert_eq!(info(&r).pool_gen, 0xfffe);
        c.set_checked("db", ip("198.18.11.1"), false);
        c.reconcile(&mut r).unwrap();
        assert_eq!(info(&r).pool_gen, 0xffff);
        c.set_checked("db", ip("198.18.11.1"), true);
        c.reconcile(&mut r).unwrap();
        assert_eq!(info(&r).pool_gen, 0, "wrapped");
        assert_eq!(c.persistent_state().pools[0].2, 0);
    }

    #[test]
    fn entries_of_the_previous_pool_are_void_ten_minutes_after_the_change() {
        let mut c = Controller::new(Config::parse(FAILOVER).unwrap());
        let mut r = Recorder { now: 1_000, ..Default::default() };
        c.reconcile(&mut r).unwrap();
        let info = |r: &Recorder| *r.services.values().next().unwrap();
        assert_eq!(c.next_pool_drain_end(), None, "no pool change yet");
        // The primary fails: failover pool, a new generation, and the 10-minute drain runs.
        c.set_checked("db", ip("198.18.11.1"), false);
        r.now = 5_000;
        c.reconcile(&mut r).unwrap();
        assert_eq!((info(&r).pool_gen, info(&r).flags & service_flags::POOL_DRAIN_OVER), (1, 0));
        let end = 5_000 + POOL_CHANGE_DRAIN_NS;
        assert_eq!(c.next_pool_drain_end(), Some(end));
        r.now = end - 1;
        c.reconcile(&mut r).unwrap();
        assert_eq!(info(&r).flags & service_flags::POOL_DRAIN_OVER, 0, "still draining");
        r.now = end;
        c.reconcile(&mut r).unwrap();
        assert_ne!(
            info(&r).flags & service_flags::POOL_DRAIN_OVER,
            0,
            "drain over: the data plane voids generation-0 entries"
        );
        assert_eq!(c.next_pool_drain_end(), None);
        // With disable_connection_drain_on_failover the flush is immediate and no drain runs.
        let flush = FAILOVER.to_owned() + "disable_connection_drain_on_failover = true\n";
        let mut c = Controller::new(Config::parse(&flush).unwrap());
        c.reconcile(&mut r).unwrap();
        c.set_checked("db", ip("198.18.11.1"), false);
        c.reconcile(&mut r).unwrap();
        assert_ne!(info(&r).flags & service_flags::FLUSH_ON_POOL_CHANGE, 0);
        assert_eq!(c.next_pool_drain_end(), None);
    }

    #[test]
    fn a_re_enabled_endpoint_starts_over_as_checking_endpoint() {
        let profile = |status: &str| {
            format!(
                "[[service]]\nname = \"tm\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\nrouting_method = \"PRIORITY\"\n\
                 [[service.backend]]\nname = \"e1\"\naddress = \"198.18.11.1\"\npriority = 1\n{status}\n\
                 [[service.backend]]\nname = \"e2\"\naddress = \"198.18.11.2\"\npriority = 2\n"
            )
        };
        let mut c = Controller::new(Config::parse(&profile("")).unwrap());
        c.set_checked("tm", ip("198.18.11.1"), false);
        c.set_checked("tm", ip("198.18.11.2"), true);
        assert_eq!(c.monitor_status("tm", ip("198.18.11.1")), MonitorStatus::Degraded);
        c.replace_config(Config::parse(&profile("endpoint_status = \"Disabled\"")).unwrap());
        c.replace_config(Config::parse(&profile("")).unwrap());
        assert_eq!(c.monitor_status("tm", ip("198.18.11.1")), MonitorStatus::CheckingEndpoint, "just enabled");
        assert_eq!(c.monitor_status("tm", ip("198.18.11.2")), MonitorStatus::Online, "the other keeps its verdict");
    }

    #[test]
    fn a_reload_that_fails_midway_is_repaired_to_the_previous_state() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder::default();
        c.reconcile(&mut r).unwrap();
        let before = (r.tables.clone(), r.services.clone(), r.prefixes.clone(), r.backends.clone());
        // The reload adds a backend to web (its tables change) and a service; the second table
        // write of the change fails, after the first one is live.
        let next = CFG.to_owned()
            + "\n[[service.backend]]\naddress = \"198.18.12.2\"\nzone = \"zone-b\"\n\
               [[service]]\nname = \"api\"\nvip = \"198.18.0.101\"\nprotocol = \"TCP\"\nports = [443]\n\
               [[service.backend]]\naddress = \"198.18.13.1\"\nzone = \"zone-a\"\n";
        r.fail = Some(("write_table", 1));
        let err = c.reload(Config::parse(&next).unwrap(), &mut r).unwrap_err();
        assert!(format!("{err:#}").contains("injected failure"), "{err:#}");
        assert_eq!(c.config().services.len(), 1, "the previous configuration is back");
        // (The recorder keeps an empty prefix list for a service whose prefixes were removed.)
        r.prefixes.retain(|_, p| !p.is_empty());
        assert_eq!(
            (&r.tables, &r.services, &r.prefixes),
            (&before.0, &before.1, &before.2),
            "the repair rewrote what was written"
        );
        for (id, b) in &r.backends {
            match before.3.get(id) {
                Some(was) => assert_eq!(b, was, "backend {id}"),
                None => assert_ne!(
                    b.flags & backend_flags::REMOVED,
                    0,
                    "a record written for the failed change is flagged removed: {id}"
                ),
            }
        }
        // And the change applies when it can.
        c.reload(Config::parse(&next).unwrap(), &mut r).unwrap();
        assert_eq!(r.services.len(), 2);
    }

    /// Failures late in a change (after keys were removed, after backends were flagged
    /// removed) are repaired too: what the failed change took away comes back.
    #[test]
    fn a_reload_that_fails_late_gets_back_what_it_removed() {
        let api = "\n[[service]]\nname = \"api\"\nvip = \"198.18.0.101\"\nprotocol = \"TCP\"\nports = [443]\n\
                   [[service.backend]]\naddress = \"198.18.13.1\"\nzone = \"zone-a\"\n";
        let both = CFG.to_owned() + api;
        // web without two of its backends, api gone.
        let smaller = CFG
            .replace("[[service.backend]]\n        address = \"198.18.11.1\"\n        zone = \"zone-a\"\n", "")
            .replace("[[service.backend]]\n        address = \"198.18.11.2\"\n        zone = \"zone-a\"\n", "");
        assert_eq!(Config::parse(&smaller).unwrap().services[0].backends.len(), 1, "{smaller}");
        for fail in [("remove_tables", 0), ("set_backend", 1)] {
            let mut c = Controller::new(Config::parse(&both).unwrap());
            let mut r = Recorder { now: 1_000, ..Default::default() };
            c.reconcile(&mut r).unwrap();
            let before = (r.tables.clone(), r.services.clone(), r.backends.clone());
            r.fail = Some(fail);
            let err = c.reload(Config::parse(&smaller).unwrap(), &mut r).unwrap_err();
            assert!(format!("{err:#}").contains("injected failure"), "{fail:?}: {err:#}");
            assert_eq!(r.services, before.1, "{fail:?}: api's keys are back");
            assert_eq!(r.tables, before.0, "{fail:?}: every table as before");
            assert_eq!(r.backends, before.2, "{fail:?}: no backend left flagged removed");
        }
    }

    #[test]
    fn removed_service_loses_its_keys() {
        let mut c = Controller::new(Config::parse(CFG).unwrap());
        let mut r = Recorder::default();
        c.reconcile(&mut r).unwrap();
        assert_eq!(r.services.len(), 1);
        let cfg = Config::parse("[[zone]]\nname = \"zone-a\"\nclient_prefixes = [\"198.18.1.0/24\"]\n").unwrap();
        c.replace_config(cfg);
        let rep = c.reconcile(&mut r).unwrap();
        assert_eq!(rep.services_removed, 1);
        assert!(r.services.is_empty() && r.tables.is_empty());
    }
}
