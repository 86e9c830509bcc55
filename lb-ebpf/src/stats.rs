//! Per-CPU counters (no atomics needed: each CPU owns its copy). The global counters are one
//! record looked up once per packet; a (service, class) pair's counters are another.

use crate::maps::{CLASS_STATS, STATS};
use lb_common::{stat, ClassCounters, CtSearch, GlobalStats};

/// This CPU's global counter record, looked up once and then only added to.
#[derive(Clone, Copy)]
pub struct Counters(*mut GlobalStats);

impl Counters {
    #[inline(always)]
    pub fn get() -> Self {
        Self(STATS.get_ptr_mut(0).unwrap_or(core::ptr::null_mut()))
    }

    /// Adds one to counter `index` (a `lb_common::stat` index).
    #[inline(always)]
    pub fn inc(self, index: u32) {
        // The test folds away for the constant indices of most calls.
        if !self.0.is_null() && index < stat::GLOBAL_COUNT {
            unsafe { (*self.0).counters[index as usize] += 1 };
        }
    }

    /// This CPU's connection-table search record, kept in the same per-CPU record.
    #[inline(always)]
    pub fn ct_search(self) -> Option<*mut CtSearch> {
        if self.0.is_null() {
            None
        } else {
            Some(unsafe { &mut (*self.0).ct_search })
        }
    }
}

/// One counter increment outside the balancer's hot path (decap, rare drops).
#[inline(always)]
pub fn inc(index: u32) {
    Counters::get().inc(index);
}

/// This CPU's counters of (service, class).
#[inline(always)]
pub fn class_counters(service: u32, class: u32, classes_per_service: u32) -> Option<*mut ClassCounters> {
    CLASS_STATS.get_ptr_mut(service * classes_per_service + class)
}
