//! Which Maglev slots a SYN may pass without a connection-table entry (`CLEAN_SLOTS`, issue 35),
//! and the previous tables kept for handshakes that straddle a change.
//!
//! A slot of a table is *clean* when no live entry of the table's service hashed to it names
//! another backend than the table does: a SYN there goes by the stateless choice, which is what
//! any entry of its key would say, and its flow is inserted at its first non-SYN packet. The
//! invariant, kept in this order:
//! * a new table's bits are the old table's bits of the slots it did not change (all zero
//!   without an old table), written before the table is published;
//! * only this writer's scan sets bits, and only for slots where it found no disagreeing live
//!   entry. The data plane inserts disagreeing entries only from a previous table (a
//!   straddling handshake), so the scan runs only when no previous table is in use, one
//!   [`GRACE_NS`] after the last window closed (a program run that read the old reference
//!   has long ended by then), and is serialized with table writes (`&mut self`).

use std::collections::HashMap;

use anyhow::{anyhow, Context, Result};
use lb_common::ct_table::{self, Bucket4, Bucket6, Slot as _};
use lb_common::hash::maglev_slot;
use lb_common::maps::{clean_slots, Backend, CtEntry, TableRef};

use super::sys::ArrayMmap;
use super::Dataplane;

/// How long a replaced table serves the first ACKs of handshakes whose SYN went without an
/// entry (`TableRef::prev_until_ns`): an ACK follows its SYN by a round trip, and a client
/// whose SYN-ACK is slower retransmits the SYN after 1 s (which then makes an entry). Short,
/// because the scan for clean slots waits for every window to close.
pub const HANDSHAKE_WINDOW_NS: u64 = 5_000_000_000;

/// After a window closes, before its slot is reused or a scan trusts the table: a program run
/// that read the old reference ends within microseconds; a second is beyond doubt.
pub const GRACE_NS: u64 = 1_000_000_000;

/// First and longest pause between scans while some slot stays dirty (long-lived flows that
/// keep an older backend keep their slots dirty until they end): doubled after each scan that
/// leaves a dirty slot, reset by a table change.
const SCAN_PAUSE_NS: (u64, u64) = (1_000_000_000, 64_000_000_000);

/// A replaced table kept for the handshake window.
#[derive(Clone, Copy, Debug)]
pub(super) struct Retiring {
    pub slot: u32,
    pub until_ns: u64,
}

/// The writer's state of the clean bitmaps.
pub(super) struct CleanSlots {
    bits: ArrayMmap<u64>,
    words: u32,
    /// The connection tables, mapped: a scan reads them as memory (a syscall per bucket would
    /// hold the daemon's loop for a second at 2^18 buckets). None where a table cannot be
    /// mapped (pinned by an older version): read through the map then.
    ct4: Option<ArrayMmap<Bucket4>>,
    ct6: Option<ArrayMmap<Bucket6>>,
    buckets: usize,
    /// Replaced tables per (service, class), until their window and grace are over.
    pub retiring: HashMap<(u32, u32), Retiring>,
    /// The window given to a replaced table (tests shorten it).
    pub window_ns: u64,
    /// When the next scan may run (data-plane clock); None: every slot is clean, no scan needed.
    next_scan_ns: Option<u64>,
    pause_ns: u64,
    /// The last scan's result.
    pub last: Option<ScanReport>,
}

/// What a scan found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanReport {
    /// Live entries read (both families).
    pub entries: usize,
    /// Maglev slots of active tables left dirty, and all of them.
    pub dirty_slots: u64,
    pub slots: u64,
    /// Data-plane clock at the scan.
    pub at_ns: u64,
}

impl CleanSlots {
    /// `map`: `CLEAN_SLOTS`; `conntrack`: `CONNTRACK4` and `CONNTRACK` of `buckets` buckets each.
    pub fn new(
        map: &aya::maps::Map,
        conntrack: [Option<&aya::maps::Map>; 2],
        buckets: u32,
        table_slots: u32,
        m: u32,
    ) -> Result<Self> {
        let words = clean_slots::words(m);
        let bits = ArrayMmap::new(map, table_slots as usize * words as usize)
            .ok_or_else(|| anyhow!("CLEAN_SLOTS cannot be mapped (made without BPF_F_MMAPABLE?)"))?;
        let buckets = buckets as usize;
        Ok(Self {
            bits,
            words,
            ct4: conntrack[0].and_then(|m| ArrayMmap::new(m, buckets)),
            ct6: conntrack[1].and_then(|m| ArrayMmap::new(m, buckets)),
            buckets,
            retiring: HashMap::new(),
            window_ns: HANDSHAKE_WINDOW_NS,
            next_scan_ns: Some(0),
            pause_ns: SCAN_PAUSE_NS.0,
            last: None,
        })
    }

    fn read(&self, slot: u32) -> Vec<u64> {
        self.bits.read(slot as usize * self.words as usize, self.words as usize)
    }

    fn write(&mut self, slot: u32, bits: &[u64]) {
        self.bits.write(slot as usize * self.words as usize, bits)
    }

    /// A scan is wanted soon (a table changed).
    fn want_scan(&mut self, now_ns: u64) {
        self.pause_ns = SCAN_PAUSE_NS.0;
        self.next_scan_ns = Some(now_ns + self.pause_ns);
    }
}

/// An active table during a scan: its slot, entries, and the Maglev slots found dirty.
struct ScannedTable {
    slot: u32,
    entries: Vec<u32>,
    dirty: Vec<u64>,
}

/// Calls `f(service, entry)` for each published entry of the mapped table `ct`, a chunk of
/// buckets at a time.
fn for_each_mapped<S: ct_table::Slot>(ct: &ArrayMmap<ct_table::Bucket<S>>, buckets: usize, mut f: impl FnMut(&S)) {
    const CHUNK: usize = 1024;
    let mut at = 0;
    while at < buckets {
        let n = CHUNK.min(buckets - at);
        for b in ct.read(at, n) {
            for slot in &b.slots {
                if ct_table::state::published(ct_table::slot_state(slot)) {
                    f(slot);
                }
            }
        }
        at += n;
    }
}

/// `old` bits kept only where `old_entries` and `new_entries` agree.
fn carried_bits(old: &[u64], old_entries: &[u32], new_entries: &[u32]) -> Vec<u64> {
    let mut bits = old.to_vec();
    for (i, (a, b)) in old_entries.iter().zip(new_entries).enumerate() {
        if a != b {
            let (word, bit) = clean_slots::bit(i as u32);
            bits[word as usize] &= !bit;
        }
    }
    bits
}

impl Dataplane {
    /// The bits of a new table of `entries` in `slot`, replacing the table in `old` (if any),
    /// written before the new table is published. Whether the change moved a clean slot of the
    /// old table (where a SYN may have gone without an entry: its handshake needs the old table).
    pub(super) fn carry_clean_bits(&mut self, slot: u32, old: Option<u32>, entries: &[u32], now: u64) -> bool {
        let m = self.sizes.table_size_m as usize;
        let words = self.clean.words as usize;
        let (bits, moved_clean) = match (old, self.tables_mmap.as_ref()) {
            (Some(o), Some(tables)) => {
                let old_bits = self.clean.read(o);
                let bits = carried_bits(&old_bits, &tables.read(o as usize * m, m), entries);
                let moved = old_bits.iter().zip(&bits).any(|(a, b)| a != b);
                (bits, moved)
            }
            // Without the old table (or a mapping to read it cheaply): nothing is known clean.
            _ => (vec![0; words], false),
        };
        self.clean.write(slot, &bits);
        self.clean.want_scan(now);
        moved_clean
    }

    /// The reference that publishes `slot` with `flags`, the replaced table `old` kept for the
    /// handshake window (none if the window is 0).
    pub(super) fn table_ref_replacing(&self, slot: u32, flags: u32, old: Option<u32>, now: u64) -> TableRef {
        let (prev_slot, prev_until_ns) = match old {
            Some(o) if self.clean.window_ns > 0 => (o, now + self.clean.window_ns),
            _ => (0, 0),
        };
        TableRef { slot, flags, prev_slot, _pad: 0, prev_until_ns }
    }

    /// Shortens the handshake window of later table changes (0: none); for tests.
    pub fn set_handshake_window(&mut self, ns: u64) {
        self.clean.window_ns = ns;
    }

    /// Frees replaced tables whose window and grace are over; then, when no previous table is
    /// in use and a table changed or a slot stayed dirty, scans (see [`Dataplane::scan_clean_slots`]).
    /// Called every second by the daemon. Returns the scan's report if one ran.
    pub fn maintain_tables(&mut self) -> Result<Option<ScanReport>> {
        let now = self.now_ns()?;
        let over: Vec<(u32, u32)> = self
            .clean
            .retiring
            .iter()
            .filter(|(_, r)| r.until_ns.saturating_add(GRACE_NS) <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in over {
            if let Some(r) = self.clean.retiring.remove(&k) {
                self.free_slots.push_back(r.slot);
            }
        }
        if !self.clean.retiring.is_empty() || self.clean.next_scan_ns.is_none_or(|t| t > now) {
            return Ok(None);
        }
        // Without a mapping of TABLES (pinned by an older version) no slot is ever marked
        // clean: SYNs make entries, as they always did.
        if self.tables_mmap.is_none() {
            return Ok(None);
        }
        self.scan_clean_slots().map(Some)
    }

    /// Ends the window of the table `(service, class)` replaced now (its slot is reused): the
    /// reference stops naming it first.
    pub(super) fn end_window(&mut self, key: (u32, u32)) -> Result<Option<u32>> {
        let Some(r) = self.clean.retiring.remove(&key) else { return Ok(None) };
        let index = self.table_index_of(key.0, key.1)?;
        let mut t = self.table_index.get(&index, 0).context("reading TABLE_INDEX")?;
        if t.prev_until_ns != 0 {
            t.prev_until_ns = 0;
            self.table_index.set(index, t, 0).context("writing TABLE_INDEX")?;
        }
        Ok(Some(r.slot))
    }

    /// Marks clean every Maglev slot of every active table where no live connection-table
    /// entry of the table's service names another backend, and dirty every other. An entry is
    /// compared with every class table of its service (a client's class may change with the
    /// configuration). Entries that no packet can use again are left out: idle beyond their
    /// service's timeout, or of a backend id since given to another backend. The caller makes
    /// sure no previous table is in use ([`Dataplane::maintain_tables`] does).
    pub fn scan_clean_slots(&mut self) -> Result<ScanReport> {
        let m = self.sizes.table_size_m;
        let words = self.clean.words as usize;
        let now = self.now_ns()?;
        let tables = self.tables_mmap.as_ref().ok_or_else(|| anyhow!("TABLES is not mapped: no slot can be clean"))?;
        let mut by_service: HashMap<u32, Vec<ScannedTable>> = HashMap::new();
        for (&(service, _), &slot) in &self.active_slots {
            let entries = tables.read(slot as usize * m as usize, m as usize);
            by_service.entry(service).or_default().push(ScannedTable { slot, entries, dirty: vec![0; words] });
        }
        let idle: HashMap<u32, u64> =
            self.installed_services().into_iter().map(|(_, info)| (info.id, info.idle_timeout_ns)).collect();
        let mut backends: HashMap<u32, Option<Backend>> = HashMap::new();
        let mut seen = 0usize;
        let mut check = |service: u32, e: &CtEntry| {
            seen += 1;
            let Some(tables) = by_service.get_mut(&service) else { return };
            let timeout = idle.get(&service).copied().unwrap_or(0);
            if timeout != 0 && now.saturating_sub(e.last_seen_ns) > timeout {
                return;
            }
            let b = *backends.entry(e.backend).or_insert_with(|| self.backends.get(&e.backend, 0).ok());
            if b.is_some_and(|b| b.family != 0 && b.generation != e.backend_gen) {
                return;
            }
            let i = maglev_slot(e.hash, m);
            let (word, bit) = clean_slots::bit(i);
            for t in tables.iter_mut() {
                if t.entries[i as usize] != e.backend {
                    t.dirty[word as usize] |= bit;
                }
            }
        };
        match (&self.clean.ct4, &self.clean.ct6) {
            (Some(ct4), Some(ct6)) => {
                let buckets = self.clean.buckets;
                for_each_mapped(ct4, buckets, |s| check(s.key.to_key().service, &s.entry()));
                for_each_mapped(ct6, buckets, |s| check(s.key.to_key().service, &s.entry()));
            }
            _ => {
                for (_, key, e) in self.conntrack_entries() {
                    check(key.service, &e);
                }
            }
        }
        let mut report = ScanReport { entries: seen, at_ns: now, ..Default::default() };
        let tail = if m.is_multiple_of(64) { u64::MAX } else { (1u64 << (m % 64)) - 1 };
        for tables in by_service.into_values() {
            for t in tables {
                let mut clean: Vec<u64> = t.dirty.iter().map(|d| !d).collect();
                clean[words - 1] &= tail;
                report.dirty_slots += t.dirty.iter().map(|d| d.count_ones() as u64).sum::<u64>();
                report.slots += m as u64;
                self.clean.write(t.slot, &clean);
            }
        }
        if report.dirty_slots == 0 {
            self.clean.next_scan_ns = None;
        } else {
            self.clean.next_scan_ns = Some(now + self.clean.pause_ns);
            self.clean.pause_ns = (self.clean.pause_ns * 2).min(SCAN_PAUSE_NS.1);
        }
        self.clean.last = Some(report);
        Ok(report)
    }

    /// Whether scans read the connection tables through a mapping (else a syscall per bucket).
    pub fn conntrack_mapped(&self) -> bool {
        self.clean.ct4.is_some() && self.clean.ct6.is_some()
    }

    /// The last scan's report (`lb status`).
    pub fn clean_slots_report(&self) -> Option<ScanReport> {
        self.clean.last
    }

    /// Whether Maglev slot `index` of the active table of (service, class) is clean.
    pub fn slot_clean(&self, service: u32, class: u32, index: u32) -> Option<bool> {
        let slot = *self.active_slots.get(&(service, class))?;
        let (word, bit) = clean_slots::bit(index);
        Some(self.clean.read(slot)[word as usize] & bit != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::carried_bits;

    #[test]
    fn a_changed_entry_makes_its_slot_dirty_and_keeps_the_others() {
        let old = [u64::MAX, 0b1011];
        let a: Vec<u32> = (0..68).map(|i| i % 3).collect();
        let mut b = a.clone();
        b[5] = 9;
        b[65] = 9;
        let bits = carried_bits(&old, &a, &b);
        assert_eq!(bits[0], !(1 << 5));
        assert_eq!(bits[1], 0b1001, "slot 65 dirty, 64 and 67 as they were, 66 still dirty");
    }
}
