//! The balancer's XDP object: the program `lb` and `clock_probe` (the daemon's reading of the
//! data-plane clock, see `clock`), nothing else. The backend side (`lb_decap`) is an object of
//! its own (src/decap.rs); the bench programs are in the bench build of this object only
//! (feature `bench`, loaded by lb-tests' `dp_bench`).
//!
//! Per packet: parse -> service -> connection table -> (new flow) client class -> class table
//! -> backend -> encapsulate or rewrite -> transmit. No policy here: the controller has
//! compiled it into the tables and the service/backend flags.
#![no_std]
// The connection table's compare-and-swap (`conntrack::take`): core's atomic types are not
// available on the BPF target.
#![allow(internal_features)]
#![feature(core_intrinsics, adt_const_params)]
#![no_main]

#[cfg(feature = "bench")]
mod bench;
// `clock_probe` stays in this object: it must read the clock exactly as `lb` computes it,
// from this object's load-time `NS_PER_JIFFY`, and the daemon loads this object anyway (an
// object of its own would need the same constant set apart, and one more load).
mod clock;
mod conntrack;
mod encap;
mod icmp;
mod maps;
mod nexthop;
mod parse;
mod select;
mod stats;
mod trace;

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};
use lb_common::decide::{directionless, hash_tuple, is_new_flow, takes_new_flows, track_tuple};
use lb_common::hash::flow_hash;
use lb_common::maps::{
    forwarding, service_flags, stat, table_flags, Backend, CtEntry, CtKey4, CtKey6, FlowTuple, ServiceInfo, TableRef,
    BACKEND_DROP, FAMILY_V4, PROTO_TCP, PROTO_UDP,
};
use lb_ebpf::consts::{ETH_P_IP, ETH_P_IPV6};
use lb_ebpf::packet::{parse_eth, Verdict};

use crate::conntrack::FlowKey;
use crate::maps::{BACKENDS, CLASSES_PER_SERVICE};
use crate::parse::Packet;
use crate::stats::{drop, Counters};

/// The object's licence, as the kernel reads it: `bpf_fib_lookup` (IPIP next hops) is a
/// GPL-only helper, so it must be GPL-compatible; the eBPF crates are dual MIT / GPL-2.0.
#[no_mangle]
#[link_section = "license"]
#[used]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

// `#[xdp]` wraps the function in the program's entry point; `inline(always)` makes it part
// of that entry instead of a BPF-to-BPF call (a call and a return per packet, and returns
// are costly on CPUs with return-thunk mitigations).
#[xdp]
#[inline(always)]
pub fn lb(ctx: XdpContext) -> u32 {
    balance(&ctx)
}

/// The balancer with tracing (`trace`): attached in place of `lb` only while `lb trace` runs.
#[xdp]
#[inline(always)]
pub fn lb_traced(ctx: XdpContext) -> u32 {
    trace::begin();
    let action = balance_until::<{ u32::MAX }, true>(&ctx);
    trace::end(&ctx, action);
    action
}

/// What the traced build notes on the way (`trace`); nothing at all in `lb` (`TRACE` false).
macro_rules! note {
    ($trace:ident, $e:expr) => {
        if $trace {
            $e;
        }
    };
}

/// Stage boundary `$n` of `dp_bench --stages`: `balance_until::<$n>` passes the packet here
/// instead of going on. Only the bench build (feature `bench`) instantiates `balance_until`
/// with a stage; `lb` runs it with `u32::MAX`, where the test folds away at compile time. The
/// test is not compiled out without the feature: rustc then lays `lb` out differently (same
/// instructions in another block order, one more), where with it `lb` is exactly as before.
macro_rules! stop_before {
    ($stop:ident, $n:literal) => {
        if $stop == $n {
            return xdp_action::XDP_PASS;
        }
    };
}

/// The flow hash of the packet (spec §1.3 table S fields). For IPv4 the tuple's unused address
/// words are written as constants, so the hash's rounds over them fold at compile time.
#[inline(always)]
fn packet_hash(svc: &ServiceInfo, pkt: &Packet) -> u32 {
    let t = &pkt.tuple;
    if pkt.family == FAMILY_V4 {
        let v4 = FlowTuple { src: [t.src[0], 0, 0, 0], dst: [t.dst[0], 0, 0, 0], ..*t };
        flow_hash(&hash_tuple(svc.affinity, &v4, pkt.ports_valid))
    } else {
        flow_hash(&hash_tuple(svc.affinity, t, pkt.ports_valid))
    }
}

#[inline(always)]
fn balance(ctx: &XdpContext) -> u32 {
    balance_until::<{ u32::MAX }, false>(ctx)
}

/// The balancer. In the bench build it stops with XDP_PASS before stage `STOP` (1 service
/// lookup, 2 connection table / backend choice, 3 class counters, 4 forwarding) for
/// `dp_bench --stages`; `lb` runs it with `u32::MAX` (no stop, see `stop_before!`).
#[inline(always)]
pub fn balance_until<const STOP: u32, const TRACE: bool>(ctx: &XdpContext) -> u32 {
    // One lookup of this CPU's counter record for the whole packet.
    let counters = stats::counters();
    counters.inc(stat::RX_PACKETS);
    // `forward` is inlined once per family, so in each copy the family is a constant: the IPv4
    // copy has no IPv6 address words and no family tests (fewer instructions).
    // The common IPv4 and IPv6 packets are parsed with one bounds check each; the full parsers
    // handle the rest. Both parsers of a family feed its one copy of `forward`.
    let parsed = match parse::parse_v4_fast(ctx) {
        Some(pkt) => Parsed::V4(pkt),
        None => match parse::parse_v6_fast(ctx) {
            Some(pkt) => Parsed::V6(pkt),
            None => match parse_eth(ctx) {
                Ok((l3_off, ETH_P_IP)) => Parsed::from(parse::parse_v4(ctx, l3_off), Parsed::V4),
                Ok((l3_off, ETH_P_IPV6)) => Parsed::from(parse::parse_v6(ctx, l3_off), Parsed::V6),
                Ok(_) => Parsed::Not(Verdict::Pass),
                Err(v) => Parsed::Not(v),
            },
        },
    };
    let verdict = match parsed {
        Parsed::V4(mut pkt) => return forward::<STOP, TRACE>(ctx, &mut pkt, counters),
        Parsed::V6(mut pkt) => return forward::<STOP, TRACE>(ctx, &mut pkt, counters),
        Parsed::Not(v) => v,
    };
    match verdict {
        Verdict::Pass => {
            counters.inc(stat::PASS_NOT_VIP);
            xdp_action::XDP_PASS
        }
        Verdict::Drop(reason) => drop(reason, counters),
        Verdict::DropIfVip(reason, addr, family) => {
            if parse::is_vip(addr, family) {
                return drop(reason, counters);
            }
            counters.inc(stat::PASS_NOT_VIP);
            xdp_action::XDP_PASS
        }
    }
}

/// What the parsers made of a frame: a packet of either family, or the verdict on it.
enum Parsed {
    V4(Packet),
    V6(Packet),
    Not(Verdict),
}

impl Parsed {
    #[inline(always)]
    fn from(r: Result<Packet, Verdict>, family: impl FnOnce(Packet) -> Parsed) -> Parsed {
        match r {
            Ok(pkt) => family(pkt),
            Err(v) => Parsed::Not(v),
        }
    }
}

/// A new flow's backend, or why there is none. Every field is set on every path (no enum
/// payload left undefined: the compiler may spill undefined bits from a register the verifier
/// calls unreadable).
#[derive(Clone, Copy)]
struct Choice {
    /// The backend record; None: drop, counted in `reason`.
    backend: Option<&'static Backend>,
    reason: u32,
    class: u32,
    table: TableRef,
    id: u32,
    hash: u32,
    /// The Maglev slot of `hash` in `table` (0 without a table).
    index: u32,
}

/// The backend of a new flow of `pkt`: the client's class, its table, `table[hash % M]`.
#[inline(always)]
fn choose(svc: &ServiceInfo, pkt: &Packet) -> Choice {
    let hash = packet_hash(svc, pkt);
    let none = |reason, table, index| Choice { backend: None, reason, class: 0, table, id: 0, hash, index };
    let Some((class, table)) = select::class_table(svc.id, select::client_class(svc.id, pkt)) else {
        return none(stat::DROP_NO_TABLE, TableRef::default(), 0);
    };
    let Some(index) = select::maglev_index(hash) else {
        return none(stat::DROP_NO_TABLE, TableRef::default(), 0);
    };
    let id = match select::table_entry(table.slot, index) {
        Some(id) if id != BACKEND_DROP => id,
        _ if table.flags & table_flags::UNROUTABLE != 0 => return none(stat::DROP_CLASS_UNROUTABLE, table, index),
        _ => return none(stat::DROP_NO_BACKEND, table, index),
    };
    match BACKENDS.get(id) {
        Some(b) if b.family != 0 => Choice { backend: Some(b), reason: 0, class, table, id, hash, index },
        _ => none(stat::DROP_NO_BACKEND, table, index),
    }
}

/// A TCP packet after the SYN without an entry shortly after its table changed
/// (`TableRef::prev_until_ns`): the backend the previous table gives it if that one still takes
/// new connections, so that a handshake whose SYN went by the previous table without an entry
/// (`CLEAN_SLOTS`) reaches one backend. Otherwise `c`. (SYNs never take it: new connections
/// follow a change at once. A SYN retransmitted across a change re-selects in its now dirty
/// slot and makes an entry, which its ACK then follows.) `window`: all ones where the flow's
/// SYN may have gone without an entry, else 0 (no previous table).
#[inline(always)]
fn or_previous(c: Choice, now: u64, window: u64, counters: Counters) -> Choice {
    if now >= c.table.prev_until_ns & window {
        return c;
    }
    let Some(id) = select::table_entry(c.table.prev_slot, c.index) else { return c };
    // Only where a SYN could have gone without an entry: the slot was clean in that table.
    // (Elsewhere a miss is a flow from another balancer or from before a restart, which the
    // current table describes better.)
    if id == c.id || !select::slot_clean(c.table.prev_slot, c.index) {
        return c;
    }
    match BACKENDS.get(id) {
        Some(b) if takes_new_flows(b) => {
            counters.inc(stat::CT_PREV_TABLE);
            Choice { backend: Some(b), reason: 0, id, ..c }
        }
        _ => c,
    }
}

/// The balancer's work on a parsed packet: service, connection table or backend choice,
/// counters, encapsulation and transmit.
#[inline(always)]
fn forward<const STOP: u32, const TRACE: bool>(ctx: &XdpContext, pkt: &mut Packet, counters: Counters) -> u32 {
    stop_before!(STOP, 1);
    note!(TRACE, trace::packet(pkt.family, &pkt.tuple));
    let svc = match select::lookup_service(pkt) {
        Some(s) => s,
        // A later fragment of TCP/UDP (no ports to match) to a VIP is counted apart: only a
        // service on every port balances fragments.
        None if !pkt.ports_valid
            && (pkt.tuple.proto == PROTO_TCP || pkt.tuple.proto == PROTO_UDP)
            && parse::is_vip(pkt.tuple.dst, pkt.family) =>
        {
            counters.inc(stat::PASS_FRAGMENT);
            return xdp_action::XDP_PASS;
        }
        // Not a VIP, or a VIP without a service on this port/protocol: a next-hop service's if
        // a routed prefix holds the destination, else the host's business.
        None => match select::lookup_next_hop(ctx, pkt) {
            // Symmetric hashing: the packet's tuple made direction-free here, so that the hash
            // and tracking key below follow without code of their own on the VIP path (inlined
            // there, the eight-word IPv6 compare cost every VIP packet 4 to 10 ns). What reads
            // the tuple after this sees the ordered ends.
            Ok(s) if s.flags & service_flags::SYMMETRIC != 0 => {
                directionless(&mut pkt.tuple);
                s
            }
            Ok(s) => s,
            Err(reason) => {
                counters.inc(reason);
                return xdp_action::XDP_PASS;
            }
        },
    };
    note!(TRACE, trace::service(svc.id));
    // Only frames sent to the ingress device's own MAC: not a broadcast or multicast, nor a
    // frame flooded to us for another host (whatever the forwarding method).
    let Some(ingress) = parse::local_ingress(ctx) else {
        counters.inc(stat::PASS_NOT_OUR_MAC);
        return xdp_action::XDP_PASS;
    };
    stop_before!(STOP, 2);
    let proto = pkt.tuple.proto;
    let t = track_tuple(svc.affinity, svc.tracking, &pkt.tuple, pkt.ports_valid);

    // Both keys are built only in the copy of their family (the other one folds away).
    let key4 = CtKey4::new(&t, svc.id);
    let key6 = CtKey6::new(&t, svc.id);
    let key = if pkt.family == FAMILY_V4 { FlowKey::v4(&key4) } else { FlowKey::v6(&key6) };
    // Tick granularity (see `clock`); one load instead of a clock read.
    let now = clock::now_ns();

    let new_by_rule = is_new_flow(pkt.is_syn, svc.tracking, svc.affinity);
    // TCP flows of this service start at their SYN (which may go without an entry).
    let syn_starts_flows = proto == PROTO_TCP && is_new_flow(true, svc.tracking, svc.affinity);
    // Err: no entry; the choice, and whether to make one (not for a SYN in a clean slot).
    let tracked = if new_by_rule {
        let choice = choose(svc, pkt);
        if choice.backend.is_some() && select::slot_clean(choice.table.slot, choice.index) {
            // No live entry of this Maglev slot names another backend: whatever entry the key
            // has agrees, so the SYN neither reads nor writes the table (issue 35). Its flow
            // is inserted at its first non-SYN packet.
            counters.inc(stat::CT_SYN_STATELESS);
            Err((choice, false))
        } else {
            // The search re-selects unless the key's entry has a backend still usable for a
            // new connection, and chooses the slot the insert below writes.
            key.prefetch();
            conntrack::keep_for_syn(key, svc, now, counters).ok_or((choice, true))
        }
    } else {
        conntrack::lookup(key, svc, proto, now, pkt.quoted, counters).ok_or_else(|| {
            // Only where a SYN may have gone without an entry: its first ACK follows it. (A
            // mask, not a branch: two paths through the rest of the program would cost the
            // verifier more states than it allows.)
            let window = 0u64.wrapping_sub(syn_starts_flows as u64);
            (or_previous(choose(svc, pkt), now, window, counters), true)
        })
    };
    // (backend id, class, backend, new flows, spills, flow hash) of this packet.
    let (id, class, backend, new_flows, spills, hash) = match tracked {
        Ok((id, class, b, hash)) => {
            counters.inc(stat::CT_HIT);
            (id, class, b, 0u64, 0, hash)
        }
        Err((choice, make_entry)) => {
            counters.inc(stat::CT_MISS);
            let Choice { backend, reason, class, table, id, hash, .. } = choice;
            let Some(b) = backend else { return drop(reason, counters) };
            // Martians: a new flow from a VIP, or from a backend of this service. Checked here
            // only: a hit's entry was made by a first packet that passed this check.
            let src = pkt.tuple.src;
            if b.addr == src || parse::is_vip(src, pkt.family) || parse::is_backend_of(svc.id, src, pkt.family) {
                return drop(stat::DROP_MARTIAN, counters);
            }
            let entry = CtEntry {
                backend: id,
                pool_gen: svc.pool_gen,
                last_seen_ns: now,
                class: class as u16,
                backend_gen: b.generation,
                hash,
            };
            // An ICMP error quoting a flow follows the flow's entry or, without one, the
            // stateless choice: it never makes an entry (a forged one could otherwise pin a
            // flow the client never opened).
            // (What an insert cannot write it counts itself: `conntrack::FlowKey::write`.)
            if !pkt.quoted && make_entry {
                // Into the slot this packet's search chose (`keep_for_syn`'s or `lookup`'s).
                let _written = key.insert_chosen(&entry, svc.idle_timeout_ns, counters);
            }
            // A connection is counted once, at its SYN, where SYNs start flows (its first ACK
            // misses too when the SYN made no entry); elsewhere at its first packet.
            if new_by_rule || !syn_starts_flows {
                counters.inc(stat::NEW_FLOW);
                let spill = table.flags & table_flags::ZONAL != 0 && b.zone_class as u32 != class;
                (id, class, b, 1, spill as u64, hash)
            } else {
                (id, class, b, 0, 0, hash)
            }
        }
    };
    stop_before!(STOP, 3);
    note!(TRACE, trace::backend(id, class));
    let len = (ctx.data_end() - ctx.data()) as u64;
    if let Some(c) = stats::class_counters(svc.id, class, CLASSES_PER_SERVICE.load()) {
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len;
            // Only a new flow touches these (a hit would add zeros).
            if new_flows != 0 {
                (*c).new_flows += 1;
                (*c).spills += spills;
            }
        }
    }

    // The backend's own counters (metrics per backend): one more inlined per-CPU lookup.
    if let Some(c) = stats::backend_counters(id) {
        unsafe {
            (*c).packets += 1;
            (*c).bytes += len;
            (*c).new_flows += new_flows;
        }
    }

    stop_before!(STOP, 4);
    let to = encap::Target { id, backend, hash };
    let at = encap::Context { now, ingress, counters };
    match svc.forwarding {
        forwarding::L2_DSR => encap::l2_dsr(ctx, pkt, to, at, svc.flags & service_flags::NEXT_HOP != 0),
        _ if pkt.family == FAMILY_V4 => encap::encapsulate::<encap::Ipip>(ctx, pkt, to, svc, at),
        _ => encap::encapsulate::<encap::Ip6ip6>(ctx, pkt, to, svc, at),
    }
}
