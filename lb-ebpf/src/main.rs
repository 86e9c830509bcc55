//! XDP programs of the load balancer: `lb` (the balancer) and `lb_decap` (backend side).
//!
//! Per packet: parse -> service -> connection table -> (new flow) client class -> class table
//! -> backend -> encapsulate or rewrite -> transmit. No policy here: the controller has
//! compiled it into the tables and the service/backend flags.
#![no_std]
#![no_main]

mod bench;
mod conntrack;
mod decap;
mod encap;
mod maps;
mod parse;
mod select;
mod stats;

use aya_ebpf::{bindings::xdp_action, helpers::bpf_ktime_get_ns, macros::xdp, programs::XdpContext};
use lb_common::{
    flow_hash, forwarding, hash_tuple, is_new_flow, stat, table_flags, track_tuple, CtEntry, CtKey,
    BACKEND_DROP, FAMILY_V4,
};

use crate::maps::{BACKENDS, CLASSES_PER_SERVICE};
use crate::parse::Verdict;

#[xdp]
pub fn lb(ctx: XdpContext) -> u32 {
    balance(&ctx)
}

#[xdp]
pub fn lb_decap(ctx: XdpContext) -> u32 {
    decap::run(&ctx)
}

#[inline(always)]
fn drop(reason: u32) -> u32 {
    stats::inc(reason);
    xdp_action::XDP_DROP
}

#[inline(always)]
fn balance(ctx: &XdpContext) -> u32 {
    stats::inc(stat::RX_PACKETS);
    let pkt = match parse::parse(ctx) {
        Ok(p) => p,
        Err(Verdict::Pass) => {
            stats::inc(stat::PASS_NOT_VIP);
            return xdp_action::XDP_PASS;
        }
        Err(Verdict::Drop(reason)) => return drop(reason),
    };
    let svc = match select::lookup_service(&pkt) {
        Some(s) => s,
        None => {
            // A VIP address, but no service on this port/protocol: the host's business.
            stats::inc(stat::PASS_NOT_VIP);
            return xdp_action::XDP_PASS;
        }
    };
    let proto = pkt.tuple.proto;
    let hash = flow_hash(&hash_tuple(svc.affinity, &pkt.tuple, pkt.ports_valid));
    let key = CtKey { tuple: track_tuple(svc.affinity, svc.tracking, &pkt.tuple, pkt.ports_valid), service: svc.id };
    let now = unsafe { bpf_ktime_get_ns() };
    let cps = CLASSES_PER_SERVICE.load();

    let tracked = if is_new_flow(pkt.is_syn, svc.tracking, svc.affinity) {
        None
    } else {
        conntrack::lookup(&key, &svc, proto, now)
    };
    let (class, backend) = match tracked {
        Some((id, class)) => {
            stats::inc(stat::CT_HIT);
            match BACKENDS.get(id) {
                Some(b) => (class, *b),
                None => return drop(stat::DROP_NO_BACKEND),
            }
        }
        None => {
            stats::inc(stat::CT_MISS);
            let (class, table) = match select::class_table(svc.id, select::client_class(svc.id, &pkt)) {
                Some(t) => t,
                None => return drop(stat::DROP_NO_TABLE),
            };
            let id = match select::table_entry(table.slot, hash) {
                Some(id) if id != BACKEND_DROP => id,
                _ if table.flags & table_flags::UNROUTABLE != 0 => return drop(stat::DROP_CLASS_UNROUTABLE),
                _ => return drop(stat::DROP_NO_BACKEND),
            };
            let b = match BACKENDS.get(id) {
                Some(b) if b.family != 0 => *b,
                _ => return drop(stat::DROP_NO_BACKEND),
            };
            conntrack::insert(&key, &CtEntry { backend: id, pool_gen: svc.pool_gen, last_seen_ns: now, class, _pad: 0 });
            stats::inc(stat::NEW_FLOW);
            stats::inc(stats::class_index(svc.id, class, cps, stat::CLASS_NEW_FLOWS));
            if table.flags & table_flags::ZONAL != 0 && b.zone_class as u32 != class {
                stats::inc(stats::class_index(svc.id, class, cps, stat::CLASS_SPILLS));
            }
            (class, b)
        }
    };
    stats::inc(stats::class_index(svc.id, class, cps, stat::CLASS_PACKETS));
    stats::add(stats::class_index(svc.id, class, cps, stat::CLASS_BYTES), (ctx.data_end() - ctx.data()) as u64);

    match svc.forwarding {
        forwarding::L2_DSR => encap::l2_dsr(ctx, &backend),
        _ if pkt.family == FAMILY_V4 => encap::ipip_v4(ctx, &pkt, &backend, &svc, hash),
        _ => encap::ip6ip6(ctx, &pkt, &backend, &svc, hash),
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
