//! Service lookup and backend choice for new flows: client class (LPM trie), the class's
//! active table, then `table[hash % M]`. Only table reads; the policy is in the tables.

use aya_ebpf::maps::lpm_trie::Key;
use aya_ebpf::programs::XdpContext;
use lb_common::hash::{find_service, maglev_slot};
use lb_common::maps::{
    clean_slots, stat, table_flags, ClassKey, NextHopKey, ServiceInfo, ServiceTableRef, TableRef,
    CLASS_KEY_SERVICE_BITS, CLASS_NONE, FAMILY_NEXT_HOP, FAMILY_V4, NEXT_HOP_FAMILY_BITS, NEXT_HOP_UNTOUCHED,
    PROTO_ANY,
};
use lb_ebpf::packet::as_key;

use crate::maps::{
    CLASSED_SERVICES, CLASSES_PER_SERVICE, CLEAN_SLOTS, CLIENT_CLASS, NEXT_HOP_ROUTES, SERVICE_INDEX, SERVICE_SLOTS,
    SERVICE_TABLE, TABLES, TABLE_INDEX, TABLE_M,
};
use crate::parse::{is_vip, Packet};

/// The active half of the service table (copied: 8 bytes), and its slot mask; None before
/// the load-time size is set (never, once loaded by `lb_user::dataplane`).
#[inline(always)]
fn service_table() -> Option<(ServiceTableRef, u32)> {
    let slots = SERVICE_SLOTS.load();
    if slots == 0 {
        return None;
    }
    SERVICE_INDEX.get(0).map(|r| (*r, slots - 1))
}

/// The service under (addr, port, proto, family); a reference into the map (valid for the
/// rest of the program run), not a copy. Probes the active half of SERVICE_TABLE inline
/// (`lb_common::hash::find_service`, the routine userspace tests run): every array lookup is
/// inlined by the verifier, with its own bounds check, so no helper call and no unbounded
/// index.
#[inline(always)]
fn service(
    table: (ServiceTableRef, u32),
    addr: [u32; 4],
    port: u16,
    proto: u8,
    family: u8,
) -> Option<&'static ServiceInfo> {
    let (r, mask) = table;
    let key = [addr[0], addr[1], addr[2], addr[3], port as u32 | (proto as u32) << 16 | (family as u32) << 24];
    find_service(|i| SERVICE_TABLE.get(i), &key, r.seed, mask, r.base)
}

/// The service of a packet: exact port, then the all-ports service of the protocol, then
/// the L3_DEFAULT service; None if there is none or the destination is not a VIP. Fragments
/// carry no usable port, so they only match all-ports services (as on GCP, fragmented traffic
/// needs an all-ports or L3_DEFAULT rule).
///
/// An exact hit needs no `VIPS` lookup: the writer adds a VIP before any service key on it and
/// removes it after the last one, so every service key's address is in `VIPS`.
#[inline(always)]
pub fn lookup_service(pkt: &Packet) -> Option<&'static ServiceInfo> {
    let t = &pkt.tuple;
    let table = service_table()?;
    if pkt.ports_valid {
        if let Some(s) = service(table, t.dst, t.dport, t.proto, pkt.family) {
            return Some(s);
        }
    }
    if !is_vip(t.dst, pkt.family) {
        return None;
    }
    if let Some(s) = service(table, t.dst, 0, t.proto, pkt.family) {
        return Some(s);
    }
    service(table, t.dst, 0, PROTO_ANY, pkt.family)
}

/// The next-hop service of a packet that no VIP service took: the longest prefix of its
/// destination in `NEXT_HOP_ROUTES` names a route, whose service (the protocol's, else the
/// L3_DEFAULT one) has the key `[route, 0, 0, 0]` of family `FAMILY_NEXT_HOP`, every port.
/// Err: not to be touched, with the counter to add (`pass_not_vip` outside every routed
/// prefix; `pass_next_hop_no_service` for an exempted address, a protocol without service, or
/// an interface the service is not limited to).
#[inline(always)]
pub fn lookup_next_hop(ctx: &XdpContext, pkt: &Packet) -> Result<&'static ServiceInfo, u32> {
    let d = if pkt.family == FAMILY_V4 { [pkt.tuple.dst[0], 0, 0, 0] } else { pkt.tuple.dst };
    // lpm_trie::Key<NextHopKey>: prefix length, then the family and the address (an IPv4
    // tuple's other words are zero).
    let key = [NEXT_HOP_FAMILY_BITS + 128, (pkt.family as u32).to_be(), d[0], d[1], d[2], d[3]];
    let route = match NEXT_HOP_ROUTES.get(as_key::<Key<NextHopKey>, 6>(&key)) {
        Some(r) => *r,
        None => return Err(stat::PASS_NOT_VIP),
    };
    if route == NEXT_HOP_UNTOUCHED {
        return Err(stat::PASS_NEXT_HOP_NO_SERVICE);
    }
    let table = service_table().ok_or(stat::PASS_NEXT_HOP_NO_SERVICE)?;
    let at = [route, 0, 0, 0];
    let svc = service(table, at, 0, pkt.tuple.proto, FAMILY_NEXT_HOP)
        .or_else(|| service(table, at, 0, PROTO_ANY, FAMILY_NEXT_HOP))
        .ok_or(stat::PASS_NEXT_HOP_NO_SERVICE)?;
    // A service limited to some interfaces (its parameters' cache line is read only here).
    if !svc.forward_params.admits_ingress(ctx.ingress_ifindex() as u32) {
        return Err(stat::PASS_NEXT_HOP_NO_SERVICE);
    }
    Ok(svc)
}

/// Client class of the source within the service; IPv4 sources as `::ffff:a.b.c.d`.
#[inline(always)]
pub fn client_class(service_id: u32, pkt: &Packet) -> u32 {
    // Services without client prefixes (no zones, no Traffic Manager classes) skip the trie.
    if !matches!(CLASSED_SERVICES.get(service_id), Some(&c) if c != 0) {
        return CLASS_NONE;
    }
    let src = pkt.tuple.src;
    let addr = if pkt.family == FAMILY_V4 { [0, 0, 0xffffu32.to_be(), src[0]] } else { src };
    // lpm_trie::Key<ClassKey>: prefix length, then the ClassKey.
    let key = [CLASS_KEY_SERVICE_BITS + 128, service_id.to_be(), addr[0], addr[1], addr[2], addr[3]];
    match CLIENT_CLASS.get(as_key::<Key<ClassKey>, 6>(&key)) {
        Some(c) if *c < CLASSES_PER_SERVICE.load() => *c,
        _ => CLASS_NONE,
    }
}

#[inline(always)]
pub fn table_ref(service_id: u32, class: u32) -> Option<TableRef> {
    let index = service_id * CLASSES_PER_SERVICE.load() + class;
    match TABLE_INDEX.get(index) {
        Some(t) if t.flags & table_flags::ACTIVE != 0 => Some(*t),
        _ => None,
    }
}

/// The table of the class, or of class 0 (non-compatible clients) when the class has none;
/// returns the class whose table is used.
#[inline(always)]
pub fn class_table(service_id: u32, class: u32) -> Option<(u32, TableRef)> {
    if let Some(t) = table_ref(service_id, class) {
        return Some((class, t));
    }
    if class != CLASS_NONE {
        if let Some(t) = table_ref(service_id, CLASS_NONE) {
            return Some((CLASS_NONE, t));
        }
    }
    None
}

/// The Maglev slot of `hash` (`hash % M`); None before the load-time size is set.
#[inline(always)]
pub fn maglev_index(hash: u32) -> Option<u32> {
    let m = TABLE_M.load();
    if m == 0 {
        return None;
    }
    Some(maglev_slot(hash, m))
}

/// Backend id at Maglev slot `index` of table `slot`.
#[inline(always)]
pub fn table_entry(slot: u32, index: u32) -> Option<u32> {
    TABLES.get(slot * TABLE_M.load() + index).copied()
}

/// Whether Maglev slot `index` of table `slot` is clean (`CLEAN_SLOTS`): no live entry of it
/// names another backend, so a SYN there needs none.
#[inline(always)]
pub fn slot_clean(slot: u32, index: u32) -> bool {
    let (word, bit) = clean_slots::bit(index);
    let at = slot * clean_slots::words(TABLE_M.load()) + word;
    matches!(CLEAN_SLOTS.get(at), Some(&w) if w & bit != 0)
}
