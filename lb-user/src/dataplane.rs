//! The data-plane writer: loads the XDP object with map sizes fixed at load time, writes
//! services, backends, client-class prefixes and Maglev tables, and reads counters.
//!
//! It knows nothing of policy: callers hand it finished tables. Tables are written into a free
//! slot of `TABLES` and then made active with a single `TABLE_INDEX` update, so the kernel never
//! sees a half-written table; the previous slot becomes free again. Service keys go the same way
//! through the two halves of `SERVICE_TABLE` (see `service_table`).

use std::collections::{HashMap as StdHashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use aya::maps::lpm_trie::{Key as LpmKey, LpmTrie};
use aya::maps::{Array, HashMap, MapData, PerCpuArray};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::xdp::XdpLink;
use aya::programs::{TestRun, TestRunOptions, Xdp, XdpMode};
use aya::{Ebpf, EbpfLoader};
use ipnet::IpNet;
pub use lb_common::maps::addr_words;
use lb_common::ct_table;
use lb_common::maps::{
    stat, table_flags, AddrKey, Backend, ClassCounters, ClassKey, CtEntry, CtKey, CtKey4, GlobalStats, LocalMac,
    ServiceInfo, ServiceKey, TableRef, BACKEND_DROP, CLASS_KEY_SERVICE_BITS, FAMILY_V4, FAMILY_V6, LOCAL_MAC_SLOTS,
    MAX_SERVICE_ID,
};

use crate::service_table::{self, ServiceTable};

/// A map of the balancer's object that is sized at load time.
struct SizedMap {
    name: &'static str,
    /// Pinned (by its name) under the daemon's pin directory.
    pinned: bool,
    max_entries: fn(&DataplaneSizes) -> u32,
}

/// Every map of the object that is sized at load time: the one list that names them, their
/// sizes and which are pinned. `NEXT_HOPS`, a per-CPU cache of route lookups that refills
/// itself within a second, is not pinned.
const SIZED_MAPS: &[SizedMap] = &[
    // Two halves of S slots, S >= twice the key capacity (16 keys per service).
    SizedMap { name: "SERVICE_TABLE", pinned: true, max_entries: |s| 2 * s.service_slots() },
    SizedMap { name: "SERVICE_INDEX", pinned: true, max_entries: |_| 1 },
    SizedMap { name: "VIPS", pinned: true, max_entries: |s| s.max_services.saturating_mul(4) },
    SizedMap { name: "CONNTRACK", pinned: true, max_entries: |s| s.conntrack_buckets() },
    SizedMap { name: "CONNTRACK4", pinned: true, max_entries: |s| s.conntrack_buckets() },
    SizedMap { name: "CT_SEED_STORE", pinned: true, max_entries: |_| 1 },
    SizedMap { name: "CLIENT_CLASS", pinned: true, max_entries: |s| s.class_pairs().saturating_mul(16).max(16) },
    SizedMap { name: "CLASSED_SERVICES", pinned: true, max_entries: |s| s.max_services },
    SizedMap { name: "TABLE_INDEX", pinned: true, max_entries: |s| s.class_pairs() },
    SizedMap { name: "TABLES", pinned: true, max_entries: |s| s.table_slots * s.table_size_m },
    SizedMap { name: "BACKENDS", pinned: true, max_entries: |s| s.max_backends },
    // One record of global counters; one record per (service, class).
    SizedMap { name: "STATS", pinned: true, max_entries: |_| 1 },
    SizedMap { name: "CLASS_STATS", pinned: true, max_entries: |s| s.class_pairs() },
    SizedMap { name: "NEXT_HOPS", pinned: false, max_entries: |s| s.max_backends },
    // A fixed size (the data plane indexes it by `local_mac_slot`); not pinned: each loaded
    // object has its own, filled before it is attached or swapped in.
    SizedMap { name: "LOCAL_MACS", pinned: false, max_entries: |_| LOCAL_MAC_SLOTS },
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

/// The balancer's XDP object (built by `build.rs`): `lb` and `clock_probe`, nothing else.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_OBJ"));

/// Where `build.rs` left the bench build of the balancer's object (`lb` plus the bench
/// programs, feature `bench` of lb-ebpf): only lb-tests' `dp_bench` loads it.
pub const BENCH_OBJECT_PATH: &str = env!("LB_EBPF_BENCH_OBJ");

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

    fn validate(&self) -> Result<()> {
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

/// The programs of the balancer's object. (The backend-side decapsulator is an object of its
/// own, `crate::cli::decap::Decapsulator`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// The balancer.
    Lb,
    /// Writes the data-plane clock for [`Dataplane::now_ns`]; never attached.
    ClockProbe,
}

impl Program {
    fn name(self) -> &'static str {
        match self {
            Program::Lb => "lb",
            Program::ClockProbe => "clock_probe",
        }
    }
}

/// Result of one `BPF_PROG_TEST_RUN`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestOutput {
    /// XDP action (`XDP_DROP` = 1, `XDP_PASS` = 2, `XDP_TX` = 3, `XDP_REDIRECT` = 4).
    pub action: u32,
    /// The packet as the program left it.
    pub data: Vec<u8>,
}

// XDP actions, for tests and tools that run programs (feature `test-helpers`).
#[cfg(feature = "test-helpers")]
pub const XDP_ABORTED: u32 = 0;
#[cfg(feature = "test-helpers")]
pub const XDP_DROP: u32 = 1;
#[cfg(feature = "test-helpers")]
pub const XDP_PASS: u32 = 2;
#[cfg(feature = "test-helpers")]
pub const XDP_TX: u32 = 3;
#[cfg(feature = "test-helpers")]
pub const XDP_REDIRECT: u32 = 4;

/// Counters of one (service, class).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    pub service: u32,
    pub class: u32,
    pub packets: u64,
    pub bytes: u64,
    pub new_flows: u64,
    pub spills: u64,
}

/// All counters, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Indexed by `lb_common::maps::stat::*` (`stat::NAMES` names them).
    pub global: Vec<u64>,
    /// Only pairs with a non-zero counter.
    pub classes: Vec<ClassStats>,
}

impl Stats {
    pub fn get(&self, index: u32) -> u64 {
        self.global.get(index as usize).copied().unwrap_or(0)
    }

    /// Counters of a service: the sum over its classes (`class` field = 0).
    pub fn service(&self, service: u32) -> ClassStats {
        self.classes.iter().filter(|c| c.service == service).fold(
            ClassStats { service, ..Default::default() },
            |a, c| ClassStats {
                packets: a.packets + c.packets,
                bytes: a.bytes + c.bytes,
                new_flows: a.new_flows + c.new_flows,
                spills: a.spills + c.spills,
                ..a
            },
        )
    }

    pub fn class(&self, service: u32, class: u32) -> ClassStats {
        self.classes
            .iter()
            .find(|c| c.service == service && c.class == class)
            .copied()
            .unwrap_or(ClassStats { service, class, ..Default::default() })
    }
}

/// A loaded data plane: the programs and typed handles to every map.
pub struct Dataplane {
    ebpf: Ebpf,
    sizes: DataplaneSizes,
    services: ServiceTable,
    vips: HashMap<MapData, AddrKey, u32>,
    conntrack: Array<MapData, ct_table::Bucket6>,
    conntrack4: Array<MapData, ct_table::Bucket4>,
    /// The connection tables' bucket hash seed (the data plane's `CT_SEED`).
    ct_seed: u64,
    client_class: LpmTrie<MapData, ClassKey, u32>,
    /// Service id -> 1 if it has client-class prefixes (the kernel consults the trie only then).
    classed_services: Array<MapData, u32>,
    /// The (service, prefix) pairs in `CLIENT_CLASS`, to keep `classed_services` exact.
    class_prefixes: HashSet<(u32, IpNet)>,
    table_index: Array<MapData, TableRef>,
    /// Kept as the raw map: tables are written through `tables_mmap`, or with one
    /// BPF_MAP_UPDATE_BATCH each where the map cannot be mapped (pinned by an older version).
    tables: aya::maps::Map,
    tables_mmap: Option<TableMmap>,
    backends: Array<MapData, Backend>,
    stats: PerCpuArray<MapData, GlobalStats>,
    class_stats: PerCpuArray<MapData, ClassCounters>,
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

/// The 128-bit trie address of a client prefix and its prefix length: IPv4 as `::ffff:a.b.c.d`.
fn class_prefix(net: IpNet) -> ([u32; 4], u32) {
    match net {
        IpNet::V4(n) => ([0, 0, 0xffffu32.to_be(), u32::from_ne_bytes(n.network().octets())], 96 + n.prefix_len() as u32),
        IpNet::V6(n) => (addr_words(IpAddr::V6(n.network())).0, n.prefix_len() as u32),
    }
}

/// The form the writer keeps a client prefix in (what reading it back from the trie gives):
/// `::ffff:198.19.0.0/112` and `198.19.0.0/16` are one trie key, so one prefix.
fn canonical_prefix(net: IpNet) -> IpNet {
    let (addr, len) = class_prefix(net.trunc());
    trie_prefix(addr, len)
}

/// The client prefix of a trie key (inverse of [`class_prefix`]).
fn trie_prefix(addr: [u32; 4], len: u32) -> IpNet {
    let bytes: Vec<u8> = addr.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes.as_slice()).unwrap_or([0; 16]));
    match v6.to_ipv4_mapped() {
        Some(v4) if len >= 96 => IpNet::V4(ipnet::Ipv4Net::new(v4, (len - 96) as u8).unwrap_or_default()),
        _ => IpNet::V6(ipnet::Ipv6Net::new(v6, len.min(128) as u8).unwrap_or_default()),
    }
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
        let mut ebpf = settings
            .apply(&mut loader)
            .load(EBPF_OBJECT)
            .context("loading the XDP object (root, or CAP_BPF + CAP_NET_ADMIN, is required)")?;
        for p in [Program::Lb, Program::ClockProbe] {
            verify(&mut ebpf, p.name())?;
        }
        let mut seed_store: Array<MapData, u64> = take(&mut ebpf, "CT_SEED_STORE")?;
        seed_store.set(0, ct_seed, 0).context("writing CT_SEED_STORE")?;
        Ok(Self {
            ct_seed,
            services: ServiceTable::new(take_raw(&mut ebpf, "SERVICE_TABLE")?, take_raw(&mut ebpf, "SERVICE_INDEX")?, sizes.service_slots())?,
            vips: take(&mut ebpf, "VIPS")?,
            conntrack: take(&mut ebpf, "CONNTRACK")?,
            conntrack4: take(&mut ebpf, "CONNTRACK4")?,
            client_class: take(&mut ebpf, "CLIENT_CLASS")?,
            classed_services: take(&mut ebpf, "CLASSED_SERVICES")?,
            class_prefixes: HashSet::new(),
            table_index: take(&mut ebpf, "TABLE_INDEX")?,
            tables: take_raw(&mut ebpf, "TABLES")?,
            tables_mmap: None,
            backends: take(&mut ebpf, "BACKENDS")?,
            stats: take(&mut ebpf, "STATS")?,
            class_stats: take(&mut ebpf, "CLASS_STATS")?,
            local_macs: take(&mut ebpf, "LOCAL_MACS")?,
            clock_probe: take(&mut ebpf, "CLOCK_PROBE")?,
            ebpf,
            sizes,
            vip_refs: StdHashMap::new(),
            active_slots: StdHashMap::new(),
            free_slots: VecDeque::new(),
        }
        .with_recovered_bookkeeping())
    }

    /// Rebuild the writer's bookkeeping from the maps (all empty on a fresh load).
    fn with_recovered_bookkeeping(mut self) -> Self {
        self.tables_mmap = ArrayMmap::new(&self.tables, self.sizes.table_slots as usize * self.sizes.table_size_m as usize);
        let cps = self.sizes.classes_per_service;
        for index in 0..self.sizes.max_services * cps {
            if let Ok(r) = self.table_index.get(&index, 0) {
                if r.flags & table_flags::ACTIVE != 0 && r.slot < self.sizes.table_slots {
                    self.active_slots.insert((index / cps, index % cps), r.slot);
                }
            }
        }
        let used: HashSet<u32> = self.active_slots.values().copied().collect();
        self.free_slots = (0..self.sizes.table_slots).filter(|s| !used.contains(s)).collect();
        // `services` adopted the active half of SERVICE_TABLE when it was made.
        self.vip_refs = vip_refs(&self.services);
        self.class_prefixes = self
            .client_class
            .keys()
            .filter_map(|k| k.ok())
            .map(|k| (u32::from_be(k.data().service_be), trie_prefix(k.data().addr, k.prefix_len() - CLASS_KEY_SERVICE_BITS)))
            .collect();
        self
    }

    /// The service keys in the active half of `SERVICE_TABLE`, with their services, as the
    /// kernel reads them (after a restart: what the previous daemon installed).
    pub fn installed_services(&self) -> Vec<(ServiceKey, ServiceInfo)> {
        self.services.read_active().unwrap_or_default()
    }

    /// Whether service table halves are written through a shared mapping.
    pub fn service_table_mapped(&self) -> bool {
        self.services.mapped()
    }

    pub fn sizes(&self) -> &DataplaneSizes {
        &self.sizes
    }

    /// Installs (or updates) one service under each of its keys (VIP, port, protocol).
    pub fn set_service(&mut self, keys: &[ServiceKey], info: ServiceInfo) -> Result<()> {
        self.update_services(&[(keys, &info)], &[])
    }

    /// Removes service keys; a VIP address stops being ours when its last key is gone (after
    /// the table without the keys is active).
    pub fn remove_service_keys(&mut self, keys: &[ServiceKey]) -> Result<()> {
        self.update_services(&[], keys)
    }

    /// Installs services (each under its keys) and removes keys, with one rebuild and flip of
    /// the service table for the whole batch (a reconcile that changes many services publishes
    /// once). `VIPS` gains new addresses before the table that uses them is active and loses
    /// addresses only after the table without them is; if the batch does not fit, nothing is
    /// published and the VIPs it added are taken back.
    pub fn update_services(&mut self, set: &[(&[ServiceKey], &ServiceInfo)], remove: &[ServiceKey]) -> Result<()> {
        if let Some((_, info)) = set.iter().find(|(_, info)| info.id >= self.sizes.max_services) {
            bail!("service id {} out of range (max_services {})", info.id, self.sizes.max_services);
        }
        let mut added = Vec::new();
        for (keys, info) in set {
            for key in keys.iter() {
                let vip = addr_key(key.addr, key.family);
                if !self.vip_refs.contains_key(&vip) && !added.contains(&vip) {
                    if let Err(e) = self.vips.insert(vip, info.id, 0) {
                        self.take_back_vips(&added);
                        return Err(anyhow::Error::from(e).context("writing VIPS"));
                    }
                    added.push(vip);
                }
            }
        }
        let entries: Vec<(ServiceKey, ServiceInfo)> =
            set.iter().flat_map(|(keys, info)| keys.iter().map(move |k| (*k, **info))).collect();
        if let Err(e) = self.services.update(&entries, remove) {
            self.take_back_vips(&added);
            return Err(e.context("writing the service table"));
        }
        let mut now = vip_refs(&self.services);
        let gone: Vec<AddrKey> = self.vip_refs.keys().filter(|v| !now.contains_key(v)).copied().collect();
        let mut failed = None;
        for vip in gone {
            if let Err(e) = self.vips.remove(&vip) {
                // Still in VIPS: kept in the count (with none left), so a later change retries.
                now.insert(vip, 0);
                failed.get_or_insert(e);
            }
        }
        self.vip_refs = now;
        match failed {
            Some(e) => Err(anyhow::Error::from(e).context("removing from VIPS")),
            None => Ok(()),
        }
    }

    /// Removes VIPs added for a batch that was not published.
    fn take_back_vips(&mut self, added: &[AddrKey]) {
        for vip in added {
            let _ = self.vips.remove(vip);
        }
    }

    /// Writes a backend slot (address, MAC, zone, state flags, drain deadline).
    pub fn set_backend(&mut self, id: u32, backend: Backend) -> Result<()> {
        if id >= self.sizes.max_backends {
            bail!("backend id {id} out of range (max_backends {})", self.sizes.max_backends);
        }
        self.backends.set(id, backend, 0).context("writing BACKENDS")?;
        Ok(())
    }

    pub fn backend(&self, id: u32) -> Result<Backend> {
        Ok(self.backends.get(&id, 0)?)
    }

    /// Updates only the state of a backend: `backend_flags` and the drain deadline
    /// (data-plane clock, see [`Dataplane::now_ns`]) that applies with REMOVED.
    pub fn set_backend_state(&mut self, id: u32, flags: u8, drain_deadline_ns: u64) -> Result<()> {
        let mut b = self.backend(id).with_context(|| format!("reading backend {id}"))?;
        b.flags = flags;
        b.drain_deadline_ns = drain_deadline_ns;
        self.set_backend(id, b)
    }

    /// Maps clients of `service` in `prefix` to `class` (longest prefix wins).
    pub fn set_class_prefix(&mut self, service: u32, prefix: IpNet, class: u32) -> Result<()> {
        if class >= self.sizes.classes_per_service || service >= self.sizes.max_services {
            bail!(
                "(service {service}, class {class}) out of range (max_services {}, classes_per_service {})",
                self.sizes.max_services,
                self.sizes.classes_per_service
            );
        }
        let (addr, len) = class_prefix(prefix.trunc());
        let key = LpmKey::new(CLASS_KEY_SERVICE_BITS + len, ClassKey { service_be: service.to_be(), addr });
        self.client_class.insert(&key, class, 0).context("writing CLIENT_CLASS")?;
        // After the prefix: a packet that sees the flag finds it. Recorded once both are in.
        if !self.class_prefixes.contains(&(service, canonical_prefix(prefix))) {
            self.classed_services.set(service, 1, 0).context("writing CLASSED_SERVICES")?;
            self.class_prefixes.insert((service, canonical_prefix(prefix)));
        }
        Ok(())
    }

    pub fn remove_class_prefix(&mut self, service: u32, prefix: IpNet) -> Result<()> {
        let (addr, len) = class_prefix(prefix.trunc());
        let key = LpmKey::new(CLASS_KEY_SERVICE_BITS + len, ClassKey { service_be: service.to_be(), addr });
        self.class_prefixes.remove(&(service, canonical_prefix(prefix)));
        // The flag goes before the last prefix does.
        if !self.class_prefixes.iter().any(|(s, _)| *s == service) {
            self.classed_services.set(service, 0, 0).context("writing CLASSED_SERVICES")?;
        }
        match self.client_class.remove(&key) {
            // Not there (a repair after a failed write removes what may have been added): done.
            Err(aya::maps::MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.context("removing from CLIENT_CLASS"),
        }
    }

    fn table_index_of(&self, service: u32, class: u32) -> Result<u32> {
        if service >= self.sizes.max_services || class >= self.sizes.classes_per_service {
            bail!("(service {service}, class {class}) out of range");
        }
        Ok(service * self.sizes.classes_per_service + class)
    }

    /// Writes the Maglev table of (service, class) into a free slot, then activates it with one
    /// `TABLE_INDEX` update and frees the previous slot. `flags` are `table_flags` bits (ACTIVE
    /// is added). Returns the slot used.
    pub fn write_table(&mut self, service: u32, class: u32, flags: u32, entries: &[u32]) -> Result<u32> {
        let index = self.table_index_of(service, class)?;
        let m = self.sizes.table_size_m;
        if entries.len() != m as usize {
            bail!("table has {} entries, M is {m}", entries.len());
        }
        if let Some(bad) = entries.iter().find(|&&b| b != BACKEND_DROP && b >= self.sizes.max_backends) {
            bail!("table names backend {bad}, beyond max_backends {}", self.sizes.max_backends);
        }
        let slot = self.free_slots.pop_front().ok_or_else(|| anyhow!("no free table slot (table_slots {})", self.sizes.table_slots))?;
        let written = (|| -> Result<()> {
            match self.tables_mmap.as_mut() {
                Some(mapping) => mapping.write(slot as usize * m as usize, entries),
                None => {
                    let keys: Vec<u32> = (slot * m..slot * m + m).collect();
                    update_batch(&self.tables, &keys, entries)?;
                }
            }
            self.table_index.set(index, TableRef { slot, flags: flags | table_flags::ACTIVE }, 0)?;
            Ok(())
        })();
        if let Err(e) = written {
            self.free_slots.push_front(slot);
            return Err(e.context("writing a table"));
        }
        if let Some(old) = self.active_slots.insert((service, class), slot) {
            self.free_slots.push_back(old);
        }
        Ok(slot)
    }

    /// Whether the controller's next state `new` (after `old`, what it last wrote) fits the
    /// sizes and free room of this data plane, checked before the controller writes any of it:
    /// ids, table slots (simulating the writes in order), service keys (the service table's
    /// own build, dry), `VIPS` and `CLIENT_CLASS` entries.
    pub fn admit(&self, old: Option<&crate::compile::Compiled>, new: &crate::compile::Compiled) -> Result<()> {
        let s = &self.sizes;
        for svc in &new.services {
            if svc.id >= s.max_services {
                bail!("service {:?} would get id {}; the data plane holds ids below {} (max_services)", svc.name, svc.id, s.max_services);
            }
            if let Some(t) = svc.tables.iter().find(|t| t.class >= s.classes_per_service) {
                bail!("service {:?} has client class {}; the data plane holds {} classes per service", svc.name, t.class, s.classes_per_service);
            }
        }
        if let Some((id, _)) = new.backends.iter().find(|(id, _)| *id >= s.max_backends) {
            bail!("a backend would get id {id}; the data plane holds ids below {} (max_backends)", s.max_backends);
        }
        // A table of a new (service, class) takes a free slot for good; a rewrite takes one and
        // frees its old one.
        let mut free = self.free_slots.len();
        for (svc, t) in crate::controller::tables_to_write(old, new) {
            if free == 0 {
                bail!("the new tables need more Maglev table slots than the {} the data plane has (table_slots)", s.table_slots);
            }
            if !self.active_slots.contains_key(&(svc.id, t.class)) {
                free -= 1;
            }
        }
        let keys = new.services.iter().flat_map(|svc| svc.keys.iter().map(move |k| (k, &svc.info)));
        self.services.check_fits(keys.clone()).context("service keys (one per port of each service)")?;
        // New VIPs are added before the old ones go.
        let mut vips: HashSet<AddrKey> = self.vip_refs.keys().copied().collect();
        vips.extend(keys.map(|(k, _)| addr_key(k.addr, k.family)));
        let vip_capacity = self.sizes.map_max_entries().iter().find(|(n, _)| *n == "VIPS").map_or(0, |(_, c)| *c);
        if vips.len() > vip_capacity as usize {
            bail!("{} VIP addresses (old and new while the change is applied) exceed the {vip_capacity} the data plane holds", vips.len());
        }
        // Prefixes are added before the ones that go are removed: at most the installed ones
        // and the new ones at once.
        let mut prefixes = self.class_prefixes.clone();
        prefixes.extend(new.services.iter().flat_map(|svc| svc.class_prefixes.iter().map(move |(net, _)| (svc.id, canonical_prefix(*net)))));
        let prefix_capacity = self.sizes.map_max_entries().iter().find(|(n, _)| *n == "CLIENT_CLASS").map_or(0, |(_, c)| *c);
        if prefixes.len() > prefix_capacity as usize {
            bail!(
                "{} client-class prefixes (installed and new while the change is applied; {} installed) exceed the {prefix_capacity} the data plane holds",
                prefixes.len(),
                self.class_prefixes.len()
            );
        }
        Ok(())
    }

    /// Before the first reconcile on an adopted data plane: removes what the predecessor left
    /// that `kept` (what the controller is about to write) does not have, which the controller,
    /// starting without a picture of it, cannot diff away, and which would otherwise take room
    /// the new configuration needs: service keys (and with them VIPs), client-class prefixes,
    /// tables. Returns (keys, prefixes, tables) removed. (Its backends are flagged only once the
    /// new tables are written, [`Dataplane::depart_unused_backends`]: if the start fails before,
    /// their flows go on.)
    pub fn sweep_unowned(&mut self, kept: &crate::compile::Compiled) -> Result<(usize, usize, usize)> {
        let keys: HashSet<[u32; 5]> = kept.services.iter().flat_map(|s| s.keys.iter().map(|k| k.words())).collect();
        let stale_keys: Vec<ServiceKey> = self.services.installed().map(|(k, _)| *k).filter(|k| !keys.contains(&k.words())).collect();
        if !stale_keys.is_empty() {
            self.update_services(&[], &stale_keys)?;
        }
        let prefixes: HashSet<(u32, IpNet)> =
            kept.services.iter().flat_map(|s| s.class_prefixes.iter().map(move |(n, _)| (s.id, canonical_prefix(*n)))).collect();
        let stale_prefixes: Vec<(u32, IpNet)> = self.class_prefixes.iter().filter(|p| !prefixes.contains(p)).copied().collect();
        for (service, net) in &stale_prefixes {
            self.remove_class_prefix(*service, *net)?;
        }
        let tables: HashSet<(u32, u32)> = kept.services.iter().flat_map(|s| s.tables.iter().map(move |t| (s.id, t.class))).collect();
        let stale_tables: Vec<(u32, u32)> = self.active_slots.keys().filter(|p| !tables.contains(p)).copied().collect();
        for (service, class) in &stale_tables {
            self.remove_table(*service, *class)?;
        }
        Ok((stale_keys.len(), stale_prefixes.len(), stale_tables.len()))
    }

    /// After the first reconcile on an adopted data plane: flags the backend records of ids
    /// `kept` (what the controller wrote) does not use as REMOVED, draining until
    /// `now + drain_ns(id)`; one that was draining already keeps its deadline. Returns how many.
    pub fn depart_unused_backends(&mut self, kept: &crate::compile::Compiled, now: u64, drain_ns: &dyn Fn(u32) -> u64) -> Result<usize> {
        let used: HashSet<u32> = kept.backends.iter().map(|(id, _)| *id).collect();
        let mut backends = 0;
        for id in (0..self.sizes.max_backends).filter(|id| !used.contains(id)) {
            let b = self.backend(id)?;
            if b.family != 0 && b.flags & lb_common::maps::backend_flags::REMOVED == 0 {
                self.set_backend_state(id, b.flags | lb_common::maps::backend_flags::REMOVED, now + drain_ns(id))?;
                backends += 1;
            }
        }
        Ok(backends)
    }

    /// Changes the flags of the active table of (service, class) without rewriting it.
    pub fn set_table_flags(&mut self, service: u32, class: u32, flags: u32) -> Result<()> {
        let index = self.table_index_of(service, class)?;
        let slot = *self.active_slots.get(&(service, class)).ok_or_else(|| anyhow!("no table for ({service}, {class})"))?;
        self.table_index.set(index, TableRef { slot, flags: flags | table_flags::ACTIVE }, 0)?;
        Ok(())
    }

    /// The active table of (service, class), as the kernel reads it.
    pub fn read_table(&self, service: u32, class: u32) -> Result<Option<(TableRef, Vec<u32>)>> {
        let r = self.table_index.get(&self.table_index_of(service, class)?, 0)?;
        if r.flags & table_flags::ACTIVE == 0 {
            return Ok(None);
        }
        let m = self.sizes.table_size_m;
        let tables: Array<&MapData, u32> = Array::try_from(&self.tables)?;
        let entries = (0..m).map(|i| tables.get(&(r.slot * m + i), 0)).collect::<Result<Vec<_>, _>>()?;
        Ok(Some((r, entries)))
    }

    /// Deactivates the table of (service, class) and frees its slot.
    pub fn remove_table(&mut self, service: u32, class: u32) -> Result<()> {
        let index = self.table_index_of(service, class)?;
        if let Some(&slot) = self.active_slots.get(&(service, class)) {
            // The slot stays in the entry, only ACTIVE goes: the kernel reads the flags and the
            // slot as two loads, so one that saw ACTIVE still reads this table's slot (which
            // the FIFO of free slots keeps intact for a long while).
            self.table_index.set(index, TableRef { slot, flags: 0 }, 0)?;
            self.active_slots.remove(&(service, class));
            self.free_slots.push_back(slot);
        }
        Ok(())
    }

    /// Whether tables are written through a shared mapping (else one batch syscall each).
    pub fn tables_mapped(&self) -> bool {
        self.tables_mmap.is_some()
    }

    /// Number of free table slots.
    pub fn free_table_slots(&self) -> usize {
        self.free_slots.len()
    }

    /// The connection-table entry of a flow of `family` (`FAMILY_V4` or `FAMILY_V6`; IPv4 flows
    /// live in `CONNTRACK4`, keyed by the packed form of `key`). For tests and inspection: the
    /// bucket is copied with one syscall and not re-checked against the slot's state word, so
    /// a packet writing the same slot at that instant can make the copy inconsistent.
    pub fn conntrack_get(&self, family: u8, key: &CtKey) -> Option<CtEntry> {
        match family {
            FAMILY_V4 => table_get(&self.conntrack4, &CtKey4::new(&key.tuple, key.service), self.ct_seed),
            _ => table_get(&self.conntrack, key, self.ct_seed),
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
            FAMILY_V6 => table_set(&mut self.conntrack, key, &entry, self.ct_seed).context("writing CONNTRACK"),
            _ => bail!("conntrack_set: family {family} is neither FAMILY_V4 nor FAMILY_V6"),
        }
    }

    /// Every connection-table entry of both families: (family, key, entry).
    pub fn conntrack_entries(&self) -> Vec<(u8, CtKey, CtEntry)> {
        let v4 = live_slots(&self.conntrack4).map(|s| (FAMILY_V4, s.key.to_key(), s.entry));
        let v6 = live_slots(&self.conntrack).map(|s| (FAMILY_V6, s.key, s.entry));
        v4.chain(v6).collect()
    }

    /// All counters, summed over CPUs.
    pub fn stats(&self) -> Result<Stats> {
        let global = global_counters(&self.stats)?;
        let mut classes = Vec::new();
        let cps = self.sizes.classes_per_service;
        for service in 0..self.sizes.max_services {
            for class in 0..cps {
                let per_cpu = self.class_stats.get(&(service * cps + class), 0)?;
                let c = per_cpu.iter().fold(ClassStats { service, class, ..Default::default() }, |a, v| ClassStats {
                    packets: a.packets + v.packets,
                    bytes: a.bytes + v.bytes,
                    new_flows: a.new_flows + v.new_flows,
                    spills: a.spills + v.spills,
                    ..a
                });
                if c.packets + c.bytes + c.new_flows + c.spills != 0 {
                    classes.push(c);
                }
            }
        }
        Ok(Stats { global, classes })
    }

    /// Registers `ifindex` as an interface `lb` balances on, with its MAC: `lb` balances only
    /// frames sent to the ingress device's registered MAC (others pass, counted as
    /// `pass_not_our_mac`). Refuses a second interface in the same `LOCAL_MACS` slot.
    pub fn set_local_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> Result<()> {
        let slot = lb_common::maps::local_mac_slot(ifindex);
        let old = self.local_macs.get(&slot, 0).context("reading LOCAL_MACS")?;
        if old.ifindex != 0 && old.ifindex != ifindex {
            bail!(
                "interfaces {} and {ifindex} share slot {slot} of LOCAL_MACS (ifindexes equal modulo {})",
                old.ifindex,
                LOCAL_MAC_SLOTS
            );
        }
        self.local_macs.set(slot, LocalMac { ifindex, mac, _pad: [0; 2] }, 0).context("writing LOCAL_MACS")
    }

    /// Registers `ifname` (its index and current MAC, see [`Dataplane::set_local_mac`]).
    pub fn register_interface(&mut self, ifname: &str) -> Result<()> {
        let (ifindex, mac) = interface_mac(ifname)?;
        self.set_local_mac(ifindex, mac)
    }

    /// Attaches a program to an interface, native (driver) mode first, else generic.
    /// Returns the mode used. The attachment lives as long as this `Dataplane`. The interface
    /// is registered first (`set_local_mac`), so the first packet already finds its MAC.
    pub fn attach(&mut self, ifname: &str, p: Program) -> Result<XdpMode> {
        self.register_interface(ifname)?;
        attach(&mut self.ebpf, p.name(), ifname)
    }

    /// Attaches a program to an interface through a bpf_link pinned at `link_pin`, so that it
    /// stays attached when this process exits. If a link is already pinned there (a previous
    /// daemon), its program is replaced atomically: no packet sees the interface without XDP.
    pub fn attach_pinned(&mut self, ifname: &str, p: Program, link_pin: &Path) -> Result<XdpMode> {
        self.register_interface(ifname)?;
        attach_pinned(&mut self.ebpf, p.name(), ifname, link_pin)
    }

    /// The data-plane clock now (ns; jiffies times the tick length, the kernel's jiffies epoch),
    /// read by running `clock_probe`, so it is exactly the clock the balancer stamps entries
    /// and compares drain deadlines with.
    pub fn now_ns(&self) -> Result<u64> {
        run_test(&self.ebpf, Program::ClockProbe.name(), &[0u8; 64], 0).context("running clock_probe")?;
        self.clock_probe.get(&0, 0).context("reading CLOCK_PROBE")
    }

    /// Runs a program once on `packet` with `BPF_PROG_TEST_RUN` (feature `test-helpers`).
    /// `ingress_ifindex` 0 means the loopback device of the calling thread's network namespace.
    #[cfg(feature = "test-helpers")]
    pub fn run_test(&self, p: Program, packet: &[u8], ingress_ifindex: u32) -> Result<TestOutput> {
        run_test(&self.ebpf, p.name(), packet, ingress_ifindex)
    }
}

/// The global counters of an object's `STATS` record, summed over CPUs.
pub(crate) fn global_counters(stats: &PerCpuArray<MapData, GlobalStats>) -> Result<Vec<u64>> {
    let mut global = vec![0u64; stat::GLOBAL_COUNT as usize];
    for cpu in stats.get(&0, 0)?.iter() {
        for (sum, v) in global.iter_mut().zip(cpu.counters.iter()) {
            *sum += v;
        }
    }
    Ok(global)
}

/// Verifies (loads into the kernel) the XDP program `name` of `ebpf`.
pub(crate) fn verify(ebpf: &mut Ebpf, name: &str) -> Result<()> {
    load_program(xdp_mut(ebpf, name)?).with_context(|| format!("verifying program {name}"))
}

fn xdp_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp> {
    Ok(ebpf.program_mut(name).ok_or_else(|| anyhow!("program {name} missing"))?.try_into()?)
}

/// Attaches the program `name` of `ebpf` to an interface, native (driver) mode first, else
/// generic. Returns the mode used. The attachment lives as long as `ebpf`.
pub(crate) fn attach(ebpf: &mut Ebpf, name: &str, ifname: &str) -> Result<XdpMode> {
    let prog = xdp_mut(ebpf, name)?;
    match prog.attach(ifname, XdpMode::Driver) {
        Ok(_) => Ok(XdpMode::Driver),
        Err(native) => {
            prog.attach(ifname, XdpMode::Skb)
                .with_context(|| format!("attaching {name} to {ifname} (native mode failed: {native})"))?;
            Ok(XdpMode::Skb)
        }
    }
}

/// Attaches the program `name` of `ebpf` to an interface through a bpf_link pinned at
/// `link_pin`, so that it stays attached when this process exits. If a link is already pinned
/// there, its program is replaced atomically: no packet sees the interface without XDP.
pub(crate) fn attach_pinned(ebpf: &mut Ebpf, name: &str, ifname: &str, link_pin: &Path) -> Result<XdpMode> {
    let prog = xdp_mut(ebpf, name)?;
    if link_pin.exists() {
        let pinned = PinnedLink::from_pin(link_pin).with_context(|| format!("opening {}", link_pin.display()))?;
        let link = XdpLink::try_from(FdLink::from(pinned)).context("pinned link is not an XDP link")?;
        let id = prog.attach_to_link(link).with_context(|| format!("replacing the program on {ifname}"))?;
        // The pin keeps the link (and so the attachment); our fd to it can go.
        drop(prog.take_link(id)?);
        return Ok(XdpMode::Default);
    }
    let (id, mode) = match prog.attach(ifname, XdpMode::Driver) {
        Ok(id) => (id, XdpMode::Driver),
        Err(native) => {
            let id = prog
                .attach(ifname, XdpMode::Skb)
                .with_context(|| format!("attaching {name} to {ifname} (native mode failed: {native})"))?;
            (id, XdpMode::Skb)
        }
    };
    let link = FdLink::try_from(prog.take_link(id)?).context("the kernel gave no bpf_link for XDP (needs Linux 5.9+)")?;
    link.pin(link_pin).with_context(|| format!("pinning the XDP link at {}", link_pin.display()))?;
    Ok(mode)
}

/// Runs the program `name` of `ebpf` once on `packet` with `BPF_PROG_TEST_RUN`.
/// `ingress_ifindex` 0 means the loopback device of the calling thread's network namespace.
pub(crate) fn run_test(ebpf: &Ebpf, name: &str, packet: &[u8], ingress_ifindex: u32) -> Result<TestOutput> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    // Room for the headers an encapsulation adds.
    let mut out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ctx_in: if ingress_ifindex != 0 { Some(&ctx) } else { None },
        repeat: 1,
        ..Default::default()
    };
    let prog: &Xdp = ebpf.program(name).ok_or_else(|| anyhow!("program {name} missing"))?.try_into()?;
    let r = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
    out.truncate(r.data_size_out as usize);
    Ok(TestOutput { action: r.return_value, data: out })
}

/// An interface's index and MAC (`SIOCGIFHWADDR`), in the calling thread's network namespace.
fn interface_mac(ifname: &str) -> Result<(u32, [u8; 6])> {
    let name = std::ffi::CString::new(ifname).context("interface name")?;
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        bail!("no interface {ifname}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a zeroed ifreq with the name copied in (shorter than IFNAMSIZ, checked), on a
    // socket we own and close; the ioctl writes only into the ifreq.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        let bytes = name.as_bytes();
        if bytes.len() >= req.ifr_name.len() {
            bail!("interface name {ifname} is too long");
        }
        for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        let rc = libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            bail!("reading the MAC of {ifname}: {err}");
        }
        let data = req.ifr_ifru.ifru_hwaddr.sa_data;
        Ok((ifindex, std::array::from_fn(|i| data[i] as u8)))
    }
}

/// A shared mapping of a BPF_F_MMAPABLE array map (`TABLES`, `SERVICE_TABLE`): writes land in
/// the map directly. The index flip that follows is a syscall, which orders these stores
/// before it. An array map stores each element in a slot of its size rounded up to 8 bytes, so
/// element `i` is at byte `stride * i` of the mapping (a u32 in the low-address half of its
/// 8-byte slot, a 64-byte `ServiceSlot` exactly at `64 * i`).
pub(crate) struct ArrayMmap<T> {
    ptr: *mut u8,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

type TableMmap = ArrayMmap<u32>;

// SAFETY: the mapping is owned by one writer and only written through `&mut self`.
unsafe impl<T> Send for ArrayMmap<T> {}

impl<T: Copy> ArrayMmap<T> {
    const STRIDE: usize = std::mem::size_of::<T>().div_ceil(8) * 8;

    fn bytes(len: usize) -> usize {
        (len * Self::STRIDE).div_ceil(4096) * 4096
    }

    /// A mapping of the first `entries` elements; None if the map was not created mmapable
    /// (e.g. pinned by an older daemon).
    pub(crate) fn new(map: &aya::maps::Map, entries: usize) -> Option<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        const { assert!(std::mem::align_of::<T>() <= 8) };
        let aya::maps::Map::Array(data) = map else { return None };
        // SAFETY: mapping a map fd we own; the kernel checks the size and the flag.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::bytes(entries),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Self { ptr: ptr as *mut u8, len: entries, _elem: std::marker::PhantomData })
    }

    pub(crate) fn write(&mut self, at: usize, values: &[T]) {
        assert!(at + values.len() <= self.len, "write beyond the mapped array");
        for (i, v) in values.iter().enumerate() {
            // SAFETY: in bounds (checked), the mapping lives as long as self; the element is
            // written at the start of its own slot, which is 8-byte aligned (page-aligned base,
            // stride a multiple of 8) and at least as large as T.
            unsafe { (self.ptr.add((at + i) * Self::STRIDE) as *mut T).write(*v) };
        }
    }

    pub(crate) fn read(&self, at: usize, count: usize) -> Vec<T> {
        assert!(at + count <= self.len, "read beyond the mapped array");
        // SAFETY: as in `write`.
        (at..at + count).map(|i| unsafe { (self.ptr.add(i * Self::STRIDE) as *const T).read() }).collect()
    }
}

impl<T> Drop for ArrayMmap<T> {
    fn drop(&mut self) {
        let stride = std::mem::size_of::<T>().div_ceil(8) * 8;
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, (self.len * stride).div_ceil(4096) * 4096) };
    }
}

/// Service keys per VIP address of the installed keys.
fn vip_refs(services: &ServiceTable) -> StdHashMap<AddrKey, usize> {
    let mut refs = StdHashMap::new();
    for (key, _) in services.installed() {
        *refs.entry(addr_key(key.addr, key.family)).or_default() += 1;
    }
    refs
}

/// Writes `values[i]` at `keys[i]` of an array map with one `BPF_MAP_UPDATE_BATCH` (Linux 5.6+)
/// instead of one syscall per entry: a 65537-entry table costs one syscall, not 65537.
pub(crate) fn update_batch<V: Copy>(map: &aya::maps::Map, keys: &[u32], values: &[V]) -> Result<()> {
    use std::os::fd::{AsFd, AsRawFd};
    const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
    /// `union bpf_attr`'s `batch` member.
    #[repr(C)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    let aya::maps::Map::Array(data) = map else { bail!("batch update: not an array map") };
    if keys.len() != values.len() {
        bail!("batch update: {} keys, {} values", keys.len(), values.len());
    }
    let mut done = 0usize;
    // The kernel may stop early (count is written back); continue from there.
    while done < keys.len() {
        let mut attr = BatchAttr {
            in_batch: 0,
            out_batch: 0,
            keys: keys[done..].as_ptr() as u64,
            values: values[done..].as_ptr() as u64,
            count: (keys.len() - done) as u32,
            map_fd: data.fd().as_fd().as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: attr points at live key/value buffers of `count` elements each.
        let rc = unsafe {
            libc::syscall(libc::SYS_bpf, BPF_MAP_UPDATE_BATCH, &mut attr as *mut BatchAttr, std::mem::size_of::<BatchAttr>() as u32)
        };
        if rc != 0 {
            bail!("BPF_MAP_UPDATE_BATCH: {}", std::io::Error::last_os_error());
        }
        if attr.count == 0 {
            bail!("BPF_MAP_UPDATE_BATCH made no progress");
        }
        done += attr.count as usize;
    }
    Ok(())
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
    Some(*b[k / ct_table::WAYS].slots[k % ct_table::WAYS].entry())
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
    let k = ct_table::victim([&b[0], &b[1]], key, &mut ct_table::Search::default()).index as usize;
    let (which, way) = (k / ct_table::WAYS, k % ct_table::WAYS);
    // A slot caught mid-write would be written back in that state, and nothing would ever
    // clear it: refuse (the caller may retry).
    if b[which].slots.iter().any(|s| ct_table::slot_state(s) & ct_table::state::WRITING != 0) {
        bail!("the data plane is writing bucket {} of the connection table", index[which]);
    }
    let slot = &mut b[which].slots[way];
    let state = ct_table::slot_state(slot);
    slot.set(key, entry);
    // Written whole, with the state word: not WRITING, next version, live.
    let next = ct_table::next_state(state & !ct_table::state::WRITING, true);
    unsafe { core::ptr::write(slot.state_mut(), next) };
    map.set(index[which], b[which], 0)?;
    Ok(())
}

/// The live slots of a connection table.
fn live_slots<S: ct_table::Slot>(map: &Array<MapData, ct_table::Bucket<S>>) -> impl Iterator<Item = S> + '_
where
    ct_table::Bucket<S>: aya::Pod,
{
    map.iter()
        .filter_map(|b| b.ok())
        .flat_map(|b| b.slots)
        .filter(|s| ct_table::slot_state(s) & (ct_table::state::LIVE | ct_table::state::WRITING) == ct_table::state::LIVE)
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

/// The kernel's tick length in ns (`NS_PER_JIFFY` of the XDP object): the resolution of
/// CLOCK_MONOTONIC_COARSE is exactly one tick (TICK_NSEC: 4,000,000 at HZ = 250).
pub fn ns_per_jiffy() -> Result<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_getres writes into the timespec we own.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        bail!("clock_getres(CLOCK_MONOTONIC_COARSE): {}", std::io::Error::last_os_error());
    }
    let ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    // HZ is between 24 and 10,000 on any Linux build.
    if !(100_000..=50_000_000).contains(&ns) {
        bail!("CLOCK_MONOTONIC_COARSE resolution {ns} ns is not a kernel tick length");
    }
    Ok(ns)
}

/// The controller writes through this; each call maps to one of the writer's operations.
impl crate::controller::Tables for Dataplane {
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<()> {
        Dataplane::set_backend(self, id, *backend)
    }
    fn write_table(&mut self, service: u32, class: u32, flags: u32, entries: &[u32]) -> Result<()> {
        Dataplane::write_table(self, service, class, flags, entries).map(|_| ())
    }
    fn set_class_prefixes(&mut self, service: u32, old: &[(IpNet, u32)], new: &[(IpNet, u32)]) -> Result<()> {
        // Add and update first, then remove: a source never falls back to class 0 in between.
        // Compared in the trie's form (two spellings of one prefix are one key).
        let same = |a: &IpNet, b: &IpNet| canonical_prefix(*a) == canonical_prefix(*b);
        for (net, class) in new {
            if !old.iter().any(|(n, c)| same(n, net) && c == class) {
                self.set_class_prefix(service, *net, *class)?;
            }
        }
        for (net, _) in old {
            if !new.iter().any(|(n, _)| same(n, net)) {
                self.remove_class_prefix(service, *net)?;
            }
        }
        Ok(())
    }
    fn update_services(&mut self, set: &[(&[ServiceKey], &ServiceInfo)], remove: &[ServiceKey]) -> Result<()> {
        Dataplane::update_services(self, set, remove)
    }
    fn remove_tables(&mut self, service: u32, classes: u32) -> Result<()> {
        for class in 0..classes.min(self.sizes.classes_per_service) {
            self.remove_table(service, class)?;
        }
        Ok(())
    }
    fn now_ns(&self) -> Result<u64> {
        Dataplane::now_ns(self)
    }
    fn admit(&self, old: Option<&crate::compile::Compiled>, new: &crate::compile::Compiled) -> Result<()> {
        self.admit(old, new).context("the change does not fit the data plane loaded at start (restart the daemon to size it for this configuration); nothing was written")
    }
}

/// Detaches the XDP program whose bpf_link is pinned at `link_pin` (removing the pin closes
/// the last reference). Returns false if nothing was pinned there.
pub fn detach_pinned(link_pin: &Path) -> Result<bool> {
    if !link_pin.exists() {
        return Ok(false);
    }
    let pinned = PinnedLink::from_pin(link_pin).with_context(|| format!("opening {}", link_pin.display()))?;
    drop(pinned.unpin().with_context(|| format!("removing {}", link_pin.display()))?);
    Ok(true)
}

/// `BPF_PROG_LOAD` for `prog`, retried when it fails with EAGAIN: the verifier gives up with
/// EAGAIN when a signal arrives while it runs (any signal with a handler, to any thread that
/// happens to be verifying), which says nothing about the program. libbpf retries the same way.
pub fn load_program(prog: &mut Xdp) -> Result<(), aya::programs::ProgramError> {
    const ATTEMPTS: usize = 5;
    let mut attempt = 1;
    loop {
        match prog.load() {
            Err(aya::programs::ProgramError::LoadError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && attempt < ATTEMPTS =>
            {
                attempt += 1;
            }
            other => return other,
        }
    }
}
