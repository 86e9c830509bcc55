//! An upgrade's carry-over: what a start takes from pinned maps it cannot adopt (other sizes,
//! or a previous version's slot layout), into the new maps before the program is attached.

use std::path::Path;

use anyhow::{Context, Result};
use aya::maps::{Array, MapData};
use lb_common::ct_table;
use lb_common::maps::{Backend, CtEntry, CtKey, CtKey4, CtKey6};

use super::conntrack::live_slots;
use super::Dataplane;

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
                let slots = from.iter().filter_map(|b| b.ok()).flat_map(|b| b.slots);
                Box::new(slots.filter(|s| ct_table::state::published(s.state())).map(move |s| {
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
