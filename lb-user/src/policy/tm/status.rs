//! Effective endpoint status and the common availability rule (spec §2.2): probe results come
//! in from outside (`ProbeStatuses`), everything else (endpoint Disabled, profile Disabled,
//! alwaysServe, nested endpoints) is derived here.

use super::monitor::{nested_endpoint_status, profile_monitor_status};
use super::ranges::Family;
use crate::config::{Config, Service};
use crate::model::{AdminStatus, MonitorStatus, ProfileMonitorStatus};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

pub use crate::config::MAX_NESTING_DEPTH;

/// The last probe-derived monitor status of every probed endpoint, `[service][backend]`. The
/// entries of nested, disabled and alwaysServe endpoints are ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeStatuses {
    by_service: Vec<Vec<MonitorStatus>>,
}

impl ProbeStatuses {
    /// Every endpoint of every service starts as `initial`.
    pub fn new(cfg: &Config, initial: MonitorStatus) -> Self {
        Self { by_service: cfg.services.iter().map(|s| vec![initial; s.backends.len()]).collect() }
    }

    pub fn get(&self, service: usize, backend: usize) -> MonitorStatus {
        self.by_service.get(service).and_then(|s| s.get(backend)).copied().unwrap_or(MonitorStatus::CheckingEndpoint)
    }

    /// Sets one endpoint by index; false if there is no such endpoint.
    pub fn set_index(&mut self, service: usize, backend: usize, status: MonitorStatus) -> bool {
        match self.by_service.get_mut(service).and_then(|s| s.get_mut(backend)) {
            Some(slot) => {
                *slot = status;
                true
            }
            None => false,
        }
    }

    /// Sets one endpoint by service name and endpoint label (`Backend::label`).
    pub fn set(&mut self, cfg: &Config, service: &str, endpoint: &str, status: MonitorStatus) -> Result<(), String> {
        let s = cfg.service_index(service).ok_or_else(|| format!("no service {service:?}"))?;
        let b = cfg.services[s]
            .backend_index(endpoint)
            .ok_or_else(|| format!("service {service:?} has no endpoint {endpoint:?}"))?;
        self.set_index(s, b, status);
        Ok(())
    }
}

/// Monitor statuses under which an endpoint may be returned without the all-degraded rule.
pub fn is_routable(status: MonitorStatus) -> bool {
    matches!(status, MonitorStatus::Online | MonitorStatus::CheckingEndpoint | MonitorStatus::Unmonitored)
}

/// An endpoint status memo key: (service, endpoint, record type, nesting depth).
type EndpointAt = (usize, usize, Option<Family>, usize);

/// Read-only view of a configuration plus probe results: statuses and availability.
///
/// Statuses are memoized per view: a nested endpoint's status reads every endpoint of its child
/// (and the child's profile status reads them again), so without the memo a tree of services
/// that each nest several children of the next level costs exponential time in its depth. With
/// it, each (service, endpoint, record type, depth) is evaluated once.
#[derive(Clone, Debug)]
pub struct Statuses<'a> {
    pub cfg: &'a Config,
    pub probes: &'a ProbeStatuses,
    endpoints: RefCell<HashMap<EndpointAt, MonitorStatus>>,
    profiles: RefCell<HashMap<(usize, usize), ProfileMonitorStatus>>,
    work: Cell<u64>,
}

impl<'a> Statuses<'a> {
    pub fn new(cfg: &'a Config, probes: &'a ProbeStatuses) -> Self {
        Self { cfg, probes, endpoints: RefCell::default(), profiles: RefCell::default(), work: Cell::new(0) }
    }

    /// Evaluations done through this view so far: endpoint and profile statuses computed (not
    /// answered from the memo) and selection steps. A measure of work for tests.
    pub fn work(&self) -> u64 {
        self.work.get()
    }

    pub(super) fn count_work(&self) {
        self.work.set(self.work.get() + 1);
    }

    fn service(&self, svc: usize) -> &'a Service {
        &self.cfg.services[svc]
    }

    /// The endpoint's monitor status as Traffic Manager reports it.
    pub fn endpoint_status(&self, svc: usize, ep: usize) -> MonitorStatus {
        self.endpoint_status_for(svc, ep, None, 0)
    }

    /// Same, with the per-record-type child thresholds of a nested endpoint applied for
    /// `family` (A = V4, AAAA = V6).
    pub fn endpoint_status_for(&self, svc: usize, ep: usize, family: Option<Family>, depth: usize) -> MonitorStatus {
        let key = (svc, ep, family, depth);
        if let Some(&status) = self.endpoints.borrow().get(&key) {
            return status;
        }
        let status = self.evaluate_endpoint(svc, ep, family, depth);
        self.endpoints.borrow_mut().insert(key, status);
        status
    }

    fn evaluate_endpoint(&self, svc: usize, ep: usize, family: Option<Family>, depth: usize) -> MonitorStatus {
        self.count_work();
        let service = self.service(svc);
        let b = &service.backends[ep];
        if service.profile_status() == AdminStatus::Disabled {
            // Vector O6: a disabled profile's endpoints are Inactive.
            return MonitorStatus::Inactive;
        }
        if b.endpoint_status() == AdminStatus::Disabled {
            return MonitorStatus::Disabled;
        }
        if let Some(n) = b.nested() {
            let child = &n.service;
            // Health checks cannot be disabled for nested endpoints: alwaysServe is ignored.
            let Some(c) = self.cfg.service_index(child) else {
                return MonitorStatus::Stopped;
            };
            if depth >= MAX_NESTING_DEPTH {
                return MonitorStatus::Stopped;
            }
            return self.nested_status(c, n, family, depth + 1);
        }
        // An endpoint given by DNS name that no longer resolves has nowhere to go (its last
        // answer was kept for `[resolver] keep_last_answer_sec`): Degraded, alwaysServe or not.
        if let Some(crate::config::Resolution::Failed(_)) = b.name_target().map(|t| &t.resolved.state) {
            return MonitorStatus::Degraded;
        }
        if b.tm().is_some_and(|t| t.always_serve) {
            return MonitorStatus::Unmonitored;
        }
        self.probes.get(svc, ep)
    }

    fn nested_status(
        &self,
        child: usize,
        b: &crate::config::Nested,
        family: Option<Family>,
        depth: usize,
    ) -> MonitorStatus {
        let child_status = self.profile_status_at(child, depth);
        let statuses: Vec<(MonitorStatus, Option<Family>)> = (0..self.service(child).backends.len())
            .map(|e| {
                let cb = &self.service(child).backends[e];
                let fam = cb.address().map(|a| Family::of(&a));
                (self.endpoint_status_for(child, e, family, depth), fam)
            })
            .collect();
        let count = |only: Option<Family>| {
            let relevant = statuses.iter().filter(|(_, f)| only.is_none() || f.is_none() || *f == only);
            let online = relevant
                .clone()
                .filter(|(s, _)| matches!(s, MonitorStatus::Online | MonitorStatus::Unmonitored))
                .count();
            let checking = relevant.filter(|(s, _)| *s == MonitorStatus::CheckingEndpoint).count();
            (online, checking)
        };
        let (online, checking) = count(None);
        let overall = nested_endpoint_status(child_status, online, checking, b.min_child_endpoints.unwrap_or(1));
        let family_min = match family {
            Some(Family::V4) => b.min_child_endpoints_ipv4,
            Some(Family::V6) => b.min_child_endpoints_ipv6,
            None => None,
        };
        match family_min {
            Some(min) => {
                let (online, checking) = count(family);
                let per_family = nested_endpoint_status(child_status, online, checking, min);
                worse(overall, per_family)
            }
            None => overall,
        }
    }

    /// The profile monitor status of a service (spec §2.3).
    pub fn profile_status(&self, svc: usize) -> ProfileMonitorStatus {
        self.profile_status_at(svc, 0)
    }

    fn profile_status_at(&self, svc: usize, depth: usize) -> ProfileMonitorStatus {
        if let Some(&status) = self.profiles.borrow().get(&(svc, depth)) {
            return status;
        }
        self.count_work();
        let service = self.service(svc);
        let status = profile_monitor_status(
            service.profile_status(),
            (0..service.backends.len()).map(|e| self.endpoint_status_for(svc, e, None, depth)),
        );
        self.profiles.borrow_mut().insert((svc, depth), status);
        status
    }

    /// The endpoints a method may return (spec §2.2): enabled, not Stopped/Inactive, and
    /// routable; if none is routable but some are Degraded, every Degraded one (best effort).
    /// In service order.
    pub fn available(&self, svc: usize, family: Option<Family>, depth: usize) -> Vec<usize> {
        let statuses: Vec<(usize, MonitorStatus)> = (0..self.service(svc).backends.len())
            .map(|e| (e, self.endpoint_status_for(svc, e, family, depth)))
            .collect();
        let routable: Vec<usize> = statuses.iter().filter(|(_, s)| is_routable(*s)).map(|(e, _)| *e).collect();
        if !routable.is_empty() {
            return routable;
        }
        statuses.iter().filter(|(_, s)| *s == MonitorStatus::Degraded).map(|(e, _)| *e).collect()
    }
}

/// The less routable of two nested statuses (Online > CheckingEndpoint > Degraded > Stopped).
fn worse(a: MonitorStatus, b: MonitorStatus) -> MonitorStatus {
    let rank = |s| match s {
        MonitorStatus::Online => 3,
        MonitorStatus::CheckingEndpoint => 2,
        MonitorStatus::Degraded => 1,
        _ => 0,
    };
    if rank(a) <= rank(b) {
        a
    } else {
        b
    }
}
