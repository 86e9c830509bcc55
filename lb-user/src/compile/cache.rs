//! Maglev tables already built, shared across classes and reconciles.

use super::maglev::{self, MaglevBackend};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A table's identity: its size M and its members, each as (address bytes, weight).
type TableKey = (u32, Vec<(Vec<u8>, u32)>);

/// Maglev tables already built, by (M, members): a table is rebuilt only when its eligible set
/// (or a weight) changed, and classes with the same set share one build. The controller keeps
/// one across reconciles, so a health change costs the tables it really changes.
#[derive(Debug, Default)]
pub struct TableCache {
    tables: HashMap<TableKey, Arc<Vec<u32>>>,
    used: HashSet<TableKey>,
}

impl TableCache {
    pub(super) fn build(&mut self, members: &[MaglevBackend], m: u32) -> Result<Arc<Vec<u32>>, maglev::MaglevError> {
        let key = (m, members.iter().map(|b| (b.key.to_vec(), b.weight)).collect::<Vec<_>>());
        self.used.insert(key.clone());
        if let Some(t) = self.tables.get(&key) {
            return Ok(t.clone());
        }
        let t = Arc::new(maglev::build_table(members, m)?);
        self.tables.insert(key, t.clone());
        Ok(t)
    }

    /// Forget the tables the last compile did not use.
    pub fn sweep(&mut self) {
        let used = std::mem::take(&mut self.used);
        self.tables.retain(|k, _| used.contains(k));
    }
}
