//! The connection tables (`CONNTRACK`, `CONNTRACK4`: set-associative, two candidate buckets per
//! flow), read and, for tests and tools, written the way the data plane does; and their seed.

use std::path::Path;

use anyhow::{bail, Context, Result};
use aya::maps::{Array, MapData};
use lb_common::ct_table::{self, Slot as _};
use lb_common::maps::{CtEntry, CtKey, CtKey4, CtKey6, FAMILY_V4, FAMILY_V6};

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
pub(super) fn live_slots<S: ct_table::Slot>(map: &Array<MapData, ct_table::Bucket<S>>) -> impl Iterator<Item = S> + '_
where
    ct_table::Bucket<S>: aya::Pod,
{
    map.iter().filter_map(|b| b.ok()).flat_map(|b| b.slots).filter(is_live)
}

/// A slot that holds a published entry (live, not being written).
pub(super) fn is_live<S: ct_table::Slot>(s: &S) -> bool {
    ct_table::state::published(ct_table::slot_state(s))
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
