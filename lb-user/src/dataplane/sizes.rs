//! Map sizes, fixed when the object is loaded.

use anyhow::{bail, Result};
use lb_common::ct_table;
use lb_common::maps::{
    AddrKey, Backend, BackendCounters, ClassCounters, ClassKey, GlobalStats, NextHopKey, SourceKey, TableRef,
    LOCAL_MAC_SLOTS, MAX_SERVICE_ID,
};
use lb_common::trace::{TraceEvent, TraceFilter};
use std::mem::size_of;

use super::service_table;

/// A map of the balancer's object that is sized at load time.
struct SizedMap {
    name: &'static str,
    /// Pinned (by its name) under the daemon's pin directory.
    pinned: bool,
    /// One value per possible CPU for each entry.
    per_cpu: bool,
    /// Kernel memory per entry (and CPU), about: the value in an 8-byte aligned slot; a hash
    /// or trie entry also holds its key and the element's overhead.
    entry_bytes: usize,
    max_entries: fn(&DataplaneSizes) -> u32,
    /// The configuration settings its size follows, named when the maps would take more than
    /// [`MAP_MEMORY_LIMIT_MIB`].
    driven_by: &'static str,
}

/// The most kernel memory the maps of one data plane may take together. The connection tables
/// at their largest (`dataplane.conntrack_entries` is capped at validation) fit with room for
/// the rest; beyond it the load would fail with ENOMEM, or take the host's memory.
pub const MAP_MEMORY_LIMIT_MIB: u64 = 4096;

const BY_SERVICES: &str = "the number of services and ports";
const BY_CLASSES: &str = "services × client classes (zones, Traffic Manager classes, ports, prefixes)";
const BY_BACKENDS: &str = "the number of backends";
const FIXED: &str = "nothing (a fixed size)";

/// Bytes of the trace events' ring buffer: about 700 events, read by `lb trace` every few ms.
pub const TRACE_RING_BYTES: u32 = 1 << 16;
/// lb-ebpf `trace::Scratch`: the counters, an event, the token bucket and a count.
const TRACE_SCRATCH_BYTES: usize = size_of::<GlobalStats>() + size_of::<TraceEvent>() + 24;

/// Destination prefixes the next-hop routes hold at most (routed prefixes and the addresses
/// exempted inside them).
pub const MAX_NEXT_HOP_ROUTES: u32 = 4096;

/// A hash or trie element's own overhead (list links, hash, lock; about).
const HASHED: usize = 48;
/// `NEXT_HOPS`' value: a route cached per backend and CPU (the data plane's `NextHop`).
const NEXT_HOP_BYTES: usize = 80;

/// Every map of the object that is sized at load time: the one list that names them, their
/// sizes and which are pinned. `NEXT_HOPS`, a per-CPU cache of route lookups that refills
/// itself within a second, is not pinned.
const SIZED_MAPS: &[SizedMap] = &[
    // Two halves of S slots, S >= twice the key capacity (16 keys per service).
    SizedMap {
        name: "SERVICE_TABLE",
        pinned: true,
        per_cpu: false,
        entry_bytes: size_of::<lb_common::maps::ServiceSlot>(),
        max_entries: |s| 2 * s.service_slots(),
        driven_by: BY_SERVICES,
    },
    SizedMap {
        name: "SERVICE_INDEX",
        pinned: true,
        per_cpu: false,
        entry_bytes: 8,
        max_entries: |_| 1,
        driven_by: FIXED,
    },
    SizedMap {
        name: "VIPS",
        pinned: true,
        per_cpu: false,
        entry_bytes: HASHED + size_of::<AddrKey>() + 4,
        max_entries: |s| s.max_services.saturating_mul(4),
        driven_by: BY_SERVICES,
    },
    // One (address, service) pair per backend id at most.
    SizedMap {
        name: "BACKEND_SOURCES",
        pinned: true,
        per_cpu: false,
        entry_bytes: HASHED + size_of::<SourceKey>() + 4,
        max_entries: |s| s.max_backends,
        driven_by: BY_BACKENDS,
    },
    SizedMap {
        name: "CONNTRACK",
        pinned: true,
        per_cpu: false,
        entry_bytes: size_of::<ct_table::Bucket6>(),
        max_entries: |s| s.conntrack_buckets(),
        driven_by: "dataplane.conntrack_entries",
    },
    SizedMap {
        name: "CONNTRACK4",
        pinned: true,
        per_cpu: false,
        entry_bytes: size_of::<ct_table::Bucket4>(),
        max_entries: |s| s.conntrack_buckets(),
        driven_by: "dataplane.conntrack_entries",
    },
    SizedMap {
        name: "CT_SEED_STORE",
        pinned: true,
        per_cpu: false,
        entry_bytes: 8,
        max_entries: |_| 1,
        driven_by: FIXED,
    },
    SizedMap {
        name: "CLIENT_CLASS",
        pinned: true,
        per_cpu: false,
        entry_bytes: HASHED + size_of::<ClassKey>() + 4,
        max_entries: |s| s.class_pairs().saturating_mul(16).max(16),
        driven_by: BY_CLASSES,
    },
    SizedMap {
        name: "NEXT_HOP_ROUTES",
        pinned: true,
        per_cpu: false,
        entry_bytes: HASHED + size_of::<NextHopKey>() + 4,
        max_entries: |_| MAX_NEXT_HOP_ROUTES,
        driven_by: FIXED,
    },
    SizedMap {
        name: "CLASSED_SERVICES",
        pinned: true,
        per_cpu: false,
        entry_bytes: 8,
        max_entries: |s| s.max_services,
        driven_by: BY_SERVICES,
    },
    SizedMap {
        name: "TABLE_INDEX",
        pinned: true,
        per_cpu: false,
        entry_bytes: size_of::<TableRef>(),
        max_entries: |s| s.class_pairs(),
        driven_by: BY_CLASSES,
    },
    SizedMap {
        name: "TABLES",
        pinned: true,
        per_cpu: false,
        entry_bytes: 8,
        max_entries: |s| s.table_slots * s.table_size_m,
        driven_by: "dataplane.maglev_table_size × (services × client classes)",
    },
    SizedMap {
        name: "CLEAN_SLOTS",
        pinned: true,
        per_cpu: false,
        entry_bytes: 8,
        max_entries: |s| s.table_slots * lb_common::maps::clean_slots::words(s.table_size_m),
        driven_by: "dataplane.maglev_table_size × (services × client classes) / 64",
    },
    SizedMap {
        name: "BACKENDS",
        pinned: true,
        per_cpu: false,
        entry_bytes: size_of::<Backend>(),
        max_entries: |s| s.max_backends,
        driven_by: BY_BACKENDS,
    },
    // One record of global counters; one record per (service, class).
    SizedMap {
        name: "STATS",
        pinned: true,
        per_cpu: true,
        entry_bytes: size_of::<GlobalStats>(),
        max_entries: |_| 1,
        driven_by: FIXED,
    },
    SizedMap {
        name: "CLASS_STATS",
        pinned: true,
        per_cpu: true,
        entry_bytes: size_of::<ClassCounters>(),
        max_entries: |s| s.class_pairs(),
        driven_by: BY_CLASSES,
    },
    // One record per backend id (metrics per backend).
    SizedMap {
        name: "BACKEND_STATS",
        pinned: true,
        per_cpu: true,
        entry_bytes: size_of::<BackendCounters>(),
        max_entries: |s| s.max_backends,
        driven_by: BY_BACKENDS,
    },
    SizedMap {
        name: "NEXT_HOPS",
        pinned: false,
        per_cpu: true,
        entry_bytes: NEXT_HOP_BYTES,
        max_entries: |s| s.max_backends,
        driven_by: BY_BACKENDS,
    },
    // Packet tracing (`lb trace`, lb-ebpf `trace`): the filter and the events' ring buffer
    // (its size in bytes; counted as 8 bytes a byte here, an over-estimate of 448 KiB), pinned
    // so that `lb trace` reads the events the daemon's traced program writes; each CPU's packet
    // in progress, not pinned.
    SizedMap {
        name: "TRACE_FILTER",
        pinned: true,
        per_cpu: false,
        entry_bytes: size_of::<TraceFilter>(),
        max_entries: |_| 1,
        driven_by: FIXED,
    },
    SizedMap {
        name: "TRACE_EVENTS",
        pinned: true,
        per_cpu: false,
        entry_bytes: 1,
        max_entries: |_| TRACE_RING_BYTES,
        driven_by: FIXED,
    },
    SizedMap {
        name: "TRACE_SCRATCH",
        pinned: false,
        per_cpu: true,
        entry_bytes: TRACE_SCRATCH_BYTES,
        max_entries: |_| 1,
        driven_by: FIXED,
    },
    // A fixed size (the data plane indexes it by `local_mac_slot`); not pinned: each loaded
    // object has its own, filled before it is attached or swapped in.
    SizedMap {
        name: "LOCAL_MACS",
        pinned: false,
        per_cpu: false,
        entry_bytes: size_of::<lb_common::maps::LocalMac>(),
        max_entries: |_| LOCAL_MAC_SLOTS,
        driven_by: FIXED,
    },
];

const fn pinned_count() -> usize {
    let (mut n, mut i) = (0, 0);
    while i < SIZED_MAPS.len() {
        n += SIZED_MAPS[i].pinned as usize;
        i += 1;
    }
    n
}

const fn pinned_names<const N: usize>() -> [&'static str; N] {
    let (mut names, mut n, mut i) = ([""; N], 0, 0);
    while i < SIZED_MAPS.len() {
        if SIZED_MAPS[i].pinned {
            names[n] = SIZED_MAPS[i].name;
            n += 1;
        }
        i += 1;
    }
    names
}

/// Every map of the object that is pinned (by these names), from [`SIZED_MAPS`].
pub const MAP_NAMES: [&str; pinned_count()] = pinned_names();

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
    pub fn map_max_entries(&self) -> Vec<(&'static str, u32)> {
        SIZED_MAPS.iter().map(|m| (m.name, (m.max_entries)(self))).collect()
    }

    /// Each map's kernel memory for these sizes (bytes, about: values rounded up to 8 bytes,
    /// per-CPU maps times the possible CPUs).
    pub fn map_bytes(&self) -> Vec<(&'static str, u64)> {
        // SAFETY: sysconf reads a system setting.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as u64;
        SIZED_MAPS
            .iter()
            .map(|m| {
                let entry = m.entry_bytes.div_ceil(8) as u64 * 8 * if m.per_cpu { cpus } else { 1 };
                (m.name, u64::from((m.max_entries)(self)) * entry)
            })
            .collect()
    }

    /// Refuses sizes whose maps would take more than [`MAP_MEMORY_LIMIT_MIB`] of kernel memory,
    /// naming the largest maps and the settings behind them.
    pub fn check_memory(&self) -> Result<()> {
        let mut maps: Vec<(&SizedMap, u64)> =
            SIZED_MAPS.iter().zip(self.map_bytes()).map(|(m, (_, b))| (m, b)).collect();
        let total: u64 = maps.iter().map(|(_, b)| b).sum();
        if total >> 20 <= MAP_MEMORY_LIMIT_MIB {
            return Ok(());
        }
        maps.sort_by_key(|(_, b)| std::cmp::Reverse(*b));
        let largest: Vec<String> =
            maps.iter().take(3).map(|(m, b)| format!("{} {} MiB ({})", m.name, b >> 20, m.driven_by)).collect();
        bail!(
            "this configuration needs {} MiB of BPF maps, above the limit of {MAP_MEMORY_LIMIT_MIB} MiB; the largest: {}",
            total >> 20,
            largest.join(", ")
        )
    }

    /// (service, class) pairs: the rows of `TABLE_INDEX` and `CLASS_STATS`.
    fn class_pairs(&self) -> u32 {
        self.max_services * self.classes_per_service
    }

    /// Buckets per connection table (a power of two; the load-time `CT_BUCKET_MASK` + 1).
    pub fn conntrack_buckets(&self) -> u32 {
        ct_table::buckets_for(self.conntrack_entries)
    }

    /// Slots per half of `SERVICE_TABLE` (a power of two; the load-time `SERVICE_SLOTS`).
    pub fn service_slots(&self) -> u32 {
        service_table::slots_for(self.max_services)
    }

    pub(super) fn validate(&self) -> Result<()> {
        let s = self;
        if s.table_size_m < 2
            || s.conntrack_entries == 0
            || s.max_services == 0
            || s.classes_per_service == 0
            || s.max_backends == 0
            || s.table_slots == 0
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
