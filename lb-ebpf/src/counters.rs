//! Per-CPU counters (no atomics needed: each CPU owns its copy). The global counters are one
//! record (`lb_common::maps::GlobalStats`), looked up once per packet and then only added to.

use aya_ebpf::{bindings::xdp_action, maps::PerCpuArray};
use lb_common::ct_table;
use lb_common::maps::{stat, GlobalStats};

/// This CPU's global counter record, looked up once and then only added to.
#[derive(Clone, Copy)]
pub struct Counters(*mut GlobalStats);

impl Counters {
    /// This CPU's record of `map` (the object's `STATS`).
    #[inline(always)]
    pub fn get(map: &PerCpuArray<GlobalStats>) -> Self {
        Self(map.get_ptr_mut(0).unwrap_or(core::ptr::null_mut()))
    }

    /// Adds one to counter `index` (a `lb_common::maps::stat` index).
    #[inline(always)]
    pub fn inc(self, index: u32) {
        // The test folds away for the constant indices of most calls.
        if !self.0.is_null() && index < stat::GLOBAL_COUNT {
            unsafe { (*self.0).counters[index as usize] += 1 };
        }
    }

    /// This CPU's connection-table search record, kept in the same per-CPU record.
    #[inline(always)]
    pub fn ct_search(self) -> Option<*mut ct_table::Search> {
        if self.0.is_null() {
            None
        } else {
            Some(unsafe { &mut (*self.0).ct_search })
        }
    }
}

/// Drops the packet, counted as `reason`.
#[inline(always)]
pub fn drop(reason: u32, counters: Counters) -> u32 {
    counters.inc(reason);
    xdp_action::XDP_DROP
}
