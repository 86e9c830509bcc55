//! The data plane's clock: `bpf_jiffies64()` (the kernel's tick count) times the tick length
//! in ns, set at load time (`NS_PER_JIFFY`, from `clock_getres(CLOCK_MONOTONIC_COARSE)`).
//!
//! Why not `bpf_ktime_get_coarse_ns`: that helper converts a timespec under a seqcount and
//! costs ~15-20 ns per packet on the build machine, `bpf_jiffies64` is one load (~0-5 ns).
//! Both advance once per tick (4 ms at HZ = 250); idle timeouts, drain deadlines and the
//! next-hop TTL are seconds, so a tick of granularity does not matter. The epoch is the
//! kernel's jiffies epoch, not CLOCK_MONOTONIC's: userspace reads this clock through
//! `clock_probe` (`lb_user::dataplane::Dataplane::now_ns`), never computes it itself.

use aya_ebpf::{bindings::xdp_action, helpers::bpf_jiffies64, macros::xdp, programs::XdpContext};

use crate::maps::{CLOCK_PROBE, NS_PER_JIFFY};

/// Now, in ns of the data-plane clock, rounded down to the grain of connection-table times
/// (`lb_common::ct_table::seen_grain`, 65.5 µs): an entry's time reads back as written.
#[inline(always)]
pub fn now_ns() -> u64 {
    lb_common::ct_table::seen_grain(unsafe { bpf_jiffies64() }.wrapping_mul(NS_PER_JIFFY.load()))
}

/// Writes `now_ns()` into `CLOCK_PROBE[0]`: userspace runs it with `BPF_PROG_TEST_RUN` to read
/// the data-plane clock exactly as the balancer computes it (drain deadlines, tests).
#[xdp]
#[inline(always)]
pub fn clock_probe(_ctx: XdpContext) -> u32 {
    if let Some(slot) = CLOCK_PROBE.get_ptr_mut(0) {
        unsafe { *slot = now_ns() };
    }
    xdp_action::XDP_PASS
}
