//! `lb plan`: offline rendering of the policy engine's output (table or JSON): per client
//! class the eligible set and the reason, for ZONAL and Traffic Manager services; with
//! `--client IP`, the eligible set a client with that source address gets from each service.
//!
//! Rendering is pure (`render_json`, `render_table`, `client_json`, `client_table`); `run`
//! only loads, plans and prints.
use crate::compile::probes_from_health;
use crate::config::{Config, Service};
use crate::policy::tm::{TmServicePlan, DEFAULT_CLASS};
use crate::policy::{plan_config, ClassPlan, EligibleKind, ServicePlan, ZonalOutcome, ZonalPlan};
use anyhow::bail;
use clap::Args;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;

/// Label of the class of clients outside every zone.
const NON_COMPATIBLE_LABEL: &str = "(non-compatible)";

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Configuration file.
    #[arg(long)]
    pub config: PathBuf,
    /// Backends to treat as unhealthy (comma-separated, repeatable).
    #[arg(long, value_delimiter = ',')]
    pub unhealthy: Vec<std::net::IpAddr>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Only the eligible set each service gives a client with this source address.
    #[arg(long)]
    pub client: Option<IpAddr>,
}

/// Every service's plan (zonal, or a Traffic Manager service's classes), indexed like the
/// services.
pub struct Plans {
    pub services: Vec<ServicePlan>,
}

/// Plans every service with `healthy(service, backend)`; Traffic Manager endpoints are Online
/// when healthy and Degraded otherwise.
pub fn plan_all(cfg: &Config, healthy: &dyn Fn(usize, usize) -> bool) -> Plans {
    let probes = probes_from_health(cfg, healthy);
    Plans { services: plan_config(cfg, healthy, &probes) }
}

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let cfg = Config::load(&args.config)?;
    let unhealthy =
        unhealthy_set(&cfg, &args.unhealthy).map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    let plans = plan_all(&cfg, &|si, bi| {
        let b = &cfg.services[si].backends[bi];
        b.address().is_none_or(|a| !unhealthy.contains(&a))
    });
    if let Some(client) = args.client {
        if args.json {
            println!("{}", serde_json::to_string_pretty(&client_json(&cfg, &plans, client))?);
        } else {
            print!("{}", client_table(&cfg, &plans, client));
        }
        return Ok(());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&render_json(&cfg, &plans))?);
    } else {
        print!("{}", render_table(&cfg, &plans));
    }
    Ok(())
}

/// The addresses to mark unhealthy; every one must be a configured backend of some service.
pub fn unhealthy_set(cfg: &Config, addrs: &[IpAddr]) -> anyhow::Result<HashSet<IpAddr>> {
    let known: HashSet<IpAddr> =
        cfg.services.iter().flat_map(|s| s.backends.iter().filter_map(|b| b.address())).collect();
    let unknown: Vec<String> = addrs.iter().filter(|a| !known.contains(a)).map(|a| a.to_string()).collect();
    if !unknown.is_empty() {
        bail!("--unhealthy {}: not a backend address of any service", unknown.join(","));
    }
    Ok(addrs.iter().copied().collect())
}

/// `{"services": [...]}`. A ZONAL service: `{"name", "eligible_kind", "rule", "active_pool",
/// "zones": [{"client_zone", "affinity", "eligible"}]}` (every configured zone, then
/// `client_zone: null`). A Traffic Manager service: `{"name", "routing_method", "prefixes":
/// [{"prefix", "class"}], "classes": [{"class", "eligible": [{"address", "weight"}],
/// "reason"}]}` (class 0 = sources matching no prefix; empty `eligible` = dropped).
pub fn render_json(cfg: &Config, plans: &Plans) -> Value {
    let services: Vec<Value> = cfg
        .services
        .iter()
        .zip(&plans.services)
        .map(|(svc, plan)| match plan {
            ServicePlan::Zonal(plan) => zonal_json(cfg, svc, plan),
            ServicePlan::TrafficManager(tm) => tm_json(svc, tm),
        })
        .collect();
    json!({ "services": services })
}

fn zonal_json(cfg: &Config, svc: &Service, plan: &ZonalPlan) -> Value {
    let zones: Vec<Value> = plan
        .classes
        .iter()
        .map(|class| {
            json!({
                "client_zone": class.client_zone.map(|z| cfg.zones[z].name.clone()),
                "affinity": class.outcome.as_str(),
                "why": zonal_why(svc, plan, class),
                "spill": class.spill.map(|a| json!({
                    "healthy_in_zone": a.healthy_in_zone,
                    "configured_in_zone": a.relevant_in_zone,
                    "ratio": a.healthy_in_zone as f64 / a.relevant_in_zone as f64,
                    "spillover_ratio": spillover_ratio(svc),
                })),
                "eligible": addresses(svc, class),
            })
        })
        .collect();
    json!({
        "name": svc.name,
        "eligible_kind": plan.kind.as_str(),
        "rule": plan.rule.id(),
        "active_pool": plan.active_pool.as_str(),
        "zones": zones,
    })
}

fn tm_json(svc: &Service, tm: &TmServicePlan) -> Value {
    json!({
        "name": svc.name,
        "routing_method": tm.method.to_string(),
        "prefixes": tm.prefixes.iter().map(|(net, c)| json!({"prefix": net.to_string(), "class": c})).collect::<Vec<_>>(),
        "classes": tm.classes.iter().map(|c| json!({
            "class": c.id,
            "eligible": c.eligible.iter().map(|e| json!({"address": e.address.to_string(), "weight": e.weight})).collect::<Vec<_>>(),
            "reason": c.reason,
        })).collect::<Vec<_>>(),
    })
}

/// One block per service: a header line, then one row per client class (a Traffic Manager
/// service: its prefixes -> classes, then each class's weighted set and reason).
pub fn render_table(cfg: &Config, plans: &Plans) -> String {
    let mut out = String::new();
    for (i, (svc, plan)) in cfg.services.iter().zip(&plans.services).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        match plan {
            ServicePlan::Zonal(plan) => zonal_table(cfg, svc, plan, &mut out),
            ServicePlan::TrafficManager(tm) => tm_table(svc, tm, &mut out),
        }
    }
    out
}

fn tm_table(svc: &Service, tm: &TmServicePlan, out: &mut String) {
    out.push_str(&format!(
        "service {} ({} {})  routing_method {}\n",
        svc.name,
        svc.frontend_text(),
        svc.protocol,
        tm.method
    ));
    for (net, c) in &tm.prefixes {
        out.push_str(&format!("  client {net} -> class {c}\n"));
    }
    for c in &tm.classes {
        let which = if c.id == DEFAULT_CLASS { "class 0 (no prefix)".to_string() } else { format!("class {}", c.id) };
        let set = if c.eligible.is_empty() {
            "DROP (unroutable)".to_string()
        } else {
            c.eligible.iter().map(|e| format!("{} x{}", e.address, e.weight)).collect::<Vec<_>>().join(", ")
        };
        out.push_str(&format!("  {which}: {set}\n    why: {}\n", c.reason));
    }
}

fn zonal_table(cfg: &Config, svc: &Service, plan: &ZonalPlan, out: &mut String) {
    out.push_str(&format!(
        "service {} ({} {})  eligible_kind {}  {}: {}  active_pool {}\n",
        svc.name,
        svc.frontend_text(),
        svc.protocol,
        plan.kind.as_str(),
        plan.rule.id(),
        plan.rule.reason(),
        plan.active_pool.as_str(),
    ));
    let rows: Vec<[String; 4]> = plan
        .classes
        .iter()
        .map(|class| {
            let zone = match class.client_zone {
                Some(z) => cfg.zones[z].name.clone(),
                None => NON_COMPATIBLE_LABEL.to_string(),
            };
            let eligible = addresses(svc, class);
            let eligible = if eligible.is_empty() { "DROP".to_string() } else { eligible.join(", ") };
            [zone, class.outcome.as_str().to_string(), zonal_why(svc, plan, class), eligible]
        })
        .collect();
    let header = ["CLIENT ZONE", "AFFINITY", "WHY", "ELIGIBLE"].map(String::from);
    let width = |col: usize| std::iter::once(&header).chain(&rows).map(|r| r[col].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    for row in std::iter::once(&header).chain(&rows) {
        out.push_str(&format!("  {:<w0$}  {:<w1$}  {:<w2$}  {}\n", row[0], row[1], row[2], row[3]));
    }
}

/// Why zonal affinity left a class's set as it did (spec §1.2 step 2.2), with the ratio test's
/// arithmetic where it decided, e.g. `3/5 = 0.60 < 0.80: spills`.
pub fn zonal_why(svc: &Service, plan: &ZonalPlan, class: &ClassPlan) -> String {
    if let Some(a) = class.spill {
        let r = a.healthy_in_zone as f64 / a.relevant_in_zone as f64;
        let want = spillover_ratio(svc);
        let (op, then) = if class.outcome == ZonalOutcome::Refined { (">=", "stays in zone") } else { ("<", "spills") };
        return format!("{}/{} = {r:.2} {op} {want:.2}: {then}", a.healthy_in_zone, a.relevant_in_zone);
    }
    match class.outcome {
        ZonalOutcome::Disabled => "zonal affinity disabled".into(),
        ZonalOutcome::NotCompatible => "client outside every zone".into(),
        ZonalOutcome::NoZonalMatch => "no backend of the active pool in the zone".into(),
        ZonalOutcome::Refined => "eligible backends in the zone".into(),
        ZonalOutcome::Replaced => "every backend of the zone unhealthy: stays in zone".into(),
        ZonalOutcome::Unchanged if plan.kind == EligibleKind::Drop => "the set is empty (dropped)".into(),
        ZonalOutcome::Unchanged if !plan.kind.is_healthy_set() => "a last-resort set is never refined".into(),
        ZonalOutcome::Unchanged => "no eligible backend in the zone: spills".into(),
    }
}

/// The class's eligible backends as written in the config, in config order.
fn addresses(svc: &Service, class: &ClassPlan) -> Vec<String> {
    class.eligible.iter().filter_map(|&i| svc.backends[i].address()).map(|a| a.to_string()).collect()
}

/// A zonal service's `zonal_affinity.spillover_ratio`.
fn spillover_ratio(svc: &Service) -> f64 {
    svc.zonal().map_or(0.0, |z| z.zonal_affinity.spillover_ratio)
}

/// What one service does for one client source address.
struct ClientView {
    /// The data plane's class id.
    class: u32,
    /// The client's zone (ZONAL services only).
    zone: Option<String>,
    eligible: Vec<String>,
    reason: String,
    /// Where GEOGRAPHIC routing locates the client, and by what (Traffic Manager services that
    /// route by geography).
    location: Option<String>,
}

/// The class a source address falls in for one service (as the kernel's LPM lookup does) and
/// the eligible addresses with the reason.
fn client_view(cfg: &Config, plans: &Plans, si: usize, client: IpAddr) -> ClientView {
    let svc = &cfg.services[si];
    let plan = match &plans.services[si] {
        ServicePlan::Zonal(plan) => plan,
        ServicePlan::TrafficManager(tm) => {
            let class = &tm.classes[tm.class_of(client)];
            let eligible = class.eligible.iter().map(|e| e.address.to_string()).collect();
            let location = crate::policy::tm::client::geo_location(cfg, si, client);
            return ClientView { class: class.id as u32, zone: None, eligible, reason: class.reason.clone(), location };
        }
    };
    // Zonal: the zone whose prefix matches longest (zone prefixes never overlap).
    let zone = cfg
        .zones
        .iter()
        .enumerate()
        .flat_map(|(z, zone)| zone.client_prefixes.iter().map(move |p| (z, p)))
        .filter(|(_, p)| p.contains(&client))
        .max_by_key(|(_, p)| p.prefix_len())
        .map(|(z, _)| z);
    let class = plan
        .classes
        .iter()
        .find(|c| c.client_zone == zone)
        .or_else(|| plan.classes.iter().find(|c| c.client_zone.is_none()));
    let eligible = class.map(|c| addresses(svc, c)).unwrap_or_default();
    let reason = format!(
        "{}: {}; zonal affinity {}",
        plan.rule.id(),
        plan.rule.reason(),
        class.map(|c| c.outcome.as_str()).unwrap_or("-")
    );
    ClientView {
        class: zone.map(crate::compile::zone_class).unwrap_or(lb_common::maps::CLASS_NONE),
        zone: zone.map(|z| cfg.zones[z].name.clone()),
        eligible,
        reason,
        location: None,
    }
}

/// `lb plan --client IP --json`: `{"client", "services": [{"name", "client_class", "client_zone"
/// (ZONAL only), "location" (GEOGRAPHIC routing only: the region and what located the client),
/// "eligible", "reason"}]}`; `client_class` is the data plane's class id.
pub fn client_json(cfg: &Config, plans: &Plans, client: IpAddr) -> Value {
    let services: Vec<Value> = (0..cfg.services.len())
        .map(|si| {
            let ClientView { class, zone, eligible, reason, location } = client_view(cfg, plans, si, client);
            let mut v =
                json!({"name": cfg.services[si].name, "client_class": class, "eligible": eligible, "reason": reason});
            if plans.services[si].zonal().is_some() {
                v["client_zone"] = json!(zone);
            }
            if let Some(location) = location {
                v["location"] = json!(location);
            }
            v
        })
        .collect();
    json!({"client": client.to_string(), "services": services})
}

/// `lb plan --client IP`: one line per service.
pub fn client_table(cfg: &Config, plans: &Plans, client: IpAddr) -> String {
    let mut out = format!("client {client}\n");
    for si in 0..cfg.services.len() {
        let ClientView { class, eligible, reason, location, .. } = client_view(cfg, plans, si, client);
        let set = if eligible.is_empty() { "DROP".to_string() } else { eligible.join(", ") };
        out.push_str(&format!("  {}  class {class}: {set}\n    why: {reason}\n", cfg.services[si].name));
        if let Some(location) = location {
            out.push_str(&format!("    located: {location}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const CFG: &str = r#"
        [[zone]]
        name = "zone-a"
        client_prefixes = ["198.18.1.0/24"]
        [[geo]]
        client_prefixes = ["198.18.1.0/24"]
        region = "IE"
        [[service]]
        name = "web"
        vip = "198.18.0.100"
        protocol = "TCP"
        [service.zonal_affinity]
        spillover = "ZONAL_AFFINITY_STAY_WITHIN_ZONE"
        [[service.backend]]
        address = "198.18.11.1"
        zone = "zone-a"
        [[service.backend]]
        address = "198.18.12.1"
        [[service]]
        name = "geo"
        vip = "198.18.0.4"
        protocol = "TCP"
        routing_method = "GEOGRAPHIC"
        [[service.backend]]
        address = "198.18.13.1"
        geo_mapping = ["IE"]
    "#;

    fn plans(cfg: &Config, unhealthy: &[&str]) -> Plans {
        let bad: Vec<IpAddr> = unhealthy.iter().map(|a| a.parse().unwrap()).collect();
        plan_all(cfg, &|s, b| cfg.services[s].backends[b].address().is_none_or(|a| !bad.contains(&a)))
    }

    #[test]
    fn client_json_for_zonal_and_tm_services() {
        let cfg = Config::parse(CFG).unwrap();
        let v = client_json(&cfg, &plans(&cfg, &[]), "198.18.1.7".parse().unwrap());
        assert_eq!(v["services"][0]["name"], "web");
        assert_eq!(v["services"][0]["client_class"], 1);
        assert_eq!(v["services"][0]["client_zone"], "zone-a");
        assert_eq!(v["services"][0]["eligible"], json!(["198.18.11.1"]));
        assert_eq!(v["services"][1]["name"], "geo");
        assert_eq!(v["services"][1]["eligible"], json!(["198.18.13.1"]));
        assert!(v["services"][1]["reason"].as_str().unwrap().contains("IE"));
        let v = client_json(&cfg, &plans(&cfg, &[]), "198.18.9.9".parse().unwrap());
        assert_eq!(v["services"][0]["client_class"], 0);
        assert_eq!(v["services"][0]["eligible"], json!(["198.18.11.1", "198.18.12.1"]));
        assert_eq!(v["services"][1]["client_class"], 0);
        assert_eq!(v["services"][1]["eligible"], json!([]), "no geo data: NODATA, dropped");
    }

    #[test]
    fn tm_json_and_table_show_classes_and_reasons() {
        let cfg = Config::parse(CFG).unwrap();
        let p = plans(&cfg, &["198.18.13.1"]);
        let v = render_json(&cfg, &p);
        let geo = &v["services"][1];
        assert_eq!(geo["routing_method"], "GEOGRAPHIC");
        assert_eq!(geo["prefixes"], json!([{"prefix": "198.18.1.0/24", "class": 1}]));
        assert_eq!(
            geo["classes"][1]["eligible"],
            json!([{"address": "198.18.13.1", "weight": 1}]),
            "Q3: Degraded still mapped"
        );
        let table = render_table(&cfg, &p);
        assert!(table.contains("client 198.18.1.0/24 -> class 1"), "{table}");
        assert!(table.contains("class 0 (no prefix): DROP (unroutable)"), "{table}");
        assert!(table.contains("CLIENT ZONE"), "zonal block kept: {table}");
    }
}
