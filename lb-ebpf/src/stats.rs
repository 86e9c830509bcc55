//! The balancer's counters: the global record (`STATS`, see `lb_ebpf::counters`), one
//! record per (service, class) and one per backend.

use crate::maps::{BACKEND_STATS, CLASS_STATS, STATS};
use lb_common::maps::{BackendCounters, ClassCounters};
pub use lb_ebpf::counters::{drop, Counters};

/// This CPU's global counter record of the balancer.
#[inline(always)]
pub fn counters() -> Counters {
    Counters::get(&STATS)
}

/// This CPU's counters of (service, class).
#[inline(always)]
pub fn class_counters(service: u32, class: u32, classes_per_service: u32) -> Option<*mut ClassCounters> {
    CLASS_STATS.get_ptr_mut(service * classes_per_service + class)
}

/// This CPU's counters of backend `id`.
#[inline(always)]
pub fn backend_counters(id: u32) -> Option<*mut BackendCounters> {
    BACKEND_STATS.get_ptr_mut(id)
}
