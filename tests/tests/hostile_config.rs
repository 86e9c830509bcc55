//! Hostile configurations, issue 19 item 2 (the loader and `lb plan`): the example
//! configurations mutated at the TOML value level (wrong types, out-of-range numbers, unknown
//! fields, duplicated entries, huge and empty arrays, unicode and huge strings, missing keys)
//! and as raw bytes, through `Config::load` and, when they load, `lb plan`'s planning and
//! rendering. Never a panic, never a hang (each case runs on a thread with a 30 s budget: a
//! hang is a failure, not a timing assertion).
//!
//! "The error names the field", precisely: for a structural mutation the error message
//! contains the name of the mutated key (the last key on the path to the mutated value; for
//! an element of an array, the array's key; for an added unknown field, its name), or the
//! error is a list of contract violations each of which carries a field path (a value that is
//! valid on its own can break a rule elsewhere: a renamed zone makes the backends that named
//! it refer to nothing, and those are the fields reported). Raw byte mutations make text that
//! may not be TOML at all; their errors must point at a line (`line N`) or name a field.
//!
//! Seeded: `LB_FUZZ_SEED` and `LB_FUZZ_CASES` override the defaults; the seed is printed on
//! failure.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use lb_tests::fuzz;
use lb_user::cli::plan::{plan_all, render_json, render_table};
use lb_user::config::{Config, ConfigError};
use lb_user::rng::{Rng, SplitMix64};
use toml::Value;

const CI_CASES: u64 = 2000;
const BUDGET: Duration = Duration::from_secs(30);
/// The 1.5 MB file of 100,000 backends: the debug build's TOML parser alone takes ~14 s here
/// (linear: 3.7 s for 25,000, 7 s for 50,000), validation 0.8 s, planning and rendering 2 s.
const BUDGET_100K: Duration = Duration::from_secs(180);
const UNKNOWN_KEY: &str = "surely_not_a_field";

fn examples() -> Vec<(PathBuf, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            Config::parse(&text).unwrap_or_else(|e| panic!("example {} must load: {e:#}", p.display()));
            (p, text.parse::<Value>().expect("an example is TOML"))
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(out.len() >= 3, "examples found in {}", dir.display());
    out
}

#[derive(Clone, Debug)]
enum Seg {
    Key(String),
    Index(usize),
}

/// Every path in `v` (tables, arrays and leaves), depth first.
fn paths(v: &Value, prefix: &mut Vec<Seg>, out: &mut Vec<Vec<Seg>>) {
    out.push(prefix.clone());
    match v {
        Value::Table(t) => {
            for (k, child) in t {
                prefix.push(Seg::Key(k.clone()));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                prefix.push(Seg::Index(i));
                paths(child, prefix, out);
                prefix.pop();
            }
        }
        _ => {}
    }
}

fn at<'a>(v: &'a mut Value, path: &[Seg]) -> &'a mut Value {
    path.iter().fold(v, |v, s| match s {
        Seg::Key(k) => &mut v[k.as_str()],
        Seg::Index(i) => &mut v[*i],
    })
}

/// The key an error about `path` must name: its last key.
fn key_of(path: &[Seg]) -> Option<String> {
    path.iter().rev().find_map(|s| match s {
        Seg::Key(k) => Some(k.clone()),
        Seg::Index(_) => None,
    })
}

/// A value of another type than `v`.
fn other_type(rng: &mut SplitMix64, v: &Value) -> Value {
    let candidates = [
        Value::String("not-a-number".into()),
        Value::Integer(7),
        Value::Float(0.5),
        Value::Boolean(true),
        Value::Array(vec![Value::Integer(1), Value::String("x".into())]),
        Value::Table(toml::map::Map::new()),
    ];
    loop {
        let c = candidates[rng.below(candidates.len() as u64) as usize].clone();
        if c.type_str() != v.type_str() {
            return c;
        }
    }
}

const STRINGS: [&str; 8] =
    ["", " ", "zöne-☃", "\u{202e}evil\u{200b}", "\u{0}nul", "198.18.0.1/33", "::ffff:198.18.0.1", "𝕧𝕚𝕡"];

/// Mutates `doc` at one random path; returns (what, the key an error must name).
fn mutate(rng: &mut SplitMix64, doc: &mut Value) -> (String, Option<String>) {
    let mut all = Vec::new();
    paths(doc, &mut Vec::new(), &mut all);
    let path = all[1 + rng.below(all.len() as u64 - 1) as usize].clone();
    let key = key_of(&path);
    let target = at(doc, &path);
    let kind = rng.below(8);
    let what = match (kind, &*target) {
        (0, _) => {
            *target = other_type(rng, target);
            "wrong type"
        }
        (1, Value::Integer(_) | Value::Float(_)) => {
            let edges = [-1i64, 0, 1 << 16, 1 << 31, 1 << 32, i64::MAX, i64::MIN];
            *target = if rng.below(4) == 0 {
                Value::Float([-1.0, f64::INFINITY, 1e308, -0.0, 1e-300][rng.below(5) as usize])
            } else {
                Value::Integer(edges[rng.below(edges.len() as u64) as usize])
            };
            "out of range"
        }
        (2, Value::Table(_)) => {
            target.as_table_mut().expect("table").insert(UNKNOWN_KEY.into(), Value::Integer(1));
            return ("unknown field".into(), Some(UNKNOWN_KEY.into()));
        }
        (3, Value::Array(a)) if !a.is_empty() => {
            let i = rng.below(a.len() as u64) as usize;
            let dup = a[i].clone();
            target.as_array_mut().expect("array").insert(i, dup);
            "duplicate entry"
        }
        (4, Value::Array(a)) if !a.is_empty() => {
            let n = [0usize, 1000, 5000][rng.below(3) as usize];
            let first = a[0].clone();
            *target = Value::Array(vec![first; n]);
            "huge or empty array"
        }
        (5, Value::String(_)) => {
            *target = if rng.below(4) == 0 {
                Value::String("x".repeat(1 << 16))
            } else {
                Value::String(STRINGS[rng.below(STRINGS.len() as u64) as usize].into())
            };
            "odd string"
        }
        (6, _) => {
            // Remove the key (or the array element).
            let (parent, last) = path.split_at(path.len() - 1);
            match (at(doc, parent), &last[0]) {
                (Value::Table(t), Seg::Key(k)) => {
                    t.remove(k);
                }
                (Value::Array(a), Seg::Index(i)) => {
                    a.remove(*i);
                }
                _ => unreachable!("paths follow the document"),
            }
            "missing key"
        }
        _ => {
            *target = other_type(rng, target);
            "wrong type"
        }
    };
    (what.into(), key)
}

/// Runs `f` on a thread; a panic or more than `budget` is an error naming `case`.
fn guarded<T: Send + 'static>(case: &str, budget: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let r = std::panic::catch_unwind(AssertUnwindSafe(f));
        let _ = tx.send(r);
    });
    match rx.recv_timeout(budget) {
        Ok(Ok(v)) => v,
        Ok(Err(p)) => {
            let msg = p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
            panic!("{case}: panicked: {msg:?}")
        }
        Err(_) => panic!("{case}: no answer within {budget:?} (a hang)"),
    }
}

/// `Config::load` of `text` (from a file, as `lb plan` and the daemon read it), then, if it
/// loads, what `lb plan` computes and renders.
fn load_and_plan(dir: &Path, case: &str, budget: Duration, text: String) -> Result<(), anyhow::Error> {
    let file = dir.join("lb.toml");
    std::fs::write(&file, text).unwrap();
    guarded(case, budget, move || {
        let cfg = Config::load(&file)?;
        let plans = plan_all(&cfg, &|_, _| true);
        let _ = render_json(&cfg, &plans);
        let _ = render_table(&cfg, &plans);
        Ok(())
    })
}

/// The error names `key`, or is a list of violations that each name their field.
fn names_a_field(err: &anyhow::Error, key: Option<&str>) -> bool {
    let text = format!("{err:#}");
    if key.is_some_and(|k| text.contains(k)) {
        return true;
    }
    err.downcast_ref::<ConfigError>()
        .is_some_and(|c| !c.violations().is_empty() && c.violations().iter().all(|v| !v.field.is_empty()))
}

/// `LB_FUZZ_CASES`, else the CI's number.
fn cases() -> u64 {
    std::env::var("LB_FUZZ_CASES").ok().map(|c| c.parse().expect("LB_FUZZ_CASES")).unwrap_or(CI_CASES)
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("lb-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn mutated_examples_load_or_fail_naming_the_field() {
    let seed = fuzz::seed_from_env(fuzz::DEFAULT_SEED);
    let cases = cases();
    eprintln!("hostile config: LB_FUZZ_SEED={seed:#x} LB_FUZZ_CASES={cases}");
    let examples = examples();
    let tmp = TempDir::new("hostile-config");
    let mut rng = SplitMix64(seed);
    let (mut ok, mut refused) = (0u64, 0u64);
    for n in 0..cases {
        let (path, base) = &examples[rng.below(examples.len() as u64) as usize];
        let mut doc = base.clone();
        let mutations = 1 + u64::from(rng.below(4) == 0);
        let mut keys = Vec::new();
        let mut whats = Vec::new();
        for _ in 0..mutations {
            let (what, key) = mutate(&mut rng, &mut doc);
            whats.push(what);
            keys.push(key);
        }
        let text = match toml::to_string(&doc) {
            Ok(t) => t,
            // A value TOML cannot write (e.g. an empty table in an inline array position).
            Err(_) => continue,
        };
        let case = format!("LB_FUZZ_SEED={seed:#x} case {n}: {} with {whats:?} at {keys:?}", path.display());
        match load_and_plan(&tmp.0, &case, BUDGET, text.clone()) {
            Ok(()) => ok += 1,
            Err(e) => {
                refused += 1;
                let named = keys.iter().any(|k| names_a_field(&e, k.as_deref()));
                assert!(named, "{case}: the error names no field of the mutation: {e:#}\n--- file ---\n{text}");
            }
        }
    }
    eprintln!("hostile config: {ok} loaded and planned, {refused} refused naming the field");
    assert!(refused > cases / 4, "most mutations are refused: {refused} of {cases}");
}

#[test]
fn raw_byte_mutations_never_panic_or_hang() {
    let seed = fuzz::seed_from_env(fuzz::DEFAULT_SEED);
    let tmp = TempDir::new("hostile-config-raw");
    let mut rng = SplitMix64(seed ^ 0x5a5a);
    let texts: Vec<Vec<u8>> = examples().iter().map(|(p, _)| std::fs::read(p).unwrap()).collect();
    for n in 0..cases() {
        let mut t = texts[rng.below(texts.len() as u64) as usize].clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(t.len() as u64) as usize;
            match rng.below(5) {
                0 => t[i] ^= 1 << rng.below(8),
                1 => {
                    const BYTES: &[u8] = b"[]{}=\"'.,#\n\\\0\xff";
                    t[i] = BYTES[rng.below(BYTES.len() as u64) as usize];
                }
                2 => {
                    t.remove(i);
                }
                3 => t.truncate(i),
                _ => {
                    let chunk = t[i..(i + 1 + rng.below(40) as usize).min(t.len())].to_vec();
                    t.splice(i..i, chunk);
                }
            }
            if t.is_empty() {
                break;
            }
        }
        let text = String::from_utf8_lossy(&t).into_owned();
        let case = format!("LB_FUZZ_SEED={seed:#x} raw case {n}");
        if let Err(e) = load_and_plan(&tmp.0, &case, BUDGET, text.clone()) {
            let msg = format!("{e:#}");
            let points = msg.contains("line ") || names_a_field(&e, None);
            assert!(points, "{case}: the error points at no line or field: {msg}\n--- file ---\n{text}");
        }
    }
}

#[test]
fn a_hundred_thousand_backends_load_and_plan() {
    let tmp = TempDir::new("hostile-config-100k");
    let mut text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/failover.toml"))
        .expect("examples/failover.toml");
    for i in 0..100_000u32 {
        let zone = if i % 2 == 0 { "zone-1" } else { "zone-2" };
        text += &format!(
            "\n[[service.backend]]\naddress = \"10.{}.{}.{}\"\nzone = \"{zone}\"\n",
            i >> 16,
            (i >> 8) & 0xff,
            i & 0xff
        );
    }
    match load_and_plan(&tmp.0, "100000 backends", BUDGET_100K, text) {
        Ok(()) => {}
        Err(e) => assert!(names_a_field(&e, Some("backend")), "refused without naming the field: {e:#}"),
    }
}

/// Maps a refused reload must leave as they were: all pinned maps but the counters (`STATS`,
/// `CLASS_STATS`, `BACKEND_STATS`: the health checks' replies cross the program) and the
/// connection tables (written per packet by the kernel, not by a reload; this test sends no
/// traffic to the VIP, and their dump would be the bulk of the time).
/// Counters, connection tables, and the trace ring buffer (which has no keys to walk).
/// Maps that change by themselves: counters, flows, trace events, and the clean-slot bits the
/// daemon's connection-table scans set (no reload writes them).
const NOT_COMPARED: [&str; 7] =
    ["STATS", "CLASS_STATS", "BACKEND_STATS", "CONNTRACK", "CONNTRACK4", "TRACE_EVENTS", "CLEAN_SLOTS"];

/// A running daemon refuses hostile reloads (mutations of its own configuration that the
/// loader refuses, and broken TOML), by `lb reload` and by SIGHUP in turn; afterwards
/// `lb status --json` is the same text, byte for byte, and the pinned maps hold the same
/// bytes. (`lb status` carries no clocks; its only counters, the reloads', are left out of the
/// comparison and checked to count every refusal.)
#[test]

fn refused_reloads_leave_status_and_tables_byte_for_byte() {
    use lb_tests::e2e::{service_toml, start_server, wait_for, zones_toml, Daemon};
    use lb_tests::topology::{Topology, TopologySpec};

    let seed = fuzz::seed_from_env(fuzz::DEFAULT_SEED);
    eprintln!("hostile reload: LB_FUZZ_SEED={seed:#x}");
    let topo = Topology::build(&TopologySpec { prefix: "hc1".into(), zones: vec![(1, 2), (1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    // Backends decapsulate: health probes reach them through the data path (IPIP).
    let _decap =
        lb_tests::e2e::DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-hc1-decap")).unwrap();
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let stay = "[service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_STAY_WITHIN_ZONE\"\n";
    let good = zones_toml(2) + &service_toml(&topo, "web", false, "", stay, 80, &|_| false);
    let d = Daemon::start(&topo, "hc1", &good).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("LB_FUZZ_SEED={seed:#x}: {e:#}\n{}", d.diagnostics()) };
    // Health settles first (backends start healthy; their checks must keep them so).
    let raw_status = || -> serde_json::Value {
        serde_json::from_str(&d.cli(&["status", "--json"]).unwrap_or_else(|e| fail(e))).unwrap()
    };
    // Everything but the reload counters, which count each refusal (checked at the end).
    let status = || {
        let mut s = raw_status();
        s.as_object_mut().unwrap().remove("reloads");
        // The last probes' timings, and the connection-table scans, move on by themselves.
        s.as_object_mut().unwrap().remove("probes");
        s.as_object_mut().unwrap().remove("clean_slots");
        s.to_string()
    };
    wait_for("every backend healthy", Duration::from_secs(60), || {
        let s: serde_json::Value = serde_json::from_str(&status()).ok()?;
        let backends = s["services"][0]["backends"].as_array()?.clone();
        backends.iter().all(|b| b["health"] == "healthy").then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    let status_before = status();
    let maps_before = lb_tests::pinned::dump(&d.pin_dir, &NOT_COMPARED).unwrap_or_else(|e| fail(e));
    assert!(maps_before.contains_key("TABLES") && maps_before.contains_key("BACKENDS"), "{:?}", maps_before.keys());

    // Bad files: mutations of the running configuration the loader refuses, then broken TOML.
    let base: Value = good.parse().expect("the running configuration is TOML");
    let mut rng = SplitMix64(seed);
    let mut bad = Vec::new();
    while bad.len() < 10 {
        let mut doc = base.clone();
        let (what, key) = mutate(&mut rng, &mut doc);
        if let Ok(text) = toml::to_string(&doc) {
            if Config::parse(&text).is_err() {
                bad.push((format!("{what} at {key:?}"), text));
            }
        }
    }
    bad.push(("broken TOML".into(), good.replacen("protocol = \"TCP\"", "protocol = \"TCP", 1)));
    for (i, (what, text)) in bad.iter().enumerate() {
        d.rewrite_config(text).unwrap();
        if i % 2 == 0 {
            if let Ok(out) = d.cli(&["reload"]) {
                panic!("LB_FUZZ_SEED={seed:#x}: reload of a bad file ({what}) succeeded: {out}\n{text}");
            }
        } else {
            let refusals = || d.log().matches("reload refused").count();
            let before = refusals();
            d.sighup().unwrap();
            wait_for(&format!("SIGHUP refusal of {what} in the log"), Duration::from_secs(30), || {
                (refusals() > before).then_some(())
            })
            .unwrap_or_else(|e| fail(e));
        }
        assert_eq!(status(), status_before, "LB_FUZZ_SEED={seed:#x}: status changed by refusing {what}");
        let maps = lb_tests::pinned::dump(&d.pin_dir, &NOT_COMPARED).unwrap_or_else(|e| fail(e));
        for (name, pairs) in &maps_before {
            assert!(maps.get(name) == Some(pairs), "LB_FUZZ_SEED={seed:#x}: map {name} changed by refusing {what}");
        }
        assert_eq!(maps.len(), maps_before.len(), "the same maps are pinned");
    }
    let reloads = &raw_status()["reloads"];
    assert_eq!(reloads["refused"], bad.len(), "every refusal is counted in lb status: {reloads}");
    assert_eq!(reloads["applied"], 0, "{reloads}");
}
