//! The writer of the data plane's service table: an open-addressing hash table of service keys
//! in the `SERVICE_TABLE` array, which the XDP program probes inline (`lb_common::hash::find_service`)
//! instead of calling the hash-map lookup helper.
//!
//! The array holds two halves of S slots (S a power of two, at least twice the key capacity, so
//! the load factor stays at or below 1/2). `SERVICE_INDEX[0]` names the active half and the
//! seed it was built with. Every change rebuilds the whole key set into the standby half, then
//! flips the index with one 8-byte write: the kernel sees the old set or the new one, never a
//! mix. The keys are kept here (and can be read back from the active half after a restart).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use aya::maps::{Array, MapData};
use lb_common::hash::service_slot_hash;
use lb_common::maps::{ServiceInfo, ServiceKey, ServiceSlot, ServiceTableRef, SERVICE_PROBES};

use super::sys::{update_batch, ArrayMmap};

/// Slots per half for a data plane of `max_services` services: the power of two at or above
/// twice the key capacity (16 keys per service, as the former hash map held).
pub fn slots_for(max_services: u32) -> u32 {
    max_services.saturating_mul(16).saturating_mul(2).max(2).next_power_of_two()
}

/// A half must not be rewritten within this time of being retired (the flip that made the other
/// half active). A program run that read `SERVICE_INDEX` just before the flip may still probe
/// the retired half; XDP runs one packet per invocation, in softirq/NAPI context without
/// preemption, within microseconds, so 1 ms is a wide margin. (An RCU grace period would be
/// exact, but userspace has no direct way to wait for one.) The wait only costs anything when
/// changes come faster than one per millisecond.
pub const REUSE_GRACE: Duration = Duration::from_millis(1);

/// Seeds tried per rebuild before giving up. At load factor 1/2 with Robin Hood placement the
/// first seed practically always fits (see the tests).
const SEED_ATTEMPTS: u32 = 64;

/// Builds one half of `slots` slots (a power of two) holding `entries`, with the first seed
/// from `first_seed` on under which every key lies within `SERVICE_PROBES` slots of its home
/// slot. Robin Hood placement (a key that is further from home takes the slot of one that is
/// closer) keeps the longest probe short; a lookup is still a plain linear probe that stops at
/// the key or at an empty slot. Returns the seed and the slots (empty ones zeroed).
pub fn build_half<'a>(
    entries: impl Iterator<Item = (&'a ServiceKey, &'a ServiceInfo)> + Clone,
    slots: u32,
    first_seed: u32,
) -> Result<(u32, Vec<ServiceSlot>)> {
    if !slots.is_power_of_two() {
        bail!("service table half of {slots} slots is not a power of two");
    }
    let n = entries.clone().count();
    if n > slots as usize / 2 {
        bail!("{n} service keys exceed the service table capacity {}", slots / 2);
    }
    let mask = slots - 1;
    'seed: for attempt in 0..SEED_ATTEMPTS {
        let seed = first_seed.wrapping_add(attempt);
        let mut half = vec![ServiceSlot::default(); slots as usize];
        for (key, info) in entries.clone() {
            if key.family == 0 {
                bail!("service key without address family: {key:?}");
            }
            let mut cur = ServiceSlot { key: *key, _pad: 0, info: *info };
            let mut home = service_slot_hash(&cur.key.words(), seed) & mask;
            let mut dist = 0u32;
            loop {
                if dist >= SERVICE_PROBES {
                    continue 'seed;
                }
                let at = ((home + dist) & mask) as usize;
                let there = &mut half[at];
                if there.key.family == 0 {
                    *there = cur;
                    break;
                }
                if there.key == cur.key {
                    bail!("service key listed twice: {key:?}");
                }
                let there_home = service_slot_hash(&there.key.words(), seed) & mask;
                let there_dist = (at as u32).wrapping_sub(there_home) & mask;
                if there_dist < dist {
                    std::mem::swap(there, &mut cur);
                    home = there_home;
                    dist = there_dist;
                }
                dist += 1;
            }
        }
        return Ok((seed, half));
    }
    bail!("no seed among {SEED_ATTEMPTS} places all {n} service keys within {SERVICE_PROBES} probes")
}

/// The keys and values of a half's used slots.
pub fn read_half(half: &[ServiceSlot]) -> impl Iterator<Item = (ServiceKey, ServiceInfo)> + '_ {
    half.iter().filter(|s| s.key.family != 0).map(|s| (s.key, s.info))
}

/// `SERVICE_TABLE` and `SERVICE_INDEX` of a loaded object, with the installed keys.
pub struct ServiceTable {
    /// Raw map: written through `mmap`, else with one BPF_MAP_UPDATE_BATCH per half.
    table: aya::maps::Map,
    mmap: Option<ArrayMmap<ServiceSlot>>,
    index: Array<MapData, ServiceTableRef>,
    /// Slots per half (S).
    slots: u32,
    /// The active half as it was written (or read back on adoption), by key words.
    keys: BTreeMap<[u32; 5], (ServiceKey, ServiceInfo)>,
    active: ServiceTableRef,
    /// When the standby half was last retired (see `REUSE_GRACE`).
    retired_at: Instant,
}

impl ServiceTable {
    /// Takes the maps of a loaded object with halves of `slots` slots and adopts what the active
    /// half holds (empty on a fresh load; a restarted daemon's predecessor's keys otherwise).
    pub fn new(table: aya::maps::Map, index: aya::maps::Map, slots: u32) -> Result<Self> {
        let index: Array<MapData, ServiceTableRef> = Array::try_from(index).context("SERVICE_INDEX is not an array")?;
        let mmap = ArrayMmap::new(&table, 2 * slots as usize);
        let mut active = index.get(&0, 0).context("reading SERVICE_INDEX")?;
        if active.base != 0 && active.base != slots {
            // Not written by this layout: treat as empty (half 0 is then rebuilt on first use).
            active = ServiceTableRef::default();
        }
        // The predecessor may have flipped just now: wait the grace before the first rewrite.
        let mut me = Self { table, mmap, index, slots, keys: BTreeMap::new(), active, retired_at: Instant::now() };
        me.keys = me.read_active()?.into_iter().map(|(k, i)| (k.words(), (k, i))).collect();
        // Rebuilt with this build's hash and layout: a predecessor built with another version
        // would otherwise leave keys where this program's probe does not look.
        if !me.keys.is_empty() {
            me.publish(me.keys.clone()).context("republishing the adopted service table")?;
        }
        Ok(me)
    }

    /// Slots per half.
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Keys the table can hold (load factor 1/2).
    pub fn capacity(&self) -> usize {
        self.slots as usize / 2
    }

    /// The installed keys, as last written.
    pub fn installed(&self) -> impl Iterator<Item = &(ServiceKey, ServiceInfo)> {
        self.keys.values()
    }

    /// Whether a table of exactly `keys` can be published (the check `update` makes before it
    /// writes, without writing): the same build from the same seed.
    pub fn check_fits<'a>(&self, keys: impl Iterator<Item = (&'a ServiceKey, &'a ServiceInfo)> + Clone) -> Result<()> {
        build_half(keys, self.slots, self.active.seed).map(|_| ())
    }

    pub fn contains(&self, key: &ServiceKey) -> bool {
        self.keys.contains_key(&key.words())
    }

    /// The active half as the kernel reads it: index entry and used slots.
    pub fn read_active(&self) -> Result<Vec<(ServiceKey, ServiceInfo)>> {
        let r = self.index.get(&0, 0).context("reading SERVICE_INDEX")?;
        if r.base != 0 && r.base != self.slots {
            return Ok(Vec::new());
        }
        let half = match &self.mmap {
            Some(m) => m.read(r.base as usize, self.slots as usize),
            None => {
                let table: Array<&MapData, ServiceSlot> = Array::try_from(&self.table)?;
                (r.base..r.base + self.slots).map(|i| table.get(&i, 0)).collect::<Result<Vec<_>, _>>()?
            }
        };
        Ok(read_half(&half).collect())
    }

    /// Installs `insert` (replacing the value of keys already present) and removes `remove`,
    /// then publishes the result. Nothing changes if the new set does not fit.
    pub fn update(&mut self, insert: &[(ServiceKey, ServiceInfo)], remove: &[ServiceKey]) -> Result<()> {
        let mut next = self.keys.clone();
        for k in remove {
            next.remove(&k.words());
        }
        for (k, i) in insert {
            next.insert(k.words(), (*k, *i));
        }
        if next == self.keys {
            return Ok(());
        }
        self.publish(next)
    }

    /// Builds `keys` into the standby half, writes it and makes it active.
    fn publish(&mut self, keys: BTreeMap<[u32; 5], (ServiceKey, ServiceInfo)>) -> Result<()> {
        let (seed, half) = build_half(keys.values().map(|(k, i)| (k, i)), self.slots, self.active.seed)?;
        let base = if self.active.base == 0 { self.slots } else { 0 };
        let since = self.retired_at.elapsed();
        if since < REUSE_GRACE {
            std::thread::sleep(REUSE_GRACE - since);
        }
        match self.mmap.as_mut() {
            Some(m) => m.write(base as usize, &half),
            None => {
                let idx: Vec<u32> = (base..base + self.slots).collect();
                update_batch(&self.table, &idx, &half).context("writing SERVICE_TABLE")?;
            }
        }
        // The flip: a syscall, so the stores above are ordered before it.
        let r = ServiceTableRef { base, seed };
        self.index.set(0, r, 0).context("writing SERVICE_INDEX")?;
        self.retired_at = Instant::now();
        self.active = r;
        self.keys = keys;
        Ok(())
    }

    /// Whether halves are written through a shared mapping (else one batch syscall each).
    pub fn mapped(&self) -> bool {
        self.mmap.is_some()
    }

    /// The active index entry.
    pub fn active(&self) -> ServiceTableRef {
        self.active
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::hash::find_service;

    // Reproducible random keys: the DNS view's generator.
    use crate::rng::{Rng as _, SplitMix64 as Rng};

    /// A random key: IPv4 or IPv6, exact port, all-ports or L3_DEFAULT.
    fn random_key(rng: &mut Rng) -> ServiceKey {
        let r = rng.next_u64();
        let v6 = r & 1 == 1;
        let addr = if v6 {
            [0x2001_0db8u32.to_be(), 0, (rng.next_u64() as u32) & 0xff, rng.next_u64() as u32]
        } else {
            [u32::from_ne_bytes([10, 0, (r >> 8) as u8, (r >> 16) as u8]), 0, 0, 0]
        };
        let (port, proto) = match (r >> 24) % 4 {
            0 => (0, lb_common::maps::PROTO_ANY),
            1 => (0, lb_common::maps::PROTO_TCP),
            2 => (((r >> 32) as u16 | 1).to_be(), lb_common::maps::PROTO_UDP),
            _ => (((r >> 32) as u16 | 1).to_be(), lb_common::maps::PROTO_TCP),
        };
        ServiceKey {
            addr,
            port,
            proto,
            family: if v6 { lb_common::maps::FAMILY_V6 } else { lb_common::maps::FAMILY_V4 },
        }
    }

    fn random_set(rng: &mut Rng, n: usize) -> BTreeMap<[u32; 5], (ServiceKey, ServiceInfo)> {
        let mut set = BTreeMap::new();
        while set.len() < n {
            let k = random_key(rng);
            let info = ServiceInfo { id: set.len() as u32, ..Default::default() };
            set.insert(k.words(), (k, info));
        }
        set
    }

    #[test]
    fn slots_for_is_a_power_of_two_with_load_at_most_half() {
        assert_eq!(slots_for(8), 256);
        assert_eq!(slots_for(16), 512);
        assert_eq!(slots_for(3), 128);
        for m in 1..300 {
            let s = slots_for(m);
            assert!(s.is_power_of_two() && s >= 2 * 16 * m, "{m}: {s}");
        }
    }

    /// Random key sets up to the capacity: every key is found by `find_service` (the kernel's
    /// probe routine) in the half it was built into, in either half of the full array, and
    /// keys that were not installed are not.
    #[test]
    fn every_key_is_found_within_the_probe_limit_up_to_capacity() {
        let mut rng = Rng(42);
        for (slots, trials) in [(64u32, 200), (512, 50), (8192, 5), (65536, 1)] {
            for t in 0..trials {
                let n =
                    if t % 2 == 0 { slots as usize / 2 } else { (rng.next_u64() % (slots as u64 / 2)) as usize + 1 };
                let set = random_set(&mut rng, n);
                let (seed, half) = build_half(set.values().map(|(k, i)| (k, i)), slots, 0).unwrap();
                // The kernel's view: both halves in one array, this one at base `slots`.
                let mut array = vec![ServiceSlot::default(); 2 * slots as usize];
                array[slots as usize..].copy_from_slice(&half);
                let get = |i: u32| array.get(i as usize);
                for (k, info) in set.values() {
                    assert_eq!(
                        find_service(get, &k.words(), seed, slots - 1, slots),
                        Some(info),
                        "slots {slots}, {k:?}"
                    );
                    assert_eq!(find_service(get, &k.words(), seed, slots - 1, 0), None);
                }
                for _ in 0..200 {
                    let k = random_key(&mut rng);
                    if !set.contains_key(&k.words()) {
                        assert_eq!(find_service(get, &k.words(), seed, slots - 1, slots), None);
                    }
                }
                assert_eq!(read_half(&half).count(), n);
            }
        }
    }

    #[test]
    fn the_first_seed_practically_always_fits_at_full_load() {
        let mut rng = Rng(7);
        let mut retries = 0;
        for _ in 0..100 {
            let set = random_set(&mut rng, 2048);
            let (seed, _) = build_half(set.values().map(|(k, i)| (k, i)), 4096, 1000).unwrap();
            retries += seed - 1000;
        }
        assert!(retries <= 5, "{retries} retries in 100 builds");
    }

    #[test]
    fn build_half_rejects_overfull_duplicate_and_familyless_sets() {
        let mut rng = Rng(1);
        let set = random_set(&mut rng, 33);
        assert!(build_half(set.values().map(|(k, i)| (k, i)), 64, 0).is_err());
        assert!(build_half(set.values().map(|(k, i)| (k, i)), 63, 0).is_err());
        let k = random_key(&mut rng);
        let info = ServiceInfo::default();
        assert!(build_half([(&k, &info), (&k, &info)].into_iter(), 64, 0).is_err());
        let empty = ServiceKey::default();
        assert!(build_half([(&empty, &info)].into_iter(), 64, 0).is_err());
        // An empty set builds an all-empty half.
        let none: [(&ServiceKey, &ServiceInfo); 0] = [];
        let (_, half) = build_half(none.into_iter(), 64, 0).unwrap();
        assert!(half.iter().all(|s| *s == ServiceSlot::default()));
    }
}
