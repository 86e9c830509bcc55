//! Stable ids for services and backends, kept across reloads: a tracked flow stores a backend
//! id, so renumbering would silently move established connections.

use crate::config::Config;
use crate::model::{keyed_triples, BackendKey};
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;

/// Stable ids for services (by name) and backends (by service name and address).
#[derive(Clone, Debug, Default)]
pub struct Ids {
    services: BTreeMap<String, u32>,
    backends: BTreeMap<BackendKey, u32>,
    /// Generation of each backend id's current holder (`Backend::generation`): bumped when the
    /// id is handed to another backend, kept after the id is freed.
    generations: BTreeMap<u32, u16>,
    /// The ids not in use, derived from `services` / `backends` when first needed after a
    /// change other than handing out an id (then kept up to date): handing out n ids costs
    /// O(n log n), not a sort of every id in use per new id.
    free_services: Option<FreeIds>,
    free_backends: Option<FreeIds>,
}

/// Serializable form of [`Ids`] (JSON maps need string keys).
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct IdsSnapshot {
    pub services: Vec<(String, u32)>,
    #[serde(with = "keyed_triples")]
    pub backends: Vec<(BackendKey, u32)>,
    /// Absent in an older daemon's state: every id is then at generation 0, as its backend
    /// records and connection-table entries are.
    #[serde(default)]
    pub generations: Vec<(u32, u16)>,
}

impl Ids {
    pub fn snapshot(&self) -> IdsSnapshot {
        IdsSnapshot {
            services: self.services.iter().map(|(n, i)| (n.clone(), *i)).collect(),
            backends: self.backends.iter().map(|(k, i)| (k.clone(), *i)).collect(),
            generations: self.generations.iter().map(|(i, g)| (*i, *g)).collect(),
        }
    }

    pub fn from_snapshot(s: &IdsSnapshot) -> Self {
        Self {
            services: s.services.iter().cloned().collect(),
            backends: s.backends.iter().cloned().collect(),
            generations: s.generations.iter().copied().collect(),
            ..Self::default()
        }
    }

    pub(super) fn service(&mut self, name: &str) -> u32 {
        if let Some(id) = self.services.get(name) {
            return *id;
        }
        let hint = self.services.len() as u32;
        let services = &self.services;
        let id = self.free_services.get_or_insert_with(|| FreeIds::of(services.values())).take(hint);
        self.services.insert(name.to_owned(), id);
        id
    }

    pub(super) fn backend(&mut self, service: &str, addr: IpAddr) -> u32 {
        let next = self.backends.len() as u32;
        let key = BackendKey::new(service, addr);
        if let Some(id) = self.backends.get(&key) {
            return *id;
        }
        let backends = &self.backends;
        let id = self.free_backends.get_or_insert_with(|| FreeIds::of(backends.values())).take(next);
        self.backends.insert(key, id);
        let generation = self.generations.entry(id).or_insert(0);
        *generation = generation.wrapping_add(1);
        id
    }

    /// Adds what `other` (a copy of these ids that handed out more) has and these lack: its
    /// new services and backends, with the generations it reached.
    pub fn absorb(&mut self, other: &Ids) {
        for (name, id) in &other.services {
            self.services.entry(name.clone()).or_insert(*id);
        }
        for (key, id) in &other.backends {
            self.backends.entry(key.clone()).or_insert(*id);
        }
        self.generations.extend(other.generations.iter().map(|(i, g)| (*i, *g)));
        self.free_services = None;
        self.free_backends = None;
    }

    /// Every backend's key and id.
    pub fn backends(&self) -> impl Iterator<Item = (&BackendKey, u32)> {
        self.backends.iter().map(|(k, id)| (k, *id))
    }

    /// The backend that holds id `id`.
    pub fn owner_of(&self, id: u32) -> Option<&BackendKey> {
        self.backends.iter().find(|(_, i)| **i == id).map(|(k, _)| k)
    }

    /// The generation of the backend that holds `id` (0 for an id never handed out here).
    pub fn backend_generation(&self, id: u32) -> u16 {
        self.generations.get(&id).copied().unwrap_or(0)
    }

    /// Forget ids of services and backends that are no longer configured, except backends for
    /// which `keep(key)` holds (tracked flows may still point at their id).
    pub fn retain(&mut self, cfg: &Config, keep: &dyn Fn(&BackendKey) -> bool) {
        let configured: HashSet<(&str, IpAddr)> = cfg
            .services
            .iter()
            .flat_map(|s| s.backends.iter().flat_map(|b| b.addresses().iter().map(|a| (s.name.as_str(), *a))))
            .collect();
        self.backends.retain(|k, _| keep(k) || configured.contains(&(k.service.as_str(), k.address)));
        let named: HashSet<&str> = cfg
            .services
            .iter()
            .map(|s| s.name.as_str())
            .chain(self.backends.keys().map(|k| k.service.as_str()))
            .collect();
        self.services.retain(|name, _| named.contains(name.as_str()));
        self.free_services = None;
        self.free_backends = None;
    }

    pub fn backend_id(&self, service: &str, addr: IpAddr) -> Option<u32> {
        self.backends.get(&BackendKey::new(service, addr)).copied()
    }
}

/// The ids not in use: every id from `end` on, and the gaps below it as ranges (start -> end,
/// exclusive), so a sparse set of ids (an old state file) costs no more than a dense one.
#[derive(Clone, Debug, Default)]
struct FreeIds {
    end: u32,
    gaps: BTreeMap<u32, u32>,
}

impl FreeIds {
    fn of<'a>(used: impl Iterator<Item = &'a u32>) -> Self {
        #[cfg(test)]
        tests::SCANS.with(|n| n.set(n.get() + 1));
        let mut used: Vec<u32> = used.copied().collect();
        used.sort_unstable();
        let mut free = Self::default();
        for id in used {
            if id > free.end {
                free.gaps.insert(free.end, id);
            }
            free.end = id.saturating_add(1);
        }
        free
    }

    /// `hint` if it is free, else the lowest free id (ids are dense so arrays stay small).
    fn take(&mut self, hint: u32) -> u32 {
        let id = match self.gaps.range(..=hint).next_back() {
            _ if hint >= self.end => hint,
            Some((_, &gap_end)) if hint < gap_end => hint,
            _ => match self.gaps.keys().next() {
                Some(&lowest) => lowest,
                None => self.end,
            },
        };
        if id >= self.end {
            if id > self.end {
                self.gaps.insert(self.end, id);
            }
            self.end = id.saturating_add(1);
            return id;
        }
        let (&start, &gap_end) = self.gaps.range(..=id).next_back().expect("a free id lies in a gap");
        self.gaps.remove(&start);
        if start < id {
            self.gaps.insert(start, id);
        }
        if id + 1 < gap_end {
            self.gaps.insert(id + 1, gap_end);
        }
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Scans of every id in use (`FreeIds::of`) on this test's thread.
        pub(super) static SCANS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// The old rule: `hint` if unused, else the lowest unused id.
    fn lowest_free(hint: u32, used: &[u32]) -> u32 {
        if !used.contains(&hint) {
            return hint;
        }
        (0..).find(|i| !used.contains(i)).unwrap()
    }

    #[test]
    fn free_ids_hand_out_what_the_lowest_free_rule_does() {
        for used in [vec![], vec![0, 1, 2], vec![1, 2, 5, 9], vec![0, 3, 4, 7, 8]] {
            let mut all = used.clone();
            let mut free = FreeIds::of(used.iter());
            for _ in 0..12 {
                let hint = all.len() as u32;
                let id = free.take(hint);
                assert_eq!(id, lowest_free(hint, &all), "used {all:?}");
                all.push(id);
            }
        }
    }

    #[test]
    fn a_hundred_thousand_backends_get_dense_ids_from_one_scan() {
        let mut ids = Ids::default();
        for n in 0..100_000u32 {
            let addr = IpAddr::from([198, 18, (n >> 8) as u8, n as u8]);
            assert_eq!(ids.backend(&format!("s{}", n / 250), addr), n);
        }
        // The free ids were derived once (from nothing) and then kept, never re-sorted.
        assert_eq!(SCANS.with(|n| n.get()), 1);
        let free = ids.free_backends.as_ref().unwrap();
        assert_eq!((free.end, free.gaps.len()), (100_000, 0));
    }
}
