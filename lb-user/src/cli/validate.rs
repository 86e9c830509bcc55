//! `lb validate --config FILE`: checks a configuration offline, as `lb run` and `lb reload`
//! would (every rule, then compiling its tables), and lists every problem at once. VIPs are
//! checked against the addresses of the host it runs on (in its network namespace).

use crate::config::{Config, HostAddrs};
use crate::controller::Controller;
use anyhow::Context;
use std::path::Path;

/// Ok with a one-line summary, or the error listing every problem (the command exits 1).
pub fn check(path: &Path) -> anyhow::Result<String> {
    let host = HostAddrs::current().context("listing this host's addresses (no VIP may be one of them)")?;
    let cfg = Config::load_on(path, Some(&host))?;
    let services = cfg.services.len();
    let backends: usize = cfg.services.iter().map(|s| s.backends.len()).sum();
    // What the rules cannot see (e.g. more client classes than a service can hold) shows when
    // the tables are compiled.
    let notices = cfg.notices();
    Controller::new(cfg).preview(0).map_err(|e| anyhow::anyhow!("{}: {e:#}", path.display()))?;
    let mut summary = format!("{}: valid ({services} services, {backends} backends)", path.display());
    for n in notices {
        summary += &format!("\nwarning: {n}");
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("lb-validate-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn settings_without_effect_are_warned_about() {
        let path = file("mac.toml", "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n[[service.backend]]\naddress = \"198.18.11.1\"\nmac = \"02:00:00:00:00:01\"\n");
        let summary = check(&path).unwrap();
        assert!(
            summary.contains("valid (1 services, 1 backends)\nwarning: service \"web\": backend[0].mac: has no effect"),
            "{summary}"
        );
    }

    #[test]
    fn a_valid_file_is_summed_up() {
        let path = file("ok.toml", "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n[[service.backend]]\naddress = \"198.18.11.1\"\n");
        assert!(check(&path).unwrap().ends_with("valid (1 services, 1 backends)"));
    }

    #[test]
    fn every_problem_is_listed() {
        let path = file(
            "bad.toml",
            "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\nsession_affinity = \"CLIENT_IP\"\n\
             [service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 1.5\n\
             [[service.backend]]\naddress = \"198.18.11.1\"\nweight = 0\n",
        );
        let err = format!("{:#}", check(&path).unwrap_err());
        assert!(
            err.contains("problems):")
                && err.contains("spillover_ratio")
                && err.starts_with(&path.display().to_string()),
            "{err}"
        );
        assert!(err.matches("\n  - ").count() >= 2, "{err}");
    }

    #[test]
    fn syntax_and_type_errors_of_every_table_are_listed_with_line_and_path() {
        let path = file(
            "syntax.toml",
            "[dataplane]\nmaglev_table_size = \"big\"\n\
             [[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80\n\
             [[service]]\nname = \"db\"\nvip = \"198.18.0.101\"\nprotocol = \"UDP\"\nweight = 1\n",
        );
        let err = format!("{:#}", check(&path).unwrap_err());
        assert!(err.contains("(3 syntax or type problems)"), "{err}");
        for want in [
            "dataplane.maglev_table_size: line 2, column 21:",
            // An unclosed array: the parser notices at the next line, the next table's header.
            "line 8, column 1: invalid array; expected `]`",
            "service[1].weight: line 12, column 1: unknown field `weight`",
        ] {
            assert!(err.contains(want), "{want} in {err}");
        }
    }
}
