//! Connection tracking: look up the flow's entry, check it against the backend's state and the
//! service's persistence flags (`lb_common::ct_verdict`), refresh or delete it.

use lb_common::{stat, table_flags, ct_verdict, Backend, CtEntry, CtKey, CtKey4, CtVerdict, ServiceInfo};

use crate::maps::{BACKENDS, CONNTRACK, CONNTRACK4};
use crate::select;
use crate::stats::Counters;

/// A flow's key in its family's table. The balancer's body is inlined once per family, so
/// each copy keeps only its own arm.
#[derive(Clone, Copy)]
pub enum FlowKey<'a> {
    V4(&'a CtKey4),
    V6(&'a CtKey),
}

impl FlowKey<'_> {
    #[inline(always)]
    fn get(self) -> Option<*mut CtEntry> {
        match self {
            FlowKey::V4(k) => CONNTRACK4.get_ptr_mut(k),
            FlowKey::V6(k) => CONNTRACK.get_ptr_mut(k),
        }
    }

    #[inline(always)]
    fn remove(self) {
        let _ = match self {
            FlowKey::V4(k) => CONNTRACK4.remove(k),
            FlowKey::V6(k) => CONNTRACK.remove(k),
        };
    }

    /// Writes the flow's entry, replacing any (a SYN that starts a new flow on a known tuple).
    #[inline(always)]
    pub fn insert(self, entry: &CtEntry) {
        let _ = match self {
            FlowKey::V4(k) => CONNTRACK4.insert(k, entry, 0),
            FlowKey::V6(k) => CONNTRACK.insert(k, entry, 0),
        };
    }
}

/// The tracked (backend id, class, backend record, flow hash) of a flow if its entry is still
/// valid; an invalid entry is deleted and counted by reason. The backend record is the one the
/// check read, so the caller needs no second `BACKENDS` lookup.
#[inline(always)]
pub fn lookup(
    key: FlowKey,
    service: &ServiceInfo,
    proto: u8,
    now: u64,
    counters: Counters,
) -> Option<(u32, u32, &'static Backend, u32)> {
    let entry = key.get()?;
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
                return Some((backend_id, class, b, e.hash));
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
    key.remove();
    None
}
