//! `lb reload --dry-run`: what a reload would change, from the controller's preview of the new
//! configuration (`Controller::preview_config`) against what it last wrote.

use super::reply::{ChangeKind, EligibleChange, ReloadPlan, ServiceChange};
use super::views::{class_views, zone_views};
use crate::compile::tables_to_write;
use crate::compile::{Compiled, CompiledService};
use crate::config::Config;
use std::net::IpAddr;
use std::path::Path;

/// The eligible set per client zone (zonal) or class (Traffic Manager), labelled.
fn eligible_sets(cfg: &Config, svc: &CompiledService) -> Vec<(String, Vec<IpAddr>)> {
    match class_views(svc) {
        Some(classes) => classes.into_iter().map(|c| (format!("class {}", c.class), c.eligible)).collect(),
        None => zone_views(cfg, svc)
            .into_iter()
            .map(|z| (z.client_zone.map_or_else(|| "(non-compatible)".to_owned(), |z| format!("zone {z}")), z.eligible))
            .collect(),
    }
}

/// The changes from `old` (compiled from `old_cfg`; None before the first tables) to `new`
/// (compiled from `new_cfg`).
pub fn plan(path: &Path, old_cfg: &Config, old: Option<&Compiled>, new_cfg: &Config, new: &Compiled) -> ReloadPlan {
    let mut services = Vec::new();
    let mut tables_total = 0;
    for svc in &new.services {
        let tables = tables_to_write(old, new).filter(|(s, _)| s.name == svc.name).count();
        tables_total += tables;
        let before = old.and_then(|o| o.services.iter().find(|s| s.name == svc.name));
        let old_addrs = before.map(|b| b.backend_addrs.clone()).unwrap_or_default();
        let after_sets = eligible_sets(new_cfg, svc);
        let before_sets = before.map(|b| eligible_sets(old_cfg, b)).unwrap_or_default();
        let mut eligible: Vec<EligibleChange> = after_sets
            .iter()
            .filter(|(client, set)| before_sets.iter().find(|(c, _)| c == client).map(|(_, s)| s) != Some(set))
            .map(|(client, set)| EligibleChange {
                client: client.clone(),
                before: before_sets.iter().find(|(c, _)| c == client).map(|(_, s)| s.clone()),
                after: Some(set.clone()),
            })
            .collect();
        eligible.extend(
            before_sets
                .iter()
                .filter(|(c, _)| !after_sets.iter().any(|(a, _)| a == c))
                .map(|(client, set)| EligibleChange { client: client.clone(), before: Some(set.clone()), after: None }),
        );
        let (backends_added, backends_removed): (Vec<IpAddr>, Vec<IpAddr>) = (
            svc.backend_addrs.iter().filter(|a| !old_addrs.contains(a)).copied().collect(),
            old_addrs.iter().filter(|a| !svc.backend_addrs.contains(a)).copied().collect(),
        );
        // Unchanged: the same keys (ports), client prefixes, backends, sets and tables.
        let same = before.is_some_and(|b| b.keys == svc.keys && b.class_prefixes == svc.class_prefixes)
            && tables == 0
            && eligible.is_empty()
            && backends_added.is_empty()
            && backends_removed.is_empty();
        if same {
            continue;
        }
        services.push(ServiceChange {
            name: svc.name.clone(),
            change: if before.is_some() { ChangeKind::Changed } else { ChangeKind::Added },
            backends_added,
            backends_removed,
            eligible,
            tables,
        });
    }
    for gone in old.into_iter().flat_map(|o| &o.services).filter(|s| !new.services.iter().any(|n| n.name == s.name)) {
        services.push(ServiceChange {
            name: gone.name.clone(),
            change: ChangeKind::Removed,
            backends_added: vec![],
            backends_removed: gone.backend_addrs.clone(),
            eligible: eligible_sets(old_cfg, gone)
                .into_iter()
                .map(|(client, set)| EligibleChange { client, before: Some(set), after: None })
                .collect(),
            tables: 0,
        });
    }
    ReloadPlan { config: path.display().to_string(), services, tables_to_write: tables_total }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::Controller;

    const WEB: &str = "[[zone]]\nname = \"zone-a\"\nclient_prefixes = [\"198.18.1.0/24\"]\n\
        [[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\
        [[service.backend]]\naddress = \"198.18.11.1\"\nzone = \"zone-a\"\n";

    fn compiled(cfg: &Config) -> Compiled {
        Controller::new(cfg.clone()).preview(0).unwrap()
    }

    #[test]
    fn an_unchanged_configuration_changes_nothing() {
        let cfg = Config::parse(WEB).unwrap();
        let c = compiled(&cfg);
        let p = plan(Path::new("lb.toml"), &cfg, Some(&c), &cfg, &c);
        assert_eq!(p.services, vec![]);
        assert_eq!(p.tables_to_write, 0);
    }

    #[test]
    fn names_added_backends_changed_sets_and_new_and_removed_services() {
        let old_cfg = Config::parse(WEB).unwrap();
        let new_text = format!(
            "{WEB}[[service.backend]]\naddress = \"198.18.11.2\"\nzone = \"zone-a\"\n\
             [[service]]\nname = \"api\"\nvip = \"198.18.0.101\"\nprotocol = \"UDP\"\nports = [53]\n\
             [[service.backend]]\naddress = \"198.18.12.1\"\n"
        );
        let new_cfg = Config::parse(&new_text).unwrap();
        let (old, new) = (compiled(&old_cfg), compiled(&new_cfg));
        let p = plan(Path::new("lb.toml"), &old_cfg, Some(&old), &new_cfg, &new);
        let web = &p.services[0];
        assert_eq!((web.name.as_str(), web.change), ("web", ChangeKind::Changed));
        assert_eq!(web.backends_added, vec!["198.18.11.2".parse::<IpAddr>().unwrap()]);
        let zone = web.eligible.iter().find(|e| e.client == "zone zone-a").expect("zone-a's set changes");
        assert_eq!(zone.before.as_ref().unwrap().len(), 1);
        assert_eq!(zone.after.as_ref().unwrap().len(), 2);
        assert!(web.tables > 0);
        assert_eq!((p.services[1].name.as_str(), p.services[1].change), ("api", ChangeKind::Added));
        // And back: api is removed.
        let back = plan(Path::new("lb.toml"), &new_cfg, Some(&new), &old_cfg, &old);
        let api = back.services.iter().find(|s| s.name == "api").unwrap();
        assert_eq!(api.change, ChangeKind::Removed);
        assert_eq!(api.backends_removed, vec!["198.18.12.1".parse::<IpAddr>().unwrap()]);
    }
}
