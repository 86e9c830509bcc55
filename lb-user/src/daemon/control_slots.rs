//! Admission to the control socket, so that slow or idle local clients cannot lock the operator
//! out. Two rules: a client (a process, by the socket's peer credentials) holds at most
//! `per_client` connections; and when all `total` slots are taken, the oldest connection that
//! has not yet sent a complete request is closed to make room. A command such as `lb status`
//! sends its request at once, so it always gets in: only connections whose requests are being
//! served (quick: the daemon's loop answers them) cannot be cut.

use super::faults::{self, Fault};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub total: usize,
    pub per_client: usize,
}

pub struct Slots {
    limits: Limits,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// Admitted connections whose `Slot` is alive (evicted ones included until they close).
    open: usize,
    /// Of those, evicted and not yet closed: they do not count against `total`.
    evicted: usize,
    by_client: HashMap<i32, usize>,
    /// Connections still reading their request, oldest first, with their eviction signal.
    reading: BTreeMap<u64, oneshot::Sender<()>>,
    next_id: u64,
}

/// One admitted connection; dropping it frees the slot.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    client: i32,
    read: bool,
    /// Fires when the connection is closed to make room, before its request was read.
    pub evicted: oneshot::Receiver<()>,
}

impl Slots {
    pub fn new(limits: Limits) -> Arc<Self> {
        Arc::new(Self { limits, inner: Mutex::new(Inner::default()) })
    }

    /// Admits a connection of `client` (its pid; -1 when unknown), or says why not.
    pub fn admit(self: &Arc<Self>, client: i32) -> Result<Slot, String> {
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let held = inner.by_client.get(&client).copied().unwrap_or(0);
        if held >= self.limits.per_client {
            faults::count(Fault::ControlRefused);
            return Err(format!(
                "busy: this client (pid {client}) already has {held} control connections open, the most one client may hold; close some and try again"
            ));
        }
        if inner.open - inner.evicted >= self.limits.total {
            let Some((_, evict)) = inner.reading.pop_first() else {
                faults::count(Fault::ControlRefused);
                return Err(format!("busy: {} control requests are being served; try again", self.limits.total));
            };
            faults::count(Fault::ControlEvicted);
            inner.evicted += 1;
            let _ = evict.send(());
        }
        let (tx, rx) = oneshot::channel();
        let id = inner.next_id;
        inner.next_id += 1;
        inner.open += 1;
        *inner.by_client.entry(client).or_default() += 1;
        inner.reading.insert(id, tx);
        Ok(Slot { slots: self.clone(), id, client, read: false, evicted: rx })
    }
}

impl Slot {
    /// The request is read: from now on the connection is served, not cut to make room.
    /// False when it was evicted meanwhile.
    pub fn request_read(&mut self) -> bool {
        let mut inner = self.slots.inner.lock().unwrap_or_else(|e| e.into_inner());
        self.read = inner.reading.remove(&self.id).is_some();
        self.read
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut inner = self.slots.inner.lock().unwrap_or_else(|e| e.into_inner());
        // Still reading: never evicted. Neither reading nor read: evicted.
        if inner.reading.remove(&self.id).is_none() && !self.read {
            inner.evicted -= 1;
        }
        inner.open -= 1;
        if let Some(n) = inner.by_client.get_mut(&self.client) {
            *n -= 1;
            if *n == 0 {
                inner.by_client.remove(&self.client);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_capped_and_idle_connections_make_room() {
        let slots = Slots::new(Limits { total: 3, per_client: 2 });
        let a1 = slots.admit(1).unwrap();
        let _a2 = slots.admit(1).unwrap();
        let err = slots.admit(1).err().unwrap();
        assert!(err.contains("pid 1") && err.contains("already has 2"), "{err}");
        let mut b = slots.admit(2).unwrap();
        assert!(b.request_read());
        // Full: the oldest still-reading connection (a1) is cut for the newcomer.
        let mut a1 = a1;
        let _c = slots.admit(3).unwrap();
        assert!(a1.evicted.try_recv().is_ok());
        assert!(!a1.request_read(), "an evicted connection is not served");
        drop(a1);
        // b is being served and is never cut; _a2 and _c are reading: _a2 goes next.
        let _d = slots.admit(4).unwrap();
        assert!(b.evicted.try_recv().is_err());
        let inner = slots.inner.lock().unwrap();
        assert_eq!((inner.open, inner.evicted, inner.reading.len()), (4, 1, 2));
    }

    #[test]
    fn all_slots_served_means_busy() {
        let slots = Slots::new(Limits { total: 1, per_client: 1 });
        let mut a = slots.admit(1).unwrap();
        assert!(a.request_read());
        assert!(slots.admit(2).err().unwrap().contains("being served"));
        drop(a);
        assert!(slots.admit(2).is_ok());
    }
}
