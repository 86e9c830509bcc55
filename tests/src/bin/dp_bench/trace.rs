//! `dp_bench --trace`: what packet tracing costs. `lb` carries no tracing code (the daemon
//! attaches the traced build `lb_traced` in its place only while `lb trace` runs), so tracing
//! off costs nothing; this measures the traced build on the L2 DSR connection-table hit (the
//! production programs alone, no wrapper): with a filter no packet matches, and with a filter
//! that matches every packet and no rate limit, so that every call sends an event (counted).

use anyhow::{bail, Context, Result};
use aya::maps::{Array, MapData, RingBuf};
use lb_common::trace::TraceFilter;
use lb_tests::fixture_net::in_netns;
use lb_tests::packet::{TCP_ACK, TCP_SYN};

use super::{frame4_to, Bench, Expect, FrameCheck, Params, BACKEND_MAC, CT_HIT_PATH, L2_PORT, NEW_FLOW_PATH};
use lb_user::dataplane::XDP_TX;

pub fn run(p: Params) -> Result<()> {
    in_netns(move |topo| -> Result<()> {
        let mut b = Bench::load(topo.lbv0)?;
        let rewritten = FrameCheck::DestinationRewritten(BACKEND_MAC);
        let hit = Expect { action: XDP_TX, per_iteration: CT_HIT_PATH, frame: rewritten };
        let new = Expect { action: XDP_TX, per_iteration: NEW_FLOW_PATH, frame: rewritten };
        let (syn, ack) = (frame4_to(L2_PORT, TCP_SYN), frame4_to(L2_PORT, TCP_ACK));
        b.run("lb", &syn, 1, new)?;
        let set_filter = |b: &mut Bench, f: TraceFilter| -> Result<()> {
            let mut map: Array<&mut MapData, TraceFilter> =
                Array::try_from(b.ebpf.map_mut("TRACE_FILTER").context("no TRACE_FILTER map")?)?;
            Ok(map.set(0, f, 0)?)
        };
        // Repeat mode: the same frame takes the same path each iteration (the counters prove it).
        set_filter(&mut b, TraceFilter { port: 1u16.to_be(), rate_per_sec: u32::MAX, ..Default::default() })?;
        let lb = b.median_ns("lb", &ack, &p, hit)?;
        let missed = b.median_ns("lb_traced", &ack, &p, hit)?;
        // One call per frame, every call an event (the ring drained between batches).
        set_filter(&mut b, TraceFilter { rate_per_sec: u32::MAX, ..Default::default() })?;
        let mut ring: RingBuf<MapData> =
            RingBuf::try_from(b.ebpf.take_map("TRACE_EVENTS").context("no TRACE_EVENTS")?)?;
        let calls = p.single_calls.max(1000);
        let single = |b: &Bench, prog: &str, ring: &mut RingBuf<MapData>| -> Result<(f64, usize)> {
            let (mut total, mut events) = (0u64, 0usize);
            for i in 0..calls {
                total += b.run(prog, &ack, 1, hit)?;
                if i % 256 == 255 || i + 1 == calls {
                    while ring.next().is_some() {
                        events += 1;
                    }
                }
            }
            Ok((total as f64 / calls as f64, events))
        };
        let (lb_single, none) = single(&b, "lb", &mut ring)?;
        let (traced_single, events) = single(&b, "lb_traced", &mut ring)?;
        if none != 0 || events != calls {
            bail!("events: lb sent {none} (expected 0), lb_traced {events} for {calls} calls");
        }
        println!("Packet tracing, IPv4 L2 DSR connection-table hit, ns per packet (production programs alone):");
        println!("  tracing off: lb is the program attached; it has no tracing code (0 ns)");
        println!("  repeat mode, median of {} runs of {}:  lb {lb:.0}   lb_traced, filter matching nothing {missed:.0} ({:+.0})", p.runs, p.repeat, missed - lb);
        println!(
            "  one call per frame, mean of {calls}:  lb {lb_single:.0}   lb_traced, every packet an event {traced_single:.0} ({:+.0}; {events} events)",
            traced_single - lb_single
        );
        Ok(())
    })
}
