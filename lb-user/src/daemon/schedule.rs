//! When the tables are compiled and written: on the loop for operator actions and reloads, off
//! the loop for health changes (one compile at a time, stale ones discarded); the probes that
//! feed it; and the VIP announcement that follows every reconcile.

use super::*;

impl Daemon {
    /// Reconciles now, on the loop (operator actions, reloads, ends of pool drains: their
    /// answer says how it went). A compile still running off the loop is stale after it.
    pub(super) fn reconcile(&mut self) -> Result<()> {
        self.supersede_compile();
        let result = self.ctl.reconcile(&mut self.dp);
        self.after_reconcile(result.as_ref().ok());
        result.map(|_| ())
    }

    /// A reconcile on the loop covers every change so far: a compile running off the loop is
    /// discarded when it ends, and none needs to follow it.
    pub(super) fn supersede_compile(&mut self) {
        self.compiles.epoch += 1;
        self.compiles.again = false;
    }

    /// Reconciles for a health change with the compile (policy, Maglev tables) off the loop,
    /// so that health events, control requests and signals are served meanwhile. One compile
    /// runs at a time, in order: changes that come in while it runs are taken by one more
    /// compile after it (a newer one supersedes the pending ones).
    pub(super) fn reconcile_soon(&mut self) {
        if self.compiles.running {
            self.compiles.again = true;
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
        let (epoch, done) = (self.compiles.epoch, self.compiles.done.clone());
        self.compiles.running = true;
        tokio::task::spawn_blocking(move || {
            let _ = done.send((epoch, job.run()));
        });
    }

    /// A compile off the loop ended: written unless a reconcile on the loop came since; then
    /// the next one starts if changes came in meanwhile.
    pub(super) fn on_compiled(&mut self, epoch: u64, out: CompileOutput) {
        self.compiles.running = false;
        if epoch == self.compiles.epoch {
            let result = self.ctl.finish_compile(out, &mut self.dp);
            self.after_reconcile(result.as_ref().ok());
            if let Err(e) = result {
                tracing::error!("error applying a health change: {e:#}");
            }
        }
        if std::mem::take(&mut self.compiles.again) {
            self.reconcile_soon();
        }
    }

    /// Republishes the DNS view, logs what was written and saves the state.
    pub(super) fn after_reconcile(&mut self, report: Option<&crate::controller::ReconcileReport>) {
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

    /// A pool-change drain that has ended is written to the data plane. A failure is retried
    /// at every tick but logged once per distinct error.
    pub(super) fn on_tick(&mut self) {
        self.announce();
        self.follow_local_addresses();
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

    /// Frees replaced tables past their handshake window and scans the connection table for
    /// clean Maglev slots when one is due (`Dataplane::maintain_tables`). A failure is logged
    /// once, counted (`slot_scan_failed` in `lb status`) and retried next second; meanwhile
    /// SYNs keep making entries, as they do in every slot not known clean.
    pub(super) fn maintain_tables(&mut self) {
        match self.dp.maintain_tables() {
            Ok(report) => {
                if let Some(r) = report {
                    tracing::debug!(
                        "connection-table scan: {} entries, {} of {} Maglev slots clean",
                        r.entries,
                        r.slots - r.dirty_slots,
                        r.slots
                    );
                }
                self.maintain_error = None;
            }
            Err(e) => {
                super::faults::count(super::faults::Fault::SlotScanFailed);
                let text = format!("{e:#}");
                if self.maintain_error.as_deref() != Some(text.as_str()) {
                    tracing::error!(
                        "scanning the connection table for clean Maglev slots (retried every second): {text}"
                    );
                    self.maintain_error = Some(text);
                }
            }
        }
    }

    /// The host's own addresses, followed every tick while a next-hop service routes prefixes:
    /// one added later (DHCP, an operator) must stay the host's inside a routed prefix, one
    /// removed is no longer exempted.
    fn follow_local_addresses(&mut self) {
        if !self.ctl.has_next_hops() {
            return;
        }
        match crate::config::HostAddrs::current() {
            Ok(host) if self.ctl.set_local_addresses(host.addresses()) => {
                tracing::info!("this host's addresses changed: the next-hop routes exempt the new set");
                self.reconcile_soon();
            }
            Ok(_) => {}
            Err(e) => tracing::warn!("cannot list this host's addresses ({e}); next-hop exemptions unchanged"),
        }
    }

    /// Runs the probes the configuration asks for: one that runs already with the same target
    /// and settings keeps running (a reload does not reset its streak of results); the others
    /// stop, and new ones start from the last verdict known.
    pub(super) fn start_checkers(&mut self) {
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
        super::probe::keep_last_probes(&|s, a| running.iter().any(|(p, _, _)| p.target() == (s, a)));
        self.checkers = running;
    }

    /// A resolution of an endpoint name: counted; a changed answer (or state) is logged and
    /// written at once, and the monitors follow the addresses.
    pub(super) fn on_name(&mut self, ev: names::NameEvent) {
        self.metrics.name_resolution(ev.name.as_str(), ev.error.is_none());
        if !self.ctl.set_resolved(&ev.name, ev.resolved.clone()) {
            if let Some(e) = &ev.error {
                tracing::debug!("endpoint name {}: resolution failed again ({e})", ev.name);
            }
            return;
        }
        names::log_result(&ev);
        if let Err(e) = self.reconcile() {
            tracing::error!("error applying the new addresses of endpoint name {}: {e:#}", ev.name);
        }
        self.start_checkers();
    }

    pub(super) fn on_health(&mut self, ev: HealthEvent) {
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

    /// Brings the announced VIPs in line with what can be served now (a failure is retried at
    /// the next reconcile or tick).
    pub(super) fn announce(&mut self) {
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
}
