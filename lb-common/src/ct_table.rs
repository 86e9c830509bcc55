//! The connection table's layout and its pure routines, shared by the data plane and userspace.
//!
//! A set-associative table in an array map (`CONNTRACK4` for IPv4 flows, `CONNTRACK` for IPv6):
//! each key has two candidate buckets of [`WAYS`] slots, both derived from one seeded 64-bit
//! hash. A lookup compares the key with up to 16 slots, all inline (an array lookup is inlined
//! by the verifier; a kernel hash map costs a helper call, and its LRU insert hundreds of ns,
//! see BENCHMARKS.md). An insert takes the key's own slot, else a free one, else the least
//! recently seen of the 16, so the table behaves like an LRU per pair of buckets. Closed
//! connections are not removed (as with the LRU hash before), so a busy table fills up and
//! every new flow then evicts: the least recently seen of its 16 candidates, which keeps active
//! flows as long as they fill at most half the slots ([`buckets_for`] sizes tables so: filled
//! that far, no bucket in a simulation of 2^20 flows was even full).
//!
//! Each slot's `state` word guards it against concurrent writers on other CPUs: a writer
//! takes the slot by setting [`state::WRITING`] with a compare-and-swap, writes, then
//! stores a new version with WRITING clear. Readers check the state before and after copying.
//! A writer that finds its slot taken gives up: the flow is untracked for that packet and its
//! next packet makes the entry. Two CPUs inserting the same new key at the same instant can
//! leave two copies; lookups find the first, the other ages out like any idle flow. (RSS keeps
//! a flow's packets on one CPU, so both are rare.)
//!
//! An entry is *confirmed* ([`state::CONFIRMED`]) once its flow has shown a packet after the
//! one that made it (a hit of the data plane's lookup; a SYN that keeps its entry does not
//! confirm it). A new flow never takes the slot of a confirmed live flow (issue 35): a flood of
//! single packets with spoofed tuples, however many, replaces only unconfirmed entries, and
//! when all 16 candidates hold confirmed live flows the packet is forwarded by the stateless
//! choice without an entry (`ct_full_stateless`).

use crate::maps::{CtEntry, CtKey4, CtKey6};

/// Slots per bucket.
pub const WAYS: usize = 8;

/// Bits of a slot's `state` word.
pub mod state {
    /// A writer holds the slot.
    pub const WRITING: u32 = 1;
    /// The slot holds a flow.
    pub const LIVE: u32 = 2;
    /// The flow has shown a packet after the one that made its entry: no new flow takes its
    /// slot while it is live. Set once per flow by a compare-and-swap that leaves the version
    /// as it is (readers compare states without this bit); every write clears it.
    pub const CONFIRMED: u32 = 4;
    /// The version counter's unit (bits 3 and up): bumped by every write.
    pub const VERSION: u32 = 8;

    /// Whether a slot in state `bits` holds a published entry (live, no writer).
    #[inline(always)]
    pub const fn published(bits: u32) -> bool {
        bits & (LIVE | WRITING) == LIVE
    }
}

/// The state a completed write leaves: next version, WRITING and CONFIRMED clear, LIVE as
/// given (a written entry is a new, unconfirmed one).
#[inline(always)]
pub const fn next_state(observed: u32, live: bool) -> u32 {
    let next = (observed & !(state::WRITING | state::LIVE | state::CONFIRMED)).wrapping_add(state::VERSION);
    if live {
        next | state::LIVE
    } else {
        next
    }
}

/// Last-seen times are kept in units of 2^`SEEN_GRAIN_SHIFT` ns (65.5 µs) in the tables
/// ([`PackedEntry`]). The data-plane clock is rounded down to the unit (lb-ebpf `clock`, by
/// [`seen_grain`]), so every time it writes reads back exactly.
pub const SEEN_GRAIN_SHIFT: u32 = 16;

/// `t_ns` rounded down to the unit of last-seen times ([`SEEN_GRAIN_SHIFT`]).
#[inline(always)]
pub const fn seen_grain(t_ns: u64) -> u64 {
    t_ns & !((1 << SEEN_GRAIN_SHIFT) - 1)
}

/// One slot of an IPv4 bucket (40 bytes: a bucket is 5 cache lines).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot4 {
    pub state: u32,
    pub key: CtKey4,
    pub entry: PackedEntry,
}

/// One slot of an IPv6 bucket: one cache line (64 bytes), so that a hit reads one line and a
/// bucket is 8 lines.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot6 {
    pub state: u32,
    pub key: CtKey6,
    pub entry: PackedEntry,
}

/// A [`CtEntry`] in 20 bytes, as a slot holds it: the last-seen time in 48 bits of
/// [`SEEN_GRAIN_SHIFT`] units (2^64 ns: no wrap), the pool generation in 16 (the controller
/// wraps `ServiceInfo::pool_gen` at 2^16). With the [`CtEntry`] of 24 bytes, slots were 48
/// (IPv4, 6 lines a bucket) and 72 bytes (IPv6: 9 lines a bucket, most slots across two):
/// measured dearer per cold hit and new flow (BENCHMARKS.md).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackedEntry {
    pub backend: u32,
    pub hash: u32,
    /// Last-seen time >> SEEN_GRAIN_SHIFT: its low 32 bits, then its high 16.
    pub seen_low: u32,
    pub seen_high: u16,
    pub pool_gen: u16,
    pub class: u16,
    pub backend_gen: u16,
}

impl PackedEntry {
    /// A copy of the entry, every field read once with a volatile load, the time as
    /// [`Self::last_seen_ns`] reads it.
    #[inline(always)]
    pub fn load(&self) -> CtEntry {
        let last_seen_ns = self.last_seen_ns();
        // SAFETY: reads of fields of `self`.
        unsafe {
            CtEntry {
                backend: core::ptr::read_volatile(&self.backend),
                pool_gen: core::ptr::read_volatile(&self.pool_gen) as u32,
                last_seen_ns,
                class: core::ptr::read_volatile(&self.class),
                backend_gen: core::ptr::read_volatile(&self.backend_gen),
                hash: core::ptr::read_volatile(&self.hash),
            }
        }
    }

    /// `e` packed: its time rounded down to the grain, 16 bits of its pool generation.
    #[inline(always)]
    pub fn store(e: &CtEntry) -> Self {
        let seen = e.last_seen_ns >> SEEN_GRAIN_SHIFT;
        Self {
            backend: e.backend,
            hash: e.hash,
            seen_low: seen as u32,
            seen_high: (seen >> 32) as u16,
            pool_gen: e.pool_gen as u16,
            class: e.class,
            backend_gen: e.backend_gen,
        }
    }

    /// The last-seen time: its low 32 bits, then its high 16. A refresh on another CPU
    /// ([`Self::set_last_seen_ns`], which takes no lock) writes them the other way round, so a
    /// read racing it yields the old time, the new one or, when the high bits change (every
    /// 78 hours), a time after both: never one before, which could make a live flow look idle.
    /// (x86 keeps stores in order and loads in order; volatile accesses keep program order.)
    #[inline(always)]
    pub fn last_seen_ns(&self) -> u64 {
        // SAFETY: reads of fields of `self`.
        let (low, high) =
            unsafe { (core::ptr::read_volatile(&self.seen_low), core::ptr::read_volatile(&self.seen_high)) };
        (((high as u64) << 32) | low as u64) << SEEN_GRAIN_SHIFT
    }

    /// Sets the last-seen time: its high 16 bits, then its low 32 (see [`Self::last_seen_ns`]).
    #[inline(always)]
    pub fn set_last_seen_ns(&mut self, t_ns: u64) {
        let seen = t_ns >> SEEN_GRAIN_SHIFT;
        // SAFETY: writes of fields of `self`.
        unsafe {
            core::ptr::write_volatile(&mut self.seen_high, (seen >> 32) as u16);
            core::ptr::write_volatile(&mut self.seen_low, seen as u32);
        }
    }
}

/// A bucket: the unit of the array map.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket<S> {
    pub slots: [S; WAYS],
}

impl<S: Default + Copy> Default for Bucket<S> {
    fn default() -> Self {
        Self { slots: [S::default(); WAYS] }
    }
}

pub type Bucket4 = Bucket<Slot4>;
pub type Bucket6 = Bucket<Slot6>;

/// What the table routines need of a slot type.
pub trait Slot: Copy {
    /// A `repr(C)` struct of `KEY_WORDS` 32-bit words without padding (explicit pad fields
    /// count as words), so it is hashed and compared as words, read in place.
    type Key: Copy;
    const KEY_WORDS: usize;
    /// Two key words that differ between most flows (the ports, the low source address word),
    /// compared first by [`Slot::key_is`].
    const TELLING_WORDS: [usize; 2];
    fn state_ptr(&self) -> *const u32;
    /// The state word for writing (a compare-and-swap or a store).
    fn state_mut(&mut self) -> *mut u32;
    fn key(&self) -> &Self::Key;
    /// A copy of the entry, read with volatile loads (the data plane copies it between two
    /// reads of the state word; a refresh of the time changes no state, see
    /// [`PackedEntry::last_seen_ns`]).
    fn entry(&self) -> CtEntry;
    /// The entry's last-seen time.
    fn last_seen_ns(&self) -> u64;
    /// Sets the entry's last-seen time (a hit's refresh), without taking the slot (see
    /// [`PackedEntry::set_last_seen_ns`]).
    fn touch(&mut self, now_ns: u64);
    /// Writes key and entry with volatile stores: the data plane publishes them with a
    /// volatile store of the state word after, which the compiler keeps in that order (the
    /// BPF target has no fence instruction).
    fn set(&mut self, key: &Self::Key, entry: &CtEntry);

    /// Word `i` of a key (no copy of the key: the data plane's stack is small).
    #[inline(always)]
    fn key_word(key: &Self::Key, i: usize) -> u32 {
        unsafe { *(key as *const Self::Key as *const u32).add(i) }
    }

    /// Whether the slot's key is `key`, word by word (no memcmp in eBPF). Two telling words
    /// first: a slot of another flow (most slots a search passes) usually differs there, and
    /// its other words are then not read; the rest branch-free.
    #[inline(always)]
    fn key_is(&self, key: &Self::Key) -> bool {
        let [a, b] = Self::TELLING_WORDS;
        let telling = (Self::key_word(self.key(), a) ^ Self::key_word(key, a))
            | (Self::key_word(self.key(), b) ^ Self::key_word(key, b));
        if telling != 0 {
            return false;
        }
        let mut diff = 0;
        let mut i = 0;
        while i < Self::KEY_WORDS {
            diff |= Self::key_word(self.key(), i) ^ Self::key_word(key, i);
            i += 1;
        }
        diff == 0
    }
}

macro_rules! ct_slot {
    ($slot:ty, $key:ty, $telling:expr) => {
        impl Slot for $slot {
            type Key = $key;
            const KEY_WORDS: usize = core::mem::size_of::<$key>() / 4;
            const TELLING_WORDS: [usize; 2] = $telling;
            #[inline(always)]
            fn state_ptr(&self) -> *const u32 {
                &self.state
            }
            #[inline(always)]
            fn state_mut(&mut self) -> *mut u32 {
                &mut self.state
            }
            #[inline(always)]
            fn key(&self) -> &$key {
                &self.key
            }
            #[inline(always)]
            fn entry(&self) -> CtEntry {
                self.entry.load()
            }
            #[inline(always)]
            fn last_seen_ns(&self) -> u64 {
                self.entry.last_seen_ns()
            }
            #[inline(always)]
            fn touch(&mut self, now_ns: u64) {
                self.entry.set_last_seen_ns(now_ns)
            }
            #[inline(always)]
            fn set(&mut self, key: &$key, entry: &CtEntry) {
                unsafe {
                    core::ptr::write_volatile(&mut self.key, *key);
                    core::ptr::write_volatile(&mut self.entry, PackedEntry::store(entry));
                }
            }
        }
    };
}
// CtKey4: src, dst, ports, service | proto. CtKey6: src[4], dst[4], ports, service | proto.
ct_slot!(Slot4, CtKey4, [2, 0]);
ct_slot!(Slot6, CtKey6, [8, 3]);
// The word views above rely on these: whole words, alignment 4, no implicit padding.
const _: () = assert!(core::mem::size_of::<CtKey4>() == 16 && core::mem::align_of::<CtKey4>() == 4);
const _: () = assert!(core::mem::size_of::<CtKey6>() == 40 && core::mem::align_of::<CtKey6>() == 4);

/// The two candidate buckets of `key` in a table of `mask + 1` buckets (a power of two), for
/// the tables' `seed` (random when they are made, pinned with them: a client who cannot
/// predict the buckets cannot aim flows at one): the flow hash's construction
/// ([`crate::hash::pair_hash`]) over the key's words; the halves of the result pick the buckets.
#[inline(always)]
pub fn buckets<S: Slot>(key: &S::Key, seed: u64, mask: u32) -> [u32; 2] {
    let h = crate::hash::pair_hash(|i| S::key_word(key, i), S::KEY_WORDS, seed);
    [h as u32 & mask, (h >> 32) as u32 & mask]
}

/// Buckets for a table of `entries` flows: at least twice as many slots, rounded up to a power
/// of two buckets (so 2 to 4 slots per flow; 2^21 slots for 2^20 flows).
///
/// Twice, not a third more: filled with its configured number of flows a table is then at most
/// half full, where the two-choice placement of [`victim`] leaves no bucket even full (unit
/// test `no_flow_is_evicted_at_the_worst_case_configured_size`), so no flow can meet two full
/// buckets. At 3/4 of the slots (the fullest the former 4/3 rule made a table) a few flows in
/// 10^5 did and were evicted while alive (issue 17). The power-of-two sizes are the worst case
/// and cost what they did before (2^20 flows: 2^18 buckets).
pub const fn buckets_for(entries: u32) -> u32 {
    let buckets = (entries as u64 * 2).div_ceil(WAYS as u64);
    let mut b = 1u64;
    while b < buckets {
        b *= 2;
    }
    if b > 1 << 31 {
        1 << 31
    } else {
        b as u32
    }
}

/// Reads a slot's state word as it is now (another CPU may be writing it).
#[inline(always)]
pub fn slot_state<S: Slot>(slot: &S) -> u32 {
    unsafe { core::ptr::read_volatile(slot.state_ptr()) }
}

pub use crate::maps::Search;

/// Values of [`Search::chosen`].
pub mod chosen {
    /// The key's own slot.
    pub const OWN: u32 = 1;
    /// The least recently seen unconfirmed flow's slot: the insert evicts it
    /// ([`super::Victim::evicts`]).
    pub const EVICTS: u32 = 2;
    /// No slot: all 16 candidates hold confirmed live flows (or are being written). `state`
    /// is left WRITING, so an insert from this choice fails.
    pub const FULL: u32 = 3;
}

/// Keeps the compiler from moving memory accesses across this point (no instruction): plain
/// loads may otherwise move across volatile ones. The BPF target has no fence instruction;
/// an empty `asm!` that may touch memory does the job.
#[inline(always)]
fn compiler_barrier() {
    #[cfg(target_arch = "bpf")]
    unsafe {
        core::arch::asm!("", options(nostack, preserves_flags))
    };
    #[cfg(not(target_arch = "bpf"))]
    core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
}

#[inline(always)]
fn put<T>(p: *mut T, v: T) {
    unsafe { core::ptr::write_volatile(p, v) }
}

/// The slot at `search.index` (`candidate * WAYS + way`), written just before. Read back from
/// the record, the index is one unknown value to the verifier, which then checks one access
/// in range; computed in registers, the compiler folds the bucket choice into the offset in a
/// way the verifier cannot follow. A branch, not `buckets[k / WAYS]`: an array on the stack
/// indexed by an unknown value loses its pointers' type for the verifier.
#[inline(always)]
fn indexed<S: Slot>(buckets: [&Bucket<S>; 2], search: *const Search) -> &S {
    let k = unsafe { core::ptr::read_volatile(&(*search).index) } as usize & (2 * WAYS - 1);
    &(if k < WAYS { buckets[0] } else { buckets[1] }).slots[k % WAYS]
}

/// Whether a live slot holds `key`; if so its index (`candidate * WAYS + way`) is in
/// `search.index` and returned state is the slot's state when seen.
// `search` is a raw pointer on purpose: the data plane passes its per-CPU search record,
// written with volatile stores (see `put`), and must be valid for both callers.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[inline(always)]
pub fn find<S: Slot>(buckets: [&Bucket<S>; 2], key: &S::Key, search: *mut Search) -> Option<u32> {
    let mut k = 0;
    while k < 2 * WAYS {
        let slot = &buckets[k / WAYS].slots[k % WAYS];
        let bits = slot_state(slot);
        // The key is read after the state: the data plane's reader validates what it read
        // against this state (lb-ebpf `conntrack::find`).
        compiler_barrier();
        if bits & state::LIVE != 0 && slot.key_is(key) {
            put(unsafe { &mut (*search).index }, k as u32);
            return Some(bits);
        }
        k += 1;
    }
    None
}

/// What an insert of a key writes: [`victim`]'s choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Victim {
    /// The slot, `candidate * WAYS + way` (at most 15).
    pub index: u32,
    /// Both buckets had only live flows: the insert evicts the least recently seen
    /// unconfirmed one (`search.oldest` is its `last_seen_ns`). Not set for a slot of an idle flow.
    pub evicts: bool,
    /// No slot may be taken: every candidate holds a confirmed live flow (or a writer). The
    /// flow goes without an entry (`index` means nothing).
    pub full: bool,
}

/// The slot an insert of `key` writes: the key's own slot; else a slot without a live flow
/// (empty, or holding a flow last seen before `fresh_after`, idle; and without a writer) of the
/// first bucket while it has [`FIRST_WHILE_FREE`] such slots, else of the less loaded candidate
/// bucket, the one with more such slots (the first bucket on a tie); else
/// the least recently seen unconfirmed flow of the two buckets; else none ([`Victim::full`]: a
/// confirmed live flow never gives way to a new one, issue 35). The chosen slot, its state as seen and how
/// it was chosen are left in `search` (`index`, `state`, `chosen`). `fresh_after`: the insert's time minus the idle timeout (0: no flow counts
/// as idle, as for a table with no idle timeout, or a copy of all flows).
///
/// The less loaded bucket, not simply the first with room: with the first-fit rule the first
/// buckets fill up and a table below capacity already evicts live flows (0.69 % of the flows
/// at 71.5 % of slots); choosing the less loaded of two keeps the buckets even (two choices).
/// Filled with its configured number of flows, a table (see [`buckets_for`]: at most half its
/// slots) then evicts none; at 3/4 of its slots it would evict about 3e-5 of them (unit tests
/// below; 1.5e-5 without the first bucket's threshold). Load counts live flows only: closed
/// connections are not removed, so a busy table is full of idle flows, and if they counted
/// every bucket would look full and a new flow would go wherever the oldest flow is, not to the
/// bucket with fewer live flows (in a simulation at half the slots live, 4e-5 of the new flows
/// then evicted a live one; none with this rule).
///
/// One pass over the 16 slots: the key is compared and the choice prepared slot by slot. (The
/// data plane's lookup is [`find`], then [`choose`] on a miss: a hit there costs only the
/// lookup, and the choice reads lines the lookup has just brought in.)
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[inline(always)]
pub fn victim<S: Slot>(buckets: [&Bucket<S>; 2], key: &S::Key, fresh_after: u64, search: *mut Search) -> Victim {
    begin(search);
    let mut free = 0;
    let mut k = 0;
    while k < 2 * WAYS {
        let slot = &buckets[k / WAYS].slots[k % WAYS];
        let bits = slot_state(slot);
        // Key and last-seen time are read after the state (see `find`).
        compiler_barrier();
        if bits & state::LIVE != 0 && slot.key_is(key) {
            put(unsafe { &mut (*search).index }, k as u32);
            put(unsafe { &mut (*search).state }, bits);
            put(unsafe { &mut (*search).chosen }, chosen::OWN);
            return Victim { index: k as u32, evicts: false, full: false };
        }
        free |= note(slot, k, bits, fresh_after, search);
        k += 1;
    }
    decide(buckets, free, fresh_after, search)
}

/// [`victim`]'s choice for a key that none of the 16 slots holds (a [`find`] that missed has
/// just read their lines): the same choice, without comparing keys.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[inline(always)]
pub fn choose<S: Slot>(buckets: [&Bucket<S>; 2], fresh_after: u64, search: *mut Search) -> Victim {
    begin(search);
    let mut free = 0;
    let mut k = 0;
    while k < 2 * WAYS {
        let slot = &buckets[k / WAYS].slots[k % WAYS];
        let bits = slot_state(slot);
        // The last-seen time is read after the state (see `find`).
        compiler_barrier();
        free |= note(slot, k, bits, fresh_after, search);
        k += 1;
    }
    decide(buckets, free, fresh_after, search)
}

/// Starts a choice: no unconfirmed live flow seen yet (`oldest`), and a slot and state an
/// insert fails from.
#[inline(always)]
fn begin(st: *mut Search) {
    put(unsafe { &mut (*st).oldest }, u64::MAX);
    put(unsafe { &mut (*st).index }, 0);
    put(unsafe { &mut (*st).state }, state::WRITING);
}

/// Notes slot `k` (in state `bits`) for a choice: the least recently seen unconfirmed live
/// flow so far is kept in the record (time, slot, state), and the slot's bit in the returned
/// mask is set if it takes a key without evicting a live flow (no live flow, or an idle one;
/// no writer: taking a slot another CPU is writing would fail). In the record and in branch-free
/// bit arithmetic (WRITING, LIVE and CONFIRMED are bits 0, 1 and 2; times are below 2^63 ns,
/// so `seen < fresh_after` is the sign of the difference), not in registers the compares set:
/// the verifier then follows one path past each slot, not two.
#[inline(always)]
fn note<S: Slot>(slot: &S, k: usize, bits: u32, fresh_after: u64, st: *mut Search) -> u64 {
    let seen = slot.last_seen_ns();
    if bits & (state::WRITING | state::LIVE | state::CONFIRMED) == state::LIVE
        && seen < unsafe { core::ptr::read_volatile(&(*st).oldest) }
    {
        put(unsafe { &mut (*st).oldest }, seen);
        put(unsafe { &mut (*st).index }, k as u32);
        put(unsafe { &mut (*st).state }, bits);
    }
    let no_writer = (bits as u64 & 1) ^ 1;
    let not_live = ((bits as u64 >> 1) & 1) ^ 1;
    let idle = seen.wrapping_sub(fresh_after) >> 63;
    ((not_live | idle) & no_writer) << k
}

/// A new flow goes to its first bucket while that has at least this many free slots (at most 3 live
/// flows), whatever the second holds; else to the less loaded one. A hit in the second bucket reads
/// a line of another page, 40-60 ns dearer cold than one in the first (`dp_bench --cold-by-slot`).
/// With plain two choices 31 % of the flows of a table filled to its configured size sat there,
/// with this threshold 15 % (4 % at half that size): over five `--compare-cold` runs cold hits were
/// 9 (IPv4) and 13 ns (IPv6) cheaper in the median run, 4 and 7 on average (single runs swing by
/// ±20 ns). The table still has no full bucket at its configured size (unit tests below); a
/// threshold of 6 free slots left some full.
pub const FIRST_WHILE_FREE: u32 = WAYS as u32 - 3;

/// Ends a choice from the mask of slots [`note`] found free: the first free slot of the first
/// bucket if it has [`FIRST_WHILE_FREE`] free slots, else of the less loaded bucket (the one
/// with more free slots, the first on a tie); else the least recently seen unconfirmed live
/// flow's; else none.
#[inline(always)]
fn decide<S: Slot>(buckets: [&Bucket<S>; 2], free: u64, fresh_after: u64, st: *mut Search) -> Victim {
    let free = free as u32;
    put(unsafe { &mut (*st).free }, free);
    let in_first = (free & ((1 << WAYS) - 1)).count_ones();
    let second = (in_first < FIRST_WHILE_FREE && (free >> WAYS).count_ones() > in_first) as u32;
    let in_bucket = (free >> (second * WAYS as u32)) & ((1 << WAYS) - 1);
    if in_bucket != 0 {
        // Its first free slot: the bits below the lowest set one, counted (BPF has no
        // count-trailing-zeros instruction; a population count is bit arithmetic).
        let way = ((in_bucket & in_bucket.wrapping_neg()) - 1).count_ones();
        let k = second * WAYS as u32 + way;
        put(unsafe { &mut (*st).index }, k);
        // Its state now (not remembered per slot): if another CPU has written a live flow
        // there or is writing since, the insert must fail, as from any outdated state.
        let slot = indexed(buckets, st);
        let bits = slot_state(slot);
        compiler_barrier();
        let idle = bits & state::LIVE == 0 || slot.last_seen_ns() < fresh_after;
        put(unsafe { &mut (*st).state }, if bits & state::WRITING == 0 && idle { bits } else { state::WRITING });
        put(unsafe { &mut (*st).chosen }, 0);
        return Victim { index: k, evicts: false, full: false };
    }
    if unsafe { core::ptr::read_volatile(&(*st).oldest) } == u64::MAX {
        // No unconfirmed live flow either (`index` and `state` are still 0 and WRITING, from
        // `begin`: an insert from them fails).
        put(unsafe { &mut (*st).chosen }, chosen::FULL);
        return Victim { index: 0, evicts: false, full: true };
    }
    put(unsafe { &mut (*st).chosen }, chosen::EVICTS);
    Victim { index: unsafe { core::ptr::read_volatile(&(*st).index) }, evicts: true, full: false }
}

/// The least recently seen live flow's slot of two buckets, confirmed or not, `candidate *
/// WAYS + way` (0 if none is live). For userspace copies of a table, where a flow that finds
/// both buckets confirmed and full must still displace one ([`victim`] gives none then).
pub fn least_recent<S: Slot>(buckets: [&Bucket<S>; 2]) -> u32 {
    let mut best = (u64::MAX, 0);
    for k in 0..2 * WAYS {
        let slot = &buckets[k / WAYS].slots[k % WAYS];
        if slot_state(slot) & state::LIVE != 0 && slot.last_seen_ns() < best.0 {
            best = (slot.last_seen_ns(), k as u32);
        }
    }
    best.1
}

/// The `fresh_after` of [`victim`] for an insert at `now_ns`: flows last seen before it are
/// idle (0 for no idle timeout: every flow is live).
#[inline(always)]
pub fn fresh_after(now_ns: u64, idle_timeout_ns: u64) -> u64 {
    if idle_timeout_ns == 0 {
        0
    } else {
        now_ns.saturating_sub(idle_timeout_ns)
    }
}

#[cfg(feature = "user")]
crate::pod!(Slot4, Slot6, PackedEntry, Bucket4, Bucket6);

// Layout guards, see `maps`.
const _: () = assert!(core::mem::size_of::<Slot4>() == 40);
const _: () = assert!(core::mem::size_of::<PackedEntry>() == 20);
const _: () = assert!(core::mem::size_of::<Slot6>() == 64);
const _: () = assert!(core::mem::size_of::<Bucket4>() == 40 * WAYS);
const _: () = assert!(core::mem::size_of::<Bucket6>() == 64 * WAYS);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::maps::FlowTuple;
    use std::vec;

    fn key4(i: u32) -> CtKey4 {
        CtKey4 { src: i, dst: 0x6400_12c6, ports: 0x5000_409c, service_proto: 1 | 6 << 24 }
    }

    /// The telling words are the client port and the low source address word (a layout change
    /// that moved them would make `key_is` test other words first: slower, not wrong), and a
    /// key differing in any single word, telling or not, is another key.
    #[test]
    fn key_is_tells_words_first_and_compares_every_word() {
        let t = FlowTuple {
            src: [0x0db8_0120, 0, 0, 0x0500_0000],
            dst: [0x0db8_0120, 0, 0, 0x0001_0000],
            sport: 0x409c,
            dport: 0x5000,
            proto: 6,
            _pad: [0; 3],
        };
        let six = CtKey6::new(&t, 3);
        let other_port = CtKey6 { ports: six.ports ^ 0x100, ..six };
        let other_src = CtKey6 { src: [t.src[0], 0, 0, 0x0600_0000], ..six };
        let [a, b] = <Slot6 as Slot>::TELLING_WORDS;
        assert_ne!(Slot6::key_word(&six, a), Slot6::key_word(&other_port, a));
        assert_ne!(Slot6::key_word(&six, b), Slot6::key_word(&other_src, b));
        let four = CtKey4::new(&FlowTuple { src: [0x0501_12c6, 0, 0, 0], dst: [0x6400_12c6, 0, 0, 0], ..t }, 3);
        let [a, b] = <Slot4 as Slot>::TELLING_WORDS;
        assert_eq!(Slot4::key_word(&four, a), four.ports);
        assert_eq!(Slot4::key_word(&four, b), four.src);

        assert_every_word_counts(&Slot6 { state: state::LIVE, key: six, entry: PackedEntry::default() });
        assert_every_word_counts(&Slot4 { state: state::LIVE, key: four, entry: PackedEntry::default() });
    }

    /// `slot` holds its own key, and a key differing from it in any one word is another key.
    fn assert_every_word_counts<S: Slot>(slot: &S) {
        let key = *slot.key();
        assert!(slot.key_is(&key));
        for i in 0..S::KEY_WORDS {
            let mut changed = key;
            // SAFETY: a key is KEY_WORDS 32-bit words without padding (`Slot::Key`).
            unsafe { *(&mut changed as *mut S::Key as *mut u32).add(i) ^= 1 };
            assert!(!slot.key_is(&changed), "word {i}");
        }
    }

    /// A slot of either table holds every field of an entry whose time is on the data-plane
    /// clock's grain and whose pool generation is below 2^16 (the controller's), whatever the
    /// values; a time off the grain reads back rounded down; a refresh sets only the time.
    #[test]
    fn a_slot_holds_an_entry_exactly() {
        fn holds<S: Slot + Default>(key: &S::Key) {
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for _ in 0..10_000 {
                let e = CtEntry {
                    backend: next() as u32,
                    pool_gen: next() as u32 & 0xffff,
                    last_seen_ns: seen_grain(next() >> 1),
                    class: next() as u16,
                    backend_gen: next() as u16,
                    hash: next() as u32,
                };
                let mut slot = S::default();
                slot.set(key, &e);
                assert_eq!(slot.entry(), e);
                assert_eq!(slot.last_seen_ns(), e.last_seen_ns);
                let t = seen_grain(next() >> 1);
                slot.touch(t);
                assert_eq!(slot.entry(), CtEntry { last_seen_ns: t, ..e });
            }
            let mut slot = S::default();
            slot.set(key, &CtEntry { last_seen_ns: (5 << SEEN_GRAIN_SHIFT) + 12345, ..CtEntry::default() });
            assert_eq!(slot.last_seen_ns(), 5 << SEEN_GRAIN_SHIFT);
        }
        holds::<Slot4>(&key4(1));
        holds::<Slot6>(&CtKey6::default());
        assert_eq!(seen_grain(u64::MAX >> 1) >> SEEN_GRAIN_SHIFT, (1 << 47) - 1, "48 bits cover every time");
    }

    #[test]
    fn sizing_leaves_half_free_and_is_a_power_of_two() {
        assert_eq!(buckets_for(1), 1);
        assert_eq!(buckets_for(4), 1);
        assert_eq!(buckets_for(5), 2);
        // 2^20 flows: 2^21 slots, 2^18 buckets (as with the former 4/3 rule).
        assert_eq!(buckets_for(1 << 20), 1 << 18);
        assert_eq!(buckets_for((1 << 20) + 1), 1 << 19);
        // The largest configurable size (lb-user MAX_CONNTRACK_ENTRIES) takes no more than before.
        assert_eq!(buckets_for(1 << 24), 1 << 22);
        for n in [1, 100, 65536, 1_000_000, u32::MAX] {
            let b = buckets_for(n) as u64;
            assert!(b.is_power_of_two());
            assert!(b * WAYS as u64 >= n as u64 * 2 || b == 1 << 31, "{n}");
        }
    }

    #[test]
    fn buckets_spread_and_depend_on_the_seed() {
        let mask = (1 << 10) - 1;
        let mut hits = [0u32; 1 << 10];
        for i in 0..(1 << 16) {
            let [a, b] = buckets::<Slot4>(&key4(i), 7, mask);
            hits[a as usize] += 1;
            hits[b as usize] += 1;
        }
        // 128 per bucket on average; a fair hash stays well within these bounds.
        assert!(hits.iter().all(|&h| (64..=200).contains(&h)), "{:?}", (hits.iter().min(), hits.iter().max()));
        let moved =
            (0..1000).filter(|&i| buckets::<Slot4>(&key4(i), 7, mask) != buckets::<Slot4>(&key4(i), 8, mask)).count();
        assert!(moved > 990, "{moved}");
        // Every word of an IPv6 key counts.
        let t = FlowTuple { src: [1, 2, 3, 4], dst: [5, 6, 7, 8], sport: 9, dport: 10, proto: 6, _pad: [0; 3] };
        let k = CtKey6::new(&t, 11);
        let base = buckets::<Slot6>(&k, 7, u32::MAX);
        let k2 = CtKey6::new(&t, 12);
        assert_ne!(buckets::<Slot6>(&k2, 7, u32::MAX), base);
        let mut k3 = k;
        k3.dst[3] = 9;
        assert_ne!(buckets::<Slot6>(&k3, 7, u32::MAX), base);
    }

    /// A test's time `t`, in grains of the tables' clock (what a slot keeps).
    fn g(t: u64) -> u64 {
        t << SEEN_GRAIN_SHIFT
    }

    /// A live flow last seen at `seen` grains.
    fn live(key: CtKey4, seen: u64) -> Slot4 {
        let mut slot = Slot4 { state: state::LIVE, ..Default::default() };
        slot.set(&key, &CtEntry { last_seen_ns: g(seen), backend: 1, ..Default::default() });
        slot
    }

    #[test]
    fn find_and_victim_follow_the_slot_states() {
        let mut b0 = Bucket4::default();
        let mut b1 = Bucket4::default();
        let mut st = Search::default();
        let st: *mut Search = &mut st;
        let find = |b0: &Bucket4, b1: &Bucket4, k: u32| {
            super::find([b0, b1], &key4(k), st).map(|s| (unsafe { (*st).index }, s))
        };
        let victim = |b0: &Bucket4, b1: &Bucket4, k: u32| victim([b0, b1], &key4(k), 0, st).index;
        // The second bucket holds two flows, so the first stays the less loaded one below.
        b1.slots[0] = live(key4(30), 60);
        b1.slots[1] = live(key4(31), 60);
        assert_eq!(find(&b0, &b1, 1), None);
        // No flow in the first bucket: its first slot.
        assert_eq!(victim(&b0, &b1, 1), 0);
        b0.slots[0] = live(key4(1), 50);
        assert_eq!(find(&b0, &b1, 1), Some((0, state::LIVE)));
        // Its own slot, else the next free one.
        assert_eq!(victim(&b0, &b1, 1), 0);
        assert_eq!(victim(&b0, &b1, 2), 1);
        // A removed flow (not LIVE) is not found, and its slot is reused.
        b0.slots[0].state = next_state(state::LIVE, false);
        assert_eq!(find(&b0, &b1, 1), None);
        assert_eq!(victim(&b0, &b1, 2), 0);
        // A slot being written (not yet live) is not taken as free.
        b0.slots[0].state |= state::WRITING;
        assert_eq!(victim(&b0, &b1, 2), 1);
        assert_eq!(unsafe { (*st).state }, 0, "the chosen slot's state as seen");
        // Both buckets full: the least recently seen flow of the 16 goes.
        for w in 0..WAYS {
            b0.slots[w] = live(key4(10 + w as u32), 100 + w as u64);
            b1.slots[w] = live(key4(20 + w as u32), 200 + w as u64);
        }
        b1.slots[5].touch(g(3));
        assert_eq!(victim(&b0, &b1, 99), 13);
        assert!(super::victim([&b0, &b1], &key4(99), 0, st).evicts);
        assert!(!super::victim([&b0, &b1], &key4(25), 0, st).evicts, "its own slot");
        assert_eq!(unsafe { (*st).state }, state::LIVE);
        assert_eq!(find(&b0, &b1, 25), Some((13, state::LIVE)));
    }

    /// The data plane's lookup chooses a missing key's slot with `choose` after `find` (one
    /// search for both, issue 35): the same choice, record included, as `victim`'s single
    /// pass, over buckets of every mix of free, idle, live, confirmed and written slots.
    #[test]
    fn a_lookup_that_misses_chooses_as_victim_does() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let fresh_after = g(1_000);
        let (mut evicts, mut full, mut free) = (0, 0, 0);
        for _ in 0..20_000 {
            // A mix of every kind of slot; or no free one (so some evict); or only confirmed
            // live flows and writers (so some find none).
            let kinds: &[u32] = match next() % 3 {
                0 => &[0, state::LIVE, state::LIVE | state::CONFIRMED, state::WRITING | state::LIVE],
                1 => &[state::LIVE, state::LIVE | state::CONFIRMED, state::WRITING],
                _ => &[state::LIVE | state::CONFIRMED, state::WRITING | state::LIVE],
            };
            let mut pair = [Bucket4::default(), Bucket4::default()];
            for b in &mut pair {
                for (w, slot) in b.slots.iter_mut().enumerate() {
                    let r = next();
                    let bits = kinds[(r % kinds.len() as u64) as usize] | (r as u32 & 0xf0);
                    // Idle (seen before `fresh_after`) only in the mix.
                    let seen = if kinds.len() == 4 { 900 } else { 1_000 } + (r >> 8) % 200;
                    *slot = Slot4 { state: bits, ..live(key4(100 + w as u32), seen) };
                }
            }
            let key = key4(1);
            let (mut a, mut b) = (Search::default(), Search::default());
            let victim = super::victim([&pair[0], &pair[1]], &key, fresh_after, &mut a);
            assert_eq!(super::find([&pair[0], &pair[1]], &key, &mut b), None);
            assert_eq!(choose([&pair[0], &pair[1]], fresh_after, &mut b), victim);
            assert_eq!(a, b);
            evicts += victim.evicts as u32;
            full += victim.full as u32;
            free += (!victim.evicts && !victim.full) as u32;
        }
        assert!(evicts > 100 && full > 100 && free > 100, "{evicts} {full} {free}");
    }

    #[test]
    fn a_new_flow_goes_to_its_first_bucket_while_it_has_room_else_to_the_less_loaded() {
        let (mut b0, mut b1) = (Bucket4::default(), Bucket4::default());
        let mut st = Search::default();
        let st: *mut Search = &mut st;
        for w in 0..3 {
            b0.slots[w] = live(key4(10 + w as u32), 100);
        }
        b1.slots[0] = live(key4(20), 100);
        // 5 free slots in the first bucket (FIRST_WHILE_FREE), 7 in the second: the first.
        assert_eq!(victim([&b0, &b1], &key4(99), 0, st).index, 3);
        // 4 free in the first, 7 in the second: the second's first free slot.
        b0.slots[3] = live(key4(13), 100);
        let v = victim([&b0, &b1], &key4(99), 0, st);
        assert_eq!((v, unsafe { (*st).state }), (Victim { index: 9, evicts: false, full: false }, 0));
        // A tie: the first bucket.
        for w in 1..4 {
            b1.slots[w] = live(key4(20 + w as u32), 100);
        }
        assert_eq!(victim([&b0, &b1], &key4(99), 0, st).index, 4);
        // A slot being written is not free.
        b0.slots[4].state = state::WRITING;
        assert_eq!(victim([&b0, &b1], &key4(99), 0, st).index, 12);
    }

    /// Fills a table of `buckets` buckets with `flows` distinct flows through `victim`; returns
    /// the number of flows evicted and the number of full buckets.
    fn fill(flows: u32, buckets: u32) -> (usize, usize) {
        let (evicted, full, _) = fill_counting_second(flows, buckets);
        (evicted, full)
    }

    /// `fill`, and the number of flows placed in their second bucket.
    fn fill_counting_second(flows: u32, buckets: u32) -> (usize, usize, usize) {
        let mut table = vec![Bucket4::default(); buckets as usize];
        let mut st = Search::default();
        let (mut evicted, mut second) = (0, 0);
        for i in 0..flows {
            let key = CtKey4 { src: i.wrapping_mul(0x9e37_79b9), ..key4(0) };
            let [a, b] = super::buckets::<Slot4>(&key, 0x5eed, buckets - 1);
            let (ba, bb) = (table[a as usize], table[b as usize]);
            let v = victim([&ba, &bb], &key, 0, &mut st);
            evicted += v.evicts as usize;
            second += (v.index as usize >= WAYS) as usize;
            let (which, way) =
                if (v.index as usize) < WAYS { (a, v.index as usize) } else { (b, v.index as usize - WAYS) };
            table[which as usize].slots[way] = live(key, i as u64);
        }
        let full = table.iter().filter(|b| b.slots.iter().all(|s| s.state & state::LIVE != 0)).count();
        (evicted, full, second)
    }

    /// `FIRST_WHILE_FREE`: a flow found in its second bucket costs a line of another page, so
    /// most flows sit in their first: at the configured size 15 % in the second (31 % with
    /// plain two choices), at half of it 4 %.
    #[test]
    fn most_flows_sit_in_their_first_bucket() {
        let share = |flows: u32, buckets: u32| fill_counting_second(flows, buckets).2 as f64 / flows as f64;
        let at_capacity = share(1 << 18, buckets_for(1 << 18));
        assert!(at_capacity < 0.17, "{at_capacity}");
        let at_half = share(1 << 17, buckets_for(1 << 18));
        assert!(at_half < 0.05, "{at_half}");
    }

    #[test]
    fn the_configured_number_of_flows_fits_without_eviction() {
        // A power-of-two capacity fills half the slots.
        assert_eq!(fill(1 << 18, buckets_for(1 << 18)).0, 0);
        // At 3/4 of the slots (what the former 4/3 rule allowed) a few flows meet two full
        // buckets (12 of 393,216 here, 3e-5; 6 without the first bucket's threshold,
        // `FIRST_WHILE_FREE`; first fit lost 0.69 % at 71.5 %, issue 17).
        assert!(fill(6 << 16, 1 << 16).0 <= 16);
    }

    /// Issue 17.1 at the worst case: the configured sizes that fill a table the most are the
    /// powers of two (half the slots; every other size fills less, a size just above a power
    /// of two a quarter). Filled with the default 2^20 flows, the table has not one full
    /// bucket, so no flow met two.
    #[test]
    fn no_flow_is_evicted_at_the_worst_case_configured_size() {
        for configured in (1..=1 << 12).chain([(1 << 20) - 1, 1 << 20, (1 << 20) + 1, 1 << 24]) {
            assert!(buckets_for(configured) as u64 * WAYS as u64 >= 2 * configured as u64, "{configured}");
        }
        assert_eq!(fill(1 << 20, buckets_for(1 << 20)), (0, 0));
    }

    #[test]
    fn an_idle_flow_leaves_its_slot_to_a_new_one() {
        let (mut b0, mut b1) = (Bucket4::default(), Bucket4::default());
        let mut st = Search::default();
        let st: *mut Search = &mut st;
        // Both buckets full; the first holds three idle flows (seen before 100), the second two.
        for w in 0..WAYS {
            b0.slots[w] = live(key4(10 + w as u32), if w >= 5 { 50 + w as u64 } else { 200 });
            b1.slots[w] = live(key4(20 + w as u32), if w == 1 || w == 4 { 10 } else { 300 });
        }
        // Without an idle time, the least recently seen of the 16 goes.
        assert_eq!(victim([&b0, &b1], &key4(99), 0, st), Victim { index: 9, evicts: true, full: false });
        assert_eq!(unsafe { ((*st).index, (*st).chosen) }, (9, chosen::EVICTS), "recorded for a later write");
        // Idle before 100: the first idle slot of the bucket with more of them, no eviction.
        assert_eq!(victim([&b0, &b1], &key4(99), g(100), st), Victim { index: 5, evicts: false, full: false });
        assert_eq!(unsafe { (*st).state }, state::LIVE, "taken from the state it was seen in");
        assert_eq!(unsafe { ((*st).index, (*st).chosen) }, (5, 0));
        // An empty slot and an idle one count alike.
        b1.slots[6].state = next_state(state::LIVE, false);
        b1.slots[7].state = next_state(state::LIVE, false);
        assert_eq!(victim([&b0, &b1], &key4(99), g(100), st), Victim { index: 9, evicts: false, full: false });
        // A flow's own slot still wins, idle or not.
        assert_eq!(victim([&b0, &b1], &key4(20), g(400), st), Victim { index: 8, evicts: false, full: false });
        assert_eq!(unsafe { ((*st).index, (*st).state, (*st).chosen) }, (8, state::LIVE, chosen::OWN));
    }

    /// Issue 17.1 in a busy table: closed flows stay until evicted, so the table is full of
    /// idle flows and live ones are half of the slots (the configured number). One live flow
    /// ends and a new one arrives per step; no live flow may be evicted. Counting idle flows
    /// as load (`fresh_after` 0, the rule before) evicted live flows here (18 of 524,288 new
    /// flows; 4e-5 at 2^18 live flows).
    #[test]
    fn a_table_full_of_idle_flows_evicts_no_live_one() {
        // Live flows are seen after LIVE; a flow that ends keeps its last time, before it.
        const LIVE: u64 = 1 << 40;
        let steady = |fresh_after: u64| {
            let buckets = 1u32 << 14;
            let live_flows = 2 * buckets as usize * WAYS / 4;
            let mut table = vec![Bucket4::default(); buckets as usize];
            let mut st = Search::default();
            // The live flows' slots (`bucket * WAYS + way`) and each slot's place in that list.
            let mut live_slots: vec::Vec<u32> = vec::Vec::new();
            let mut place = vec![u32::MAX; buckets as usize * WAYS];
            let mut rng = 0x1234_5678u64;
            let mut evicted = 0;
            let forget = |live_slots: &mut vec::Vec<u32>, place: &mut vec::Vec<u32>, i: usize| {
                let s = live_slots.swap_remove(i);
                if i < live_slots.len() {
                    place[live_slots[i] as usize] = i as u32;
                }
                place[s as usize] = u32::MAX;
                s
            };
            for t in 0..live_flows as u64 * 8 {
                if live_slots.len() == live_flows {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    let s = forget(&mut live_slots, &mut place, (rng % live_flows as u64) as usize);
                    table[s as usize / WAYS].slots[s as usize % WAYS].touch(g(t));
                }
                let key = CtKey4 { src: (t as u32).wrapping_mul(0x9e37_79b9), dst: t as u32, ..key4(0) };
                let [a, b] = super::buckets::<Slot4>(&key, 0x5eed, buckets - 1);
                let v = victim([&table[a as usize], &table[b as usize]], &key, fresh_after, &mut st);
                let (which, way) =
                    if (v.index as usize) < WAYS { (a, v.index as usize) } else { (b, v.index as usize - WAYS) };
                let s = which * WAYS as u32 + way as u32;
                let i = place[s as usize];
                if i != u32::MAX {
                    evicted += 1;
                    forget(&mut live_slots, &mut place, i as usize);
                }
                table[which as usize].slots[way] = live(key, LIVE + t);
                place[s as usize] = live_slots.len() as u32;
                live_slots.push(s);
            }
            evicted
        };
        assert_eq!(steady(g(LIVE)), 0);
        assert!(steady(0) > 0, "the rule before evicted live flows here");
    }

    fn confirmed(key: CtKey4, last_seen_ns: u64) -> Slot4 {
        Slot4 { state: state::LIVE | state::CONFIRMED, ..live(key, last_seen_ns) }
    }

    /// Issue 35: a new flow takes a free or idle slot, else the least recently seen
    /// unconfirmed live flow's, never a confirmed live flow's; with 16 confirmed live flows
    /// there is no slot. A confirmed idle flow's slot is free like any idle one.
    #[test]
    fn a_confirmed_live_flow_never_gives_way() {
        let (mut b0, mut b1) = (Bucket4::default(), Bucket4::default());
        let mut st = Search::default();
        let st: *mut Search = &mut st;
        for w in 0..WAYS {
            b0.slots[w] = confirmed(key4(10 + w as u32), 100 + w as u64);
            b1.slots[w] = confirmed(key4(20 + w as u32), 200 + w as u64);
        }
        // Seen longest ago, but confirmed: it stays; an unconfirmed flow seen later goes.
        b1.slots[3] = live(key4(23), 250);
        b1.slots[6] = live(key4(26), 240);
        assert_eq!(victim([&b0, &b1], &key4(99), g(50), st), Victim { index: 14, evicts: true, full: false });
        assert_eq!(unsafe { ((*st).chosen, (*st).oldest, (*st).state) }, (chosen::EVICTS, g(240), state::LIVE));
        // Only confirmed live flows: none.
        b1.slots[3] = confirmed(key4(23), 250);
        b1.slots[6] = confirmed(key4(26), 240);
        assert_eq!(victim([&b0, &b1], &key4(99), g(50), st), Victim { index: 0, evicts: false, full: true });
        assert_eq!(unsafe { ((*st).chosen, (*st).state) }, (chosen::FULL, state::WRITING), "an insert fails");
        // The key's own slot is still its own.
        assert_eq!(victim([&b0, &b1], &key4(12), g(50), st), Victim { index: 2, evicts: false, full: false });
        // A confirmed flow idle before 101 (seen at 100) frees its slot.
        assert_eq!(victim([&b0, &b1], &key4(99), g(101), st), Victim { index: 0, evicts: false, full: false });
        // Userspace copies still find the least recently seen of all.
        assert_eq!(least_recent([&b0, &b1]), 0);
    }

    /// Issue 35's requirement in a table: flows that sent two packets (confirmed) fill half
    /// the slots, then a flood of single packets with random tuples, 20 times the table's
    /// slots, is inserted. Not one confirmed flow is evicted; the flood's flows evict each
    /// other or go without an entry.
    #[test]
    fn a_single_packet_flood_evicts_no_confirmed_flow() {
        let buckets = 1u32 << 8;
        let slots = buckets as usize * WAYS;
        let mut table = vec![Bucket4::default(); buckets as usize];
        let mut st = Search::default();
        let insert = |table: &mut vec::Vec<Bucket4>, st: &mut Search, key: CtKey4, seen: u64, confirm: bool| {
            let [a, b] = super::buckets::<Slot4>(&key, 0x5eed, buckets - 1);
            let v = victim([&table[a as usize], &table[b as usize]], &key, g(1), st);
            if v.full {
                return None;
            }
            let (which, way) =
                if (v.index as usize) < WAYS { (a, v.index as usize) } else { (b, v.index as usize - WAYS) };
            let slot = &mut table[which as usize].slots[way];
            let evicted = (slot.state & state::CONFIRMED != 0 && slot.key != key).then_some(1);
            *slot = if confirm { confirmed(key, seen) } else { live(key, seen) };
            evicted
        };
        let legit = |i: u32| CtKey4 { src: 0x0a00_0000 | i, ..key4(0) };
        for i in 0..slots as u32 / 2 {
            assert_eq!(insert(&mut table, &mut st, legit(i), 10, true), None);
        }
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let (mut full, mut evicted) = (0, 0);
        for t in 0..20 * slots as u64 {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let key = CtKey4 { src: rng as u32, ports: (rng >> 32) as u32, ..key4(0) };
            let [a, b] = super::buckets::<Slot4>(&key, 0x5eed, buckets - 1);
            let pair = [&table[a as usize], &table[b as usize]];
            if victim(pair, &key, g(1), &mut st).full {
                full += 1;
            }
            evicted += insert(&mut table, &mut st, key, 20 + t, false).unwrap_or(0);
        }
        assert_eq!(evicted, 0, "confirmed flows evicted by the flood");
        for i in 0..slots as u32 / 2 {
            let [a, b] = super::buckets::<Slot4>(&legit(i), 0x5eed, buckets - 1);
            assert!(find([&table[a as usize], &table[b as usize]], &legit(i), &mut st).is_some(), "flow {i}");
        }
        // Half the slots confirmed leaves room for the flood in nearly every pair of buckets.
        assert!(full < 20 * slots / 100, "{full}");
    }

    #[test]
    fn writes_bump_the_version_and_clear_the_writer_bit() {
        let s = next_state(0, true);
        assert_eq!(s, state::VERSION | state::LIVE);
        let taken = s | state::WRITING;
        let s2 = next_state(taken, true);
        assert_eq!(s2 & state::WRITING, 0);
        assert_ne!(s2, s);
        assert_eq!(next_state(s2, false) & state::LIVE, 0);
        // A write makes a new, unconfirmed entry.
        assert_eq!(next_state(s2 | state::CONFIRMED, true) & state::CONFIRMED, 0);
    }
}
