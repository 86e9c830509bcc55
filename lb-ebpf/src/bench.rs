//! Bench-only XDP programs for `BPF_PROG_TEST_RUN` with `repeat > 1` (`dp_bench` in lb-tests).
//!
//! They exist only in the bench build of the balancer's object (feature `bench`, built by
//! lb-user's build.rs into `OUT_DIR/bpf-bench`), where they share the balancer's maps; the
//! production object, which the data plane loads, holds `lb` and `clock_probe` only.
//!
//! With `repeat > 1` the kernel runs every iteration on the same buffer, so after the first
//! encapsulation the next iterations would see the encapsulated frame. `bench_lb` therefore
//! runs the balancer and then restores the original frame (`restore`); `bench_restore_only`
//! does the same head growth as the IPIP/IP6IP6 encapsulation plus the same `restore`, so the
//! wrapper's cost can be measured and stated on its own.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_xdp_adjust_head, macros::xdp, programs::XdpContext};

use lb_common::maps::{stat, CtEntry, CtKey4};

use lb_ebpf::consts::{ETH_LEN, ETH_P_IP};
use lb_ebpf::packet::ptr_at;

use crate::conntrack::FlowKey;
use crate::stats;

/// Bytes saved and rewritten: the Ethernet header plus one VLAN tag (for an untagged frame the
/// last 4 are the first bytes of the IP header, rewritten with the same values).
const SAVED_LEN: usize = ETH_LEN + 4;

/// The frame's first bytes and length before the balancer ran. A global (the object's .bss),
/// not the stack: `balance` alone uses nearly all of the 512-byte BPF stack. The bench runs
/// on one thread, so one copy suffices. Copied as words, so no stack is needed either.
#[repr(C)]
struct Saved {
    len: usize,
    head: [u64; 2],
    tail: u16,
}

#[no_mangle]
static mut BENCH_SAVED: Saved = Saved { len: 0, head: [0; 2], tail: 0 };

/// Saves the frame's first bytes and length; false if the frame is too short.
#[inline(always)]
fn save(ctx: &XdpContext) -> bool {
    // Own bounds check, no `black_box` (it would take a stack slot next to balance's).
    let p = ctx.data() as *const u8;
    if ctx.data() + SAVED_LEN > ctx.data_end() {
        return false;
    }
    unsafe {
        let s = core::ptr::addr_of_mut!(BENCH_SAVED);
        (*s).len = ctx.data_end() - ctx.data();
        // Plain loads, not `read_unaligned` (which the BPF target lowers to byte loads): BPF
        // allows misaligned packet access, see `lb_ebpf::packet::word`.
        (*s).head[0] = core::ptr::read(p as *const u64);
        (*s).head[1] = core::ptr::read(p.add(8) as *const u64);
        (*s).tail = core::ptr::read(p.add(16) as *const u16);
    }
    true
}

/// The floor: an XDP program that does nothing.
#[xdp]
#[inline(always)]
pub fn bench_empty(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// The trivial forwarder: swap the Ethernet addresses and send the frame back (XDP_TX).
#[xdp]
#[inline(always)]
pub fn bench_mac_swap(ctx: XdpContext) -> u32 {
    let eth = match ptr_at::<[u8; 12]>(&ctx, 0) {
        Some(p) => p,
        None => return xdp_action::XDP_ABORTED,
    };
    let old = unsafe { core::ptr::read_unaligned(eth) };
    let mut h = [0u8; 12];
    h[0..6].copy_from_slice(&old[6..12]);
    h[6..12].copy_from_slice(&old[0..6]);
    unsafe { core::ptr::write_unaligned(eth, h) };
    xdp_action::XDP_TX
}

/// The IPv4 connection-table key that `bench_ct_insert` writes and `bench_ct_lookup` finds
/// (198.18.1.5:40001 -> 198.18.0.100:80/TCP, service 1: next to the bench flow's key, not it).
#[inline(always)]
fn bench_ct_key() -> CtKey4 {
    CtKey4 {
        src: u32::from_ne_bytes([198, 18, 1, 5]),
        dst: u32::from_ne_bytes([198, 18, 0, 100]),
        ports: (40001u16.to_be() as u32) | ((80u16.to_be() as u32) << 16),
        service_proto: 1 | 6 << 24,
    }
}

/// The connection table's share of a new flow: one `CONNTRACK4` insert that replaces the
/// entry, as the balancer's SYN does, and nothing else. Counted as a new flow only if the insert succeeded,
/// so the bench proves every iteration wrote the entry. The frame is not touched.
#[xdp]
#[inline(always)]
pub fn bench_ct_insert(_ctx: XdpContext) -> u32 {
    let counters = stats::counters();
    let entry = CtEntry { backend: 1, pool_gen: 0, last_seen_ns: 0, class: 0, backend_gen: 0, hash: 0 };
    if FlowKey::v4(&bench_ct_key()).insert(&entry, 0, counters) {
        counters.inc(stat::NEW_FLOW);
    }
    xdp_action::XDP_PASS
}

/// The source address of `bench_ct_insert_new`'s next key (a counter; .bss, like `BENCH_SAVED`).
#[no_mangle]
static mut BENCH_NEXT_SRC: u32 = 0;

/// What a real new flow's insert costs: one `CONNTRACK4` insert of a key not in the table
/// (each iteration a new source address, so a new entry, which takes a free slot or evicts
/// the least recently seen flow of its two buckets). Unlike `bench_ct_insert`, whose key and
/// entry stay in the cache, every insert here touches buckets the CPU has not seen for a
/// table's worth of inserts. Counted as a new flow only if the insert succeeded.
#[xdp]
#[inline(always)]
pub fn bench_ct_insert_new(_ctx: XdpContext) -> u32 {
    let counters = stats::counters();
    let entry = CtEntry { backend: 1, pool_gen: 0, last_seen_ns: 0, class: 0, backend_gen: 0, hash: 0 };
    let mut key = bench_ct_key();
    unsafe {
        let next = core::ptr::addr_of_mut!(BENCH_NEXT_SRC);
        *next = (*next).wrapping_add(1);
        key.src = *next;
    }
    if FlowKey::v4(&key).insert(&entry, 0, counters) {
        counters.inc(stat::NEW_FLOW);
    }
    xdp_action::XDP_PASS
}

/// The connection table's share of a conntrack hit: one `CONNTRACK4` lookup (counted as a hit
/// if found).
#[xdp]
#[inline(always)]
pub fn bench_ct_lookup(_ctx: XdpContext) -> u32 {
    let counters = stats::counters();
    if FlowKey::v4(&bench_ct_key()).get(0, 0, counters).is_some() {
        counters.inc(stat::CT_HIT);
    }
    xdp_action::XDP_PASS
}

/// Only the wrapper's work around an encapsulation: grow the head as IPIP (20 bytes) or
/// IP6IP6 (40 bytes) does, then `restore`. Its cost above the floor bounds the wrapper's cost
/// from above (it includes one head adjustment that the balancer's encapsulation does anyway).
#[xdp]
#[inline(always)]
pub fn bench_restore_only(ctx: XdpContext) -> u32 {
    if !save(&ctx) {
        return xdp_action::XDP_ABORTED;
    }
    // Bytes 12..14 of the frame: the ethertype.
    let ethertype = unsafe { ((*core::ptr::addr_of!(BENCH_SAVED)).head[1] >> 32) as u16 };
    let outer: i32 = if u16::from_be(ethertype) == ETH_P_IP { 20 } else { 40 };
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, -outer) } != 0 {
        return xdp_action::XDP_ABORTED;
    }
    match restore(&ctx) {
        true => xdp_action::XDP_TX,
        false => xdp_action::XDP_ABORTED,
    }
}

/// The price of the two helper calls on the balancer's hit path (its encapsulation's
/// `bpf_xdp_adjust_head` and the wrapper's, which undoes it): two calls that move nothing.
/// Each returns through the kernel's return thunk (on the build machine the SRSO "safe RET"
/// mitigation, see BENCHMARKS.md), which no inline code pays.
#[xdp]
#[inline(always)]
pub fn bench_helper_calls(ctx: XdpContext) -> u32 {
    if unsafe { bpf_xdp_adjust_head(ctx.ctx, 0) } != 0 || unsafe { bpf_xdp_adjust_head(ctx.ctx, 0) } != 0 {
        return xdp_action::XDP_ABORTED;
    }
    xdp_action::XDP_PASS
}

/// Undoes the head growth since `save` and rewrites the saved first bytes. A frame that did not
/// grow (a drop or pass verdict, or an L2 rewrite) only gets its first bytes back.
#[inline(always)]
fn restore(ctx: &XdpContext) -> bool {
    let s = core::ptr::addr_of!(BENCH_SAVED);
    // Bounded, so the verifier accepts LLVM turning this into packet-pointer arithmetic.
    let saved_len = unsafe { (*s).len } & 0xffff;
    let grown = (ctx.data_end() - ctx.data()).wrapping_sub(saved_len);
    if grown != 0 {
        // At most an IPv6 header plus a VLAN tag's worth of difference.
        if grown > 64 || unsafe { bpf_xdp_adjust_head(ctx.ctx, grown as i32) } != 0 {
            return false;
        }
    }
    let p = ctx.data() as *mut u8;
    if ctx.data() + SAVED_LEN > ctx.data_end() {
        return false;
    }
    unsafe {
        core::ptr::write(p as *mut u64, (*s).head[0]);
        core::ptr::write(p.add(8) as *mut u64, (*s).head[1]);
        core::ptr::write(p.add(16) as *mut u16, (*s).tail);
    }
    true
}

/// The balancer, then the original frame back in place for the next iteration: `bench_lb` the
/// whole balancer, `bench_stageN` the balancer up to (not including) stage N, see
/// `balance_until`; their differences split the per-packet cost by stage (`dp_bench --stages`).
macro_rules! stage_bench {
    ($($name:ident = $stop:literal),*) => {$(
        #[xdp]
        #[inline(always)]
        pub fn $name(ctx: XdpContext) -> u32 {
            if !save(&ctx) {
                return xdp_action::XDP_ABORTED;
            }
            let action = crate::balance_until::<$stop, false>(&ctx);
            match restore(&ctx) {
                true => action,
                false => xdp_action::XDP_ABORTED,
            }
        }
    )*};
}
stage_bench!(bench_lb = 4294967295, bench_stage1 = 1, bench_stage2 = 2, bench_stage3 = 3, bench_stage4 = 4);
