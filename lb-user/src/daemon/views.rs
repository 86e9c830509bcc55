//! Views the daemon answers from its state alone: `lb status`, `lb stats` and `lb explain`
//! (replies built from the controller's and the data plane's state, nothing changed). The
//! explanation is shared with the offline CLI so both give the same answer for the same
//! state: `lb explain` against a daemon, and `lb explain --config`.

use crate::compile::explain::{self, Explanation, Flow};
use crate::compile::Compiled;
use crate::config::Config;
use crate::daemon::api::Proto;
use crate::model::Protocol;
use anyhow::{bail, Result};
use std::net::IpAddr;

use super::reply::{
    self, BackendStatus, ClassStats, ClassView, Counters, Health, HealthSource, NextHopView, Role, ServiceStats,
    ServiceStatus, ZoneView,
};
use super::{faults, metrics, Daemon};

/// The flow to explain, as `lb explain` takes it.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowArgs {
    pub service: String,
    pub client: IpAddr,
    /// The destination: a next-hop service's flows need one; a VIP service's is its VIP.
    pub dst: Option<IpAddr>,
    pub sport: Option<u16>,
    pub dport: Option<u16>,
    pub proto: Option<Proto>,
}

/// What a new flow of `args.service` from `args.client` gets with the tables `compiled` of
/// `cfg`. The flow's defaults: source port 40000, the service's first port, its protocol.
pub fn explain(cfg: &Config, compiled: &Compiled, args: &FlowArgs) -> Result<Explanation> {
    let FlowArgs { ref service, client, dst, sport, dport, proto } = *args;
    let service = service.as_str();
    let svc = cfg
        .services
        .iter()
        .find(|s| s.name == service)
        .ok_or_else(|| anyhow::anyhow!("no service named {service:?}"))?;
    let proto =
        match (proto.unwrap_or(if svc.protocol == Protocol::Udp { Proto::Udp } else { Proto::Tcp }), svc.protocol) {
            (Proto::Tcp, _) => lb_common::maps::PROTO_TCP,
            (Proto::Udp, _) => lb_common::maps::PROTO_UDP,
            (Proto::Icmp, Protocol::L3Default) if client.is_ipv4() => libc::IPPROTO_ICMP as u8,
            (Proto::Icmp, Protocol::L3Default) => libc::IPPROTO_ICMPV6 as u8,
            (Proto::Icmp, p) => bail!(
                "--proto icmp: service {service:?} is {}; allowed values: tcp, udp (icmp for L3_DEFAULT services)",
                p.as_str()
            ),
        };
    let dport = dport.or(svc.ports.first().copied()).unwrap_or(0);
    let flow = Flow { client, dst, sport: sport.unwrap_or(40000), dport, proto };
    explain::explain(cfg, compiled, service, &flow)
}

/// A zonal service's eligible set per client zone (none for a Traffic Manager service).
pub(super) fn zone_views(cfg: &Config, c: &crate::compile::CompiledService) -> Vec<ZoneView> {
    let Some(plan) = c.plan.zonal() else { return Vec::new() };
    plan.classes
        .iter()
        .map(|cp| ZoneView {
            client_zone: cp.client_zone.map(|z| cfg.zones[z].name.clone()),
            affinity: cp.outcome.as_str().to_owned(),
            eligible: cp.eligible.iter().map(|&i| c.backend_addrs[i]).collect(),
        })
        .collect()
}

/// A Traffic Manager service's client classes (None for a zonal service).
pub(super) fn class_views(c: &crate::compile::CompiledService) -> Option<Vec<ClassView>> {
    let tm = c.plan.traffic_manager()?;
    let view = |cl: &crate::policy::tm::classes::TmClass| ClassView {
        class: cl.id,
        client_prefixes: tm.prefixes.iter().filter(|(_, c)| *c == cl.id).map(|(n, _)| *n).collect(),
        eligible: cl.eligible.iter().map(|e| e.address).collect(),
        reason: cl.reason.clone(),
    };
    Some(tm.classes.iter().map(view).collect())
}

/// The endpoints of `svc` (service `si`) given by DNS name, with their resolution and monitor
/// status (from `statuses`, over the effective configuration, whose endpoints are found by
/// label).
fn name_views(svc: &crate::config::Service, statuses: &crate::policy::tm::Statuses, si: usize) -> Vec<reply::NameView> {
    use crate::config::Resolution;
    svc.backends
        .iter()
        .filter_map(|b| Some((b, b.name_target()?)))
        .map(|(b, t)| {
            let label = b.label();
            let monitor = statuses.cfg.services.get(si).and_then(|s| s.backend_index(&label));
            reply::NameView {
                endpoint: label,
                target: t.name.to_string(),
                addresses: t.resolved.addresses.clone(),
                resolution: match &t.resolved.state {
                    Resolution::Pending => "pending".to_owned(),
                    Resolution::Answered => "resolved".to_owned(),
                    Resolution::Kept(why) => format!("kept: {why}"),
                    Resolution::Failed(why) => format!("failed: {why}"),
                },
                monitor_status: monitor
                    .map_or_else(|| "-".to_owned(), |bi| statuses.endpoint_status(si, bi).to_string()),
            }
        })
        .collect()
}

impl Daemon {
    pub(super) fn status(&self) -> reply::Status {
        let cfg = self.ctl.config();
        let applied = self.ctl.applied();
        // The endpoints' monitor statuses as the DNS front and the tables see them.
        let (eff, probes) = self.ctl.routing_view();
        let statuses = crate::policy::tm::Statuses::new(&eff, &probes);
        let services = cfg
            .services
            .iter()
            .enumerate()
            .map(|(si, svc)| {
                let compiled = applied.and_then(|a| a.services.iter().find(|s| s.name == svc.name));
                let zonal = compiled.and_then(|c| c.plan.zonal());
                // A nested endpoint has no address of its own: its child service lists its
                // backends.
                let backends = svc
                    .backends
                    .iter()
                    .flat_map(|b| b.addresses().iter().map(move |a| (b, *a)))
                    .map(|(b, address)| {
                        let unchecked = self.ctl.unchecked(&svc.name, address);
                        let source = if self.ctl.override_of(&svc.name, address).is_some() {
                            HealthSource::Override
                        } else if unchecked || self.ctl.checker_verdict(&svc.name, address).is_some() {
                            HealthSource::HealthCheck
                        } else {
                            HealthSource::Initial
                        };
                        let health = match (unchecked, self.ctl.healthy(&svc.name, address)) {
                            (true, _) => Health::Unchecked,
                            (false, true) => Health::Healthy,
                            (false, false) => Health::Unhealthy,
                        };
                        BackendStatus {
                            address,
                            zone: b.zone().map(str::to_owned),
                            role: if b.is_failover() { Role::Failover } else { Role::Primary },
                            health,
                            health_source: source,
                            weight: b.weight,
                            draining: self.ctl.is_drained(&svc.name, address),
                        }
                    })
                    .collect();
                ServiceStatus {
                    name: svc.name.clone(),
                    vip: svc.vip(),
                    next_hop: svc
                        .next_hop()
                        .map(|n| NextHopView { destinations: n.destinations.clone(), symmetric: n.symmetric }),
                    protocol: svc.protocol,
                    ports: svc.ports.clone(),
                    // The zonal pipeline's decision (spec §1.2); a Traffic Manager service has none.
                    eligible_kind: zonal.map(|p| p.kind),
                    rule: zonal.map(|p| p.rule),
                    active_pool: zonal.map(|p| p.active_pool.as_str().to_owned()),
                    backends,
                    zones: compiled.map(|c| zone_views(cfg, c)).unwrap_or_default(),
                    routing_method: svc.routing_method(),
                    // Traffic Manager services: the routing method's client classes.
                    classes: compiled.and_then(class_views),
                    names: name_views(svc, &statuses, si),
                    health_check: super::health::describe_check(svc, &cfg.dataplane),
                }
            })
            .collect();
        let announce = self.announcer.as_ref().map(|a| reply::AnnounceStatus {
            device: a.device().to_owned(),
            table: a.table(),
            draining: a.draining(),
            announced: a.announced().iter().copied().collect(),
        });
        let pins = if self.links.pins_lost.is_empty() {
            "ok".to_owned()
        } else {
            format!("lost: {}", self.links.pins_lost.join(", "))
        };
        reply::Status {
            config: self.args.config.display().to_string(),
            interfaces: self.args.interfaces.clone(),
            links: self.link_status(),
            pins,
            services,
            announce,
            reloads: self.reloads.counts().clone(),
            faults: faults::snapshot(),
            clean_slots: self.dp.clean_slots_report().map(|r| reply::CleanSlots {
                clean: r.slots - r.dirty_slots,
                slots: r.slots,
                entries: r.entries as u64,
            }),
            probes: self.probe_statuses(),
        }
    }

    pub(super) fn stats(&self) -> Result<reply::Stats> {
        let mut st = self.dp.stats()?;
        super::probe_path::add_counters(&mut st.global);
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
                        ServiceStats {
                            name: s.name.clone(),
                            traffic_manager: s.plan.traffic_manager().is_some(),
                            classes,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(reply::Stats { global, services })
    }

    pub(super) fn explain(&self, args: &FlowArgs) -> Result<reply::Explanation> {
        let applied = self.ctl.applied().ok_or_else(|| anyhow::anyhow!("no tables yet"))?;
        explain(self.ctl.config(), applied, args)
    }

    /// One line for `systemctl status`.
    pub(super) fn summary(&self) -> String {
        let services = self.ctl.config().services.len();
        format!(
            "{services} services on {}; control socket {}",
            self.args.interfaces.join(", "),
            self.args.socket.display()
        )
    }

    /// The last probe of every configured backend that was probed.
    fn probe_statuses(&self) -> Vec<reply::ProbeStatus> {
        let cfg = self.ctl.config();
        cfg.services
            .iter()
            .flat_map(|svc| svc.backends.iter().flat_map(|b| b.addresses().iter().map(|a| (svc.name.as_str(), *a))))
            .filter_map(|(service, address)| {
                let p = super::probe::last_probe(service, address)?;
                let last = reply::ProbeResult {
                    passed: p.passed,
                    error: p.error,
                    latency_ms: p.latency.as_secs_f64() * 1000.0,
                    seconds_ago: p.at.elapsed().as_secs(),
                };
                Some(reply::ProbeStatus { service: service.to_owned(), address, last })
            })
            .collect()
    }
}
