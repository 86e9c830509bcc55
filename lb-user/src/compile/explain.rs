//! `lb explain`: which client class a source falls in, the eligible set with its reasons, the
//! Maglev slot a flow hashes to and the backend the data plane picks for a new flow — computed
//! with the very functions and tables the kernel uses (lb-common's hashing, the compiled
//! tables), so the answer agrees with what the XDP program does.

use crate::compile::{Compiled, CompiledService};
use crate::config::Config;
use crate::policy::ServicePlan;
use lb_common::decide::{directionless, hash_tuple};
use lb_common::hash::{flow_hash, maglev_slot};
use lb_common::maps::{addr_words, service_flags, FlowTuple, BACKEND_DROP, CLASS_NONE, PROTO_TCP, PROTO_UDP};
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// A flow to explain. Ports are ignored for protocols without ports.
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    pub client: IpAddr,
    /// The destination: required for a next-hop service; a VIP service's is its VIP (None, or
    /// the VIP itself).
    pub dst: Option<IpAddr>,
    pub sport: u16,
    pub dport: u16,
    pub proto: u8,
}

/// The class the kernel's LPM lookup gives `client` among a service's class prefixes.
pub fn client_class(svc: &CompiledService, client: IpAddr) -> u32 {
    svc.class_prefixes
        .iter()
        .filter(|(net, _)| net.contains(&client))
        .max_by_key(|(net, _)| net.prefix_len())
        .map(|(_, c)| *c)
        .unwrap_or(CLASS_NONE)
}

/// The kernel's choice for a new flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prediction {
    /// The client class whose table was used.
    pub class: u32,
    pub hash: u32,
    /// The Maglev slot the hash picks.
    pub slot: u32,
    /// The backend id in that slot (`BACKEND_DROP` = dropped).
    pub backend: u32,
}

/// The kernel's choice for a new flow.
pub fn predict(svc: &CompiledService, m: u32, vip: IpAddr, flow: &Flow) -> Prediction {
    let class = client_class(svc, flow.client);
    let ports_valid = flow.proto == PROTO_TCP || flow.proto == PROTO_UDP;
    let mut full = FlowTuple {
        src: addr_words(flow.client).0,
        dst: addr_words(vip).0,
        sport: if ports_valid { flow.sport.to_be() } else { 0 },
        dport: if ports_valid { flow.dport.to_be() } else { 0 },
        proto: flow.proto,
        _pad: [0; 3],
    };
    // As the data plane: a symmetric service's packet tuple is ordered before anything is
    // derived from it (lb-ebpf `forward`, the next-hop branch).
    if svc.info.flags & service_flags::SYMMETRIC != 0 {
        directionless(&mut full);
    }
    let hashed = hash_tuple(svc.info.affinity, &full, ports_valid);
    let hash = flow_hash(&hashed);
    let slot = maglev_slot(hash, m);
    // As the kernel: a class without a table uses class 0's.
    let table =
        svc.tables.iter().find(|t| t.class == class).or_else(|| svc.tables.iter().find(|t| t.class == CLASS_NONE));
    let backend = table.map(|t| t.entries[slot as usize]).unwrap_or(BACKEND_DROP);
    Prediction { class, hash, slot, backend }
}

/// What `lb explain` answers (the daemon sends it, the CLI renders it; `--json` prints it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Explanation {
    pub service: String,
    /// The flow's destination: the VIP, or for a next-hop service the `--dst` given.
    pub vip: IpAddr,
    pub client: IpAddr,
    pub client_class: u32,
    /// What the class means: a routing method's source-prefix group, or a client zone.
    #[serde(flatten)]
    pub class: ClassFacts,
    /// The class's eligible set (empty = new flows are dropped).
    pub eligible: Vec<IpAddr>,
    pub session_affinity: String,
    pub hash: u32,
    pub maglev_slot: u32,
    pub table_size: u32,
    /// The backend a new flow gets; None when it is dropped.
    pub backend: Option<IpAddr>,
    pub dropped: bool,
    /// A next-hop service: what the flow's reverse direction (addresses and ports swapped)
    /// gets as a new flow. With symmetric hashing, the same backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reverse: Option<ReverseChoice>,
}

/// The choice for the reverse direction of a next-hop service's flow.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ReverseChoice {
    pub symmetric: bool,
    pub client_class: u32,
    pub hash: u32,
    pub maglev_slot: u32,
    pub backend: Option<IpAddr>,
}

/// The facts of a flow's client class, by kind of service.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ClassFacts {
    /// A Traffic Manager service: a source-prefix group of its routing method.
    TrafficManager {
        client_zone: Option<String>,
        routing_method: String,
        reason: Option<String>,
        /// GEOGRAPHIC routing: the client's region and what located it (a `[[geo]]` prefix or
        /// the GeoIP database's network and record).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        location: Option<String>,
    },
    /// A zonal service: a client zone (None = non-compatible client) and the §1.2 rule.
    Zonal { client_zone: Option<String>, eligible_kind: String, rule: String, reason: String, affinity: Option<String> },
}

/// The full explanation (the CLI renders it).
pub fn explain(cfg: &Config, compiled: &Compiled, service: &str, flow: &Flow) -> anyhow::Result<Explanation> {
    let svc_cfg = cfg
        .services
        .iter()
        .find(|s| s.name == service)
        .ok_or_else(|| anyhow::anyhow!("no service named {service:?}"))?;
    let svc = compiled
        .services
        .iter()
        .find(|s| s.name == service)
        .ok_or_else(|| anyhow::anyhow!("service {service:?} is not installed"))?;
    let dst = match (svc_cfg.vip(), flow.dst) {
        (Some(vip), None) => vip,
        (Some(vip), Some(d)) if d == vip => vip,
        (Some(vip), Some(d)) => anyhow::bail!("--dst {d}: service {service:?} balances its VIP {vip}; omit --dst"),
        (None, Some(d)) if svc_cfg.next_hop().is_some_and(|n| n.destinations.iter().any(|p| p.contains(&d))) => d,
        (None, Some(d)) => {
            anyhow::bail!("--dst {d} is not in the destinations of service {service:?} ({})", svc_cfg.frontend_text())
        }
        (None, None) => anyhow::bail!(
            "--dst: service {service:?} is a {}; give the flow's destination address",
            svc_cfg.frontend_text()
        ),
    };
    if flow.client.is_ipv4() != dst.is_ipv4() {
        anyhow::bail!("client {} and destination {dst} are of different address families", flow.client);
    }
    let m = cfg.dataplane.maglev_table_size;
    let Prediction { class, hash, slot, backend } = predict(svc, m, dst, flow);
    // Backend ids are unique across services (a Traffic Manager class may hold a nested
    // child's backends).
    let addr_of = |id: u32| {
        compiled.services.iter().find_map(|s| s.backend_ids.iter().position(|b| *b == id).map(|i| s.backend_addrs[i]))
    };
    // What the class means: a Traffic Manager class is a source-prefix group of the routing
    // method, a zonal class a client zone.
    let (facts, eligible) = match &svc.plan {
        ServicePlan::TrafficManager(tm) => {
            let c = tm.classes.iter().find(|c| c.id as u32 == class);
            let facts = ClassFacts::TrafficManager {
                client_zone: None,
                routing_method: svc_cfg.routing_method().as_str().to_owned(),
                reason: c.map(|c| c.reason.clone()),
                location: cfg
                    .service_index(service)
                    .and_then(|si| crate::policy::tm::client::geo_location(cfg, si, flow.client)),
            };
            (facts, c.map(|c| c.eligible.iter().map(|e| e.address).collect()).unwrap_or_default())
        }
        ServicePlan::Zonal(plan) => {
            let zone =
                if class == CLASS_NONE { None } else { cfg.zones.get(class as usize - 1).map(|z| z.name.clone()) };
            let class_plan =
                plan.classes.iter().find(|c| c.client_zone.map(|z| z as u32 + 1).unwrap_or(CLASS_NONE) == class);
            let facts = ClassFacts::Zonal {
                client_zone: zone,
                eligible_kind: plan.kind.as_str().to_owned(),
                rule: plan.rule.id().to_owned(),
                reason: plan.rule.reason().to_owned(),
                affinity: class_plan.map(|c| c.outcome.as_str().to_owned()),
            };
            (facts, class_plan.map(|c| c.eligible.iter().map(|&i| svc.backend_addrs[i]).collect()).unwrap_or_default())
        }
    };
    // The reverse direction of a next-hop service's flow: the destination as the client.
    let reverse = svc_cfg.next_hop().map(|n| {
        let back =
            Flow { client: dst, dst: Some(flow.client), sport: flow.dport, dport: flow.sport, proto: flow.proto };
        let p = predict(svc, m, flow.client, &back);
        ReverseChoice {
            symmetric: n.symmetric,
            client_class: p.class,
            hash: p.hash,
            maglev_slot: p.slot,
            backend: if p.backend == BACKEND_DROP { None } else { addr_of(p.backend) },
        }
    });
    Ok(Explanation {
        service: service.to_owned(),
        vip: dst,
        client: flow.client,
        client_class: class,
        class: facts,
        eligible,
        session_affinity: svc_cfg.session_affinity.as_str().to_owned(),
        hash,
        maglev_slot: slot,
        table_size: cfg.dataplane.maglev_table_size,
        backend: if backend == BACKEND_DROP { None } else { addr_of(backend) },
        dropped: backend == BACKEND_DROP,
        reverse,
    })
}
