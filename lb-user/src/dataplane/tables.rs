//! Backend records and Maglev tables. A table is written into a free slot of `TABLES` and then
//! made active with a single `TABLE_INDEX` update, so the kernel never sees a half-written
//! table; the previous slot becomes free again.

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::{Array, MapData};
use lb_common::maps::{table_flags, Backend, TableRef, BACKEND_DROP};

use super::clean_slots::Retiring;
use super::sys::{update_batch, ArrayMmap};
use super::Dataplane;

pub(super) type TableMmap = ArrayMmap<u32>;

impl Dataplane {
    /// Writes a backend slot (address, MAC, zone, state flags, drain deadline). An id given to
    /// another backend (other address or generation) starts its `BACKEND_STATS` from zero.
    pub fn set_backend(&mut self, id: u32, backend: Backend) -> Result<()> {
        if id >= self.sizes.max_backends {
            bail!("backend id {id} out of range (max_backends {})", self.sizes.max_backends);
        }
        let old = self.backend(id).with_context(|| format!("reading backend {id}"))?;
        if (old.addr, old.family, old.generation) != (backend.addr, backend.family, backend.generation) {
            self.reset_backend_stats(id)?;
        }
        self.backends.set(id, backend, 0).context("writing BACKENDS")?;
        Ok(())
    }

    pub fn backend(&self, id: u32) -> Result<Backend> {
        Ok(self.backends.get(&id, 0)?)
    }

    /// Updates only the state of a backend: `backend_flags` and the drain deadline
    /// (data-plane clock, see [`Dataplane::now_ns`]) that applies with REMOVED.
    pub fn set_backend_state(&mut self, id: u32, flags: u8, drain_deadline_ns: u64) -> Result<()> {
        let mut b = self.backend(id).with_context(|| format!("reading backend {id}"))?;
        b.flags = flags;
        b.drain_deadline_ns = drain_deadline_ns;
        self.set_backend(id, b)
    }

    pub(super) fn table_index_of(&self, service: u32, class: u32) -> Result<u32> {
        if service >= self.sizes.max_services || class >= self.sizes.classes_per_service {
            bail!("(service {service}, class {class}) out of range");
        }
        Ok(service * self.sizes.classes_per_service + class)
    }

    /// Writes the Maglev table of (service, class) into a free slot, then activates it with one
    /// `TABLE_INDEX` update and frees the previous slot. `flags` are `table_flags` bits (ACTIVE
    /// is added). Returns the slot used.
    pub fn write_table(&mut self, service: u32, class: u32, flags: u32, entries: &[u32]) -> Result<u32> {
        let index = self.table_index_of(service, class)?;
        let m = self.sizes.table_size_m;
        if entries.len() != m as usize {
            bail!("table has {} entries, M is {m}", entries.len());
        }
        if let Some(bad) = entries.iter().find(|&&b| b != BACKEND_DROP && b >= self.sizes.max_backends) {
            bail!("table names backend {bad}, beyond max_backends {}", self.sizes.max_backends);
        }
        let slot = match self.free_slots.pop_front() {
            Some(slot) => slot,
            // Every free slot serves a handshake window: the oldest window ends now.
            None => self.reclaim_retiring()?,
        };
        let old = self.active_slots.get(&(service, class)).copied();
        let written = (|| -> Result<TableRef> {
            match self.tables_mmap.as_mut() {
                Some(mapping) => mapping.write(slot as usize * m as usize, entries),
                None => {
                    let keys: Vec<u32> = (slot * m..slot * m + m).collect();
                    update_batch(&self.tables, &keys, entries)?;
                }
            }
            // Before the flip: a SYN never sees the new table with a bit it does not earn.
            let now = self.now_ns()?;
            let moved_clean = self.carry_clean_bits(slot, old, entries, now);
            // The old table is kept for handshakes only if a SYN may have gone by it without an
            // entry in a slot this change moves.
            let r = self.table_ref_replacing(slot, flags | table_flags::ACTIVE, old.filter(|_| moved_clean), now);
            self.table_index.set(index, r, 0)?;
            Ok(r)
        })();
        let r = match written {
            Ok(r) => r,
            Err(e) => {
                self.free_slots.push_front(slot);
                return Err(e.context("writing a table"));
            }
        };
        // A table replaced twice within a window: the older one is done.
        if let Some(before) = self.clean.retiring.remove(&(service, class)) {
            self.free_slots.push_back(before.slot);
        }
        self.active_slots.insert((service, class), slot);
        if let Some(old) = old {
            if r.prev_until_ns != 0 {
                self.clean.retiring.insert((service, class), Retiring { slot: old, until_ns: r.prev_until_ns });
            } else {
                self.free_slots.push_back(old);
            }
        }
        Ok(slot)
    }

    /// A slot for a table when none is free: the one replaced longest ago, its window ended.
    fn reclaim_retiring(&mut self) -> Result<u32> {
        let table_slots = self.sizes.table_slots;
        let none_free = || anyhow!("no free table slot (table_slots {table_slots})");
        let key = self.clean.retiring.iter().min_by_key(|(_, r)| r.until_ns).map(|(k, _)| *k).ok_or_else(none_free)?;
        self.end_window(key)?.ok_or_else(none_free)
    }

    /// Changes the flags of the active table of (service, class) without rewriting it.
    pub fn set_table_flags(&mut self, service: u32, class: u32, flags: u32) -> Result<()> {
        let index = self.table_index_of(service, class)?;
        if !self.active_slots.contains_key(&(service, class)) {
            bail!("no table for ({service}, {class})");
        }
        // The previous table's window stays as it is.
        let r = self.table_index.get(&index, 0).context("reading TABLE_INDEX")?;
        self.table_index.set(index, TableRef { flags: flags | table_flags::ACTIVE, ..r }, 0)?;
        Ok(())
    }

    /// The active table of (service, class), as the kernel reads it.
    pub fn read_table(&self, service: u32, class: u32) -> Result<Option<(TableRef, Vec<u32>)>> {
        let r = self.table_index.get(&self.table_index_of(service, class)?, 0)?;
        if r.flags & table_flags::ACTIVE == 0 {
            return Ok(None);
        }
        let m = self.sizes.table_size_m;
        let tables: Array<&MapData, u32> = Array::try_from(&self.tables)?;
        let entries = (0..m).map(|i| tables.get(&(r.slot * m + i), 0)).collect::<Result<Vec<_>, _>>()?;
        Ok(Some((r, entries)))
    }

    /// Deactivates the table of (service, class) and frees its slot.
    pub fn remove_table(&mut self, service: u32, class: u32) -> Result<()> {
        let index = self.table_index_of(service, class)?;
        if let Some(&slot) = self.active_slots.get(&(service, class)) {
            // The slot stays in the entry, only ACTIVE goes: the kernel reads the flags and the
            // slot as two loads, so one that saw ACTIVE still reads this table's slot (which
            // the FIFO of free slots keeps intact for a long while).
            self.table_index.set(index, TableRef { slot, ..TableRef::default() }, 0)?;
            self.active_slots.remove(&(service, class));
            self.free_slots.push_back(slot);
            if let Some(r) = self.clean.retiring.remove(&(service, class)) {
                self.free_slots.push_back(r.slot);
            }
        }
        Ok(())
    }

    /// Whether tables are written through a shared mapping (else one batch syscall each).
    pub fn tables_mapped(&self) -> bool {
        self.tables_mmap.is_some()
    }

    /// Number of free table slots.
    pub fn free_table_slots(&self) -> usize {
        self.free_slots.len()
    }
}
