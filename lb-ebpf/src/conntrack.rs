//! Connection tracking: look up the flow's entry, check it against the backend's state and the
//! service's persistence flags (`lb_common::ct_verdict`), refresh or delete it.

use lb_common::{stat, table_flags, ct_verdict, Backend, CtEntry, CtKey, CtVerdict, ServiceInfo};

use crate::maps::{BACKENDS, CONNTRACK};
use crate::select;
use crate::stats::Counters;

/// The tracked (backend id, class, backend record) of a flow if its entry is still valid; an
/// invalid entry is deleted and counted by reason. The backend record is the one the check read,
/// so the caller needs no second `BACKENDS` lookup.
#[inline(always)]
pub fn lookup(
    key: &CtKey,
    service: &ServiceInfo,
    proto: u8,
    now: u64,
    counters: Counters,
) -> Option<(u32, u32, &'static Backend)> {
    let entry = CONNTRACK.get_ptr_mut(key)?;
    // Only the fields read, not a copy of the whole entry.
    let (backend_id, class) = unsafe { ((*entry).backend, (*entry).class) };
    let e = unsafe { &*entry };
    let backend = BACKENDS.get(backend_id);
    let verdict = ct_verdict(e, backend, service, proto, now, || {
        match select::table_ref(service.id, class) {
            Some(t) => t.flags & table_flags::NO_HEALTHY != 0,
            None => false,
        }
    });
    let reason = match verdict {
        CtVerdict::Valid => match backend {
            Some(b) => {
                unsafe { (*entry).last_seen_ns = now };
                return Some((backend_id, class, b));
            }
            // Not reached: `ct_verdict` calls an unreadable backend gone.
            None => stat::CT_DRAIN_EXPIRED,
        },
        CtVerdict::IdleExpired => stat::CT_EXPIRED,
        CtVerdict::PoolFlushed => stat::CT_POOL_FLUSHED,
        CtVerdict::BackendGone => stat::CT_DRAIN_EXPIRED,
        CtVerdict::Unhealthy => stat::CT_REROUTED_UNHEALTHY,
    };
    counters.inc(reason);
    let _ = CONNTRACK.remove(key);
    None
}

#[inline(always)]
pub fn insert(key: &CtKey, entry: &CtEntry) {
    // Overwrites an existing entry (a SYN that starts a new flow on a known tuple).
    let _ = CONNTRACK.insert(key, entry, 0);
}
