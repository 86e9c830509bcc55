//! Connection tracking: look up the flow's entry, check it against the backend's state and the
//! service's persistence flags (`lb_common::decide::ct_verdict`), refresh or delete it. The tables are
//! set-associative arrays (`lb_common::ct_table`): lookups and inserts are inline code; a
//! slot's state word, taken with a compare-and-swap, keeps concurrent writers apart.

use core::intrinsics::{atomic_cxchg, AtomicOrdering};

use aya_ebpf::maps::Array;
use lb_common::ct_table;
use lb_common::decide::{ct_verdict, syn_keeps_entry, CtVerdict};
use lb_common::maps::{stat, table_flags, Backend, CtEntry, CtKey4, CtKey6, ServiceInfo};

use crate::maps::{BACKENDS, CONNTRACK, CONNTRACK4, CT_BUCKET_MASK, CT_SEED};
use crate::select;
use crate::stats::Counters;

/// A flow's key in its family's table, with its two candidate buckets (hashed once per packet:
/// a SYN's loads, search and insert all use them). The balancer's body is inlined once per
/// family, so each copy keeps only its own arm.
#[derive(Clone, Copy)]
pub enum FlowKey<'a> {
    V4(&'a CtKey4, [u32; 2]),
    V6(&'a CtKey6, [u32; 2]),
}

impl<'a> FlowKey<'a> {
    #[inline(always)]
    pub fn v4(key: &'a CtKey4) -> Self {
        FlowKey::V4(key, ct_table::buckets::<ct_table::Slot4>(key, CT_SEED.load(), CT_BUCKET_MASK.load()))
    }

    #[inline(always)]
    pub fn v6(key: &'a CtKey6) -> Self {
        FlowKey::V6(key, ct_table::buckets::<ct_table::Slot6>(key, CT_SEED.load(), CT_BUCKET_MASK.load()))
    }

    /// The flow's slot, a consistent copy of its entry, and the slot's state when copied.
    /// Else the slot an insert of the key at `now` writes is left in this CPU's search record
    /// (`insert_chosen` writes it): one search for both (`find_or_choose`).
    #[inline(always)]
    pub fn get(self, now: u64, idle_timeout_ns: u64, counters: Counters) -> Option<(Slot, CtEntry, u32)> {
        let st = counters.ct_search()?;
        let t = idle_timeout_ns;
        match self {
            FlowKey::V4(k, at) => find_or_choose(&CONNTRACK4, k, at, now, t, st).map(|(s, e, x)| (Slot::V4(s), e, x)),
            FlowKey::V6(k, at) => find_or_choose(&CONNTRACK, k, at, now, t, st).map(|(s, e, x)| (Slot::V6(s), e, x)),
        }
    }

    /// Writes the flow's entry after a search of its own, replacing any; see `write` for what
    /// it counts. Whether it wrote it. (The bench's: the balancer writes the slot its packet's
    /// search chose, `insert_chosen`.)
    #[cfg(feature = "bench")]
    #[inline(always)]
    pub fn insert(self, entry: &CtEntry, idle_timeout_ns: u64, counters: Counters) -> bool {
        self.write(entry, idle_timeout_ns, counters, true)
    }

    /// Starts loading the key's two buckets (all their lines), for a search that reads them all
    /// (`keep_for_syn`'s): the caller chooses a backend while they come from memory.
    #[inline(always)]
    pub fn prefetch(self) {
        match self {
            FlowKey::V4(_, at) => {
                if let Some(b) = buckets(&CONNTRACK4, at) {
                    prefetch(b)
                }
            }
            FlowKey::V6(_, at) => {
                if let Some(b) = buckets(&CONNTRACK, at) {
                    prefetch(b)
                }
            }
        }
    }

    /// `insert` into the slot that this packet's search chose (`keep_for_syn`'s or `lookup`'s,
    /// in this CPU's search record): a flow's first entry costs one scan of its buckets, not two.
    #[inline(always)]
    pub fn insert_chosen(self, entry: &CtEntry, idle_timeout_ns: u64, counters: Counters) -> bool {
        self.write(entry, idle_timeout_ns, counters, false)
    }

    /// Writes the entry (searching first, or into the slot `keep_for_syn` chose). Counts what
    /// it could not do: another CPU held the slot (`ct_insert_busy`: its next packet makes the
    /// entry), or all 16 candidates hold confirmed live flows (`ct_full_stateless`: the flow
    /// goes by the stateless choice); and an unconfirmed live entry it replaced
    /// (`ct_evict_unconfirmed`). Never a confirmed live entry (`ct_table::victim`). Whether it
    /// wrote the entry.
    #[inline(always)]
    fn write(self, entry: &CtEntry, idle_timeout_ns: u64, counters: Counters, search_first: bool) -> bool {
        let Some(st) = counters.ct_search() else { return false };
        let fresh_after = ct_table::fresh_after(entry.last_seen_ns, idle_timeout_ns);
        let written = match self {
            FlowKey::V4(k, at) => insert(&CONNTRACK4, k, at, entry, search_first.then_some(fresh_after), st),
            FlowKey::V6(k, at) => insert(&CONNTRACK, k, at, entry, search_first.then_some(fresh_after), st),
        };
        match written {
            Written::Fresh => return true,
            Written::Evicted => counters.inc(stat::CT_EVICT_UNCONFIRMED),
            Written::Full => counters.inc(stat::CT_FULL_STATELESS),
            Written::Busy => counters.inc(stat::CT_INSERT_BUSY),
        }
        matches!(written, Written::Evicted)
    }
}

/// What `insert` did.
#[derive(Clone, Copy)]
enum Written {
    /// Into the key's own slot, a free one or an idle one.
    Fresh,
    /// Into the slot of an unconfirmed live flow.
    Evicted,
    /// Nothing: every candidate holds a confirmed live flow.
    Full,
    /// Nothing: another CPU held the slot (or the buckets were out of range).
    Busy,
}

/// A slot found by `FlowKey::get`.
#[derive(Clone, Copy)]
pub enum Slot {
    V4(*mut ct_table::Slot4),
    V6(*mut ct_table::Slot6),
}

impl Slot {
    #[inline(always)]
    fn touch(self, now: u64) {
        // Without taking the slot: if another CPU rewrote it meanwhile, its flow looks recently
        // seen for a while, which only delays its idle expiry.
        match self {
            Slot::V4(s) => unsafe { ct_table::Slot::touch(&mut *s, now) },
            Slot::V6(s) => unsafe { ct_table::Slot::touch(&mut *s, now) },
        }
    }

    /// Marks the entry confirmed (its flow showed a second packet), once per flow: a
    /// compare-and-swap from the state `FlowKey::get` saw, so an entry rewritten since is left
    /// alone (the next packet tries again). The version stays: readers ignore this bit.
    #[inline(always)]
    fn confirm(self, state: u32) {
        if state & ct_table::state::CONFIRMED != 0 {
            return;
        }
        let confirmed = state | ct_table::state::CONFIRMED;
        match self {
            Slot::V4(s) => cas(unsafe { &mut (*s).state }, state, confirmed),
            Slot::V6(s) => cas(unsafe { &mut (*s).state }, state, confirmed),
        };
    }

    /// Frees the slot, unless it was rewritten since `FlowKey::get` saw it in `state`, and
    /// leaves it in the search record `st` as the slot an insert of the key writes (its own,
    /// now free; if another CPU had it, a state that makes the insert fail).
    #[inline(always)]
    fn remove(self, state: u32, st: *mut ct_table::Search) {
        let freed = match self {
            Slot::V4(s) => release(unsafe { &mut *s }, state),
            Slot::V6(s) => release(unsafe { &mut *s }, state),
        };
        unsafe {
            core::ptr::write_volatile(&mut (*st).state, freed.unwrap_or(ct_table::state::WRITING));
            core::ptr::write_volatile(&mut (*st).chosen, 0);
        }
    }
}

/// The buckets at `at` (a key's two candidates, `FlowKey::v4`/`v6`).
#[inline(always)]
fn buckets<S: ct_table::Slot>(map: &Array<ct_table::Bucket<S>>, at: [u32; 2]) -> Option<[*mut ct_table::Bucket<S>; 2]> {
    Some([map.get_ptr_mut(at[0])?, map.get_ptr_mut(at[1])?])
}

/// The slot at `index` (`candidate * ct_table::WAYS + way`), read back from the search record: the
/// verifier sees one unknown index (masked into range), not one state per slot.
#[inline(always)]
fn slot_at<S: ct_table::Slot>(b: [*mut ct_table::Bucket<S>; 2], index: u32) -> *mut S {
    let k = index as usize & (2 * ct_table::WAYS - 1);
    let bucket = if k < ct_table::WAYS { b[0] } else { b[1] };
    unsafe { &mut (*bucket).slots[k & (ct_table::WAYS - 1)] }
}

/// Loads one byte of every cache line of both buckets (whole lines: see `CONNTRACK`) before a
/// search that reads them all: the loads are independent, so the lines come from memory
/// together rather than one after the other as the search's branches resolve (BPF has no
/// prefetch instruction; these are plain loads). Not before a lookup: a hit usually ends in
/// the first bucket's first lines, and loads retire in order, so it would wait for the second
/// bucket's lines too (measured: 45-80 ns dearer; in the history of BENCHMARKS.md).
#[inline(always)]
fn prefetch<S: ct_table::Slot>(b: [*mut ct_table::Bucket<S>; 2]) {
    let lines = core::mem::size_of::<ct_table::Bucket<S>>() / 64;
    let mut i = 0;
    while i < lines {
        unsafe {
            core::ptr::read_volatile((b[0] as *const u8).add(i * 64));
            core::ptr::read_volatile((b[1] as *const u8).add(i * 64));
        }
        i += 1;
    }
}

/// The live slot of `key`, a copy of its entry taken while no writer held the slot, and the
/// slot's state then; without the key, the slot an insert of it at `now` writes is chosen
/// (`ct_table::choose`, from the lines the search has just read) and left in `st` (this CPU's
/// search record) for `insert`. A hit costs exactly a lookup (`ct_table::find`): the choice
/// is made, and the idle horizon computed, only on a miss.
#[inline(always)]
fn find_or_choose<S: ct_table::Slot>(
    map: &Array<ct_table::Bucket<S>>,
    key: &S::Key,
    at: [u32; 2],
    now: u64,
    idle_timeout_ns: u64,
    st: *mut ct_table::Search,
) -> Option<(*mut S, CtEntry, u32)> {
    let b = buckets(map, at)?;
    let pair = unsafe { [&*b[0], &*b[1]] };
    let Some(state) = ct_table::find(pair, key, st) else {
        ct_table::choose(pair, ct_table::fresh_after(now, idle_timeout_ns), st);
        return None;
    };
    // (A found entry the caller deletes is recorded as the choice by `Slot::remove`.)
    copy(b, st, state)
}

/// Like `find_or_choose`, but the search records the key's own slot as the choice when it
/// finds it (`ct_table::victim`): a re-selecting SYN overwrites its entry there.
#[inline(always)]
fn search<S: ct_table::Slot>(
    map: &Array<ct_table::Bucket<S>>,
    key: &S::Key,
    at: [u32; 2],
    fresh_after: u64,
    st: *mut ct_table::Search,
) -> Option<(*mut S, CtEntry, u32)> {
    let b = buckets(map, at)?;
    ct_table::victim(unsafe { [&*b[0], &*b[1]] }, key, fresh_after, st);
    if unsafe { core::ptr::read_volatile(&(*st).chosen) } != ct_table::chosen::OWN {
        return None;
    }
    copy(b, st, unsafe { core::ptr::read_volatile(&(*st).state) })
}

/// The slot a search (`st`) found holding the key in `state`, a copy of its entry taken while no
/// writer held it, and `state`; None if a writer held the slot then or since, and then the
/// record makes an insert from it fail (`take`), as from any outdated state.
#[inline(always)]
fn copy<S: ct_table::Slot>(
    b: [*mut ct_table::Bucket<S>; 2],
    st: *mut ct_table::Search,
    state: u32,
) -> Option<(*mut S, CtEntry, u32)> {
    if state & ct_table::state::WRITING != 0 {
        return busy(st);
    }
    let slot = slot_at(b, unsafe { core::ptr::read_volatile(&(*st).index) });
    // Key (compared by the search after its state read and a compiler barrier) and entry
    // between the two reads of the state: if the state is unchanged, no writer touched the
    // slot meanwhile and both belong to the version the search saw.
    let entry = unsafe { ct_table::Slot::entry(&*slot) };
    // CONFIRMED aside: another CPU confirming the entry meanwhile changed nothing we read.
    if (ct_table::slot_state(unsafe { &*slot }) ^ state) & !ct_table::state::CONFIRMED != 0 {
        return busy(st);
    }
    Some((slot, entry, state))
}

/// Records in `st` a choice that an insert fails from (the key's slot, held by a writer).
#[inline(always)]
fn busy<T>(st: *mut ct_table::Search) -> Option<T> {
    unsafe {
        core::ptr::write_volatile(&mut (*st).state, ct_table::state::WRITING);
        core::ptr::write_volatile(&mut (*st).chosen, ct_table::chosen::OWN);
    }
    None
}

/// Takes `slot` for writing if its state is still `observed`: false if another writer has it.
#[inline(always)]
fn take<S: ct_table::Slot>(slot: &mut S, observed: u32) -> bool {
    if observed & ct_table::state::WRITING != 0 {
        return false;
    }
    cas(slot.state_mut(), observed, observed | ct_table::state::WRITING)
}

/// Sets the state word at `state` to `new` if it is `observed`; whether it did.
#[inline(always)]
fn cas(state: *mut u32, observed: u32, new: u32) -> bool {
    // BPF_ATOMIC | BPF_CMPXCHG (needs the v3 instruction set, kernel 5.12+; see .cargo/config.toml).
    unsafe { atomic_cxchg::<u32, { AtomicOrdering::Acquire }, { AtomicOrdering::Relaxed }>(state, observed, new) }.1
}

/// Ends a write begun by `take`: the next version, live or not. The state it wrote.
#[inline(always)]
fn finish<S: ct_table::Slot>(slot: &mut S, observed: u32, live: bool) -> u32 {
    let next = ct_table::next_state(observed, live);
    // Volatile, after the volatile stores of `ct_table::Slot::set`: the compiler keeps the order, and
    // x86 (TSO) makes stores visible in program order. A weakly ordered CPU (arm64) would need
    // a store-release here; this data plane is built and tested for x86-64 only.
    unsafe { core::ptr::write_volatile(slot.state_mut(), next) };
    next
}

/// Writes `key`'s entry into its own slot, a free or idle one (last seen before `fresh_after`) of
/// the first bucket while it has room, else of the less loaded one, or that of the least recently
/// seen unconfirmed flow (`ct_table::victim`); none if all candidates hold confirmed live flows. If
/// another CPU is writing the chosen slot at this instant the flow goes untracked for this packet;
/// its next packet makes the entry. `fresh_after` None: the key's buckets were searched already
/// (`search`, for this packet, at the entry's time) and the slot chosen then is written, from the
/// state seen then.
#[inline(always)]
fn insert<S: ct_table::Slot>(
    map: &Array<ct_table::Bucket<S>>,
    key: &S::Key,
    at: [u32; 2],
    entry: &CtEntry,
    fresh_after: Option<u64>,
    st: *mut ct_table::Search,
) -> Written {
    let Some(b) = buckets(map, at) else { return Written::Busy };
    if let Some(fresh_after) = fresh_after {
        ct_table::victim(unsafe { [&*b[0], &*b[1]] }, key, fresh_after, st);
    }
    let chosen = unsafe { core::ptr::read_volatile(&(*st).chosen) };
    if chosen == ct_table::chosen::FULL {
        return Written::Full;
    }
    // Read back from the search record as plain integers: the verifier sees one unknown index.
    let slot = unsafe { &mut *slot_at(b, core::ptr::read_volatile(&(*st).index)) };
    // From the state the choice saw: if another CPU wrote the slot since, it is left alone.
    let observed = unsafe { core::ptr::read_volatile(&(*st).state) };
    if !take(slot, observed) {
        return Written::Busy;
    }
    slot.set(key, entry);
    finish(slot, observed, true);
    if chosen == ct_table::chosen::EVICTS {
        Written::Evicted
    } else {
        Written::Fresh
    }
}

/// Frees a slot found in `observed` state; a slot rewritten since has another version, and
/// the compare-and-swap leaves it alone. The state it left, if it freed the slot.
#[inline(always)]
fn release<S: ct_table::Slot>(slot: &mut S, observed: u32) -> Option<u32> {
    if !take(slot, observed) {
        return None;
    }
    Some(finish(slot, observed, false))
}

/// The tracked (backend id, class, backend record, flow hash) of a flow if its entry is still
/// valid; an invalid entry is deleted and counted by reason. The backend record is the one the
/// check read, so the caller needs no second `BACKENDS` lookup. A valid entry is confirmed
/// unless `quoted` (an ICMP error quoting the flow is no packet of it). On None the search has
/// chosen the slot an insert of the key at `now` writes (`FlowKey::insert_chosen`).
#[inline(always)]
pub fn lookup(
    key: FlowKey,
    service: &ServiceInfo,
    proto: u8,
    now: u64,
    quoted: bool,
    counters: Counters,
) -> Option<(u32, u32, &'static Backend, u32)> {
    let (slot, e, state) = key.get(now, service.idle_timeout_ns, counters)?;
    let backend = BACKENDS.get(e.backend);
    let verdict =
        ct_verdict(&e, backend, service, proto, now, || match select::table_ref(service.id, e.class as u32) {
            Some(t) => t.flags & table_flags::NO_HEALTHY != 0,
            None => false,
        });
    let reason = match verdict {
        CtVerdict::Valid => match backend {
            Some(b) => {
                slot.touch(now);
                // A packet after the one that made the entry: the flow is confirmed.
                if !quoted {
                    slot.confirm(state);
                }
                return Some((e.backend, e.class as u32, b, e.hash));
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
    if let Some(st) = counters.ct_search() {
        slot.remove(state, st);
    }
    None
}

/// For a SYN that is new by rule (`is_new_flow`): the tracked (backend id, class, backend record,
/// flow hash) of its key if the entry keeps the flow (`lb_common::decide::syn_keeps_entry`: its backend
/// is still usable for a new connection), refreshed. Else None: the caller selects a backend
/// as for a new flow and its insert overwrites the entry (nothing is deleted or counted here).
/// The search is an insert's (`ct_table::victim`, at `now`): on None, `FlowKey::insert_chosen`
/// with an entry seen at `now` writes the slot it chose without searching again.
#[inline(always)]
pub fn keep_for_syn(
    key: FlowKey,
    service: &ServiceInfo,
    now: u64,
    counters: Counters,
) -> Option<(u32, u32, &'static Backend, u32)> {
    let st = counters.ct_search()?;
    let fresh_after = ct_table::fresh_after(now, service.idle_timeout_ns);
    let (slot, e) = match key {
        FlowKey::V4(k, at) => search(&CONNTRACK4, k, at, fresh_after, st).map(|(s, e, _)| (Slot::V4(s), e))?,
        FlowKey::V6(k, at) => search(&CONNTRACK, k, at, fresh_after, st).map(|(s, e, _)| (Slot::V6(s), e))?,
    };
    let backend = BACKENDS.get(e.backend)?;
    if !syn_keeps_entry(&e, Some(backend), service, now) {
        return None;
    }
    slot.touch(now);
    Some((e.backend, e.class as u32, backend, e.hash))
}
