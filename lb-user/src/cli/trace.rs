//! `lb trace`: live per-packet verdicts of the data plane. Asks the daemon to attach the traced
//! program with a filter (applied in the kernel) and a rate limit, prints the events from the
//! pinned ring buffer as they come, and asks the daemon to attach `lb` again at the end (after
//! `--count` events, `--seconds`, or Ctrl-C; the daemon also ends the trace by itself when its
//! time is over).

use std::collections::BTreeMap;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use aya::maps::{Array, Map, MapData};
use ipnet::IpNet;
use lb_common::maps::{stat, Backend, PROTO_TCP, PROTO_UDP};
use lb_common::trace::{TraceEvent, TRACE_CT_HIT, TRACE_NEW_FLOW, TRACE_NONE, TRACE_NO_REASON, TRACE_PARSED};
use serde::Serialize;

use crate::daemon::api::{self, Proto, Request};
use crate::daemon::trace::{TraceSpec, TraceState, MAX_RATE, MAX_SECONDS};
use crate::dataplane::flows::words_addr;
use crate::dataplane::{pinning, trace as dp_trace};

#[derive(clap::Args, Clone, Debug)]
pub struct TraceArgs {
    /// Only packets from clients in this prefix (an address alone means just that address).
    #[arg(long, value_parser = super::flows::parse_prefix)]
    pub client: Option<IpNet>,
    /// Only packets to this VIP.
    #[arg(long)]
    pub vip: Option<IpAddr>,
    /// Only packets to this destination port.
    #[arg(long)]
    pub port: Option<u16>,
    /// Only packets of this protocol.
    #[arg(long, value_enum)]
    pub proto: Option<Proto>,
    /// Events per second and CPU at most (the kernel drops the rest).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=MAX_RATE as i64))]
    pub rate: u32,
    /// Stop after this many events.
    #[arg(long)]
    pub count: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(1..=MAX_SECONDS as i64))]
    pub seconds: u32,
    /// One JSON object per event (JSON Lines).
    #[arg(long)]
    pub json: bool,
    /// Control socket of the daemon.
    #[arg(long, env = "LB_SOCKET", default_value = api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
    /// bpffs directory of the data plane's pins (`lb run --pin-dir`).
    #[arg(long, default_value = pinning::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
}

/// One event as printed.
#[derive(Serialize)]
struct EventView {
    time_ns: u64,
    ifindex: u32,
    client: Option<IpAddr>,
    client_port: Option<u16>,
    vip: Option<IpAddr>,
    port: Option<u16>,
    proto: Option<&'static str>,
    verdict: &'static str,
    reason: Option<&'static str>,
    service: Option<String>,
    backend: Option<String>,
    class: u32,
    /// `hit` (a connection-table entry decided), `new` (a Maglev choice), or `none`.
    conntrack: &'static str,
}

static STOP: AtomicBool = AtomicBool::new(false);

pub fn run(args: &TraceArgs) -> Result<()> {
    let mut ring = dp_trace::open_events(&args.pin_dir)?;
    let backends = open_backends(&args.pin_dir)?;
    let names = super::flows::service_names(&args.socket);
    // Events of an earlier trace nobody read.
    let _ = dp_trace::drain(&mut ring);
    let spec = TraceSpec { client: args.client, vip: args.vip, port: args.port, proto: args.proto, rate: args.rate };
    let start: TraceState = call(&args.socket, Request::TraceStart { spec, seconds: args.seconds })?;
    eprintln!(
        "tracing on {} for {} s (Ctrl-C stops)",
        start.interfaces.join(", "),
        start.seconds_left.unwrap_or(args.seconds)
    );
    extern "C" fn stop(_: libc::c_int) {
        STOP.store(true, Ordering::Relaxed);
    }
    // SAFETY: the handler only stores to an atomic.
    unsafe { libc::signal(libc::SIGINT, stop as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    let deadline = Instant::now() + Duration::from_secs(args.seconds.into());
    let mut seen = 0u64;
    let out = std::io::stdout();
    let mut out = out.lock();
    let result = (|| -> Result<()> {
        while !STOP.load(Ordering::Relaxed) && Instant::now() < deadline {
            for e in dp_trace::drain(&mut ring) {
                let view = view(&e, &names, &backends);
                if args.json {
                    serde_json::to_writer(&mut out, &view)?;
                    writeln!(out)?;
                } else {
                    writeln!(out, "{}", line(&view))?;
                }
                seen += 1;
                if args.count.is_some_and(|n| seen >= n) {
                    return Ok(());
                }
            }
            out.flush()?;
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    })();
    // Whatever happened above: the balancer's own program goes back.
    let stopped: Result<TraceState> = call(&args.socket, Request::TraceStop);
    out.flush()?;
    eprintln!("{seen} events");
    result.and(stopped.map(|_| ()))
}

fn call<T: serde::de::DeserializeOwned>(socket: &Path, req: Request) -> Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(api::call(socket, &req))
}

fn open_backends(pin_dir: &Path) -> Result<Array<MapData, Backend>> {
    let path = pin_dir.join("BACKENDS");
    let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
    Array::try_from(Map::Array(data)).context("BACKENDS has another layout")
}

fn view(e: &TraceEvent, names: &BTreeMap<u32, String>, backends: &Array<MapData, Backend>) -> EventView {
    let parsed = e.flags & TRACE_PARSED != 0;
    let t = &e.tuple;
    EventView {
        time_ns: e.time_ns,
        ifindex: e.ifindex,
        client: parsed.then(|| words_addr(&t.src, e.family)),
        client_port: parsed.then(|| u16::from_be(t.sport)),
        vip: parsed.then(|| words_addr(&t.dst, e.family)),
        port: parsed.then(|| u16::from_be(t.dport)),
        proto: parsed.then_some(match t.proto {
            PROTO_TCP => "tcp",
            PROTO_UDP => "udp",
            1 | 58 => "icmp",
            _ => "other",
        }),
        verdict: match e.action {
            0 => "aborted",
            1 => "drop",
            2 => "pass",
            3 => "tx",
            4 => "redirect",
            _ => "unknown",
        },
        reason: (e.reason != TRACE_NO_REASON).then(|| stat::NAMES.get(e.reason as usize).copied().unwrap_or("unknown")),
        service: (e.service != TRACE_NONE)
            .then(|| names.get(&e.service).cloned().unwrap_or_else(|| format!("#{}", e.service))),
        backend: (e.backend != TRACE_NONE).then(|| {
            backends
                .get(&e.backend, 0)
                .ok()
                .filter(|b| b.family != 0)
                .map(|b| words_addr(&b.addr, b.family).to_string())
                .unwrap_or_else(|| format!("#{}", e.backend))
        }),
        class: e.class,
        conntrack: if e.flags & TRACE_CT_HIT != 0 {
            "hit"
        } else if e.flags & TRACE_NEW_FLOW != 0 {
            "new"
        } else {
            "none"
        },
    }
}

fn line(v: &EventView) -> String {
    let flow = match (v.client, v.client_port, v.vip, v.port, v.proto) {
        (Some(c), Some(cp), Some(d), Some(dp), Some(p)) => format!("{c} {cp} -> {d} {dp} {p}"),
        _ => "(not parsed)".to_owned(),
    };
    let verdict = match v.reason {
        Some(r) => format!("{} ({r})", v.verdict.to_uppercase()),
        None => v.verdict.to_uppercase(),
    };
    let mut text = format!("{:>14.6} if{} {flow}  {verdict}", v.time_ns as f64 / 1e9, v.ifindex);
    if let Some(s) = &v.service {
        text += &format!("  service {s}");
    }
    if let Some(b) = &v.backend {
        text += &format!(" class {} backend {b} ({})", v.class, v.conntrack);
    }
    text
}
