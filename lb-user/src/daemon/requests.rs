//! Control requests and reloads: each answered on the loop, operator actions audited and made
//! durable before they are applied.

use super::*;

/// The audit line of an operator action: `reload accepted (SIGHUP)`, `drain refused (service
/// web backend 198.18.11.1): no backend ...`.
fn audit<T>(verb: &str, what: &str, result: &Result<T>) {
    match result {
        Ok(_) => tracing::info!(target: "audit", "{verb} accepted ({what})"),
        Err(e) => tracing::warn!(target: "audit", "{verb} refused ({what}): {e:#}"),
    }
}

impl Daemon {
    /// Answers a control request; `read` is the config file's text for a reload (read off the
    /// loop, see `reload`).
    pub(super) fn handle(&mut self, req: Request, read: Option<&reload::ConfigRead>) -> Response {
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
            Request::Explain { service, client, dst, sport, dport, proto } => {
                let args = super::views::FlowArgs { service, client, dst, sport, dport, proto };
                self.explain(&args).map(Reply::Explain)
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
            Err(e) => Response::failed(&e),
        }
    }

    /// A read of the config file for reloads ended: each reload waiting for it is done (or
    /// refused) and answered.
    pub(super) fn on_config_read(&mut self, read: &reload::ConfigRead) {
        for origin in self.reloads.finished() {
            match origin {
                reload::Origin::GeoIpChanged => {
                    let result = self.reload(read);
                    audit("reload", "the GeoIP database changed", &result);
                }
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
    pub(super) fn reload(&mut self, read: &reload::ConfigRead) -> Result<reply::Reloaded> {
        let result = self.try_reload(read);
        self.metrics.reload(result.is_ok());
        self.reloads.record(&result);
        result
    }

    pub(super) fn try_reload(&mut self, read: &reload::ConfigRead) -> Result<reply::Reloaded> {
        let mut cfg = reload::parse(&self.args.config, read)?;
        warn_notices(&self.args.config, &cfg);
        for line in tunnel_source::fill_defaults(&mut cfg, &self.args.interfaces, tunnel_source::primary_address)? {
            tracing::debug!("{line}");
        }
        reload::check_reloadable(self.dp.sizes(), self.ctl.config(), &cfg)?;
        self.supersede_compile();
        let result = self.ctl.reload(cfg, &mut self.dp);
        self.after_reconcile(result.as_ref().ok());
        result.context("applying the new configuration")?;
        self.names.follow(&self.ctl.endpoint_names(), &self.ctl.config().resolver);
        self.start_checkers();
        tracing::info!("configuration reloaded from {}", self.args.config.display());
        Ok(reply::Reloaded { reloaded: self.args.config.display().to_string() })
    }

    /// What reloading the config file would change; refused as the reload would be.
    pub(super) fn reload_dry_run(&mut self, read: &reload::ConfigRead) -> Result<reply::ReloadPlan> {
        let cfg = reload::parse(&self.args.config, read)?;
        reload::check_reloadable(self.dp.sizes(), self.ctl.config(), &cfg)?;
        let now = self.dp.now_ns()?;
        let next = self.ctl.preview_config(cfg.clone(), now)?;
        self.dp.admit(&next.demand(self.ctl.applied()))?;
        Ok(dry_run::plan(&self.args.config, self.ctl.config(), self.ctl.applied(), &cfg, &next))
    }

    /// `lb backend drain --host`: withdraw every VIP now, keep forwarding what still arrives
    /// for the grace period, then stop as on SIGTERM.
    pub(super) fn host_drain(&mut self, grace_sec: Option<u32>) -> Result<reply::HostDrain> {
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

    /// `lb trace`: the filter written, the traced program attached for `seconds`.
    pub(super) fn trace_start(&mut self, spec: &trace::TraceSpec, seconds: u32) -> Result<trace::TraceState> {
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
    pub(super) fn trace_stop(&mut self, why: &str) -> Result<trace::TraceState> {
        if self.dp.tracing() {
            let pin_dir = self.args.pin_dir.clone();
            self.dp.set_tracing(None, |ifname| pinning::link_pin(&pin_dir, ifname))?;
            tracing::info!("{why}: lb attached again");
        }
        self.trace_until = None;
        Ok(self.trace_state())
    }

    pub(super) fn trace_state(&self) -> trace::TraceState {
        let left = self.trace_until.map(|t| t.saturating_duration_since(std::time::Instant::now()).as_secs() as u32);
        trace::TraceState { tracing: self.dp.tracing(), seconds_left: left, interfaces: self.args.interfaces.clone() }
    }

    /// A trace whose time is over stops (its client may have died).
    pub(super) fn check_trace(&mut self) {
        if self.trace_until.is_some_and(|t| std::time::Instant::now() >= t) {
            if let Err(e) = self.trace_stop("the trace's time is over") {
                tracing::error!("stopping the trace: {e:#}");
            }
        }
    }
}
