//! GEOGRAPHIC routing from a GeoIP database (`[dns] geoip_database`): a small MaxMind DB built
//! here (mmdb-writer, no download) locates clients at every level of the built-in hierarchy
//! (state, country, the World fallback, unknown), `[[geo]]` prefixes still win where given, the
//! DNS view and the per-packet classes agree, `lb plan --client` says what located a client,
//! and a file that is not a MaxMind DB is refused naming the field.

use lb_user::cli::plan::{client_json, plan_all};
use lb_user::config::{Config, ConfigError};
use lb_user::model::MonitorStatus;
use lb_user::policy::tm::client::Client;
use lb_user::policy::tm::{compile_service, resolve_dns, DnsAnswer, ProbeStatuses, QueryType, Statuses};
use lb_user::rng::SplitMix64;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(serde::Serialize)]
struct Iso {
    iso_code: &'static str,
}

#[derive(serde::Serialize)]
struct Record {
    country: Iso,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    subdivisions: Vec<Iso>,
}

/// A database of `(network, country, subdivision)`.
fn database(rows: &[(&str, &'static str, Option<&'static str>)]) -> Vec<u8> {
    let mut w = mmdb_writer::Writer::new("GeoLite2-Country");
    for (net, country, sub) in rows {
        let record = Record {
            country: Iso { iso_code: country },
            subdivisions: sub.iter().map(|s| Iso { iso_code: s }).collect(),
        };
        w.insert(net.parse::<ipnet::IpNet>().unwrap(), &record).unwrap();
    }
    w.to_bytes().unwrap()
}

const ROWS: &[(&str, &str, Option<&str>)] = &[
    // State level (US-CA is in the hierarchy).
    ("198.18.64.0/18", "US", Some("CA")),
    // A subdivision the hierarchy does not have: the country.
    ("198.18.128.0/18", "US", Some("ZZ")),
    ("198.19.0.0/17", "IE", None),
    // Mapped by nobody but WORLD: the World fallback.
    ("198.19.128.0/17", "FR", None),
    // A country the hierarchy does not know: not located.
    ("198.18.200.0/24", "XX", None),
    ("2001:db8:1::/48", "GB", Some("SCT")),
];

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("lb-geoip-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    TempDir(dir)
}

/// A GEOGRAPHIC profile whose endpoints map every level, with `[[geo]]` taking 198.19.0.0/24
/// (in the database's IE network) to GB.
fn config(db: &Path) -> Config {
    let text = format!(
        r#"
[dns]
listen = "127.0.0.1:5353"
geoip_database = "{}"

[[geo]]
client_prefixes = ["198.19.0.0/24"]
region = "GB"

[[service]]
name = "geo"
vip = "198.18.0.4"
protocol = "TCP"
routing_method = "GEOGRAPHIC"
dns_name = "geo.tm.test"
[[service.backend]]
name = "ca"
address = "198.18.11.1"
geo_mapping = ["US-CA"]
[[service.backend]]
name = "us"
address = "198.18.11.2"
geo_mapping = ["US"]
[[service.backend]]
name = "ie"
address = "198.18.11.3"
geo_mapping = ["IE"]
[[service.backend]]
name = "gb"
address = "198.18.11.4"
geo_mapping = ["GB"]
[[service.backend]]
name = "world"
address = "198.18.11.5"
geo_mapping = ["WORLD"]

[[service]]
name = "geo6"
vip = "2001:db8::4"
protocol = "TCP"
routing_method = "GEOGRAPHIC"
[[service.backend]]
name = "gb6"
address = "2001:db8:11::6"
geo_mapping = ["GB-SCT"]
[[service.backend]]
name = "world6"
address = "2001:db8:11::7"
geo_mapping = ["WORLD"]
"#,
        db.display()
    );
    Config::parse(&text).unwrap_or_else(|e| panic!("{e}"))
}

/// The endpoint the DNS view answers for a client located from `addr` ("NODATA" if none).
fn dns_answer(cfg: &Config, addr: &str) -> String {
    let p = ProbeStatuses::new(cfg, MonitorStatus::Online);
    let client = Client::locate(cfg, addr.parse().unwrap());
    let (svc, q) = if addr.contains(':') { (1, QueryType::Aaaa) } else { (0, QueryType::A) };
    match resolve_dns(&Statuses::new(cfg, &p), svc, &client, q, &mut SplitMix64(1)) {
        DnsAnswer::Records(r) => cfg.services[svc].backends[r[0].backend].label(),
        DnsAnswer::NoData => "NODATA".into(),
        DnsAnswer::NxDomain => "NXDOMAIN".into(),
        DnsAnswer::Cname(c) => cfg.services[svc].backends[c.backend].label(),
    }
}

/// The endpoint the data plane's class of `addr` holds ("DROP" if none).
fn packet_answer(cfg: &Config, addr: &str) -> String {
    let svc = if addr.contains(':') { 1 } else { 0 };
    let plan = compile_service(cfg, svc, &ProbeStatuses::new(cfg, MonitorStatus::Online));
    let class = &plan.classes[plan.class_of(addr.parse::<IpAddr>().unwrap())];
    match class.eligible.as_slice() {
        [] => "DROP".into(),
        [one] => cfg.services[svc].backends[one.backend].label(),
        more => panic!("GEOGRAPHIC returns one endpoint: {more:?}"),
    }
}

#[test]
fn every_level_of_the_hierarchy_from_the_database_dns_and_packets_alike() {
    let dir = temp_dir("levels");
    let db = dir.0.join("GeoLite2-Country.mmdb");
    std::fs::write(&db, database(ROWS)).unwrap();
    let cfg = config(&db);
    for (addr, want) in [
        ("198.18.64.7", "ca"),     // state
        ("198.18.130.9", "us"),    // country (unknown subdivision)
        ("198.19.5.5", "ie"),      // country
        ("198.19.0.9", "gb"),      // [[geo]] wins over the database's IE
        ("198.19.200.1", "world"), // FR: only WORLD maps it
        ("2001:db8:1::5", "gb6"),  // IPv6, state level
    ] {
        assert_eq!(dns_answer(&cfg, addr), want, "DNS view for {addr}");
        assert_eq!(packet_answer(&cfg, addr), want, "packet view for {addr}");
    }
    // Not in the database, or in a country the hierarchy does not know: no location.
    for addr in ["198.18.1.1", "198.18.200.1", "2001:db8:2::5"] {
        assert_eq!(dns_answer(&cfg, addr), "NODATA", "{addr}");
        assert_eq!(packet_answer(&cfg, addr), "DROP", "{addr}");
    }
}

#[test]
fn plan_client_says_what_located_the_client() {
    let dir = temp_dir("plan");
    let db = dir.0.join("GeoLite2-Country.mmdb");
    std::fs::write(&db, database(ROWS)).unwrap();
    let cfg = config(&db);
    let plans = plan_all(&cfg, &|_, _| true);
    let v = client_json(&cfg, &plans, "198.18.64.7".parse().unwrap());
    let located = v["services"][0]["location"].as_str().unwrap().to_owned();
    assert!(
        located.starts_with("US-CA (GeoIP database, network 198.18.64.0/18, country US, subdivision CA"),
        "{located}"
    );
    let v = client_json(&cfg, &plans, "198.19.0.9".parse().unwrap());
    let located = v["services"][0]["location"].as_str().unwrap().to_owned();
    assert_eq!(located, "GB ([[geo]] entry 0, prefix 198.19.0.0/24)");
}

#[test]
fn a_file_that_is_not_a_maxmind_db_is_refused_naming_the_field() {
    let dir = temp_dir("bad");
    let db = dir.0.join("broken.mmdb");
    std::fs::write(&db, b"not a database").unwrap();
    let text = format!("[dns]\nlisten = \"127.0.0.1:5353\"\ngeoip_database = \"{}\"\n", db.display());
    let err = Config::parse(&text).unwrap_err();
    let v = err.downcast_ref::<ConfigError>().expect("a configuration error").violations();
    assert_eq!(v.len(), 1, "{err}");
    assert_eq!(v[0].field, "dns.geoip_database");
    assert!(v[0].problem.contains("not a MaxMind DB"), "{err}");
    let missing =
        format!("[dns]\nlisten = \"127.0.0.1:5353\"\ngeoip_database = \"{}\"\n", dir.0.join("none").display());
    assert!(Config::parse(&missing).unwrap_err().to_string().contains("cannot read"));
}
