//! Per-CPU counters (no atomics needed: each CPU owns its copy).

use crate::maps::STATS;
use lb_common::stat;

#[inline(always)]
pub fn add(index: u32, value: u64) {
    if let Some(p) = STATS.get_ptr_mut(index) {
        unsafe { *p += value };
    }
}

#[inline(always)]
pub fn inc(index: u32) {
    add(index, 1);
}

/// Index of a per-(service, class) counter.
#[inline(always)]
pub fn class_index(service: u32, class: u32, classes_per_service: u32, counter: u32) -> u32 {
    stat::GLOBAL_COUNT + (service * classes_per_service + class) * stat::PER_CLASS_COUNT + counter
}
