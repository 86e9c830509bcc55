//! Human-readable rendering of the daemon's replies (`--json` prints them as they are). Tables
//! are aligned columns without borders (`comfy-table`); a long eligible set wraps within its
//! column instead of running off the terminal.
use crate::daemon::reply::{
    BackendChange, ChangeKind, ClassFacts, Explanation, HostDrain, ReloadPlan, Reloaded, Stats, Status,
};
use comfy_table::{presets, CellAlignment, ColumnConstraint, ContentArrangement, Table, Width};
use std::fmt::Write;
use std::net::IpAddr;

/// Width tables wrap to when stdout is not a terminal (a terminal's own width otherwise).
const DEFAULT_WIDTH: u16 = 120;

/// A borderless table with one space between columns. `min` gives each column's least width
/// (the header's width at the least); `right` the columns aligned right (numbers).
fn table(header: &[&str], min: &[u16], right: &[usize]) -> Table {
    let mut t = Table::new();
    t.load_style(presets::NOTHING);
    t.set_content_arrangement(ContentArrangement::Dynamic);
    let width = crossterm_width().unwrap_or(DEFAULT_WIDTH);
    t.set_width(width.saturating_sub(INDENT.len() as u16));
    t.set_header(header.to_vec());
    for (i, col) in t.column_iter_mut().enumerate() {
        col.set_padding((0, 1));
        if let Some(&m) = min.get(i) {
            col.set_constraint(ColumnConstraint::LowerBoundary(Width::Fixed(m + 1)));
        }
        if right.contains(&i) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    t
}

/// The terminal's width, if stdout is one.
fn crossterm_width() -> Option<u16> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    // SAFETY: a winsize is plain integers; all zeroes is a valid value.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    // SAFETY: TIOCGWINSZ fills a winsize on a terminal descriptor.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(ws.ws_col)
}

const INDENT: &str = "  ";

/// The table's lines, indented, without trailing blanks.
fn push_table(out: &mut String, t: &Table) {
    for line in t.lines() {
        let _ = writeln!(out, "{INDENT}{}", line.trim_end());
    }
}

/// An eligible set: its addresses, or DROP when it is empty.
fn eligible(set: &[IpAddr]) -> String {
    if set.is_empty() {
        "DROP".into()
    } else {
        set.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", ")
    }
}

/// `ok 1.2 ms, 3 s ago` or `failed 4 s ago: connect: ...`; `-` when not probed.
fn last_probe(p: Option<&crate::daemon::reply::ProbeResult>) -> String {
    match p {
        None => "-".into(),
        Some(p) if p.passed => format!("ok {:.1} ms, {} s ago", p.latency_ms, p.seconds_ago),
        Some(p) => format!("failed {} s ago: {}", p.seconds_ago, p.error.as_deref().unwrap_or("-")),
    }
}

fn or_dash(v: &Option<String>) -> &str {
    v.as_deref().unwrap_or("-")
}

pub fn status(v: &Status) -> String {
    let mut out = String::new();
    // The data plane's attachments and pins, when something is amiss.
    for l in v.links.iter().filter(|l| l.state != "attached") {
        let _ = writeln!(out, "interface {}: {}", l.interface, l.state);
    }
    for l in &v.links {
        if let Some(mac) = &l.mac {
            let _ = writeln!(out, "interface {}: MAC {mac}", l.interface);
        }
    }
    if v.pins != "ok" {
        let _ = writeln!(out, "pins {} (the data plane stops with the daemon; restart it to pin again)", v.pins);
    }
    if let Some(why) = &v.reloads.last_refusal {
        let r = &v.reloads;
        let _ = writeln!(out, "last reload refused ({} refused, {} applied): {why}", r.refused, r.applied);
    }
    // Failures the daemon survived (see the log for each).
    for (name, n) in v.faults.0.iter().filter(|(_, n)| *n > 0) {
        let _ = writeln!(out, "fault {name}: {n}");
    }
    if let Some(c) = &v.clean_slots {
        let _ = writeln!(
            out,
            "clean Maglev slots: {} of {} (a SYN there makes no connection-table entry; {} entries scanned)",
            c.clean, c.slots, c.entries
        );
    }
    for svc in &v.services {
        let ports = format!("[{}]", svc.ports.iter().map(u16::to_string).collect::<Vec<_>>().join(","));
        let _ = writeln!(
            out,
            "service {} ({} {} ports {})  eligible_kind {}  rule {}  active_pool {}",
            svc.name,
            svc.frontend_text(),
            svc.protocol,
            ports,
            svc.eligible_kind.map_or("-", |k| k.as_str()),
            svc.rule.map_or("-", |r| r.id()),
            or_dash(&svc.active_pool)
        );
        if let Some(check) = &svc.health_check {
            let _ = writeln!(out, "  health check: {check}");
        }
        let mut backends = table(
            &["BACKEND", "ZONE", "ROLE", "HEALTH", "SOURCE", "WEIGHT", "DRAINING", "LAST PROBE"],
            &[40, 10, 9, 10, 13, 6, 8],
            &[5],
        );
        for b in &svc.backends {
            let cells = [
                b.address.to_string(),
                or_dash(&b.zone).to_owned(),
                b.role.to_string(),
                b.health.to_string(),
                b.health_source.to_string(),
                b.weight.to_string(),
                b.draining.to_string(),
                last_probe(v.probes.iter().find(|p| p.service == svc.name && p.address == b.address).map(|p| &p.last)),
            ];
            backends.add_row(cells.to_vec());
        }
        push_table(&mut out, &backends);
        for n in &svc.names {
            let addrs = n.addresses.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
            let _ = writeln!(
                out,
                "  endpoint {} -> {}: {} [{addrs}], {}",
                n.endpoint, n.target, n.resolution, n.monitor_status
            );
        }
        if let Some(classes) = &svc.classes {
            let _ = writeln!(out, "  routing method {}", svc.routing_method);
            for c in classes {
                let prefixes = c.client_prefixes.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                let from = if prefixes.is_empty() { "(no prefix)".to_string() } else { prefixes };
                let _ = writeln!(out, "  class {} {}: {}\n    why: {}", c.class, from, eligible(&c.eligible), c.reason);
            }
            continue;
        }
        let mut t = table(&["CLIENT ZONE", "AFFINITY", "ELIGIBLE"], &[18, 15], &[]);
        for z in &svc.zones {
            let zone = z.client_zone.clone().unwrap_or_else(|| "(non-compatible)".into());
            t.add_row(vec![zone, z.affinity.clone(), eligible(&z.eligible)]);
        }
        push_table(&mut out, &t);
    }
    out
}

pub fn stats(v: &Stats) -> String {
    let mut out = String::new();
    let mut global = table(&["COUNTER", "VALUE"], &[24], &[1]);
    for (k, n) in v.global.0.iter().filter(|(_, n)| *n != 0) {
        global.add_row(vec![k.clone(), n.to_string()]);
    }
    if global.row_count() > 0 {
        for line in global.lines().skip(1) {
            let _ = writeln!(out, "{}", line.trim_end());
        }
    }
    for svc in &v.services {
        let _ = writeln!(out, "service {}", svc.name);
        let head = if svc.traffic_manager { "CLIENT CLASS" } else { "CLIENT ZONE" };
        let mut t =
            table(&[head, "PACKETS", "BYTES", "NEW FLOWS", "CROSS-ZONE SPILLS"], &[18, 10, 12, 10, 18], &[1, 2, 3, 4]);
        for c in &svc.classes {
            let label = match (svc.traffic_manager, &c.client_zone) {
                (true, _) if c.client_class == 0 => "0 (default)".into(),
                (true, _) => c.client_class.to_string(),
                (false, None) => "(non-compatible)".into(),
                (false, Some(zone)) => zone.clone(),
            };
            t.add_row(vec![
                label,
                c.packets.to_string(),
                c.bytes.to_string(),
                c.new_flows.to_string(),
                c.cross_zone_spills.to_string(),
            ]);
        }
        push_table(&mut out, &t);
    }
    out
}

pub fn explain(v: &Explanation) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "service {} ({}), client {}", v.service, v.vip, v.client);
    match &v.class {
        ClassFacts::TrafficManager { routing_method, reason, location, .. } => {
            let _ = writeln!(out, "  client class   {} ({})", v.client_class, routing_method);
            if let Some(location) = location {
                let _ = writeln!(out, "  located        {location}");
            }
            let _ = writeln!(out, "  why            {}", or_dash(reason));
        }
        ClassFacts::Zonal { client_zone, eligible_kind, rule, reason, affinity } => {
            let zone = client_zone.clone().unwrap_or_else(|| "none (non-compatible client)".into());
            let _ = writeln!(out, "  client class   {} (zone {})", v.client_class, zone);
            let _ = writeln!(
                out,
                "  eligible set   {eligible_kind} by rule {rule} ({reason}); zonal affinity {}",
                or_dash(affinity)
            );
        }
    }
    let _ = writeln!(out, "  eligible       {}", eligible(&v.eligible));
    let _ = writeln!(
        out,
        "  hash           {} ({}), Maglev slot {} of {}",
        v.hash, v.session_affinity, v.maglev_slot, v.table_size
    );
    let backend = match v.backend {
        _ if v.dropped => "DROP".to_owned(),
        Some(b) => b.to_string(),
        None => "-".to_owned(),
    };
    let _ = writeln!(out, "  new flow goes  {backend}");
    if let Some(r) = &v.reverse {
        let _ = writeln!(
            out,
            "  reverse flow   hash {} (symmetric {}), Maglev slot {}, client class {}: goes {}",
            r.hash,
            r.symmetric,
            r.maglev_slot,
            r.client_class,
            r.backend.map_or("DROP".to_owned(), |b| b.to_string())
        );
    }
    out
}

pub fn backend(v: &BackendChange) -> String {
    let mut what = Vec::new();
    if let Some(h) = v.health {
        what.push(format!(
            "health {}",
            serde_json::to_value(h).ok().and_then(|h| h.as_str().map(str::to_owned)).unwrap_or_default()
        ));
    }
    if let Some(d) = v.draining {
        what.push(if d { "draining".to_owned() } else { "not draining".to_owned() });
    }
    format!("ok: service {} backend {}: {}\n", v.service, v.address, what.join(", "))
}

pub fn host_drain(v: &HostDrain) -> String {
    format!("ok: VIPs withdrawn; the daemon stops in {} s\n", v.stop_in_sec)
}

pub fn reloaded(v: &Reloaded) -> String {
    format!("ok: reloaded {}\n", v.reloaded)
}

pub fn reload_plan(v: &ReloadPlan) -> String {
    let mut out = String::new();
    if v.services.is_empty() {
        let _ = writeln!(out, "dry run: reloading {} changes nothing", v.config);
        return out;
    }
    let _ =
        writeln!(out, "dry run: reloading {} would write {} tables (nothing was applied)", v.config, v.tables_to_write);
    for s in &v.services {
        let kind = match s.change {
            ChangeKind::Added => "added",
            ChangeKind::Removed => "removed",
            ChangeKind::Changed => "changed",
        };
        let _ = writeln!(out, "service {} {kind} ({} tables)", s.name, s.tables);
        for (sign, list) in [("+", &s.backends_added), ("-", &s.backends_removed)] {
            for a in list {
                let _ = writeln!(out, "  {sign} backend {a}");
            }
        }
        if s.eligible.is_empty() {
            continue;
        }
        let mut t = table(&["CLIENT", "ELIGIBLE BEFORE", "ELIGIBLE AFTER"], &[18], &[]);
        let set = |s: &Option<Vec<IpAddr>>| s.as_deref().map_or_else(|| "-".to_owned(), eligible);
        for e in &s.eligible {
            t.add_row(vec![e.client.clone(), set(&e.before), set(&e.after)]);
        }
        push_table(&mut out, &t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::daemon::reply::{ClassStats, ClassView, Counters, ServiceStats, ServiceStatus, ZoneView};
    use crate::model::{Protocol, RoutingMethod};
    use crate::policy::{EligibleKind, Rule};

    fn counters(client_class: u32, client_zone: Option<&str>) -> ClassStats {
        ClassStats {
            client_class,
            client_zone: client_zone.map(str::to_owned),
            packets: 1,
            bytes: 2,
            new_flows: 3,
            cross_zone_spills: 0,
        }
    }

    #[test]
    fn stats_label_zones_for_zonal_and_classes_for_traffic_manager_services() {
        let v = Stats {
            global: Counters::default(),
            services: vec![
                ServiceStats {
                    name: "web".into(),
                    traffic_manager: false,
                    classes: vec![counters(0, None), counters(1, Some("zone-a"))],
                },
                ServiceStats {
                    name: "tm".into(),
                    traffic_manager: true,
                    classes: vec![counters(0, None), counters(2, None)],
                },
            ],
        };
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

    /// 16.7: the numbers of a row stand right-aligned under their headers (they were printed
    /// one space apart, whatever the header's width).
    #[test]
    fn stats_numbers_are_aligned_under_their_headers() {
        let row = |client_class, zone: &str, n: u64| ClassStats {
            client_class,
            client_zone: Some(zone.into()),
            packets: n,
            bytes: n * 1500,
            new_flows: n / 10,
            cross_zone_spills: n % 7,
        };
        let v = Stats {
            global: Counters(vec![("rx".into(), 5), ("drop_fib".into(), 0), ("xdp_tx".into(), 123456)]),
            services: vec![ServiceStats {
                name: "web".into(),
                traffic_manager: false,
                classes: vec![row(1, "zone-a", 7), row(2, "zone-b", 1234567)],
            }],
        };
        let out = stats(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("rx ") && lines[0].ends_with(" 5") && lines[1].ends_with(" 123456"), "{out}");
        assert_eq!(lines[0].len(), lines[1].len(), "counter values right-aligned: {out}");
        assert!(!out.contains("drop_fib"), "zero counters are left out: {out}");
        let header = lines.iter().find(|l| l.contains("PACKETS")).unwrap();
        for (n, line) in lines.iter().filter(|l| l.contains("zone-")).enumerate() {
            // Every number ends where its header ends.
            for (head, value) in
                [("PACKETS", [7u64, 1234567][n]), ("BYTES", [10500, 1851850500][n]), ("NEW FLOWS", [0, 123456][n])]
            {
                let end = header.find(head).unwrap() + head.len();
                let value = value.to_string();
                assert_eq!(&line[end - value.len()..end], value, "{head} of {line:?}\n{out}");
            }
        }
    }

    fn status_of(services: Vec<ServiceStatus>) -> Status {
        Status {
            config: "lb.toml".into(),
            interfaces: vec![],
            links: vec![],
            pins: "ok".into(),
            services,
            announce: None,
            reloads: Default::default(),
            faults: Default::default(),
            probes: Vec::new(),
            clean_slots: None,
        }
    }

    /// A zonal service `web` (VIP 198.18.0.100, TCP 80) with these per-zone sets.
    fn zonal_web(zones: Vec<ZoneView>) -> ServiceStatus {
        ServiceStatus {
            name: "web".into(),
            vip: Some("198.18.0.100".parse().unwrap()),
            next_hop: None,
            protocol: Protocol::Tcp,
            ports: vec![80],
            eligible_kind: Some(EligibleKind::AllHealthy),
            rule: Some(Rule::E1),
            active_pool: Some("ALL".into()),
            backends: vec![],
            zones,
            routing_method: RoutingMethod::Zonal,
            classes: None,
            names: vec![],
            health_check: Some("TCP port 80, through the VIP 198.18.0.100 (IPIP)".into()),
        }
    }

    #[test]
    fn status_shows_zones_for_zonal_and_classes_for_traffic_manager_services() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let v = status_of(vec![
            zonal_web(vec![
                ZoneView {
                    client_zone: Some("zone-a".into()),
                    affinity: "REFINED".into(),
                    eligible: vec![ip("198.18.11.1")],
                },
                ZoneView { client_zone: None, affinity: "NOT_COMPATIBLE".into(), eligible: vec![] },
            ]),
            ServiceStatus {
                name: "app".into(),
                vip: Some(ip("198.18.0.21")),
                next_hop: None,
                protocol: Protocol::Tcp,
                ports: vec![80],
                eligible_kind: None,
                rule: None,
                active_pool: None,
                backends: vec![],
                zones: vec![],
                routing_method: RoutingMethod::Subnet,
                names: vec![],
                health_check: None,
                classes: Some(vec![
                    ClassView {
                        class: 1,
                        client_prefixes: vec!["198.18.1.0/24".parse().unwrap()],
                        eligible: vec![ip("198.18.21.1")],
                        reason: "SUBNET: mapped".into(),
                    },
                    ClassView {
                        class: 0,
                        client_prefixes: vec![],
                        eligible: vec![],
                        reason: "SUBNET: no range (NODATA)".into(),
                    },
                ]),
            },
        ]);
        let out = status(&v);
        assert!(out.contains("zone-a             REFINED         198.18.11.1"), "{out}");
        assert!(out.contains("(non-compatible)   NOT_COMPATIBLE  DROP"), "{out}");
        assert!(out.contains("routing method SUBNET"), "{out}");
        assert!(out.contains("  health check: TCP port 80, through the VIP 198.18.0.100 (IPIP)\n"), "{out}");
        assert!(out.contains("class 1 198.18.1.0/24: 198.18.21.1\n    why: SUBNET: mapped"), "{out}");
        assert!(out.contains("class 0 (no prefix): DROP"), "{out}");
    }

    /// A long eligible set wraps within its column: no line is wider than the table's width,
    /// and every address is still there.
    #[test]
    fn long_eligible_sets_wrap() {
        let set: Vec<IpAddr> = (1..=40).map(|i| format!("198.18.11.{i}").parse().unwrap()).collect();
        let v = status_of(vec![zonal_web(vec![ZoneView {
            client_zone: Some("zone-a".into()),
            affinity: "REFINED".into(),
            eligible: set.clone(),
        }])]);
        let out = status(&v);
        assert!(out.lines().all(|l| l.chars().count() <= DEFAULT_WIDTH as usize), "{out}");
        assert!(out.lines().filter(|l| l.contains("198.18.11.")).count() > 3, "wrapped over several lines: {out}");
        let text = out.split_whitespace().collect::<Vec<_>>().join(" ");
        for a in &set {
            assert!(text.contains(&a.to_string()), "{a} in {out}");
        }
    }
}
