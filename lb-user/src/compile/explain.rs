//! `lb explain`: which client class a source falls in, the eligible set with its reasons, the
//! Maglev slot a flow hashes to and the backend the data plane picks for a new flow — computed
//! with the very functions and tables the kernel uses (lb-common's hashing, the compiled
//! tables), so the answer agrees with what the XDP program does.

use crate::compile::{Compiled, CompiledService};
use crate::config::Config;
use lb_common::decide::hash_tuple;
use lb_common::hash::{flow_hash, maglev_slot};
use lb_common::maps::{addr_words, FlowTuple, BACKEND_DROP, CLASS_NONE, PROTO_TCP, PROTO_UDP};
use serde_json::{json, Value};
use std::net::IpAddr;

/// A flow to explain. Ports are ignored for protocols without ports.
#[derive(Clone, Debug, PartialEq)]
pub struct Flow {
    pub client: IpAddr,
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
    let full = FlowTuple {
        src: addr_words(flow.client).0,
        dst: addr_words(vip).0,
        sport: if ports_valid { flow.sport.to_be() } else { 0 },
        dport: if ports_valid { flow.dport.to_be() } else { 0 },
        proto: flow.proto,
        _pad: [0; 3],
    };
    let hash = flow_hash(&hash_tuple(svc.info.affinity, &full, ports_valid));
    let slot = maglev_slot(hash, m);
    // As the kernel: a class without a table uses class 0's.
    let table =
        svc.tables.iter().find(|t| t.class == class).or_else(|| svc.tables.iter().find(|t| t.class == CLASS_NONE));
    let backend = table.map(|t| t.entries[slot as usize]).unwrap_or(BACKEND_DROP);
    Prediction { class, hash, slot, backend }
}

/// The full explanation as JSON (the CLI renders it).
pub fn explain(cfg: &Config, compiled: &Compiled, service: &str, flow: &Flow) -> anyhow::Result<Value> {
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
    if flow.client.is_ipv4() != svc_cfg.vip.is_ipv4() {
        anyhow::bail!("client {} and VIP {} are of different address families", flow.client, svc_cfg.vip);
    }
    let Prediction { class, hash, slot, backend } = predict(svc, cfg.dataplane.maglev_table_size, svc_cfg.vip, flow);
    // Backend ids are unique across services (a Traffic Manager class may hold a nested
    // child's backends).
    let addr_of = |id: u32| {
        compiled
            .services
            .iter()
            .find_map(|s| s.backend_ids.iter().position(|b| *b == id).map(|i| s.backend_addrs[i].to_string()))
    };
    // What the class means: a Traffic Manager class is a source-prefix group of the routing
    // method, a zonal class a client zone.
    let class_fields = if let Some(tm) = &svc.tm {
        let c = tm.classes.iter().find(|c| c.id as u32 == class);
        json!({
            "client_zone": null,
            "routing_method": svc_cfg.routing_method.as_str(),
            "reason": c.map(|c| c.reason.clone()),
            "eligible": c.map(|c| c.eligible.iter().map(|e| e.address.to_string()).collect::<Vec<_>>()).unwrap_or_default(),
        })
    } else {
        let zone = if class == CLASS_NONE { None } else { cfg.zones.get(class as usize - 1).map(|z| z.name.clone()) };
        let class_plan =
            svc.plan.classes.iter().find(|c| c.client_zone.map(|z| z as u32 + 1).unwrap_or(CLASS_NONE) == class);
        json!({
            "client_zone": zone,
            "eligible_kind": svc.plan.kind.as_str(),
            "rule": svc.plan.rule.id(),
            "reason": svc.plan.rule.reason(),
            "affinity": class_plan.map(|c| c.outcome.as_str()),
            "eligible": class_plan.map(|c| c.eligible.iter().map(|&i| svc.backend_addrs[i].to_string()).collect::<Vec<_>>()).unwrap_or_default(),
        })
    };
    let object = |v: Value| match v {
        Value::Object(m) => m,
        _ => unreachable!("json! of braces makes an object"),
    };
    let mut out = object(json!({
        "service": service,
        "vip": svc_cfg.vip.to_string(),
        "client": flow.client.to_string(),
        "client_class": class,
    }));
    out.extend(object(class_fields));
    out.extend(object(json!({
        "session_affinity": svc_cfg.session_affinity.as_str(),
        "hash": hash,
        "maglev_slot": slot,
        "table_size": cfg.dataplane.maglev_table_size,
        "backend": if backend == BACKEND_DROP { None } else { addr_of(backend) },
        "dropped": backend == BACKEND_DROP,
    })));
    Ok(Value::Object(out))
}
