//! The data-plane writer: loads the XDP object with map sizes fixed at load time, writes
//! services, backends, client-class prefixes and Maglev tables, and reads counters.
//!
//! It knows nothing of policy: callers hand it finished tables, and it depends on lb-common
//! and neutral types only. By concern:
//!
//! - `sizes`: map sizes, fixed at load; this module: loading (and adopting pinned maps);
//! - `services` (with `service_table`, the `SERVICE_TABLE` writer), `tables` (backend records,
//!   Maglev tables), `classes` (client-class prefixes), `conntrack` (connection tables),
//!   `stats` (counters): the maps;
//! - `admission`: whether a change fits, and what an adopted data plane keeps;
//! - `programs`: attaching and running the programs; `pinning`: bpffs and pins;
//! - `sys`: raw system calls; `sink`: the [`Tables`] trait the controller writes through,
//!   and its implementation.

mod admission;
mod carry;
mod classes;
pub mod clean_slots;
mod conntrack;
pub mod flows;
mod next_hop;
pub mod pinning;
mod programs;
pub mod service_table;
mod services;
mod sink;
mod sizes;
mod sources;
mod stats;
mod sys;
mod tables;
pub mod trace;

use std::collections::{HashMap as StdHashMap, HashSet, VecDeque};
use std::os::fd::OwnedFd;
use std::path::Path;

use anyhow::{anyhow, Context, Result};
use aya::maps::lpm_trie::LpmTrie;
use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use aya::{Ebpf, EbpfLoader};
use ipnet::IpNet;
use lb_common::ct_table;
use lb_common::maps::{
    table_flags, AddrKey, Backend, BackendCounters, ClassCounters, ClassKey, GlobalStats, LocalMac, NextHopKey,
    SourceKey, TableRef, CLASS_KEY_SERVICE_BITS,
};
use lb_common::trace::TraceFilter;

pub use admission::{Demand, ServiceDemand};
pub use carry::{Carried, PreviousBucket, PreviousSlot, Slot48, Slot72};
pub use conntrack::{ct_seed, table_set};
pub use lb_common::maps::addr_words;
pub use pinning::detach_pinned;
#[cfg(feature = "test-helpers")]
pub(crate) use programs::run_test;
pub(crate) use programs::{attach, attach_pinned, verify};
pub use programs::{Attached, Program, TestOutput};
#[cfg(feature = "test-helpers")]
pub use programs::{XDP_ABORTED, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX};
pub use sink::Tables;
pub use sizes::{DataplaneSizes, MAP_NAMES};
pub(crate) use stats::global_counters;
pub use stats::{ClassStats, Stats};
pub use sys::{load_program, ns_per_jiffy};

use classes::trie_prefix;
use service_table::ServiceTable;
use services::vip_refs;
use sys::ArrayMmap;
use tables::TableMmap;

/// The balancer's XDP object (built by `build.rs`): `lb` and `clock_probe`, nothing else.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_OBJ"));

/// Where `build.rs` left the bench build of the balancer's object (`lb` plus the bench
/// programs, feature `bench` of lb-ebpf): only lb-tests' `dp_bench` loads it.
pub const BENCH_OBJECT_PATH: &str = env!("LB_EBPF_BENCH_OBJ");

/// A loaded data plane: the programs and typed handles to every map.
pub struct Dataplane {
    ebpf: Ebpf,
    sizes: DataplaneSizes,
    services: ServiceTable,
    vips: HashMap<MapData, AddrKey, u32>,
    /// Each service's backend addresses (`sources`), and what this writer put there.
    backend_sources: HashMap<MapData, SourceKey, u32>,
    backend_sources_of: StdHashMap<u32, HashSet<SourceKey>>,
    conntrack: Array<MapData, ct_table::Bucket6>,
    conntrack4: Array<MapData, ct_table::Bucket4>,
    /// The connection tables' bucket hash seed (the data plane's `CT_SEED`).
    ct_seed: u64,
    client_class: LpmTrie<MapData, ClassKey, u32>,
    /// Destination prefix -> next-hop route (`next_hop`).
    next_hop_routes: LpmTrie<MapData, NextHopKey, u32>,
    /// Service id -> 1 if it has client-class prefixes (the kernel consults the trie only then).
    classed_services: Array<MapData, u32>,
    /// The (service, prefix) pairs in `CLIENT_CLASS`, to keep `classed_services` exact.
    class_prefixes: HashSet<(u32, IpNet)>,
    table_index: Array<MapData, TableRef>,
    /// Kept as the raw map: tables are written through `tables_mmap`, or with one
    /// BPF_MAP_UPDATE_BATCH each where the map cannot be mapped (pinned by an older version).
    tables: aya::maps::Map,
    tables_mmap: Option<TableMmap>,
    /// `CLEAN_SLOTS` and the replaced tables kept for handshake windows.
    clean: clean_slots::CleanSlots,
    backends: Array<MapData, Backend>,
    stats: PerCpuArray<MapData, GlobalStats>,
    class_stats: PerCpuArray<MapData, ClassCounters>,
    backend_stats: PerCpuArray<MapData, BackendCounters>,
    /// The interfaces `lb` balances on and their MACs (`LOCAL_MACS`, not pinned).
    local_macs: Array<MapData, LocalMac>,
    clock_probe: Array<MapData, u64>,
    /// Service keys per VIP address, to keep `VIPS` in step with the service table.
    vip_refs: StdHashMap<AddrKey, usize>,
    /// Active slot per (service, class).
    active_slots: StdHashMap<(u32, u32), u32>,
    /// FIFO: a freed slot is reused as late as possible, so a packet that read the old
    /// `TABLE_INDEX` just before a flip never sees that slot being rewritten.
    free_slots: VecDeque<u32>,
    /// The bpf_links of [`Dataplane::attach_pinned`] by interface, held: the program stays
    /// attached while this data plane lives, whatever happens to the pins.
    links: StdHashMap<String, OwnedFd>,
    /// Packet tracing (`trace`): the filter, the events, and whether `lb_traced` is attached.
    trace_filter: Array<MapData, TraceFilter>,
    trace_events: aya::maps::RingBuf<MapData>,
    tracing: bool,
}

pub(crate) fn take<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(ebpf: &mut Ebpf, name: &str) -> Result<T> {
    let map = ebpf.take_map(name).ok_or_else(|| anyhow!("map {name} missing from the XDP object"))?;
    T::try_from(map).with_context(|| format!("map {name} has an unexpected type"))
}

fn take_raw(ebpf: &mut Ebpf, name: &str) -> Result<aya::maps::Map> {
    ebpf.take_map(name).ok_or_else(|| anyhow!("map {name} missing from the XDP object"))
}

pub(crate) fn addr_key(addr: [u32; 4], family: u8) -> AddrKey {
    AddrKey { addr, family, _pad: [0; 3] }
}

/// What the XDP object is given at load time: every map's size and the constants the verifier
/// sees (`CT_SEED`, `CT_BUCKET_MASK`, `NS_PER_JIFFY`, `TABLE_M`, `SERVICE_SLOTS`,
/// `CLASSES_PER_SERVICE`). The daemon and the benchmarks load with these same settings.
pub struct LoadSettings {
    sizes: DataplaneSizes,
    pub ct_seed: u64,
    ct_mask: u32,
    ns_per_jiffy: u64,
    service_slots: u32,
}

impl LoadSettings {
    /// The settings for `sizes`; the connection tables' seed is the one pinned in `pin_dir`
    /// if there is one (see [`ct_seed`]).
    pub fn new(sizes: &DataplaneSizes, pin_dir: Option<&Path>) -> Result<Self> {
        Ok(Self {
            sizes: *sizes,
            ct_seed: ct_seed(pin_dir)?,
            ct_mask: sizes.conntrack_buckets() - 1,
            ns_per_jiffy: ns_per_jiffy()?,
            service_slots: sizes.service_slots(),
        })
    }

    /// Sets every map's size and the load-time constants on `loader`.
    pub fn apply<'a, 'l>(&'a self, loader: &'l mut EbpfLoader<'a>) -> &'l mut EbpfLoader<'a> {
        for (name, max) in self.sizes.map_max_entries() {
            loader.map_max_entries(name, max);
        }
        loader
            .override_global("CT_SEED", &self.ct_seed, true)
            .override_global("CT_BUCKET_MASK", &self.ct_mask, true)
            .override_global("NS_PER_JIFFY", &self.ns_per_jiffy, true)
            .override_global("TABLE_M", &self.sizes.table_size_m, true)
            .override_global("SERVICE_SLOTS", &self.service_slots, true)
            .override_global("CLASSES_PER_SERVICE", &self.sizes.classes_per_service, true)
    }
}

impl Dataplane {
    /// Loads the balancer's object (`lb`, `clock_probe`) with the given map sizes. Needs
    /// CAP_BPF/CAP_NET_ADMIN (root).
    pub fn load(sizes: DataplaneSizes) -> Result<Self> {
        Self::load_with(sizes, None)
    }

    /// Like [`Dataplane::load`], with every map pinned under `pin_dir` (a bpffs directory).
    /// Maps already pinned there are reused with their content, so a restarted daemon keeps
    /// the connection table and the tables the old program forwards with; the writer's own
    /// bookkeeping (active table slots, VIP references) is rebuilt from the maps. The caller
    /// must make sure the pinned maps were made with the same `sizes` (see `pinning`).
    pub fn load_with(sizes: DataplaneSizes, pin_dir: Option<&Path>) -> Result<Self> {
        sizes.validate()?;
        let mut loader = EbpfLoader::new();
        if let Some(dir) = pin_dir {
            for name in MAP_NAMES {
                loader.map_pin_path(name, dir.join(name));
            }
        }
        let settings = LoadSettings::new(&sizes, pin_dir)?;
        let ct_seed = settings.ct_seed;
        let mut ebpf = settings.apply(&mut loader).load(EBPF_OBJECT).map_err(|e| load_error(e, &sizes))?;
        for p in [Program::Lb, Program::LbTraced, Program::ClockProbe] {
            verify(&mut ebpf, p.name())?;
        }
        let mut seed_store: Array<MapData, u64> = take(&mut ebpf, "CT_SEED_STORE")?;
        seed_store.set(0, ct_seed, 0).context("writing CT_SEED_STORE")?;
        // Before the connection tables are taken: it maps them.
        let clean = clean_slots::CleanSlots::new(
            &take_raw(&mut ebpf, "CLEAN_SLOTS")?,
            [ebpf.map("CONNTRACK4"), ebpf.map("CONNTRACK")],
            sizes.conntrack_buckets(),
            sizes.table_slots,
            sizes.table_size_m,
        )?;
        Ok(Self {
            ct_seed,
            services: ServiceTable::new(
                take_raw(&mut ebpf, "SERVICE_TABLE")?,
                take_raw(&mut ebpf, "SERVICE_INDEX")?,
                sizes.service_slots(),
            )?,
            vips: take(&mut ebpf, "VIPS")?,
            backend_sources: take(&mut ebpf, "BACKEND_SOURCES")?,
            backend_sources_of: StdHashMap::new(),
            conntrack: take(&mut ebpf, "CONNTRACK")?,
            conntrack4: take(&mut ebpf, "CONNTRACK4")?,
            client_class: take(&mut ebpf, "CLIENT_CLASS")?,
            classed_services: take(&mut ebpf, "CLASSED_SERVICES")?,
            next_hop_routes: take(&mut ebpf, "NEXT_HOP_ROUTES")?,
            class_prefixes: HashSet::new(),
            table_index: take(&mut ebpf, "TABLE_INDEX")?,
            tables: take_raw(&mut ebpf, "TABLES")?,
            tables_mmap: None,
            clean,
            backends: take(&mut ebpf, "BACKENDS")?,
            stats: take(&mut ebpf, "STATS")?,
            class_stats: take(&mut ebpf, "CLASS_STATS")?,
            backend_stats: take(&mut ebpf, "BACKEND_STATS")?,
            local_macs: take(&mut ebpf, "LOCAL_MACS")?,
            clock_probe: take(&mut ebpf, "CLOCK_PROBE")?,
            trace_filter: take(&mut ebpf, "TRACE_FILTER")?,
            trace_events: take(&mut ebpf, "TRACE_EVENTS")?,
            tracing: false,
            ebpf,
            sizes,
            vip_refs: StdHashMap::new(),
            active_slots: StdHashMap::new(),
            free_slots: VecDeque::new(),
            links: StdHashMap::new(),
        }
        .with_recovered_bookkeeping())
    }

    /// Rebuild the writer's bookkeeping from the maps (all empty on a fresh load).
    fn with_recovered_bookkeeping(mut self) -> Self {
        self.tables_mmap =
            ArrayMmap::new(&self.tables, self.sizes.table_slots as usize * self.sizes.table_size_m as usize);
        let cps = self.sizes.classes_per_service;
        for index in 0..self.sizes.max_services * cps {
            if let Ok(r) = self.table_index.get(&index, 0) {
                if r.flags & table_flags::ACTIVE != 0 && r.slot < self.sizes.table_slots {
                    self.active_slots.insert((index / cps, index % cps), r.slot);
                }
            }
        }
        // Replaced tables still in their handshake window (a restart within it) stay intact.
        for (&key, &slot) in &self.active_slots {
            let Ok(r) = self.table_index.get(&self.table_index_of(key.0, key.1).unwrap_or(u32::MAX), 0) else {
                continue;
            };
            if r.prev_until_ns != 0 && r.prev_slot < self.sizes.table_slots && r.prev_slot != slot {
                self.clean.retiring.insert(key, clean_slots::Retiring { slot: r.prev_slot, until_ns: r.prev_until_ns });
            }
        }
        let mut used: HashSet<u32> = self.active_slots.values().copied().collect();
        used.extend(self.clean.retiring.values().map(|r| r.slot));
        self.free_slots = (0..self.sizes.table_slots).filter(|s| !used.contains(s)).collect();
        // `services` adopted the active half of SERVICE_TABLE when it was made.
        self.vip_refs = vip_refs(&self.services);
        self.recover_backend_sources();
        self.class_prefixes = self
            .client_class
            .keys()
            .filter_map(|k| k.ok())
            .map(|k| {
                (u32::from_be(k.data().service_be), trie_prefix(k.data().addr, k.prefix_len() - CLASS_KEY_SERVICE_BITS))
            })
            .collect();
        self
    }

    pub fn sizes(&self) -> &DataplaneSizes {
        &self.sizes
    }
}

/// What a failed load of the balancer's object says: a map the kernel could not allocate
/// (ENOMEM, E2BIG) is a matter of sizes, not of privileges.
fn load_error(e: aya::EbpfError, sizes: &DataplaneSizes) -> anyhow::Error {
    let errno = {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&e);
        let mut errno = None;
        while let Some(err) = source {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                errno = io.raw_os_error();
            }
            source = err.source();
        }
        errno
    };
    match errno {
        Some(libc::ENOMEM) | Some(libc::E2BIG) => {
            let mib = sizes.map_bytes().iter().map(|(_, b)| b).sum::<u64>() >> 20;
            anyhow::Error::new(e).context(format!(
                "loading the XDP object: the kernel could not allocate its maps (about {mib} MiB; see dataplane.conntrack_entries and dataplane.maglev_table_size, and the memory cgroup's or RLIMIT_MEMLOCK's limit)"
            ))
        }
        Some(libc::EPERM) | Some(libc::EACCES) => anyhow::Error::new(e).context(crate::error::NotPermitted(
            "loading the XDP object: not permitted (root, or CAP_BPF + CAP_NET_ADMIN, is required)".into(),
        )),
        _ => anyhow::Error::new(e).context("loading the XDP object (root, or CAP_BPF + CAP_NET_ADMIN, is required)"),
    }
}
