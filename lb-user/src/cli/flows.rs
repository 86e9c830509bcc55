//! `lb flows`: the connection tables' live entries, read from the pins (a running daemon's or
//! a stopped `--keep-dataplane` one's), filtered, with a summary per service and backend.
//! Output streams as the tables are read: one line (or JSON object) per flow.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use lb_common::maps::{PROTO_ANY, PROTO_TCP, PROTO_UDP};
use serde::Serialize;

use crate::compile::IdsSnapshot;
use crate::daemon::{api, state};
use crate::dataplane::flows::{Flow, FlowState, PinnedFlows};
use crate::dataplane::pinning;

#[derive(clap::Args, Clone, Debug)]
pub struct FlowsArgs {
    /// bpffs directory of the data plane's pins (`lb run --pin-dir`).
    #[arg(long, default_value = pinning::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Control socket of the daemon; service names come from the state file beside it (without
    /// one, services are shown by id).
    #[arg(long, env = "LB_SOCKET", default_value = api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// Only flows of this service (its configured name, or `#ID`).
    #[arg(long)]
    pub service: Option<String>,
    /// Only flows tracked to this backend address.
    #[arg(long)]
    pub backend: Option<IpAddr>,
    /// Only flows from clients in this prefix (an address alone means just that address).
    #[arg(long, value_parser = parse_prefix)]
    pub client: Option<IpNet>,
    /// Only flows to this VIP.
    #[arg(long)]
    pub vip: Option<IpAddr>,
    /// Print only the summary (flows per service and per backend, by state).
    #[arg(long)]
    pub summary: bool,
    /// Print JSON: {"flows": [...], "summary": {...}}, written as the tables are read.
    #[arg(long)]
    pub json: bool,
}

pub(crate) fn parse_prefix(s: &str) -> Result<IpNet, String> {
    s.parse::<IpNet>()
        .or_else(|_| s.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{s}` is not an address or a prefix (e.g. 198.18.1.0/24, 2001:db8::/48)"))
}

/// One flow as printed.
#[derive(Serialize)]
struct FlowView<'a> {
    client: IpAddr,
    client_port: u16,
    vip: IpAddr,
    port: u16,
    proto: &'static str,
    service: &'a str,
    backend: Option<IpAddr>,
    backend_id: u32,
    client_class: u16,
    idle_sec: f64,
    idle_left_sec: Option<f64>,
    state: &'static str,
    reason: Option<&'static str>,
}

/// Flows per state.
#[derive(Default, Serialize)]
struct Counts {
    total: u64,
    live: u64,
    draining: u64,
    idle: u64,
    void: u64,
}

impl Counts {
    fn add(&mut self, f: &Flow) {
        self.total += 1;
        match f.state {
            FlowState::Live => self.live += 1,
            FlowState::Draining => self.draining += 1,
            FlowState::Idle => self.idle += 1,
            FlowState::Void(_) => self.void += 1,
        }
    }
}

#[derive(Default, Serialize)]
struct Summary {
    all: Counts,
    per_service: BTreeMap<String, Counts>,
    /// Keyed by the backend's address, or `#ID` for an id no backend holds now.
    per_backend: BTreeMap<String, Counts>,
}

pub fn run(args: &FlowsArgs) -> Result<()> {
    let flows = PinnedFlows::open(&args.pin_dir)?;
    let names = service_names(&args.socket);
    let name_of = |id: u32| names.get(&id).cloned().unwrap_or_else(|| format!("#{id}"));
    let wanted_service = match &args.service {
        None => None,
        Some(s) => Some(resolve_service(s, &names, flows.service_keys().map(|(id, _)| id))?),
    };
    let out = std::io::stdout();
    let mut out = std::io::BufWriter::new(out.lock());
    let mut summary = Summary::default();
    let mut first = true;
    if args.json {
        write!(out, "{{\"flows\":[")?;
    } else if !args.summary {
        writeln!(
            out,
            "{:<40} {:<40} {:<5} {:<14} {:<28} {:>9} {:>9}  STATE",
            "CLIENT", "VIP", "PROTO", "SERVICE", "BACKEND", "IDLE", "IDLE-LEFT"
        )?;
    }
    let mut result: Result<()> = Ok(());
    flows.for_each(|f| {
        if result.is_err() || !matches(args, wanted_service, &f) {
            return;
        }
        let service = name_of(f.service_id);
        summary.all.add(&f);
        summary.per_service.entry(service.clone()).or_default().add(&f);
        let backend_key = f.backend.map(|a| a.to_string()).unwrap_or_else(|| format!("#{}", f.backend_id));
        summary.per_backend.entry(backend_key).or_default().add(&f);
        if args.summary {
            return;
        }
        let view = FlowView {
            client: f.client,
            client_port: f.client_port,
            vip: f.vip,
            port: f.port,
            proto: proto_name(f.proto),
            service: &service,
            backend: f.backend,
            backend_id: f.backend_id,
            client_class: f.client_class,
            idle_sec: secs(f.idle_ns),
            idle_left_sec: f.idle_left_ns.map(secs),
            state: f.state.name(),
            reason: f.state.reason(),
        };
        result = if args.json {
            let sep = if std::mem::take(&mut first) { "" } else { "," };
            write!(out, "{sep}").map_err(Into::into).and_then(|()| Ok(serde_json::to_writer(&mut out, &view)?))
        } else {
            writeln!(out, "{}", line(&view)).map_err(Into::into)
        };
    })?;
    result?;
    if args.json {
        write!(out, "],\"summary\":")?;
        serde_json::to_writer(&mut out, &summary)?;
        writeln!(out, "}}")?;
    } else {
        write!(out, "{}", render_summary(&summary))?;
    }
    out.flush().context("writing the flows")
}

fn matches(args: &FlowsArgs, service: Option<u32>, f: &Flow) -> bool {
    service.is_none_or(|id| f.service_id == id)
        && args.backend.is_none_or(|b| f.backend == Some(b))
        && args.client.is_none_or(|p| p.contains(&f.client))
        && args.vip.is_none_or(|v| f.vip == v)
}

/// A service given by name (from the state file) or as `#ID`.
fn resolve_service(s: &str, names: &BTreeMap<u32, String>, ids: impl Iterator<Item = u32>) -> Result<u32> {
    if let Some(id) = s.strip_prefix('#').and_then(|n| n.parse::<u32>().ok()) {
        return Ok(id);
    }
    if let Some((id, _)) = names.iter().find(|(_, n)| *n == s) {
        return Ok(*id);
    }
    let mut known: Vec<String> = names.values().cloned().collect();
    if known.is_empty() {
        known = ids.map(|id| format!("#{id}")).collect();
        known.sort();
    }
    bail!("--service: no service `{s}`; the data plane has: {}", known.join(", "))
}

/// Service id -> name, from the daemon's state file (absent or unreadable: none).
pub(crate) fn service_names(socket: &Path) -> BTreeMap<u32, String> {
    #[derive(serde::Deserialize)]
    struct Saved {
        ids: IdsSnapshot,
    }
    std::fs::read_to_string(state::path_for(socket))
        .ok()
        .and_then(|text| serde_json::from_str::<Saved>(&text).ok())
        .map(|s| s.ids.services.into_iter().map(|(name, id)| (id, name)).collect())
        .unwrap_or_default()
}

fn proto_name(p: u8) -> &'static str {
    match p {
        PROTO_TCP => "tcp",
        PROTO_UDP => "udp",
        1 | 58 => "icmp",
        PROTO_ANY => "any",
        _ => "other",
    }
}

fn secs(ns: u64) -> f64 {
    (ns / 1_000_000) as f64 / 1000.0
}

fn endpoint(addr: IpAddr, port: u16) -> String {
    match (addr, port) {
        (IpAddr::V6(a), p) if p != 0 => format!("[{a}]:{p}"),
        (a, p) if p != 0 => format!("{a}:{p}"),
        (a, _) => a.to_string(),
    }
}

fn line(v: &FlowView) -> String {
    let backend = v.backend.map(|b| b.to_string()).unwrap_or_else(|| format!("#{} (gone)", v.backend_id));
    let left = v.idle_left_sec.map(|s| format!("{s:.1}s")).unwrap_or_else(|| "never".into());
    let state = match v.reason {
        Some(r) => format!("{} ({r})", v.state),
        None => v.state.to_owned(),
    };
    format!(
        "{:<40} {:<40} {:<5} {:<14} {:<28} {:>8.1}s {:>9}  {state}",
        endpoint(v.client, v.client_port),
        endpoint(v.vip, v.port),
        v.proto,
        v.service,
        backend,
        v.idle_sec,
        left
    )
}

fn render_summary(s: &Summary) -> String {
    let row = |name: &str, c: &Counts| {
        format!(
            "  {name:<40} {:>8} flows: {} live, {} draining, {} idle, {} void\n",
            c.total, c.live, c.draining, c.idle, c.void
        )
    };
    let mut text = format!(
        "\n{} flows: {} live, {} draining, {} idle, {} void\n",
        s.all.total, s.all.live, s.all.draining, s.all.idle, s.all.void
    );
    text.push_str("per service:\n");
    for (name, c) in &s.per_service {
        text.push_str(&row(name, c));
    }
    text.push_str("per backend:\n");
    for (name, c) in &s.per_backend {
        text.push_str(&row(name, c));
    }
    text
}
