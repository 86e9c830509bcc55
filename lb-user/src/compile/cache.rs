//! Maglev tables already built, shared across classes and reconciles.

use super::maglev::{self, MaglevBackend};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A table's identity: its size M and its members, each as (address bytes, weight).
type TableKey = (u32, Vec<(Vec<u8>, u32)>);
/// A table of backend ids: the Maglev table and the members' ids (ids alone could be given to
/// other addresses in a later reconcile, so the addresses stay in the key).
type EntriesKey = (TableKey, Vec<u32>);

/// Maglev tables already built, by (M, members): a table is rebuilt only when its eligible set
/// (or a weight) changed, and classes with the same set share one build. The controller keeps
/// one across reconciles, so a health change costs the tables it really changes.
#[derive(Debug, Default)]
pub struct TableCache {
    tables: HashMap<TableKey, Arc<Vec<u32>>>,
    used: HashSet<TableKey>,
    /// The tables in backend ids, shared by every class (of every zone) with the same members:
    /// thousands of zones with one eligible set hold one copy, not one per zone.
    entries: HashMap<EntriesKey, Arc<Vec<u32>>>,
    used_entries: HashSet<EntriesKey>,
}

impl TableCache {
    fn build(&mut self, members: &[MaglevBackend], m: u32) -> Result<Arc<Vec<u32>>, maglev::MaglevError> {
        let key = (m, members.iter().map(|b| (b.key.to_vec(), b.weight)).collect::<Vec<_>>());
        self.used.insert(key.clone());
        if let Some(t) = self.tables.get(&key) {
            return Ok(t.clone());
        }
        let t = Arc::new(maglev::build_table(members, m)?);
        self.tables.insert(key, t.clone());
        Ok(t)
    }

    /// The table of `members` in backend ids (`ids[i]` is member i's; a drop stays the drop
    /// id), one shared copy per (members, ids).
    pub(super) fn build_entries(
        &mut self,
        members: &[MaglevBackend],
        ids: &[u32],
        m: u32,
    ) -> Result<Arc<Vec<u32>>, maglev::MaglevError> {
        let key = ((m, members.iter().map(|b| (b.key.to_vec(), b.weight)).collect::<Vec<_>>()), ids.to_vec());
        self.used_entries.insert(key.clone());
        if let Some(t) = self.entries.get(&key) {
            return Ok(t.clone());
        }
        let picks = self.build(members, m)?;
        let drop = lb_common::maps::BACKEND_DROP;
        let t = Arc::new(picks.iter().map(|&i| if i == drop { i } else { ids[i as usize] }).collect::<Vec<u32>>());
        self.entries.insert(key, t.clone());
        Ok(t)
    }

    /// Forget the tables the last compile did not use.
    pub fn sweep(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.tables.retain(|k, _| used.contains(k));
        let used = std::mem::take(&mut self.used_entries);
        self.entries.retain(|k, _| used.contains(k));
    }
}
