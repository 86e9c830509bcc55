//! Stable ids for services and backends, kept across reloads: a tracked flow stores a backend
//! id, so renumbering would silently move established connections.

use crate::config::Config;
use crate::model::{keyed_triples, BackendKey};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// Stable ids for services (by name) and backends (by service name and address).
#[derive(Clone, Debug, Default)]
pub struct Ids {
    services: BTreeMap<String, u32>,
    backends: BTreeMap<BackendKey, u32>,
    /// Generation of each backend id's current holder (`Backend::generation`): bumped when the
    /// id is handed to another backend, kept after the id is freed.
    generations: BTreeMap<u32, u16>,
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
        }
    }

    pub(super) fn service(&mut self, name: &str) -> u32 {
        if let Some(id) = self.services.get(name) {
            return *id;
        }
        let id = first_free(self.services.len() as u32, self.services.values());
        self.services.insert(name.to_owned(), id);
        id
    }

    pub(super) fn backend(&mut self, service: &str, addr: IpAddr) -> u32 {
        let next = self.backends.len() as u32;
        let key = BackendKey::new(service, addr);
        if let Some(id) = self.backends.get(&key) {
            return *id;
        }
        let id = first_free(next, self.backends.values());
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
        self.backends.retain(|k, _| {
            keep(k) || cfg.has_backend(k)
        });
        let backends = &self.backends;
        self.services.retain(|name, _| cfg.services.iter().any(|s| &s.name == name) || backends.keys().any(|k| &k.service == name));
    }

    pub fn backend_id(&self, service: &str, addr: IpAddr) -> Option<u32> {
        self.backends.get(&BackendKey::new(service, addr)).copied()
    }
}

/// The lowest id not in use (ids are dense so arrays stay small).
fn first_free<'a>(hint: u32, used: impl Iterator<Item = &'a u32>) -> u32 {
    let mut used: Vec<u32> = used.copied().collect();
    used.sort_unstable();
    if !used.contains(&hint) {
        return hint;
    }
    (0..).find(|i| used.binary_search(i).is_err()).unwrap_or(hint)
}
