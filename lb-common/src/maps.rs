//! Map keys, values and constants: the ABI between the XDP program and the controller.
//!
//! All structs are `#[repr(C)]` with explicit padding fields (zeroed) and no `bool`, so that
//! the bytes the kernel hashes and compares are exactly the bytes userspace writes.
//! Addresses and ports are kept in network byte order as they sit in the packet; an IPv4
//! address occupies the first word of a 16-byte address field, the other three are zero.

/// Address families as stored in [`ServiceKey::family`] and [`Backend::family`].
pub const FAMILY_V4: u8 = 4;
pub const FAMILY_V6: u8 = 6;
/// `ServiceKey::family` of a next-hop service's key: its address is `[route, 0, 0, 0]`, the
/// route that `NEXT_HOP_ROUTES` gives the packet's destination prefix, not a VIP.
pub const FAMILY_NEXT_HOP: u8 = 1;

/// IP protocol numbers used by the data plane.
pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
/// `ServiceKey::proto` of an L3_DEFAULT service: matches every protocol.
pub const PROTO_ANY: u8 = 0;

/// A Maglev table entry with this backend id means "drop new connections" (spec E-8).
pub const BACKEND_DROP: u32 = u32::MAX;

/// Class id of clients outside every configured client prefix ("non-compatible").
pub const CLASS_NONE: u32 = 0;

/// Session affinity (spec §1.3 table S), as stored in [`ServiceInfo::affinity`].
pub mod affinity {
    pub const NONE: u8 = 0;
    pub const CLIENT_IP_PORT_PROTO: u8 = 1;
    pub const CLIENT_IP_PROTO: u8 = 2;
    pub const CLIENT_IP: u8 = 3;
    pub const CLIENT_IP_NO_DESTINATION: u8 = 4;
}

/// Connection tracking mode (spec §1.3 table T), as stored in [`ServiceInfo::tracking`].
pub mod tracking {
    pub const PER_CONNECTION: u8 = 0;
    pub const PER_SESSION: u8 = 1;
}

/// Forwarding method, as stored in [`ServiceInfo::forwarding`].
pub mod forwarding {
    /// IPv4-in-IPv4 or IPv6-in-IPv6 to the backend; next hop from `bpf_fib_lookup`.
    pub const IPIP: u8 = 0;
    /// Rewrite the destination MAC to the backend's and transmit on the same segment.
    pub const L2_DSR: u8 = 1;
}

/// [`ServiceInfo::flags`] bits, precomputed by the controller from the spec's tables.
pub mod service_flags {
    /// Tracked TCP flows persist on an unhealthy backend (spec §1.4 persistence table).
    pub const PERSIST_TCP: u8 = 1 << 0;
    /// Tracked flows of protocols other than TCP and SCTP persist on an unhealthy backend.
    pub const PERSIST_OTHER: u8 = 1 << 1;
    /// `disableConnectionDrainOnFailover`: entries made under another pool generation are void.
    pub const FLUSH_ON_POOL_CHANGE: u8 = 1 << 2;
    /// Tracked SCTP flows persist on an unhealthy backend (like TCP per connection, like the
    /// other protocols per session).
    pub const PERSIST_SCTP: u8 = 1 << 3;
    /// Without FLUSH_ON_POOL_CHANGE: the fixed 10-minute drain after the last active-pool
    /// change is over, so entries made under another pool generation are void now (spec §1.2
    /// `disableConnectionDrainOnFailover` = false). Set by the controller when it is due.
    pub const POOL_DRAIN_OVER: u8 = 1 << 4;
    /// The flow hash and the connection-tracking key are direction-free
    /// (`decide::directionless`): a flow and its reverse (addresses and ports swapped) choose
    /// the same backend and share one entry. For next-hop services in front of stateful
    /// appliances, which must see both directions of a connection.
    pub const SYMMETRIC: u8 = 1 << 5;
    /// A next-hop service (its packets are routed through the balancer, not addressed to a
    /// VIP): the L2 rewrite drops a frame that came from the MAC it would go to (`drop_loop`),
    /// an appliance routing the packet back.
    pub const NEXT_HOP: u8 = 1 << 6;
}

/// [`Backend::flags`] bits.
pub mod backend_flags {
    pub const HEALTHY: u8 = 1 << 0;
    /// Removed from the service: tracked flows continue until `drain_deadline_ns`.
    pub const REMOVED: u8 = 1 << 1;
}

/// [`TableRef::flags`] bits.
pub mod table_flags {
    /// The class is a zone: a new flow to a backend of another zone counts as a spill.
    pub const ZONAL: u32 = 1 << 0;
    /// The class's eligible set holds no healthy backend (E-2/E-9): keep unhealthy entries.
    pub const NO_HEALTHY: u32 = 1 << 1;
    /// A Traffic Manager class whose eligible set is empty (GEOGRAPHIC/SUBNET NODATA, nothing
    /// available): its new flows are dropped and counted as `stat::DROP_CLASS_UNROUTABLE`.
    pub const UNROUTABLE: u32 = 1 << 2;
    /// The entry points at a written table; a zero (never written) entry has it clear.
    pub const ACTIVE: u32 = 1 << 31;
}

/// `connectionPersistenceOnUnhealthyBackends` (spec §1.4), input of
/// [`crate::decide::persistence_flags`]; the kernel only sees the derived service flags.
pub mod persistence {
    pub const DEFAULT_FOR_PROTOCOL: u8 = 0;
    pub const NEVER_PERSIST: u8 = 1;
    pub const ALWAYS_PERSIST: u8 = 2;
}

/// An address as the maps hold it — IPv4 in the first word, network byte order — and its family.
pub fn addr_words(addr: core::net::IpAddr) -> ([u32; 4], u8) {
    match addr {
        core::net::IpAddr::V4(a) => ([u32::from_ne_bytes(a.octets()), 0, 0, 0], FAMILY_V4),
        core::net::IpAddr::V6(a) => {
            let o = a.octets();
            let w = |i: usize| u32::from_ne_bytes([o[i], o[i + 1], o[i + 2], o[i + 3]]);
            ([w(0), w(4), w(8), w(12)], FAMILY_V6)
        }
    }
}

/// Key of a service in the `SERVICE_TABLE`. Port 0 = every port; proto [`PROTO_ANY`] = L3_DEFAULT.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ServiceKey {
    pub addr: [u32; 4],
    /// Network byte order.
    pub port: u16,
    pub proto: u8,
    pub family: u8,
}

impl ServiceKey {
    /// The key as five native-endian words, exactly as it sits in memory: what
    /// `hash::service_slot_hash` hashes and the probe compares. The data plane builds the same
    /// words from a packet as `addr[0..4], port | proto << 16 | family << 24` (little endian).
    #[inline(always)]
    pub fn words(&self) -> [u32; 5] {
        // SAFETY: repr(C), 20 bytes without padding, 4-byte aligned (checked below).
        unsafe { *(self as *const Self as *const [u32; 5]) }
    }
}

/// Value of a service key. Every key of one service carries the same value.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    pub id: u32,
    pub affinity: u8,
    pub tracking: u8,
    pub forwarding: u8,
    pub flags: u8,
    /// Conntrack idle timeout in nanoseconds.
    pub idle_timeout_ns: u64,
    /// Bumped when the active pool changes (failover/failback), see FLUSH_ON_POOL_CHANGE.
    /// Below 2^16 (the controller wraps it there): a connection-table entry keeps 16 bits.
    pub pool_gen: u32,
    /// Host bits of the outer IPIP source that are taken from the flow hash (0 = fixed source).
    pub encap_src_hash_mask: u32,
    /// Outer source address of encapsulated packets (IPv4 in the first word).
    pub encap_src: [u32; 4],
    /// The forwarding method's parameters beyond the outer source. After the fields above,
    /// which with the key fill the slot's first cache line: the methods that exist read only
    /// that line.
    pub forward_params: ForwardParams,
}

/// Room in the service record for a forwarding method's parameters (a UDP encapsulation's
/// port, a next-hop service's flags), so that a method added later uses fields that exist
/// instead of changing the record's layout (and with it the pinned `SERVICE_TABLE`'s, which a
/// daemon can then no longer adopt: see lb-user `pinning::prepare_reuse`). All zero today.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ForwardParams {
    /// Destination port of a UDP encapsulation, network order; 0 for the others.
    pub udp_port: u16,
    /// Flags of the method; none defined yet.
    pub flags: u16,
    /// A next-hop service limited to packets arriving on these interfaces (ifindexes; unused
    /// entries 0, all 0 = any interface; an ifindex no interface has never matches).
    pub ingress: [u32; MAX_NEXT_HOP_INTERFACES],
    /// Zero; for parameters to come.
    pub reserved: [u32; 11],
}

/// Interfaces a next-hop service may be limited to (`ForwardParams::ingress`).
pub const MAX_NEXT_HOP_INTERFACES: usize = 4;

impl ForwardParams {
    /// Whether a next-hop service with these parameters takes a packet from `ingress`.
    #[inline(always)]
    pub fn admits_ingress(&self, ingress: u32) -> bool {
        let i = &self.ingress;
        i[0] == 0 || i[0] == ingress || i[1] == ingress || i[2] == ingress || i[3] == ingress
    }
}

/// One slot of the `SERVICE_TABLE` array: an open-addressing hash table of the service keys,
/// probed inline by the data plane (an array lookup is inlined by the verifier; a hash-map
/// lookup is a helper call). A slot whose `key.family` is 0 is empty; the writer zeroes empty
/// slots entirely, so the last key word of an empty slot is 0 and of a used one is not.
/// 128 bytes (a power of two), so the verifier's inlined lookup indexes with a shift.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceSlot {
    pub key: ServiceKey,
    pub _pad: u32,
    pub info: ServiceInfo,
}

/// A key sits at most this many slots from its home slot `service_slot_hash & (S - 1)`
/// (wrapping within its half): the probe stops after that many slots. The writer picks a seed
/// under which every key fits.
pub const SERVICE_PROBES: u32 = 8;

/// Value of the `SERVICE_INDEX` array (one entry): the active half of `SERVICE_TABLE`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceTableRef {
    /// Index of the first slot of the active half (0 or S).
    pub base: u32,
    /// Seed of `hash::service_slot_hash` the active half was built with.
    pub seed: u32,
}

/// Flow fields hashed for backend choice or used as conntrack key. Fields that the session
/// affinity or tracking mode leaves out are zero (spec §1.3 tables S and T).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowTuple {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Network byte order.
    pub sport: u16,
    /// Network byte order.
    pub dport: u16,
    pub proto: u8,
    pub _pad: [u8; 3],
}

impl FlowTuple {
    pub const WORDS: usize = 10;

    #[inline(always)]
    pub fn words(&self) -> [u32; 10] {
        [
            self.src[0],
            self.src[1],
            self.src[2],
            self.src[3],
            self.dst[0],
            self.dst[1],
            self.dst[2],
            self.dst[3],
            (self.sport as u32) | ((self.dport as u32) << 16),
            self.proto as u32,
        ]
    }
}

/// A flow's tracking key in general form: the tracking tuple, scoped to one service. Userspace
/// reads both tables' keys as this; the tables hold packed forms ([`CtKey4`], [`CtKey6`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey {
    pub tuple: FlowTuple,
    pub service: u32,
}

/// Key of the `CONNTRACK4` table (IPv4 flows): the same fields as [`CtKey`] packed into four
/// words, so IPv4 flows hash and compare 4 words instead of 11, in a table of their own.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey4 {
    pub src: u32,
    pub dst: u32,
    /// Source port in the low half, destination port in the high half (network order each).
    pub ports: u32,
    /// Service id in the low 24 bits, protocol in the high 8 (ids are below [`MAX_SERVICE_ID`]).
    pub service_proto: u32,
}

/// Service ids are below this (they share a word with the protocol in [`CtKey4`]).
pub const MAX_SERVICE_ID: u32 = 1 << 24;

impl CtKey4 {
    /// The IPv4 key of a tracking tuple (addresses in the first word of each address field).
    #[inline(always)]
    pub fn new(t: &FlowTuple, service: u32) -> Self {
        Self { src: t.src[0], dst: t.dst[0], ports: ports_word(t), service_proto: service_proto_word(t, service) }
    }

    /// The [`CtKey`] form of this key (userspace reads both tables as one).
    pub fn to_key(&self) -> CtKey {
        unpacked([self.src, 0, 0, 0], [self.dst, 0, 0, 0], self.ports, self.service_proto)
    }
}

/// The ports word of a packed key ([`CtKey4`], [`CtKey6`]): source port in the low half,
/// destination port in the high half.
#[inline(always)]
fn ports_word(t: &FlowTuple) -> u32 {
    (t.sport as u32) | ((t.dport as u32) << 16)
}

/// The service id (low 24 bits) and protocol (high 8) word of a packed key.
#[inline(always)]
fn service_proto_word(t: &FlowTuple, service: u32) -> u32 {
    (service & (MAX_SERVICE_ID - 1)) | ((t.proto as u32) << 24)
}

/// The [`CtKey`] of a packed key's addresses and words.
fn unpacked(src: [u32; 4], dst: [u32; 4], ports: u32, service_proto: u32) -> CtKey {
    CtKey {
        tuple: FlowTuple {
            src,
            dst,
            sport: ports as u16,
            dport: (ports >> 16) as u16,
            proto: (service_proto >> 24) as u8,
            _pad: [0; 3],
        },
        service: service_proto & (MAX_SERVICE_ID - 1),
    }
}

/// Key of the `CONNTRACK` table (IPv6 flows): the fields of [`CtKey`] in ten words, the
/// protocol sharing the service id's word as in [`CtKey4`]: 40 bytes, so that a slot (state,
/// key and packed entry) is one cache line (`ct_table::Slot6`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CtKey6 {
    pub src: [u32; 4],
    pub dst: [u32; 4],
    /// Source port in the low half, destination port in the high half (network order each).
    pub ports: u32,
    /// Service id in the low 24 bits, protocol in the high 8.
    pub service_proto: u32,
}

impl CtKey6 {
    /// The IPv6 key of a tracking tuple.
    #[inline(always)]
    pub fn new(t: &FlowTuple, service: u32) -> Self {
        Self { src: t.src, dst: t.dst, ports: ports_word(t), service_proto: service_proto_word(t, service) }
    }

    /// The [`CtKey`] form of this key.
    pub fn to_key(&self) -> CtKey {
        unpacked(self.src, self.dst, self.ports, self.service_proto)
    }
}

/// A flow's entry in the connection table (`CONNTRACK`, `CONNTRACK4`; see [`crate::ct_table`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtEntry {
    pub backend: u32,
    /// `ServiceInfo::pool_gen` when the entry was made.
    pub pool_gen: u32,
    /// The data-plane clock (jiffies times the tick length, rounded down to
    /// `ct_table::seen_grain`; see lb-ebpf `clock`) at the last packet.
    pub last_seen_ns: u64,
    /// Client class the flow was classified in when the entry was made (for per-class
    /// counters and the class table's NO_HEALTHY flag on later packets, without an LPM lookup).
    /// Below `classes_per_service`, which the loader keeps at or below 2^16.
    pub class: u16,
    /// [`Backend::generation`] of the backend when the entry was made: an id handed to another
    /// backend later does not inherit the flows of the one that held it. (Entries of an older
    /// version, whose `class` was a u32 below 2^16, read as generation 0, as do its backends.)
    pub backend_gen: u16,
    /// The flow hash (spec table S tuple) of the packet that made the entry. It is a function
    /// of the tracking key (table T keeps at least the fields S hashes), so later packets of
    /// the flow reuse it for the outer source and the IPv6 flow label instead of rehashing.
    pub hash: u32,
}

/// Key of the `VIPS` hash map: every address that some service listens on. Packets to these
/// addresses are ours (malformed ones are dropped); everything else is passed untouched.
/// Also the key of `lb_decap`'s `DECAP_ADDRS` (the backend's own tunnel endpoints).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddrKey {
    pub addr: [u32; 4],
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Health probes through the data path (the probe object `lb_probe`, a TC egress program on
/// the daemon's probe device): a probe socket's mark is `PROBE_MARK_BASE | slot`, its policy
/// route leads to the probe device, and the program delivers the packet (addressed to the
/// VIP) to `PROBE_TARGETS[mark]`'s backend the way the balancer delivers that backend's client
/// packets.
pub mod probe {
    /// The bits of a socket mark that say "health probe" ([`MARK_BASE`]); the rest is the slot.
    pub const MARK_MASK: u32 = 0xffff_0000;
    /// "LB" in the high half: marks in `MARK_BASE..MARK_BASE + SLOTS` are probes.
    pub const MARK_BASE: u32 = 0x4c42_0000;
    /// Probes in flight at once (entries of `PROBE_TARGETS`).
    pub const SLOTS: u32 = 16384;
    /// [`super::ProbeTarget::forward`]: IPIP / IP6IP6 to the backend.
    pub const FORWARD_ENCAP: u8 = 1;
    /// [`super::ProbeTarget::forward`]: the packet as it is, to the backend's MAC (L2 DSR).
    pub const FORWARD_L2: u8 = 2;
}

/// Value of `PROBE_TARGETS` (key: the probe socket's mark): where one health probe goes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProbeTarget {
    /// The backend's address (network-order words; IPv4 in word 0).
    pub backend: [u32; 4],
    /// The outer source of an encapsulation (IPv4 in word 0); unused by L2.
    pub outer_source: [u32; 4],
    /// The device the route to the backend leaves by.
    pub ifindex: u32,
    /// `FAMILY_V4` or `FAMILY_V6`: of the VIP, the backend and an outer header alike.
    pub family: u8,
    /// `probe::FORWARD_ENCAP` or `probe::FORWARD_L2`.
    pub forward: u8,
    pub _pad: [u8; 2],
}

/// Key of the `BACKEND_SOURCES` hash map: a backend's address within one service. A new flow of
/// that service from that address is a martian (lb-ebpf `main`): a backend reaches its own
/// service's VIP locally, so only a spoofer sends such packets.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SourceKey {
    pub addr: [u32; 4],
    pub service: u32,
    pub family: u8,
    pub _pad: [u8; 3],
}

/// Value of the `BACKENDS` array, indexed by backend id (unique across services).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Backend {
    pub addr: [u32; 4],
    pub family: u8,
    pub flags: u8,
    /// Class id of the backend's zone (0 = none).
    pub zone_class: u16,
    /// Destination MAC for L2 DSR.
    pub mac: [u8; 6],
    /// Bumped (wrapping) by the controller each time the id is given to another backend; a
    /// connection-table entry is valid only for the generation it was made with.
    pub generation: u16,
    pub _pad: [u8; 4],
    /// With REMOVED: tracked flows may use the backend until this data-plane clock value
    /// (`lb_user::dataplane::Dataplane::now_ns`).
    pub drain_deadline_ns: u64,
}

/// Key of the `CLIENT_CLASS` LPM trie data: (service id, source address). IPv4 sources are
/// looked up as IPv4-mapped IPv6 (`::ffff:a.b.c.d`) so one trie serves both families.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassKey {
    /// Big-endian service id, so that the first 32 prefix bits select the service.
    pub service_be: u32,
    pub addr: [u32; 4],
}

/// Key of the `NEXT_HOP_ROUTES` LPM trie data: the family (big endian, so that the first 32
/// prefix bits select it), then a destination address (IPv4 in the first word): a prefix of
/// length L is 32 + L bits. The family keeps the two apart: as IPv4-mapped IPv6, every IPv4
/// destination would be inside an IPv6 `::/0`. The value is a next-hop route: the address word
/// of the next-hop service keys (`FAMILY_NEXT_HOP`) of the services that route the prefix, or
/// [`NEXT_HOP_UNTOUCHED`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NextHopKey {
    pub family_be: u32,
    pub addr: [u32; 4],
}

/// Prefix bits of a [`NextHopKey`] before the address: the family.
pub const NEXT_HOP_FAMILY_BITS: u32 = 32;

/// A `NEXT_HOP_ROUTES` value for destinations the balancer must leave to the host even inside
/// a routed prefix (its own addresses): the longest prefix wins, so a /32 or /128 of this
/// value exempts one address.
pub const NEXT_HOP_UNTOUCHED: u32 = 0;

/// Number of prefix bits of a [`ClassKey`] that select the service.
pub const CLASS_KEY_SERVICE_BITS: u32 = 32;

/// Value of the `TABLE_INDEX` array at `service * classes_per_service + class`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableRef {
    /// Index of the Maglev table in `TABLES` (entries `slot * M .. slot * M + M`).
    pub slot: u32,
    pub flags: u32,
    /// The table this one replaced, kept intact until `prev_until_ns` (issue 35): a TCP packet
    /// after the SYN that misses before then (the first ACK of a handshake whose SYN went by
    /// the stateless choice) takes the backend the previous table gave it, if that backend
    /// still takes new connections, so a handshake that straddles a change reaches one backend.
    pub prev_slot: u32,
    pub _pad: u32,
    /// Data-plane clock (ns): the previous table is used before this instant (0: none).
    pub prev_until_ns: u64,
}

/// The `CLEAN_SLOTS` bitmap of a Maglev table: bit `i` of table slot `s` is word
/// `s * clean_words(m) + i / 64`, bit `i % 64`. A set bit says no live connection-table entry
/// of the table's service and Maglev slot `i` names another backend than the table does (the
/// controller's scan verified it; a table change clears every bit whose entry changed before
/// the table is published). A SYN whose slot is clean needs no entry: the stateless choice is
/// what any entry would say, so it is forwarded without reading the connection table, and its
/// flow is inserted at its first non-SYN packet (issue 35).
pub mod clean_slots {
    /// Words of one table's bitmap.
    #[inline(always)]
    pub const fn words(m: u32) -> u32 {
        m.div_ceil(64)
    }

    /// Maglev slot `index`'s word within its table's bitmap, and its bit in that word.
    #[inline(always)]
    pub const fn bit(index: u32) -> (u32, u64) {
        (index / 64, 1 << (index % 64))
    }
}

/// Defines the counters from one list, in index order: each `NAME = "name"` becomes the index
/// constant `NAME` (its position in the list) and the entry `"name"` of `NAMES`.
macro_rules! counters {
    ($($(#[$doc:meta])* $name:ident = $text:literal,)*) => {
        #[allow(non_camel_case_types, clippy::upper_case_acronyms)]
        #[repr(u32)]
        enum Index {
            $($name,)*
        }
        $($(#[$doc])* pub const $name: u32 = Index::$name as u32;)*
        /// Each counter's name, indexed like the counters.
        pub const NAMES: [&str; [$($text),*].len()] = [$($text),*];
    };
}

/// Global counters: index into [`GlobalStats::counters`] (the `STATS` record).
pub mod stat {
    counters! {
        RX_PACKETS = "rx_packets",
        PASS_NOT_VIP = "pass_not_vip",
        CT_HIT = "ct_hit",
        CT_MISS = "ct_miss",
        NEW_FLOW = "new_flow",
        TX = "tx",
        REDIRECT = "redirect",
        DROP_TRUNCATED_ETH = "drop_truncated_eth",
        DROP_TRUNCATED_IP = "drop_truncated_ip",
        DROP_BAD_IP_HEADER = "drop_bad_ip_header",
        DROP_TRUNCATED_L4 = "drop_truncated_l4",
        DROP_NO_BACKEND = "drop_no_backend",
        DROP_NO_TABLE = "drop_no_table",
        DROP_FIB = "drop_fib",
        DROP_ENCAP = "drop_encap",
        DROP_UNROUTABLE = "drop_unroutable",
        CT_EXPIRED = "ct_expired",
        CT_REROUTED_UNHEALTHY = "ct_rerouted_unhealthy",
        CT_DRAIN_EXPIRED = "ct_drain_expired",
        CT_POOL_FLUSHED = "ct_pool_flushed",
        DECAP = "decap",
        /// Encapsulated packet to a decap address whose inner header is truncated or malformed.
        DECAP_DROP_MALFORMED = "decap_drop_malformed",
        /// New flow of a client class whose table is marked `table_flags::UNROUTABLE` (Traffic
        /// Manager: no endpoint for this client). `DROP_UNROUTABLE` is the FIB's verdict instead.
        DROP_CLASS_UNROUTABLE = "drop_class_unroutable",
        /// New flow whose connection-table slot another CPU was writing at that instant: forwarded
        /// but not tracked; its next packet makes the entry.
        CT_INSERT_BUSY = "ct_insert_busy",
        /// A new flow's insert evicted a confirmed live flow. Since issue 35 no insert does
        /// (`ct_full_stateless` instead), so it stays 0; kept so the indices stay ABI.
        CT_EVICT_LIVE = "ct_evict_live",
        /// Frame to a VIP whose destination MAC is not the ingress device's (broadcast, multicast,
        /// or flooded to us for another host): passed untouched, not balanced.
        PASS_NOT_OUR_MAC = "pass_not_our_mac",
        /// Packet too big for the egress MTU once encapsulated (or, L2 DSR, as it is) that was
        /// answered with ICMP "fragmentation needed" / ICMPv6 "packet too big" (sent with
        /// XDP_TX from the VIP to the client, which lowers its path MTU and sends again).
        ICMP_TOO_BIG_SENT = "icmp_too_big_sent",
        /// Packet too big for the egress MTU and not answered: IPv4 without DF (also counted
        /// as `drop_too_big_no_df`), a VLAN-tagged frame (the reply is built for untagged
        /// frames only), or this CPU's ICMP rate limit (`lb-ebpf` `icmp::RATE_PER_SEC`) was
        /// used up.
        DROP_TOO_BIG = "drop_too_big",
        /// The route to the backend was found but its next hop had no valid neighbour entry
        /// (`BPF_FIB_LKUP_RET_NO_NEIGH`); also counted as `drop_fib`. The daemon keeps a managed
        /// neighbour entry for every backend's next hop, so this stops within a second.
        DROP_NO_NEIGH = "drop_no_neigh",
        /// The part of `drop_too_big` that is IPv4 without DF: a router would fragment it, XDP
        /// cannot send two packets for one, and no ICMP is due, so the client only sees a
        /// loss (its stack must lower the size itself). Nonzero means clients that clear DF
        /// send more than the path to the backends carries: raise that MTU (README, MTU).
        DROP_TOO_BIG_NO_DF = "drop_too_big_no_df",
        /// A later fragment (no ports) of a TCP or UDP datagram to a VIP whose services listen on
        /// given ports: it carries nothing to match them, so it passes to the host's stack (only
        /// a service on every port, `ports` empty, or L3_DEFAULT balances fragments).
        PASS_FRAGMENT = "pass_fragment",
        /// A new flow whose source is a VIP, or the address of the backend it would go to: a
        /// spoofed or looped packet (a backend holds its VIP on its loopback and reaches it
        /// locally), dropped instead of forwarded.
        DROP_MARTIAN = "drop_martian",
        /// A flow without an entry whose 16 candidate slots all hold confirmed live flows
        /// (`lb_common::ct_table`): forwarded by the stateless choice, not tracked; counted per
        /// packet. Nonzero means more established flows than `conntrack_entries`.
        CT_FULL_STATELESS = "ct_full_stateless",
        /// A new flow's insert replaced an unconfirmed live entry (a flow that had shown one
        /// packet only): what a flood of spoofed single packets does to the table.
        CT_EVICT_UNCONFIRMED = "ct_evict_unconfirmed",
        /// A frame whose next hop (the backend's MAC, L2 rewrite) is the MAC it came from: the
        /// backend, typically an appliance behind a next-hop service, routed it back to the
        /// balancer. Dropped, not sent back to be returned again until its TTL runs out.
        DROP_LOOP = "drop_loop",
        /// A packet to a routed prefix (`NEXT_HOP_ROUTES`) with no next-hop service for its
        /// protocol, or to an address exempted inside one: passed to the host untouched.
        PASS_NEXT_HOP_NO_SERVICE = "pass_next_hop_no_service",
        /// A health probe (`lb_probe`) encapsulated or readdressed and sent to its backend.
        PROBE_SENT = "probe_sent",
        /// A probe-marked packet on the probe device whose mark has no `PROBE_TARGETS` entry
        /// (its probe task ended: a late packet of its last connection), or that is not of its
        /// target's family: dropped.
        DROP_PROBE_NO_TARGET = "drop_probe_no_target",
        /// A health probe the probe program could not encapsulate or hand to the neighbour
        /// layer: dropped (the probe then fails by timeout).
        DROP_PROBE_SEND = "drop_probe_send",
        /// A SYN new by rule whose Maglev slot is clean (`CLEAN_SLOTS`): forwarded by the
        /// stateless choice without reading or writing the connection table; its flow is
        /// inserted at its first non-SYN packet.
        CT_SYN_STATELESS = "ct_syn_stateless",
        /// A flow without an entry that took the backend its table's previous version gave (a
        /// handshake straddling a table change, `TableRef::prev_until_ns`) instead of the
        /// current table's.
        CT_PREV_TABLE = "ct_prev_table",
    }

    /// Counters in the global record ([`GlobalStats::counters`]); indices past `NAMES` are spare.
    pub const GLOBAL_COUNT: u32 = 48;
    const _: () = assert!(NAMES.len() <= GLOBAL_COUNT as usize);
}

/// Value of the `STATS` per-CPU array (one entry): the global counters, indexed by `stat::*`.
/// One record, so that the data plane looks it up once per packet and then only adds. It also
/// holds this CPU's connection-table search record (`ct_search`, scratch memory, not a
/// counter): the packet's one lookup of this record then serves the table search too, instead
/// of a per-CPU lookup of its own (each costs a few ns; round 7 in the history of BENCHMARKS.md).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlobalStats {
    pub counters: [u64; stat::GLOBAL_COUNT as usize],
    pub ct_search: Search,
}

impl Default for GlobalStats {
    fn default() -> Self {
        Self { counters: [0; stat::GLOBAL_COUNT as usize], ct_search: Search::default() }
    }
}

/// The running result of a connection-table search (`ct_table`) over a key's 16 candidate
/// slots. The data plane keeps it in map memory (a per-CPU scratch record) and every access is
/// volatile: the verifier then sees one unknown value instead of following one program state per candidate slot through the
/// rest of the program, which would exceed its instruction budget.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Search {
    /// The slot found or chosen, `candidate * WAYS + way`.
    pub index: u32,
    /// That slot's state when the search saw it: a writer takes the slot only from this state,
    /// so a slot another CPU wrote since the search is left alone.
    pub state: u32,
    /// Bit `candidate * WAYS + way`: the slot has no writer and no live flow (empty, or its
    /// flow idle: see `ct_table::victim`). Written by a search that did not find the key.
    pub free: u32,
    /// How `ct_table::victim` chose `index`: `ct_table::chosen::{OWN, EVICTS, FULL}` or 0 (a
    /// slot without a live flow). Kept so that an insert can write the choice of a search made
    /// before it (a re-selecting SYN's) without searching again.
    pub chosen: u32,
    /// `last_seen_ns` of the least recently seen unconfirmed live flow so far.
    pub oldest: u64,
}

/// Slots of `LOCAL_MACS`, a direct-mapped array indexed by [`local_mac_slot`].
pub const LOCAL_MAC_SLOTS: u32 = 256;

/// The `LOCAL_MACS` slot of an interface: interfaces the balancer is attached to must have
/// ifindexes that differ modulo [`LOCAL_MAC_SLOTS`] (the daemon refuses others at attach).
#[inline(always)]
pub const fn local_mac_slot(ifindex: u32) -> u32 {
    ifindex & (LOCAL_MAC_SLOTS - 1)
}

/// Value of `LOCAL_MACS`: an interface the balancer is attached to and its MAC. The data plane
/// balances only frames whose destination is the MAC of the ingress device's slot, written by
/// the daemon before it attaches; an empty slot (`ifindex` 0) or another device's is not ours.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalMac {
    pub ifindex: u32,
    pub mac: [u8; 6],
    pub _pad: [u8; 2],
}

/// Value of the `CLASS_STATS` per-CPU array at `service * classes_per_service + class`: the
/// counters of one (service, client class), updated together with one lookup per packet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassCounters {
    /// Packets forwarded.
    pub packets: u64,
    /// Their bytes (whole frames as received).
    pub bytes: u64,
    /// New flows (backend selections).
    pub new_flows: u64,
    /// New flows of a zonal class sent to a backend of another zone.
    pub spills: u64,
}

/// Value of the `BACKEND_STATS` per-CPU array at a backend id: that backend's traffic, updated
/// with one lookup per forwarded packet. An id given to another backend (its generation bumped)
/// starts again from zero (the data-plane writer resets it).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackendCounters {
    /// Packets forwarded to the backend.
    pub packets: u64,
    /// Their bytes (whole frames as received).
    pub bytes: u64,
    /// New flows (backend selections) that chose the backend.
    pub new_flows: u64,
}

#[cfg(feature = "user")]
mod pod {
    use super::*;
    crate::pod!(
        SourceKey,
        ServiceKey,
        ServiceInfo,
        ForwardParams,
        ServiceSlot,
        ServiceTableRef,
        FlowTuple,
        CtKey,
        CtKey4,
        CtKey6,
        CtEntry,
        Search,
        Backend,
        ClassKey,
        NextHopKey,
        TableRef,
        AddrKey,
        ProbeTarget,
        GlobalStats,
        ClassCounters,
        LocalMac,
        BackendCounters
    );
}

// Layout guards: padding must be explicit, or kernel and user could disagree on bytes.
const _: () = assert!(core::mem::size_of::<ServiceKey>() == 20);
const _: () = assert!(core::mem::align_of::<ServiceKey>() == 4);
const _: () = assert!(core::mem::size_of::<ServiceInfo>() == 104);
const _: () = assert!(core::mem::offset_of!(ServiceInfo, forward_params) == 40);
const _: () = assert!(core::mem::size_of::<ServiceSlot>() == 128);
const _: () = assert!(core::mem::offset_of!(ServiceSlot, info) == 24);
const _: () = assert!(core::mem::size_of::<ServiceTableRef>() == 8);
const _: () = assert!(core::mem::size_of::<FlowTuple>() == 40);
const _: () = assert!(core::mem::size_of::<CtKey>() == 44);
const _: () = assert!(core::mem::size_of::<CtKey4>() == 16);
const _: () = assert!(core::mem::size_of::<CtKey6>() == 40);
const _: () = assert!(core::mem::size_of::<CtEntry>() == 24);
const _: () = assert!(core::mem::size_of::<Search>() == 24);
const _: () = assert!(core::mem::size_of::<AddrKey>() == 20);
const _: () = assert!(core::mem::size_of::<ProbeTarget>() == 40);
const _: () = assert!(core::mem::size_of::<SourceKey>() == 24);
const _: () = assert!(core::mem::size_of::<Backend>() == 40);
const _: () = assert!(core::mem::size_of::<ClassKey>() == 20);
const _: () = assert!(core::mem::size_of::<NextHopKey>() == 20);
const _: () = assert!(core::mem::size_of::<TableRef>() == 24);
// 40 counters and the search record. A pinned `STATS` of another size (280 bytes before
// `ct_full_stateless`) is replaced at adoption, as every map whose size changed.
const _: () = assert!(core::mem::size_of::<GlobalStats>() == 408);
const _: () = assert!(core::mem::size_of::<ClassCounters>() == 32);
const _: () = assert!(core::mem::size_of::<LocalMac>() == 12);
const _: () = assert!(core::mem::size_of::<BackendCounters>() == 24);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_indices_follow_the_list_and_keep_their_values() {
        // The indices are ABI: a restarted daemon adopts the pinned STATS record.
        assert_eq!((stat::RX_PACKETS, stat::DECAP, stat::CT_INSERT_BUSY), (0, 20, 23));
        assert_eq!((stat::CT_EVICT_LIVE, stat::PASS_NOT_OUR_MAC), (24, 25));
        assert_eq!((stat::ICMP_TOO_BIG_SENT, stat::DROP_TOO_BIG, stat::DROP_NO_NEIGH), (26, 27, 28));
        assert_eq!((stat::DROP_TOO_BIG_NO_DF, stat::PASS_FRAGMENT, stat::DROP_MARTIAN), (29, 30, 31));
        assert_eq!((stat::CT_FULL_STATELESS, stat::CT_EVICT_UNCONFIRMED), (32, 33));
        assert_eq!((stat::DROP_LOOP, stat::PASS_NEXT_HOP_NO_SERVICE), (34, 35));
        assert_eq!((stat::PROBE_SENT, stat::DROP_PROBE_NO_TARGET, stat::DROP_PROBE_SEND), (36, 37, 38));
        assert_eq!((stat::CT_SYN_STATELESS, stat::CT_PREV_TABLE), (39, 40));
        assert_eq!(stat::NAMES.len(), 41);
        assert_eq!(stat::NAMES[stat::DROP_CLASS_UNROUTABLE as usize], "drop_class_unroutable");
        assert_eq!(stat::NAMES[stat::CT_INSERT_BUSY as usize], "ct_insert_busy");
        assert_eq!(stat::NAMES[stat::CT_EVICT_LIVE as usize], "ct_evict_live");
        assert_eq!(stat::NAMES[stat::PASS_NOT_OUR_MAC as usize], "pass_not_our_mac");
    }

    #[test]
    fn ct_key4_packs_and_unpacks_every_field() {
        let t = FlowTuple {
            src: [0x0501_12c6, 0, 0, 0],
            dst: [0x6400_12c6, 0, 0, 0],
            sport: 40000u16.to_be(),
            dport: 80u16.to_be(),
            proto: PROTO_TCP,
            _pad: [0; 3],
        };
        let k = CtKey4::new(&t, MAX_SERVICE_ID - 1);
        assert_eq!(k.to_key(), CtKey { tuple: t, service: MAX_SERVICE_ID - 1 });
        // Fields left out by the tracking mode stay zero in both forms.
        let t2 = FlowTuple { sport: 0, dport: 0, proto: 0, ..t };
        assert_eq!(CtKey4::new(&t2, 7).to_key(), CtKey { tuple: t2, service: 7 });
        assert_ne!(CtKey4::new(&t, 1), CtKey4::new(&t, 2));
    }

    #[test]
    fn ct_key6_packs_and_unpacks_every_field() {
        let t = FlowTuple {
            src: [0x0db8_0120, 1, 2, 0x0500_0000],
            dst: [0x0db8_0120, 3, 4, 0x0001_0000],
            sport: 40000u16.to_be(),
            dport: 443u16.to_be(),
            proto: 17,
            _pad: [0; 3],
        };
        let k = CtKey6::new(&t, MAX_SERVICE_ID - 1);
        assert_eq!(k.to_key(), CtKey { tuple: t, service: MAX_SERVICE_ID - 1 });
        let t2 = FlowTuple { sport: 0, dport: 0, proto: 0, ..t };
        assert_eq!(CtKey6::new(&t2, 7).to_key(), CtKey { tuple: t2, service: 7 });
        assert_ne!(CtKey6::new(&t, 1), CtKey6::new(&t, 2));
    }
}
