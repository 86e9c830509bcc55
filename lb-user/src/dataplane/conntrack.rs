//! The connection tables (`CONNTRACK`, `CONNTRACK4`: set-associative, two candidate buckets per
//! flow), read and, for tests and tools, written the way the data plane does; and their seed.

use std::path::Path;

use anyhow::{bail, Context, Result};
use aya::maps::{Array, MapData};
use lb_common::ct_table::{self, Slot as _};
use lb_common::maps::{Backend, CtEntry, CtKey, CtKey4, CtKey6, FAMILY_V4, FAMILY_V6};

use super::Dataplane;

impl Dataplane {
    /// The connection-table entry of a flow of `family` (`FAMILY_V4` or `FAMILY_V6`; IPv4 flows
    /// live in `CONNTRACK4`, keyed by the packed form of `key`). For tests and inspection: the
    /// bucket is copied with one syscall and not re-checked against the slot's state word, so
    /// a packet writing the same slot at that instant can make the copy inconsistent.
    pub fn conntrack_get(&self, family: u8, key: &CtKey) -> Option<CtEntry> {
        match family {
            FAMILY_V4 => table_get(&self.conntrack4, &CtKey4::new(&key.tuple, key.service), self.ct_seed),
            _ => table_get(&self.conntrack, &CtKey6::new(&key.tuple, key.service), self.ct_seed),
        }
    }

    /// Writes a flow's entry as the data plane would (its own slot, else a free one, else the
    /// least recently seen). Only for tests and tools on a table no packet is being balanced
    /// with: a bucket is read and written back whole, so a write by the data plane to the same
    /// bucket in between would be undone, and a slot written back in its writer's state would
    /// stay unusable. (It refuses a bucket it finds mid-write.)
    #[cfg(feature = "test-helpers")]
    pub fn conntrack_set(&mut self, family: u8, key: &CtKey, entry: CtEntry) -> Result<()> {
        match family {
            FAMILY_V4 => table_set(&mut self.conntrack4, &CtKey4::new(&key.tuple, key.service), &entry, self.ct_seed)
                .context("writing CONNTRACK4"),
            FAMILY_V6 => table_set(&mut self.conntrack, &CtKey6::new(&key.tuple, key.service), &entry, self.ct_seed)
                .context("writing CONNTRACK"),
            _ => bail!("conntrack_set: family {family} is neither FAMILY_V4 nor FAMILY_V6"),
        }
    }

    /// The two candidate buckets of a flow of `family` (`FAMILY_V4` or `FAMILY_V6`), for tests
    /// that place flows in known buckets.
    #[cfg(feature = "test-helpers")]
    pub fn conntrack_buckets_of(&self, family: u8, key: &CtKey) -> [u32; 2] {
        let mask = self.sizes.conntrack_buckets() - 1;
        match family {
            FAMILY_V4 => {
                ct_table::buckets::<ct_table::Slot4>(&CtKey4::new(&key.tuple, key.service), self.ct_seed, mask)
            }
            _ => ct_table::buckets::<ct_table::Slot6>(&CtKey6::new(&key.tuple, key.service), self.ct_seed, mask),
        }
    }

    /// Every connection-table entry of both families: (family, key, entry).
    pub fn conntrack_entries(&self) -> Vec<(u8, CtKey, CtEntry)> {
        let v4 = live_slots(&self.conntrack4).map(|s| (FAMILY_V4, s.key.to_key(), s.entry()));
        let v6 = live_slots(&self.conntrack).map(|s| (FAMILY_V6, s.key.to_key(), s.entry()));
        v4.chain(v6).collect()
    }

    /// Live connection-table slots per family, `(family, live, slots)`: exact when a table has
    /// at most `sample_buckets` buckets, else estimated from that many buckets spread evenly
    /// over the table (one map read each), so the cost is bounded whatever the table's size.
    pub fn conntrack_occupancy(&self, sample_buckets: u32) -> [(u8, u64, u64); 2] {
        let buckets = self.sizes.conntrack_buckets();
        let v4 = sampled_live(&self.conntrack4, buckets, sample_buckets);
        let v6 = sampled_live(&self.conntrack, buckets, sample_buckets);
        let slots = buckets as u64 * ct_table::WAYS as u64;
        [(FAMILY_V4, v4, slots), (FAMILY_V6, v6, slots)]
    }
}

/// The two candidate buckets of `key`, as read now.
fn table_buckets<S: ct_table::Slot>(
    map: &Array<MapData, ct_table::Bucket<S>>,
    key: &S::Key,
    seed: u64,
) -> Result<([u32; 2], [ct_table::Bucket<S>; 2])>
where
    ct_table::Bucket<S>: aya::Pod,
{
    let mask = map.len() - 1;
    let index = ct_table::buckets::<S>(key, seed, mask);
    Ok((index, [map.get(&index[0], 0)?, map.get(&index[1], 0)?]))
}

fn table_get<S: ct_table::Slot>(map: &Array<MapData, ct_table::Bucket<S>>, key: &S::Key, seed: u64) -> Option<CtEntry>
where
    ct_table::Bucket<S>: aya::Pod,
{
    let (_, b) = table_buckets(map, key, seed).ok()?;
    let mut search = ct_table::Search::default();
    let state = ct_table::find([&b[0], &b[1]], key, &mut search)?;
    if state & ct_table::state::WRITING != 0 {
        return None;
    }
    let k = search.index as usize;
    Some(b[k / ct_table::WAYS].slots[k % ct_table::WAYS].entry())
}

pub fn table_set<S: ct_table::Slot>(
    map: &mut Array<MapData, ct_table::Bucket<S>>,
    key: &S::Key,
    entry: &CtEntry,
    seed: u64,
) -> Result<()>
where
    ct_table::Bucket<S>: aya::Pod,
{
    let (index, mut b) = table_buckets(map, key, seed)?;
    let v = ct_table::victim([&b[0], &b[1]], key, 0, &mut ct_table::Search::default());
    // (Only confirmed flows in both buckets: a tool may still displace the least recent.)
    let k = if v.full { ct_table::least_recent([&b[0], &b[1]]) } else { v.index } as usize;
    let own = b[k / ct_table::WAYS].slots[k % ct_table::WAYS].key_is(key);
    let (which, way) = (k / ct_table::WAYS, k % ct_table::WAYS);
    // A slot caught mid-write would be written back in that state, and nothing would ever
    // clear it: refuse (the caller may retry).
    if b[which].slots.iter().any(|s| ct_table::slot_state(s) & ct_table::state::WRITING != 0) {
        bail!("the data plane is writing bucket {} of the connection table", index[which]);
    }
    let slot = &mut b[which].slots[way];
    let state = ct_table::slot_state(slot);
    // A rewrite of the key's own live entry (as tests age entries) keeps its confirmation.
    let confirmed = if own && state & ct_table::state::LIVE != 0 { state & ct_table::state::CONFIRMED } else { 0 };
    slot.set(key, entry);
    // Written whole, with the state word: not WRITING, next version, live.
    let next = ct_table::next_state(state & !ct_table::state::WRITING, true);
    // SAFETY: `state_mut` points into `slot`, which this function holds mutably.
    unsafe { core::ptr::write(slot.state_mut(), next) };
    // SAFETY: as above; our own copy of the bucket, written back whole below.
    unsafe { *slot.state_mut() |= confirmed };
    map.set(index[which], b[which], 0)?;
    Ok(())
}

/// The live slots of a connection table.
fn live_slots<S: ct_table::Slot>(map: &Array<MapData, ct_table::Bucket<S>>) -> impl Iterator<Item = S> + '_
where
    ct_table::Bucket<S>: aya::Pod,
{
    map.iter().filter_map(|b| b.ok()).flat_map(|b| b.slots).filter(is_live)
}

/// A slot that holds a published entry (live, not being written).
fn is_live<S: ct_table::Slot>(s: &S) -> bool {
    ct_table::slot_state(s) & (ct_table::state::LIVE | ct_table::state::WRITING) == ct_table::state::LIVE
}

/// Live slots of a connection table of `buckets` buckets, counted in at most `sample` buckets
/// spread evenly over it and scaled to the whole table (exact when `sample >= buckets`).
fn sampled_live<S: ct_table::Slot>(map: &Array<MapData, ct_table::Bucket<S>>, buckets: u32, sample: u32) -> u64
where
    ct_table::Bucket<S>: aya::Pod,
{
    let sample = sample.clamp(1, buckets.max(1));
    let stride = (buckets / sample).max(1);
    let (mut read, mut live) = (0u64, 0u64);
    for i in (0..buckets).step_by(stride as usize).take(sample as usize) {
        if let Ok(b) = map.get(&i, 0) {
            read += 1;
            live += b.slots.iter().filter(|s| is_live(*s)).count() as u64;
        }
    }
    if read == 0 {
        return 0;
    }
    live * buckets as u64 / read
}

/// The connection tables' seed: the one stored with pinned tables that are being reused (also
/// how a tool that writes pinned tables finds it), else
/// a new random one (from the standard library's per-process random hasher keys).
pub fn ct_seed(pin_dir: Option<&Path>) -> Result<u64> {
    if let Some(path) = pin_dir.map(|d| d.join("CT_SEED_STORE")).filter(|p| p.exists()) {
        let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
        let store: Array<MapData, u64> = Array::try_from(aya::maps::Map::Array(data))?;
        let seed = store.get(&0, 0).with_context(|| format!("reading {}", path.display()))?;
        if seed != 0 {
            return Ok(seed);
        }
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    Ok(h.finish() | 1)
}

/// What a start takes over from pinned maps of other sizes, which it cannot adopt: the
/// connection tables, and the backend records their entries point at (ids
/// and generations are the previous daemon's, restored from its state file). Opened from the
/// pins before they are removed; the maps live as long as these descriptors (and the
/// previous program, until it is replaced).
pub struct Carried {
    conntrack4: CarriedTable<ct_table::Slot4, Slot48>,
    conntrack: CarriedTable<ct_table::Slot6, Slot72>,
    backends: Array<MapData, Backend>,
}

/// A pinned connection table: this version's layout, or the one before (`P` slots).
enum CarriedTable<S, P>
where
    ct_table::Bucket<S>: aya::Pod,
    PreviousBucket<P>: aya::Pod,
{
    Current(Array<MapData, ct_table::Bucket<S>>),
    Previous(Array<MapData, PreviousBucket<P>>),
}

/// A slot of a previous version's layout, read for its flow at an upgrade.
pub trait PreviousSlot: Copy + Default {
    /// This version's key.
    type Key;
    fn state(&self) -> u32;
    /// The flow in this version's key.
    fn flow(&self) -> (Self::Key, CtEntry);
}

/// An IPv4 slot as versions before the packed entry (`ct_table::PackedEntry`) laid it out
/// (48 bytes, the entry unpacked).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot48 {
    pub state: u32,
    pub key: CtKey4,
    pub _pad: u32,
    pub entry: CtEntry,
}

/// An IPv6 slot as versions before the one-line slot (`ct_table::Slot6`) laid it out
/// (72 bytes: the key in [`CtKey`] form, the protocol and the service id in words of their
/// own; the entry unpacked).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Slot72 {
    pub state: u32,
    pub key: CtKey,
    pub entry: CtEntry,
}

impl PreviousSlot for Slot48 {
    type Key = CtKey4;
    fn state(&self) -> u32 {
        self.state
    }
    fn flow(&self) -> (CtKey4, CtEntry) {
        (self.key, self.entry)
    }
}

impl PreviousSlot for Slot72 {
    type Key = CtKey6;
    fn state(&self) -> u32 {
        self.state
    }
    fn flow(&self) -> (CtKey6, CtEntry) {
        (CtKey6::new(&self.key.tuple, self.key.service), self.entry)
    }
}

/// A bucket of a previous version's slots.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PreviousBucket<P> {
    pub slots: [P; ct_table::WAYS],
}

// SAFETY: repr(C) records of u32/u64 fields and arrays of them, without implicit padding.
unsafe impl aya::Pod for PreviousBucket<Slot48> {}
// SAFETY: as above.
unsafe impl aya::Pod for PreviousBucket<Slot72> {}
const _: () = assert!(std::mem::size_of::<PreviousBucket<Slot48>>() == 48 * ct_table::WAYS);
const _: () = assert!(std::mem::size_of::<PreviousBucket<Slot72>>() == 72 * ct_table::WAYS);

impl<S: ct_table::Slot, P: PreviousSlot<Key = S::Key>> CarriedTable<S, P>
where
    ct_table::Bucket<S>: aya::Pod,
    PreviousBucket<P>: aya::Pod,
{
    /// The pinned table at `path` in either layout; None if it is missing or of neither.
    fn open(path: &Path) -> Option<Self> {
        let open = || MapData::from_pin(path).ok().map(aya::maps::Map::Array);
        match Array::try_from(open()?) {
            Ok(table) => Some(Self::Current(table)),
            Err(_) => Array::try_from(open()?).ok().map(Self::Previous),
        }
    }

    /// The table's live flows as (key, entry, CONFIRMED bit of the state).
    fn flows(&self) -> Box<dyn Iterator<Item = (S::Key, CtEntry, u32)> + '_> {
        let confirmed = |state: u32| state & ct_table::state::CONFIRMED;
        match self {
            Self::Current(from) => {
                Box::new(live_slots(from).map(move |s| (*s.key(), s.entry(), confirmed(ct_table::slot_state(&s)))))
            }
            Self::Previous(from) => {
                let live = ct_table::state::LIVE | ct_table::state::WRITING;
                let slots = from.iter().filter_map(|b| b.ok()).flat_map(|b| b.slots);
                Box::new(slots.filter(move |s| s.state() & live == ct_table::state::LIVE).map(move |s| {
                    let (key, entry) = s.flow();
                    (key, entry, confirmed(s.state()))
                }))
            }
        }
    }
}

impl Carried {
    /// The connection tables (this version's layout or the one before) and backend records
    /// pinned in `pin_dir`; None if one is missing or has another layout (then there is
    /// nothing to carry).
    pub fn open(pin_dir: &Path) -> Option<Self> {
        Some(Self {
            conntrack4: CarriedTable::open(&pin_dir.join("CONNTRACK4"))?,
            conntrack: CarriedTable::open(&pin_dir.join("CONNTRACK"))?,
            backends: Array::try_from(aya::maps::Map::Array(MapData::from_pin(pin_dir.join("BACKENDS")).ok()?)).ok()?,
        })
    }
}

impl std::fmt::Debug for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Carried").field("backends", &self.backends.len()).finish()
    }
}

impl Dataplane {
    /// Copies the backend records of `old` (those this data plane has room for) into
    /// `BACKENDS`, before the first reconcile: it rewrites the configured ones, and those the
    /// configuration dropped then drain ([`Dataplane::depart_unused_backends`]), as on adoption.
    pub fn carry_backends(&mut self, old: &Carried) -> Result<()> {
        for id in 0..old.backends.len().min(self.sizes.max_backends) {
            let b = old.backends.get(&id, 0)?;
            if b.family != 0 {
                self.backends.set(id, b, 0).context("writing BACKENDS")?;
            }
        }
        Ok(())
    }

    /// Copies every live entry of `old`'s connection tables into this data plane's, each placed
    /// by the new tables' bucket hash (seed and size). Only before this data plane's program is
    /// attached: buckets are written whole. Returns (entries copied, entries that found no room:
    /// both their buckets full).
    pub fn carry_conntrack(&mut self, old: &Carried) -> Result<(usize, usize)> {
        let (a, b) =
            copy_table(old.conntrack4.flows(), &mut self.conntrack4, self.ct_seed).context("copying CONNTRACK4")?;
        let (c, d) =
            copy_table(old.conntrack.flows(), &mut self.conntrack, self.ct_seed).context("copying CONNTRACK")?;
        Ok((a + c, b + d))
    }
}

/// Inserts `flows` (key, entry, CONFIRMED bit) into `to` (empty, not in use), placed by `to`'s hash.
fn copy_table<S: ct_table::Slot + Default>(
    flows: impl Iterator<Item = (S::Key, CtEntry, u32)>,
    to: &mut Array<MapData, ct_table::Bucket<S>>,
    seed: u64,
) -> Result<(usize, usize)>
where
    ct_table::Bucket<S>: aya::Pod,
{
    let mask = to.len() - 1;
    let mut buckets: std::collections::HashMap<u32, ct_table::Bucket<S>> = std::collections::HashMap::new();
    let (mut copied, mut lost) = (0, 0);
    for (key, entry, confirmed) in flows {
        let index = ct_table::buckets::<S>(&key, seed, mask);
        let pair = [*buckets.entry(index[0]).or_default(), *buckets.entry(index[1]).or_default()];
        // Every flow counts as live (`fresh_after` 0): the copy keeps idle ones too.
        let victim = ct_table::victim([&pair[0], &pair[1]], &key, 0, &mut ct_table::Search::default());
        // Both buckets full of confirmed flows: the least recently seen of them gives way.
        let k = if victim.full { ct_table::least_recent([&pair[0], &pair[1]]) } else { victim.index } as usize;
        let (which, way) = (k / ct_table::WAYS, k % ct_table::WAYS);
        let target = &mut buckets.get_mut(&index[which]).expect("inserted above").slots[way];
        if victim.evicts || victim.full {
            // Both buckets full: the least recently seen of them gives way, as in the kernel.
            lost += 1;
        } else {
            copied += 1;
        }
        target.set(&key, &entry);
        // A confirmed flow stays so.
        // SAFETY: a plain store into our own copy of the bucket.
        unsafe { core::ptr::write(target.state_mut(), ct_table::next_state(0, true) | confirmed) };
    }
    for (index, bucket) in buckets {
        to.set(index, bucket, 0)?;
    }
    Ok((copied, lost))
}
