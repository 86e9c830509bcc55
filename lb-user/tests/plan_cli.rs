//! `lb plan` end to end: the built binary on temporary config files.

use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A config file in a fresh directory under the system temp dir, removed on drop.
struct TempConfig {
    dir: PathBuf,
    path: PathBuf,
}

impl TempConfig {
    fn new(text: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lb-plan-cli-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        let path = dir.join("lb.toml");
        std::fs::write(&path, text).expect("write config");
        Self { dir, path }
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn lb(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lb")).args(args).output().expect("run lb")
}

fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "lb failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout.clone()).expect("utf-8 output")
}

/// Two zones, STAY_WITHIN_ZONE; with 198.18.2.10 unhealthy, zone-a refines to its backend and
/// zone-b is replaced by its (unhealthy) backend.
const ZONAL: &str = r#"
[[zone]]
name = "zone-a"
client_prefixes = ["198.18.1.0/24"]

[[zone]]
name = "zone-b"
client_prefixes = ["198.18.2.0/24", "2001:db8:2::/48"]

[[service]]
name = "web"
vip = "198.18.0.100"
protocol = "TCP"
ports = [80]

[service.zonal_affinity]
spillover = "ZONAL_AFFINITY_STAY_WITHIN_ZONE"

[[service.backend]]
address = "198.18.1.10"
zone = "zone-a"

[[service.backend]]
address = "198.18.2.10"
zone = "zone-b"
"#;

#[test]
fn json_for_zonal_config_with_one_unhealthy_backend() {
    let cfg = TempConfig::new(ZONAL);
    let out = lb(&["plan", "--config", cfg.path.to_str().unwrap(), "--unhealthy", "198.18.2.10", "--json"]);
    let got: Value = serde_json::from_str(&stdout(&out)).expect("JSON output");
    let want = json!({"services": [{
        "name": "web",
        "eligible_kind": "ALL_HEALTHY",
        "rule": "E-1",
        "active_pool": "ALL",
        "zones": [
            {"client_zone": "zone-a", "affinity": "REFINED", "eligible": ["198.18.1.10"]},
            {"client_zone": "zone-b", "affinity": "REPLACED", "eligible": ["198.18.2.10"]},
            {"client_zone": null, "affinity": "NOT_COMPATIBLE", "eligible": ["198.18.1.10"]},
        ],
    }]});
    assert_eq!(got, want);
}

/// The row of a table whose first column is `label`, split into its columns.
fn row<'a>(table: &'a str, label: &'a str) -> Vec<&'a str> {
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row {label} in:\n{table}"));
    let rest = line.trim_start()[label.len()..].trim_start();
    let (outcome, eligible) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    vec![label, outcome, eligible.trim()]
}

#[test]
fn table_for_zonal_config_with_one_unhealthy_backend() {
    let cfg = TempConfig::new(ZONAL);
    let table = stdout(&lb(&["plan", "--config", cfg.path.to_str().unwrap(), "--unhealthy", "198.18.2.10"]));
    let header = table.lines().next().expect("a header line");
    assert!(header.starts_with("service web "), "{header}");
    assert!(header.contains("eligible_kind ALL_HEALTHY"), "{header}");
    assert_eq!(row(&table, "zone-a"), ["zone-a", "REFINED", "198.18.1.10"]);
    assert_eq!(row(&table, "zone-b"), ["zone-b", "REPLACED", "198.18.2.10"]);
    assert_eq!(row(&table, "(non-compatible)"), ["(non-compatible)", "NOT_COMPATIBLE", "198.18.1.10"]);
}

#[test]
fn table_shows_drop_and_accepts_repeated_and_comma_separated_unhealthy() {
    let cfg = TempConfig::new(
        r#"
        [[zone]]
        name = "zone-a"
        client_prefixes = ["198.18.1.0/24"]

        [[service]]
        name = "db"
        vip = "2001:db8::100"
        protocol = "TCP"
        [service.zonal_affinity]
        spillover = "ZONAL_AFFINITY_STAY_WITHIN_ZONE"
        [service.failover_policy]
        drop_traffic_if_unhealthy = true
        [[service.backend]]
        address = "2001:db8:1::10"
        zone = "zone-a"
        [[service.backend]]
        address = "2001:db8:1::11"
        zone = "zone-a"
        [[service.backend]]
        address = "2001:db8:1::20"
        failover = true
        "#,
    );
    let path = cfg.path.to_str().unwrap();
    let args =
        ["plan", "--config", path, "--unhealthy", "2001:db8:1::10,2001:db8:1::11", "--unhealthy", "2001:db8:1::20"];
    let table = stdout(&lb(&args));
    assert!(table.contains("eligible_kind DROP"), "{table}");
    assert_eq!(row(&table, "zone-a"), ["zone-a", "UNCHANGED", "DROP"]);
    assert_eq!(row(&table, "(non-compatible)"), ["(non-compatible)", "NOT_COMPATIBLE", "DROP"]);

    // Only the failover backend down: E-4, the IPv6 addresses printed as written.
    let json: Value =
        serde_json::from_str(&stdout(&lb(&["plan", "--config", path, "--unhealthy", "2001:db8:1::20", "--json"])))
            .expect("JSON output");
    let svc = &json["services"][0];
    assert_eq!(svc["eligible_kind"], "HEALTHY_PRIMARY");
    assert_eq!(svc["rule"], "E-4");
    assert_eq!(svc["zones"][0]["eligible"], json!(["2001:db8:1::10", "2001:db8:1::11"]));
}

#[test]
fn unknown_unhealthy_address_is_an_error_naming_it() {
    let cfg = TempConfig::new(ZONAL);
    let out = lb(&["plan", "--config", cfg.path.to_str().unwrap(), "--unhealthy", "198.18.1.10,198.18.9.99"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("198.18.9.99"), "{err}");
    assert!(!err.contains("198.18.1.10"), "only the unknown address is named: {err}");
}

#[test]
fn missing_config_file_is_an_error() {
    let missing = std::env::temp_dir().join(format!("lb-plan-cli-{}-missing/lb.toml", std::process::id()));
    let out = lb(&["plan", "--config", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("lb.toml"), "error names the file: {err}");
}
