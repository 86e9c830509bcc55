//! Map sizes, fixed when the object is loaded.

use anyhow::{bail, Result};
use lb_common::{ct_buckets_for, MAX_SERVICE_ID};

use super::service_table;

/// Map sizes, fixed when the object is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataplaneSizes {
    /// Maglev table size M (prime).
    pub table_size_m: u32,
    /// Flows each connection table (one per address family) is sized for, at 75 % load.
    pub conntrack_entries: u32,
    /// Service ids are `0..max_services`.
    pub max_services: u32,
    /// Client classes per service (class 0 = non-compatible clients).
    pub classes_per_service: u32,
    /// Backend ids are `0..max_backends`.
    pub max_backends: u32,
    /// Number of tables `TABLES` holds: active tables plus at least one standby slot.
    pub table_slots: u32,
}

impl DataplaneSizes {
    /// Every map's max_entries for these sizes (also how pinned maps are checked for reuse).
    pub fn map_max_entries(&self) -> [(&'static str, u32); 15] {
        let pairs = self.max_services * self.classes_per_service;
        [
            // Two halves of S slots, S >= twice the key capacity (16 keys per service).
            ("SERVICE_TABLE", 2 * self.service_slots()),
            ("SERVICE_INDEX", 1),
            ("VIPS", self.max_services.saturating_mul(4)),
            ("CONNTRACK", self.conntrack_buckets()),
            ("CONNTRACK4", self.conntrack_buckets()),
            ("CT_SEED_STORE", 1),
            ("CLIENT_CLASS", pairs.saturating_mul(16).max(16)),
            ("CLASSED_SERVICES", self.max_services),
            ("TABLE_INDEX", pairs),
            ("TABLES", self.table_slots * self.table_size_m),
            ("BACKENDS", self.max_backends),
            // One record of global counters; one record per (service, class).
            ("STATS", 1),
            ("CLASS_STATS", pairs),
            ("NEXT_HOPS", self.max_backends),
            ("DECAP_ADDRS", 64),
        ]
    }

    /// Buckets per connection table (a power of two; the load-time `CT_BUCKET_MASK` + 1).
    pub fn conntrack_buckets(&self) -> u32 {
        ct_buckets_for(self.conntrack_entries)
    }

    /// Slots per half of `SERVICE_TABLE` (a power of two; the load-time `SERVICE_SLOTS`).
    pub fn service_slots(&self) -> u32 {
        service_table::slots_for(self.max_services)
    }

    pub(super) fn validate(&self) -> Result<()> {
        let s = self;
        if s.table_size_m < 2 || s.conntrack_entries == 0 || s.max_services == 0 || s.classes_per_service == 0
            || s.max_backends == 0 || s.table_slots == 0
        {
            bail!("data-plane sizes must be positive (M at least 2): {s:?}");
        }
        let cells = s.table_slots as u64 * s.table_size_m as u64;
        if cells > u32::MAX as u64 / 4 {
            bail!("TABLES would hold {cells} entries, too many");
        }
        // The service table's bound; it also keeps ids below MAX_SERVICE_ID (CtKey4 packs them).
        const SERVICE_LIMIT: u32 = 1 << 20;
        const _: () = assert!(SERVICE_LIMIT <= MAX_SERVICE_ID);
        if s.max_services > SERVICE_LIMIT {
            bail!("max_services {} is above the limit {SERVICE_LIMIT}", s.max_services);
        }
        // Connection-table entries keep the class in 16 bits (`CtEntry::class`).
        if s.classes_per_service > 1 << 16 {
            bail!("classes_per_service {} is above the limit {}", s.classes_per_service, 1u32 << 16);
        }
        if s.max_services as u64 * s.classes_per_service as u64 > u32::MAX as u64 / 32 {
            bail!("too many (service, class) pairs");
        }
        Ok(())
    }
}
