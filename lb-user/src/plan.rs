//! `lb plan`: offline rendering of the policy engine's output (table or JSON).
//!
//! Rendering is pure (`render_json`, `render_table`); `run` only loads, plans and prints.
use crate::config::{Config, Service};
use crate::policy::{plan_config, ClassPlan, ServicePlan};
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
}

pub fn run(args: &PlanArgs) -> anyhow::Result<()> {
    let cfg = Config::load(&args.config)?;
    let unhealthy = unhealthy_set(&cfg, &args.unhealthy)
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.config.display()))?;
    let plans = plan_config(&cfg, &|si, bi| {
        !unhealthy.contains(&cfg.services[si].backends[bi].address)
    });
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&render_json(&cfg, &plans))?
        );
    } else {
        print!("{}", render_table(&cfg, &plans));
    }
    Ok(())
}

/// The addresses to mark unhealthy; every one must be a configured backend of some service.
pub fn unhealthy_set(cfg: &Config, addrs: &[IpAddr]) -> anyhow::Result<HashSet<IpAddr>> {
    let known: HashSet<IpAddr> = cfg
        .services
        .iter()
        .flat_map(|s| s.backends.iter().map(|b| b.address))
        .collect();
    let unknown: Vec<String> = addrs
        .iter()
        .filter(|a| !known.contains(a))
        .map(|a| a.to_string())
        .collect();
    if !unknown.is_empty() {
        bail!(
            "--unhealthy {}: not a backend address of any service",
            unknown.join(",")
        );
    }
    Ok(addrs.iter().copied().collect())
}

/// `{"services": [{"name", "eligible_kind", "rule", "active_pool", "zones": [{"client_zone",
/// "affinity", "eligible"}]}]}`; `zones` holds every configured zone, then `client_zone: null`.
pub fn render_json(cfg: &Config, plans: &[ServicePlan]) -> Value {
    let services: Vec<Value> = cfg
        .services
        .iter()
        .zip(plans)
        .map(|(svc, plan)| {
            let zones: Vec<Value> = plan
                .classes
                .iter()
                .map(|class| {
                    json!({
                        "client_zone": class.client_zone.map(|z| cfg.zones[z].name.clone()),
                        "affinity": class.outcome.as_str(),
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
        })
        .collect();
    json!({ "services": services })
}

/// One block per service: a header line, then one row per client class.
pub fn render_table(cfg: &Config, plans: &[ServicePlan]) -> String {
    let mut out = String::new();
    for (i, (svc, plan)) in cfg.services.iter().zip(plans).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&format!(
            "service {} ({} {})  eligible_kind {}  {}: {}  active_pool {}\n",
            svc.name,
            svc.vip,
            svc.protocol,
            plan.kind.as_str(),
            plan.rule.id(),
            plan.rule.reason(),
            plan.active_pool.as_str(),
        ));
        let rows: Vec<[String; 3]> = plan
            .classes
            .iter()
            .map(|class| {
                let zone = match class.client_zone {
                    Some(z) => cfg.zones[z].name.clone(),
                    None => NON_COMPATIBLE_LABEL.to_string(),
                };
                let eligible = addresses(svc, class);
                let eligible = if eligible.is_empty() {
                    "DROP".to_string()
                } else {
                    eligible.join(", ")
                };
                [zone, class.outcome.as_str().to_string(), eligible]
            })
            .collect();
        let header = [
            "CLIENT ZONE".to_string(),
            "AFFINITY".to_string(),
            "ELIGIBLE".to_string(),
        ];
        let width = |col: usize| {
            std::iter::once(&header)
                .chain(&rows)
                .map(|r| r[col].chars().count())
                .max()
                .unwrap_or(0)
        };
        let (w0, w1) = (width(0), width(1));
        for row in std::iter::once(&header).chain(&rows) {
            out.push_str(&format!("  {:<w0$}  {:<w1$}  {}\n", row[0], row[1], row[2]));
        }
    }
    out
}

/// The class's eligible backends as written in the config, in config order.
fn addresses(svc: &Service, class: &ClassPlan) -> Vec<String> {
    class
        .eligible
        .iter()
        .map(|&i| svc.backends[i].address.to_string())
        .collect()
}
