//! The configuration reference against the code: docs/lb.schema.json is what `lb config-schema`
//! prints, the example and test configurations pass it, its enumerations are the validator's,
//! docs/config.md has an entry for every key (with the schema's default and allowed values) and
//! docs/lb.toml.5 is generated from it. `LB_BLESS=1` rewrites the two generated files.

use lb_tests::config_doc::{self, Entry, USED_BY};
use lb_user::cli::config_schema;
use lb_user::config::Config;
use lb_user::model::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_owned()
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `rel` must hold `expected`; with LB_BLESS=1 it is rewritten instead.
fn check_generated(rel: &str, expected: &str) {
    if std::env::var_os("LB_BLESS").is_some() {
        std::fs::write(root().join(rel), expected).unwrap();
        return;
    }
    let committed = read(rel);
    if committed != expected {
        let line = committed.lines().zip(expected.lines()).position(|(a, b)| a != b).map_or(0, |i| i + 1);
        panic!(
            "{rel} is stale (first difference near line {line}): regenerate it with \
             `LB_BLESS=1 cargo test -p lb-tests --test config_reference` and commit it"
        );
    }
}

#[test]
fn schema_file_is_current() {
    check_generated("docs/lb.schema.json", &config_schema::schema_text());
}

#[test]
fn man_page_is_current() {
    check_generated("docs/lb.toml.5", &config_doc::man_page(&read("docs/config.md")).unwrap());
}

fn schema() -> Value {
    config_schema::schema()
}

/// A schema node with its `$ref`, `allOf` and array `items` followed.
fn resolve<'a>(root: &'a Value, node: &'a Value) -> &'a Value {
    if let Some(r) = node.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap();
        return resolve(root, &root["definitions"][name]);
    }
    if let Some(all) = node.get("allOf").and_then(Value::as_array) {
        if all.len() == 1 {
            return resolve(root, &all[0]);
        }
    }
    if node.get("type") == Some(&Value::from("array")) {
        if let Some(items) = node.get("items") {
            if resolve(root, items).get("properties").is_some() {
                return resolve(root, items);
            }
        }
    }
    node
}

/// Every property of the schema by path (`service.backend.mac`), with its (resolved) node and
/// the node as written at the property (which carries the default).
fn properties(schema: &Value) -> BTreeMap<String, (Value, Value)> {
    fn walk(root: &Value, node: &Value, prefix: &str, out: &mut BTreeMap<String, (Value, Value)>) {
        let Some(props) = resolve(root, node).get("properties").and_then(Value::as_object) else { return };
        for (key, prop) in props {
            let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
            out.insert(path.clone(), (resolve(root, prop).clone(), prop.clone()));
            walk(root, prop, &path, out);
        }
    }
    let mut out = BTreeMap::new();
    walk(schema, schema, "", &mut out);
    out
}

#[test]
fn the_walk_reaches_every_level() {
    let props = properties(&schema());
    for path in ["dataplane.maglev_table_size", "service.backend.mac", "service.monitor.path", "announce.table"] {
        assert!(props.contains_key(path), "{path} not found: {:?}", props.keys().collect::<Vec<_>>());
    }
    assert!(props.len() > 80, "{} properties", props.len());
}

fn entries() -> (Vec<String>, Vec<Entry>) {
    config_doc::parse(&read("docs/config.md")).unwrap()
}

/// The keys docs/config.md documents: sections (tables) and key rows.
fn documented(tables: &[String], entries: &[Entry]) -> Vec<String> {
    tables.iter().cloned().chain(entries.iter().map(|e| e.path.clone())).collect()
}

#[test]
fn every_key_has_an_entry_and_every_entry_a_key() {
    let props = properties(&schema());
    let (tables, entries) = entries();
    let doc = documented(&tables, &entries);
    let missing: Vec<&String> = props.keys().filter(|p| !doc.contains(p)).collect();
    assert!(missing.is_empty(), "docs/config.md has no entry for {missing:?}");
    let unknown: Vec<&String> = doc.iter().filter(|p| !props.contains_key(*p)).collect();
    assert!(unknown.is_empty(), "docs/config.md documents keys the configuration does not have: {unknown:?}");
    let mut seen = std::collections::HashSet::new();
    let twice: Vec<&String> = doc.iter().filter(|p| !seen.insert(*p)).collect();
    assert!(twice.is_empty(), "documented twice: {twice:?}");
}

#[test]
fn entries_state_the_schemas_defaults_and_allowed_values() {
    let props = properties(&schema());
    let (_, entries) = entries();
    let mut problems = Vec::new();
    for e in &entries {
        let (node, at) = &props[&e.path];
        if !USED_BY.contains(&e.used_by.as_str()) {
            problems.push(format!("{}: used by {:?}, allowed {USED_BY:?}", e.path, e.used_by));
        }
        for value in node.get("enum").and_then(Value::as_array).into_iter().flatten() {
            let text = format!("`{}`", value.as_str().unwrap());
            if !e.allowed.contains(&text) {
                problems.push(format!("{}: allowed values lack {text}", e.path));
            }
        }
        let default = match at.get("default") {
            Some(Value::String(s)) => Some(format!("`{s}`")),
            Some(v @ (Value::Number(_) | Value::Bool(_))) => Some(format!("`{v}`")),
            _ => None,
        };
        if let Some(d) = default {
            if !e.default.contains(&d) {
                problems.push(format!("{}: default {:?} does not state the code's {d}", e.path, e.default));
            }
        }
        if e.ty.is_empty() || e.meaning.is_empty() {
            problems.push(format!("{}: type or meaning empty", e.path));
        }
    }
    assert!(problems.is_empty(), "docs/config.md disagrees with the code:\n{}", problems.join("\n"));
}

#[test]
fn schema_enumerations_are_the_validators() {
    let schema = schema();
    // Per enumeration: the validator's spellings (its error messages list them) and whether the
    // parser takes a string.
    fn takes<T: serde::de::DeserializeOwned>(text: &str) -> bool {
        serde_json::from_value::<T>(Value::from(text)).is_ok()
    }
    type Parse = fn(&str) -> bool;
    let allowed: BTreeMap<&str, (&[&str], Parse)> = BTreeMap::from([
        ("Protocol", (Protocol::ALLOWED, takes::<Protocol> as Parse)),
        ("SessionAffinity", (SessionAffinity::ALLOWED, takes::<SessionAffinity>)),
        ("Forwarding", (Forwarding::ALLOWED, takes::<Forwarding>)),
        ("Spillover", (Spillover::ALLOWED, takes::<Spillover>)),
        ("TrackingMode", (TrackingMode::ALLOWED, takes::<TrackingMode>)),
        ("Persistence", (Persistence::ALLOWED, takes::<Persistence>)),
        ("Subsetting", (Subsetting::ALLOWED, takes::<Subsetting>)),
        ("HealthProtocol", (HealthProtocol::ALLOWED, takes::<HealthProtocol>)),
        ("HealthPath", (HealthPath::ALLOWED, takes::<HealthPath>)),
        ("PortSpecification", (PortSpecification::ALLOWED, takes::<PortSpecification>)),
        ("ProxyHeader", (ProxyHeader::ALLOWED, takes::<ProxyHeader>)),
        ("RoutingMethod", (RoutingMethod::ALLOWED, takes::<RoutingMethod>)),
        ("AdminStatus", (AdminStatus::ALLOWED, takes::<AdminStatus>)),
        ("MonitorProtocol", (MonitorProtocol::ALLOWED, takes::<MonitorProtocol>)),
    ]);
    let defs = schema["definitions"].as_object().unwrap();
    let in_schema: Vec<&String> = defs.iter().filter(|(_, d)| d.get("enum").is_some()).map(|(n, _)| n).collect();
    assert_eq!(
        in_schema.iter().map(|n| n.as_str()).collect::<std::collections::BTreeSet<_>>(),
        allowed.keys().copied().collect(),
        "enumerations of the schema and of this test differ: add the new one here"
    );
    for (name, (values, parses)) in allowed {
        let strings: Vec<&str> = defs[name]["enum"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(strings, values, "{name}");
        for v in strings {
            assert!(parses(v), "{name}: the parser refuses the schema's {v:?}");
        }
        assert!(!parses("NOT_A_VALUE"), "{name} takes anything");
    }
}

/// A TOML document as the JSON the schema validates.
fn as_json(text: &str) -> Value {
    let value: toml::Value = toml::from_str(text).unwrap();
    serde_json::to_value(value).unwrap()
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft7::new(&schema()).expect("the schema is a valid draft-07 schema")
}

fn schema_errors(v: &jsonschema::Validator, text: &str) -> Vec<String> {
    v.iter_errors(&as_json(text)).map(|e| format!("{} at {}", e, e.instance_path())).collect()
}

/// Configurations the end-to-end tests write (tests/src/e2e.rs), on made-up backends.
fn test_configurations() -> Vec<(String, String)> {
    use lb_tests::e2e::{service_block, zones_toml};
    let backends = "[[service.backend]]\naddress = \"198.18.11.1\"\nzone = \"zone-1\"\nmac = \"02:00:00:00:00:01\"\n\n\
                    [[service.backend]]\naddress = \"198.18.12.1\"\nzone = \"zone-2\"\nfailover = true\n";
    let zonal = format!(
        "{}{}",
        zones_toml(2),
        service_block(
            "web",
            false,
            "session_affinity = \"CLIENT_IP\"\nforwarding = \"L2_DSR\"",
            "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 0.5\n\
             [service.failover_policy]\nfailover_ratio = 0.5\n",
            8080,
            backends
        )
    );
    let v6 = format!(
        "{}[metrics]\nlisten = \"127.0.0.1:9405\"\n[announce]\n{}",
        zones_toml(1),
        service_block("web6", true, "", "", 8080, "[[service.backend]]\naddress = \"2001:db8:0:11::1\"\n")
    );
    vec![("e2e zonal".into(), zonal), ("e2e IPv6".into(), v6)]
}

#[test]
fn examples_and_test_configurations_match_the_schema() {
    let v = validator();
    let mut files: Vec<(String, String)> = Vec::new();
    for entry in std::fs::read_dir(root().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            files.push((path.display().to_string(), std::fs::read_to_string(&path).unwrap()));
        }
    }
    assert!(files.len() >= 3, "examples/ has {} configurations", files.len());
    files.extend(test_configurations());
    for (name, text) in &files {
        // Each is a valid configuration, so the schema must accept it.
        Config::parse(text).unwrap_or_else(|e| panic!("{name} is not a valid configuration: {e:#}"));
        let errors = schema_errors(&v, text);
        assert!(errors.is_empty(), "{name} fails the schema: {errors:?}");
    }
}

#[test]
fn the_schema_rejects_what_the_parser_rejects() {
    let v = validator();
    let base = "[[service]]\nname = \"s\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\n";
    assert!(schema_errors(&v, base).is_empty());
    for (what, text) in [
        ("an unknown key", format!("{base}forwardng = \"IPIP\"\n")),
        ("an unknown value", format!("{base}forwarding = \"DSR\"\n")),
        ("a wrong type", format!("{base}ports = \"80\"\n")),
        ("a missing required key", "[[service]]\nname = \"s\"\nprotocol = \"TCP\"\n".to_owned()),
        ("an unknown table", format!("{base}[dataplan]\n")),
        ("a malformed MAC", format!("{base}[[service.backend]]\naddress = \"198.18.0.2\"\nmac = \"02:00\"\n")),
        ("a negative port", format!("{base}[service.health_check]\nport = -1\n")),
    ] {
        assert!(Config::parse(&text).is_err(), "the parser accepts {what}");
        assert!(!schema_errors(&v, &text).is_empty(), "the schema accepts {what}:\n{text}");
    }
}
