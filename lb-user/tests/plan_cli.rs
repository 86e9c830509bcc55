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
            {"client_zone": "zone-a", "affinity": "REFINED", "why": "eligible backends in the zone",
             "spill": null, "eligible": ["198.18.1.10"]},
            {"client_zone": "zone-b", "affinity": "REPLACED",
             "why": "every backend of the zone unhealthy: stays in zone", "spill": null, "eligible": ["198.18.2.10"]},
            {"client_zone": null, "affinity": "NOT_COMPATIBLE", "why": "client outside every zone", "spill": null,
             "eligible": ["198.18.1.10"]},
        ],
    }]});
    assert_eq!(got, want);
}

/// The row of a table whose first column is `label`, split into its columns (label, affinity,
/// eligible set; the why column between the last two is checked by its own test).
fn row<'a>(table: &'a str, label: &'a str) -> Vec<&'a str> {
    let line = table
        .lines()
        .find(|l| l.trim_start().starts_with(label))
        .unwrap_or_else(|| panic!("no row {label} in:\n{table}"));
    let rest = line.trim_start()[label.len()..].trim_start();
    let (outcome, rest) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
    // Columns are separated by at least two spaces; the why column has single spaces only.
    let eligible = rest.trim().rsplit_once("  ").map_or("", |(_, e)| e);
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

/// The spec's Z13 example: zones of five backends, SPILL_CROSS_ZONE with ratio 0.8. `lb plan`
/// shows the ratio test's arithmetic per zone, in the table and in JSON.
#[test]
fn plan_shows_the_spillover_arithmetic_per_zone() {
    let mut text = String::from(
        "[[zone]]\nname = \"z1\"\nclient_prefixes = [\"198.18.1.0/24\"]\n\
         [[zone]]\nname = \"z2\"\nclient_prefixes = [\"198.18.2.0/24\"]\n\n\
         [[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n\
         [service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 0.8\n",
    );
    for z in 1..=2 {
        for i in 1..=5 {
            text += &format!("[[service.backend]]\naddress = \"198.18.1{z}.{i}\"\nzone = \"z{z}\"\n");
        }
    }
    let cfg = TempConfig::new(&text);
    let path = cfg.path.to_str().unwrap();
    // Zone 1 loses one backend (4/5 >= 0.8: stays), zone 2 two (3/5 < 0.8: spills).
    let args = ["plan", "--config", path, "--unhealthy", "198.18.11.1,198.18.12.1,198.18.12.2"];
    let table = stdout(&lb(&args));
    let row = |zone: &str| table.lines().find(|l| l.trim_start().starts_with(zone)).unwrap_or_default().to_owned();
    assert!(row("z1").contains("REFINED") && row("z1").contains("4/5 = 0.80 >= 0.80: stays in zone"), "{table}");
    assert!(row("z2").contains("UNCHANGED") && row("z2").contains("3/5 = 0.60 < 0.80: spills"), "{table}");
    assert!(row("(non-compatible)").contains("client outside every zone"), "{table}");

    let json: Value = serde_json::from_str(&stdout(&lb(&[&args[..], &["--json"]].concat()))).unwrap();
    let zones = &json["services"][0]["zones"];
    assert_eq!(
        zones[1]["spill"],
        json!({"healthy_in_zone": 3, "configured_in_zone": 5, "ratio": 0.6, "spillover_ratio": 0.8})
    );
    assert_eq!(zones[1]["why"], "3/5 = 0.60 < 0.80: spills");
    assert_eq!(zones[0]["spill"]["healthy_in_zone"], 4);
    assert_eq!(zones[2]["spill"], Value::Null);
}
