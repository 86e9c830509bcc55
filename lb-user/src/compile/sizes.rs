//! The data plane's map sizes for a configuration, and whether a reloaded configuration still
//! fits a data plane loaded with other sizes. The maps each size drives, their memory and its
//! limit are `dataplane::sizes`.

use crate::config::Config;
use crate::dataplane::DataplaneSizes;
use crate::error::NeedsRestart;
use anyhow::Result;

/// Data-plane sizes for a configuration. Roomy powers of two, so that ordinary reloads fit and
/// a restart with a similar configuration can adopt the pinned maps.
pub fn sizes_for(cfg: &Config) -> DataplaneSizes {
    let services = cfg.services.len() as u32;
    let backends: u32 = cfg.services.iter().flat_map(|s| s.backends.iter().map(|b| b.record_room())).sum();
    let classes = super::classes_per_service(cfg);
    let classes_per_service = classes.max(8).next_power_of_two();
    // The service table holds 16 keys (ports) per service id and CLIENT_CLASS 16 prefixes per
    // (service, class): more ids than services when the configuration has more ports or
    // prefixes than that. (Only then: a configuration that fits keeps the sizes, so a restart
    // after an upgrade still adopts its pinned maps. A reload beyond the room is refused by
    // the data plane's admission check, asking for a restart.)
    let (keys, prefixes) = super::installed_counts(cfg);
    let mut max_services = (services * 2).max(16).next_power_of_two();
    while (max_services as u64 * 16) < keys as u64
        || (max_services as u64 * classes_per_service as u64 * 16) < prefixes as u64
    {
        max_services *= 2;
    }
    // Active tables plus a standby slot each, and some room for a reload that adds tables.
    // Each slot costs 8 * M bytes of kernel memory (array slots are 8 bytes wide).
    let table_slots = (2 * services * classes + 16).max(32).next_power_of_two();
    DataplaneSizes {
        table_size_m: cfg.dataplane.maglev_table_size,
        conntrack_entries: cfg.dataplane.conntrack_entries,
        max_services,
        classes_per_service,
        max_backends: (backends * 2).max(256).next_power_of_two(),
        table_slots,
    }
}

/// Whether configuration `cfg` fits a data plane loaded with sizes `now`: its Maglev and
/// connection-table sizes the same (they are load-time constants of the program), its
/// services, classes, backends and tables within the maps' room. Otherwise a restart is needed.
pub fn fits_in(now: &DataplaneSizes, cfg: &Config) -> Result<()> {
    let want = sizes_for(cfg);
    if want.table_size_m != now.table_size_m || want.conntrack_entries != now.conntrack_entries {
        return Err(NeedsRestart(
            "dataplane.maglev_table_size and dataplane.conntrack_entries take effect only on restart".into(),
        )
        .into());
    }
    let services = cfg.services.len() as u32;
    let classes = super::classes_per_service(cfg);
    let backends: u32 = cfg.services.iter().flat_map(|s| s.backends.iter().map(|b| b.record_room())).sum();
    if services > now.max_services
        || classes > now.classes_per_service
        || backends * 2 > now.max_backends
        || 2 * services * classes > now.table_slots
    {
        return Err(NeedsRestart(
            "the new configuration needs a larger data plane than was loaded at start; restart the daemon to apply it"
                .into(),
        )
        .into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(ports: usize) -> String {
        named_service(0, ports)
    }

    fn named_service(n: usize, ports: usize) -> String {
        let list: Vec<String> = (1..=ports).map(|p| p.to_string()).collect();
        format!(
            "[[service]]\nname = \"web{n}\"\nvip = \"198.18.0.{}\"\nprotocol = \"TCP\"\nports = [{}]\n[[service.backend]]\naddress = \"198.18.11.1\"\n",
            100 + n,
            list.join(", ")
        )
    }

    #[test]
    fn sizes_beyond_the_map_memory_limit_are_refused_naming_what_drives_them() {
        let cfg = Config::parse(&service(1)).unwrap();
        assert!(DataplaneSizes::check_memory(&sizes_for(&cfg)).is_ok());
        // The largest connection tables validation allows still fit.
        let most = Config::parse(&format!(
            "[dataplane]\nconntrack_entries = {}\n{}",
            crate::config::MAX_CONNTRACK_ENTRIES,
            service(1)
        ))
        .unwrap();
        assert!(
            DataplaneSizes::check_memory(&sizes_for(&most)).is_ok(),
            "{:?}",
            DataplaneSizes::check_memory(&sizes_for(&most))
        );
        // 8192 tables of M = 65537 (8 bytes per cell): 4 GiB of TABLES alone.
        let big = DataplaneSizes { table_slots: 8192, table_size_m: 65537, ..sizes_for(&cfg) };
        let err = DataplaneSizes::check_memory(&big).unwrap_err().to_string();
        assert!(
            err.contains("MiB") && err.contains("TABLES 4096 MiB") && err.contains("dataplane.maglev_table_size"),
            "{err}"
        );
    }

    #[test]
    fn sizes_hold_every_port_and_class_prefix_with_room() {
        let cfg = Config::parse(&service(1)).unwrap();
        assert_eq!(sizes_for(&cfg).max_services, 16);
        // 256 keys fit the 16 service ids' 16 keys each: the sizes stay (pinned maps of a
        // version before this rule are still adopted); 300 do not, and the table grows.
        assert_eq!(sizes_for(&Config::parse(&service(256)).unwrap()).max_services, 16);
        let cfg = Config::parse(&service(300)).unwrap();
        let s = sizes_for(&cfg);
        assert!(s.max_services * 16 >= 300, "{s:?}");
        assert!(crate::dataplane::service_table::slots_for(s.max_services) / 2 >= 300);
        // 2 zones of 130 prefixes each, installed for each of 8 services: 2080 prefixes.
        let zones: String = (0..2)
            .map(|z| {
                let p: Vec<String> = (0..130).map(|i| format!("\"198.{}.{i}.0/24\"", 18 + z)).collect();
                format!("[[zone]]\nname = \"z{z}\"\nclient_prefixes = [{}]\n", p.join(", "))
            })
            .collect();
        let services: String = (0..8).map(|n| named_service(n, 1)).collect();
        let cfg = Config::parse(&(zones + &services)).unwrap();
        let s = sizes_for(&cfg);
        let prefixes = s.map_max_entries().iter().find(|(n, _)| *n == "CLIENT_CLASS").unwrap().1;
        assert!(prefixes >= 2080, "{s:?}: CLIENT_CLASS holds {prefixes}");
    }
}
