//! The maps and load-time constants of the balancer's object. Every `max_entries` here is a
//! placeholder: `lb_user::dataplane` sets the real sizes before load, from the configuration.

use aya_ebpf::{
    macros::map,
    maps::{Array, HashMap, LpmTrie, PerCpuArray},
    Global,
};
use lb_common::ct_table;
use lb_common::maps::{
    AddrKey, Backend, BackendCounters, ClassCounters, ClassKey, GlobalStats, LocalMac, NextHopKey, ServiceSlot,
    ServiceTableRef, SourceKey, TableRef, LOCAL_MAC_SLOTS,
};

/// (VIP, port, proto) -> service, as an open-addressing hash table in two halves of
/// SERVICE_SLOTS slots each (see `select::service`). Port 0 = all ports, proto 0 = L3_DEFAULT.
/// An array rather than a hash map: the verifier inlines array lookups, a hash-map lookup is a
/// helper call. BPF_F_MMAPABLE: userspace writes a whole half with one copy.
#[map]
pub static SERVICE_TABLE: Array<ServiceSlot> = Array::with_max_entries(1, aya_ebpf::bindings::BPF_F_MMAPABLE);
/// One entry: the active half of SERVICE_TABLE and its hash seed; userspace rebuilds the
/// standby half and flips this entry.
#[map]
pub static SERVICE_INDEX: Array<ServiceTableRef> = Array::with_max_entries(1, 0);
/// Every VIP address: decides "ours (drop if malformed)" versus "pass to the stack".
#[map]
pub static VIPS: HashMap<AddrKey, u32> = HashMap::with_max_entries(1, 0);
/// (backend address, service) of every configured backend: a new flow of the service from it
/// is a martian.
#[map]
pub static BACKEND_SOURCES: HashMap<SourceKey, u32> = HashMap::with_max_entries(1, 0);
/// The connection table of IPv6 flows: CT_BUCKET_MASK + 1 buckets (`lb_common::ct_table`).
/// BPF_F_MMAPABLE for the placement, not for mapping: the kernel then starts an array's values
/// on a page, so buckets (whole cache lines) start on a line, as `conntrack::prefetch` assumes.
#[map]
pub static CONNTRACK: Array<ct_table::Bucket6> = Array::with_max_entries(1, aya_ebpf::bindings::BPF_F_MMAPABLE);
/// The connection table of IPv4 flows (4-word keys: cheaper to hash and compare).
#[map]
pub static CONNTRACK4: Array<ct_table::Bucket4> = Array::with_max_entries(1, aya_ebpf::bindings::BPF_F_MMAPABLE);
/// (service, source prefix) -> client class.
#[map]
pub static CLIENT_CLASS: LpmTrie<ClassKey, u32> = LpmTrie::with_max_entries(1, 0);
/// Destination prefix -> next-hop route (see `NextHopKey`): consulted only for a packet no VIP
/// service took.
#[map]
pub static NEXT_HOP_ROUTES: LpmTrie<NextHopKey, u32> = LpmTrie::with_max_entries(1, 0);
/// Service id -> 1 if the service has client-class prefixes in `CLIENT_CLASS`. Without, every
/// client is class 0 and the trie (a helper call) is not consulted.
#[map]
pub static CLASSED_SERVICES: Array<u32> = Array::with_max_entries(1, 0);
/// service * CLASSES_PER_SERVICE + class -> active table slot.
#[map]
pub static TABLE_INDEX: Array<TableRef> = Array::with_max_entries(1, 0);
/// slot * TABLE_M + i -> backend id. BPF_F_MMAPABLE: userspace writes a whole table with one
/// copy into its mapping instead of a syscall per entry.
#[map]
pub static TABLES: Array<u32> = Array::with_max_entries(1, aya_ebpf::bindings::BPF_F_MMAPABLE);
/// table slot * clean_slots::words(TABLE_M) + i / 64 -> bit i % 64: Maglev slot i of that table
/// is clean (`lb_common::maps::clean_slots`); a SYN there needs no connection-table entry.
/// Zero (dirty) until the controller's scan says otherwise, so a map made afresh is safe.
#[map]
pub static CLEAN_SLOTS: Array<u64> = Array::with_max_entries(1, aya_ebpf::bindings::BPF_F_MMAPABLE);
/// Backend id -> address, MAC, state flags.
#[map]
pub static BACKENDS: Array<Backend> = Array::with_max_entries(1, 0);
/// Global counters (one record), see `lb_common::maps::stat`.
#[map]
pub static STATS: PerCpuArray<GlobalStats> = PerCpuArray::with_max_entries(1, 0);
/// service * CLASSES_PER_SERVICE + class -> that pair's counters.
#[map]
pub static CLASS_STATS: PerCpuArray<ClassCounters> = PerCpuArray::with_max_entries(1, 0);
/// Backend id -> that backend's packets, bytes and new flows (this CPU's copy).
#[map]
pub static BACKEND_STATS: PerCpuArray<BackendCounters> = PerCpuArray::with_max_entries(1, 0);
// NEXT_HOPS and FIB_PARAMS are declared in `nexthop`, their one user.
/// `lb_common::maps::local_mac_slot(ifindex)` -> an interface the balancer is attached to and
/// its MAC (written by the daemon before it attaches; not pinned: each loaded program has its
/// own, filled before it is attached or swapped in). A fixed size: not set from the configuration.
#[map]
pub static LOCAL_MACS: Array<LocalMac> = Array::with_max_entries(LOCAL_MAC_SLOTS, 0);
/// This CPU's ICMP token bucket (`icmp::take_token`): tokens left, data-plane time of the
/// last refill.
#[map]
pub static ICMP_RATE: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// One slot where `clock::clock_probe` writes the data-plane clock for userspace.
#[map]
pub static CLOCK_PROBE: Array<u64> = Array::with_max_entries(1, 0);

/// Length of a kernel tick in ns (the data-plane clock is jiffies times this), set at load time.
#[no_mangle]
pub static NS_PER_JIFFY: Global<u64> = Global::new(0);
/// Maglev table size M (prime), set at load time so the verifier sees a constant.
#[no_mangle]
pub static TABLE_M: Global<u32> = Global::new(1);
/// Slots per half of SERVICE_TABLE (a power of two), set at load time.
#[no_mangle]
pub static SERVICE_SLOTS: Global<u32> = Global::new(1);
/// Number of client classes per service (row width of TABLE_INDEX and the class counters).
#[no_mangle]
pub static CLASSES_PER_SERVICE: Global<u32> = Global::new(1);
/// Buckets per connection table minus one (a power of two minus one), set at load time.
#[no_mangle]
pub static CT_BUCKET_MASK: Global<u32> = Global::new(0);
/// The connection tables' bucket hash seed (one for both tables): random when the tables are
/// made, set at load time, and kept in the pinned `CT_SEED_STORE`, so a restarted daemon finds
/// the flows its predecessor stored.
#[no_mangle]
pub static CT_SEED: Global<u64> = Global::new(0);
/// Where userspace keeps `CT_SEED` across restarts (pinned with the tables; not read here).
#[map]
pub static CT_SEED_STORE: Array<u64> = Array::with_max_entries(1, 0);
