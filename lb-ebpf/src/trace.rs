//! `lb_traced`: the balancer compiled with tracing (`balance_until::<_, true>`). The daemon
//! attaches it in place of `lb` only while `lb trace` runs, so `lb` itself has no tracing code
//! and pays nothing. Per packet it notes what the pipeline learned (tuple, service, backend,
//! class) in this CPU's scratch record, and at the end sends one event to `TRACE_EVENTS` when
//! the packet matches `TRACE_FILTER` (filtered here, in the kernel) and this CPU's token bucket
//! allows. The deciding drop or pass counter is found by comparing the global counters with
//! their values at the packet's start.

use aya_ebpf::{
    macros::map,
    maps::{Array, PerCpuArray, RingBuf},
    programs::XdpContext,
};
use lb_common::maps::{stat, FlowTuple, GlobalStats};
use lb_common::trace::{
    TraceEvent, TraceFilter, TRACE_CT_HIT, TRACE_NEW_FLOW, TRACE_NONE, TRACE_NO_REASON, TRACE_PARSED, VERDICT_COUNTERS,
};

use crate::clock;
use crate::maps::STATS;

/// The filter and rate (userspace writes it before attaching `lb_traced`).
#[map]
pub static TRACE_FILTER: Array<TraceFilter> = Array::with_max_entries(1, 0);
/// The events (`lb trace` reads them from the pin).
#[map]
pub static TRACE_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 16, 0);
/// This CPU's packet in progress and token bucket.
#[map]
pub static TRACE_SCRATCH: PerCpuArray<Scratch> = PerCpuArray::with_max_entries(1, 0);

/// Per CPU: the counters at the packet's start, the event being gathered, the token bucket.
#[repr(C)]
pub struct Scratch {
    before: [u64; stat::GLOBAL_COUNT as usize],
    event: TraceEvent,
    /// Tokens left and the data-plane time of the last refill.
    tokens: u64,
    refilled_ns: u64,
    /// Events the ring buffer had no room for.
    pub lost: u64,
}

#[inline(always)]
fn scratch() -> Option<&'static mut Scratch> {
    TRACE_SCRATCH.get_ptr_mut(0).map(|p| unsafe { &mut *p })
}

/// The packet's start: the counters as they are, and an event with nothing known yet.
#[inline(always)]
pub fn begin() {
    let (Some(s), Some(g)) = (scratch(), STATS.get_ptr(0)) else { return };
    let g: &GlobalStats = unsafe { &*g };
    s.before = g.counters;
    s.event = TraceEvent { service: TRACE_NONE, backend: TRACE_NONE, reason: TRACE_NO_REASON, ..TraceEvent::default() };
}

/// The parser read the packet's tuple.
#[inline(always)]
pub fn packet(family: u8, tuple: &FlowTuple) {
    if let Some(s) = scratch() {
        s.event.family = family;
        s.event.tuple = *tuple;
        s.event.flags |= TRACE_PARSED;
    }
}

/// The packet is for service `id`.
#[inline(always)]
pub fn service(id: u32) {
    if let Some(s) = scratch() {
        s.event.service = id;
    }
}

/// The packet goes to backend `id`, chosen in (or tracked with) client class `class`.
#[inline(always)]
pub fn backend(id: u32, class: u32) {
    if let Some(s) = scratch() {
        s.event.backend = id;
        s.event.class = class;
    }
}

/// The packet's end with `action`: one event if the filter and the rate allow.
#[inline(always)]
pub fn end(ctx: &XdpContext, action: u32) {
    let (Some(s), Some(f), Some(g)) = (scratch(), TRACE_FILTER.get(0), STATS.get_ptr(0)) else { return };
    let g: &GlobalStats = unsafe { &*g };
    let parsed = s.event.flags & TRACE_PARSED != 0;
    let wanted = if parsed { f.matches(s.event.family, &s.event.tuple) } else { !f.constrains() };
    if !wanted {
        return;
    }
    let now = clock::now_ns();
    if !take_token(s, f.rate_per_sec, now) {
        return;
    }
    let mut i = 0;
    while i < stat::GLOBAL_COUNT as usize {
        let moved = g.counters[i] != s.before[i];
        if moved && VERDICT_COUNTERS & (1 << i) != 0 {
            s.event.reason = i as u16;
        }
        if moved && i == stat::CT_HIT as usize {
            s.event.flags |= TRACE_CT_HIT;
        }
        if moved && i == stat::NEW_FLOW as usize {
            s.event.flags |= TRACE_NEW_FLOW;
        }
        i += 1;
    }
    s.event.action = action as u8;
    s.event.time_ns = now;
    s.event.ifindex = ctx.ingress_ifindex() as u32;
    if TRACE_EVENTS.output::<TraceEvent>(&s.event, 0).is_err() {
        s.lost += 1;
    }
}

/// Takes a token of this CPU's bucket: `rate` tokens a second, a burst of one second's worth.
#[inline(always)]
fn take_token(s: &mut Scratch, rate: u32, now: u64) -> bool {
    if rate == 0 {
        return false;
    }
    let per_token = 1_000_000_000 / rate as u64;
    let earned = now.saturating_sub(s.refilled_ns) / per_token.max(1);
    if earned > 0 {
        s.tokens += earned;
        s.refilled_ns = now;
    }
    // Never more than a second's worth, also when a new trace lowered the rate.
    if s.tokens > rate as u64 {
        s.tokens = rate as u64;
    }
    if s.tokens == 0 {
        return false;
    }
    s.tokens -= 1;
    true
}
