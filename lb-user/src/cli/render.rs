//! Human-readable rendering of the daemon's JSON answers (`--json` prints them as they are).
use serde_json::Value;
use std::fmt::Write;

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

fn list(v: &Value) -> String {
    match v.as_array() {
        Some(a) if a.is_empty() => "DROP".into(),
        Some(a) => a.iter().map(s).collect::<Vec<_>>().join(", "),
        None => "-".into(),
    }
}

pub fn status(v: &Value) -> String {
    let mut out = String::new();
    // The data plane's attachments and pins, when something is amiss.
    for l in v["links"].as_array().into_iter().flatten().filter(|l| l["state"] != "attached") {
        let _ = writeln!(out, "interface {}: {}", s(&l["interface"]), s(&l["state"]));
    }
    if v["pins"].as_str().is_some_and(|p| p != "ok") {
        let _ = writeln!(out, "pins {} (the data plane stops with the daemon; restart it to pin again)", s(&v["pins"]));
    }
    for svc in v["services"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "service {} ({} {} ports {})  eligible_kind {}  rule {}  active_pool {}",
            s(&svc["name"]),
            s(&svc["vip"]),
            s(&svc["protocol"]),
            svc["ports"],
            s(&svc["eligible_kind"]),
            s(&svc["rule"]),
            s(&svc["active_pool"])
        );
        let _ = writeln!(
            out,
            "  {:<40} {:<10} {:<9} {:<10} {:<13} {:>6} DRAINING",
            "BACKEND", "ZONE", "ROLE", "HEALTH", "SOURCE", "WEIGHT"
        );
        for b in svc["backends"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "  {:<40} {:<10} {:<9} {:<10} {:<13} {:>6} {}",
                s(&b["address"]),
                s(&b["zone"]),
                s(&b["role"]),
                s(&b["health"]),
                s(&b["health_source"]),
                s(&b["weight"]),
                b["draining"]
            );
        }
        if let Some(classes) = svc["classes"].as_array() {
            let _ = writeln!(out, "  routing method {}", s(&svc["routing_method"]));
            for c in classes {
                let prefixes = c["client_prefixes"]
                    .as_array()
                    .map(|p| p.iter().map(s).collect::<Vec<_>>().join(", "))
                    .unwrap_or_default();
                let from = if prefixes.is_empty() { "(no prefix)".to_string() } else { prefixes };
                let _ = writeln!(
                    out,
                    "  class {} {}: {}\n    why: {}",
                    s(&c["class"]),
                    from,
                    list(&c["eligible"]),
                    s(&c["reason"])
                );
            }
            continue;
        }
        let _ = writeln!(out, "  {:<18} {:<15} ELIGIBLE", "CLIENT ZONE", "AFFINITY");
        for z in svc["zones"].as_array().into_iter().flatten() {
            let zone = if z["client_zone"].is_null() { "(non-compatible)".into() } else { s(&z["client_zone"]) };
            let _ = writeln!(out, "  {:<18} {:<15} {}", zone, s(&z["affinity"]), list(&z["eligible"]));
        }
    }
    out
}

pub fn stats(v: &Value) -> String {
    let mut out = String::new();
    if let Some(g) = v["global"].as_object() {
        for (k, n) in g {
            if n.as_u64() != Some(0) {
                let _ = writeln!(out, "{k:<24} {n}");
            }
        }
    }
    for svc in v["services"].as_array().into_iter().flatten() {
        let _ = writeln!(out, "service {}", s(&svc["name"]));
        let tm = svc["traffic_manager"] == true;
        let head = if tm { "CLIENT CLASS" } else { "CLIENT ZONE" };
        let _ = writeln!(
            out,
            "  {:<18} {:>10} {:>12} {:>10} {:>18}",
            head, "PACKETS", "BYTES", "NEW FLOWS", "CROSS-ZONE SPILLS"
        );
        for c in svc["classes"].as_array().into_iter().flatten() {
            let label = match (tm, c["client_zone"].is_null()) {
                (true, _) if c["client_class"] == 0 => "0 (default)".into(),
                (true, _) => c["client_class"].to_string(),
                (false, true) => "(non-compatible)".into(),
                (false, false) => s(&c["client_zone"]),
            };
            let _ = writeln!(
                out,
                "  {:<18} {:>10} {:>12} {:>10} {:>18}",
                label, c["packets"], c["bytes"], c["new_flows"], c["cross_zone_spills"]
            );
        }
    }
    out
}

pub fn explain(v: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "service {} ({}), client {}", s(&v["service"]), s(&v["vip"]), s(&v["client"]));
    if v["routing_method"].is_string() {
        let _ = writeln!(out, "  client class   {} ({})", s(&v["client_class"]), s(&v["routing_method"]));
        let _ = writeln!(out, "  why            {}", s(&v["reason"]));
    } else {
        let zone =
            if v["client_zone"].is_null() { "none (non-compatible client)".into() } else { s(&v["client_zone"]) };
        let _ = writeln!(out, "  client class   {} (zone {})", s(&v["client_class"]), zone);
        let _ = writeln!(
            out,
            "  eligible set   {} by rule {} ({}); zonal affinity {}",
            s(&v["eligible_kind"]),
            s(&v["rule"]),
            s(&v["reason"]),
            s(&v["affinity"])
        );
    }
    let _ = writeln!(out, "  eligible       {}", list(&v["eligible"]));
    let _ = writeln!(
        out,
        "  hash           {} ({}), Maglev slot {} of {}",
        s(&v["hash"]),
        s(&v["session_affinity"]),
        s(&v["maglev_slot"]),
        s(&v["table_size"])
    );
    let _ = writeln!(
        out,
        "  new flow goes  {}",
        if v["dropped"] == Value::Bool(true) { "DROP".into() } else { s(&v["backend"]) }
    );
    out
}

pub fn done(v: &Value) -> String {
    format!("ok {}\n", v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn stats_label_zones_for_zonal_and_classes_for_traffic_manager_services() {
        let counters = |class: u32, zone: Value| json!({"client_class": class, "client_zone": zone, "packets": 1, "bytes": 2, "new_flows": 3, "cross_zone_spills": 0});
        let v = json!({"global": {}, "services": [
            {"name": "web", "traffic_manager": false, "classes": [counters(0, Value::Null), counters(1, json!("zone-a"))]},
            {"name": "tm", "traffic_manager": true, "classes": [counters(0, Value::Null), counters(2, Value::Null)]},
        ]});
        let out = stats(&v);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert!(
            lines[1].starts_with("CLIENT ZONE")
                && lines[2].starts_with("(non-compatible)")
                && lines[3].starts_with("zone-a"),
            "{out}"
        );
        assert!(
            lines[5].starts_with("CLIENT CLASS") && lines[6].starts_with("0 (default)") && lines[7].starts_with("2 "),
            "{out}"
        );
    }

    #[test]
    fn status_shows_zones_for_zonal_and_classes_for_traffic_manager_services() {
        let v = json!({"services": [
            {"name": "web", "vip": "198.18.0.100", "protocol": "TCP", "ports": [80], "eligible_kind": "ALL_HEALTHY",
             "rule": "E-1", "active_pool": "ALL", "backends": [], "routing_method": "ZONAL", "classes": null,
             "zones": [{"client_zone": "zone-a", "affinity": "REFINED", "eligible": ["198.18.11.1"]},
                       {"client_zone": null, "affinity": "NOT_COMPATIBLE", "eligible": []}]},
            {"name": "app", "vip": "198.18.0.21", "protocol": "TCP", "ports": [80], "eligible_kind": null, "rule": null,
             "active_pool": null, "backends": [], "routing_method": "SUBNET", "zones": [],
             "classes": [{"class": 1, "client_prefixes": ["198.18.1.0/24"], "eligible": ["198.18.21.1"], "reason": "SUBNET: mapped"},
                         {"class": 0, "client_prefixes": [], "eligible": [], "reason": "SUBNET: no range (NODATA)"}]}
        ]});
        let out = status(&v);
        assert!(out.contains("zone-a             REFINED         198.18.11.1"), "{out}");
        assert!(out.contains("(non-compatible)   NOT_COMPATIBLE  DROP"), "{out}");
        assert!(out.contains("routing method SUBNET"), "{out}");
        assert!(out.contains("class 1 198.18.1.0/24: 198.18.21.1\n    why: SUBNET: mapped"), "{out}");
        assert!(out.contains("class 0 (no prefix): DROP"), "{out}");
    }
}
