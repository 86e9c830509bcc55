//! The live connection tables read from their pins (`lb flows`), with what the data plane would
//! make of each entry now. Reads one bucket per map read, so a table of any size streams in
//! constant memory and no packet ever waits for the reader; works with a daemon running and on
//! pins a stopped `--keep-dataplane` daemon left. A bucket is copied and each slot's state word
//! checked, so a slot being written at that instant is skipped, not shown half-written.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use anyhow::{bail, Context, Result};
use aya::maps::{Array, Map, MapData};
use lb_common::ct_table::{Bucket4, Bucket6, Slot as _};
use lb_common::decide::{self, CtVerdict};
use lb_common::maps::{
    backend_flags, table_flags, Backend, CtEntry, CtKey, ServiceInfo, ServiceKey, ServiceSlot, ServiceTableRef,
    TableRef, FAMILY_V4, FAMILY_V6,
};

use super::conntrack::is_live;

/// What the data plane makes of an entry at the moment it was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowState {
    /// Valid: the next packet of the flow goes to the entry's backend.
    Live,
    /// Valid, but its backend left the service (a reload or a drain): the flow continues until
    /// the drain deadline, then its entry is void.
    Draining,
    /// No packet for longer than the service's idle timeout: the next packet is a new flow, and
    /// the slot may be taken by another flow.
    Idle,
    /// The next packet voids the entry and is treated as a new flow, for this reason.
    Void(VoidReason),
}

/// Why an entry no longer holds ([`CtVerdict`] minus idleness, plus a service that is gone).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VoidReason {
    /// The service's active pool changed (failover) and its flows are flushed.
    PoolFlushed,
    /// The backend left and its drain deadline passed, or its id belongs to another backend now.
    BackendGone,
    /// The backend is unhealthy and the service does not persist this protocol's flows there.
    Unhealthy,
    /// No service of the active service table has the entry's service id (the service was
    /// removed by a reload).
    ServiceGone,
}

impl FlowState {
    /// `live`, `draining`, `idle`, `void`.
    pub fn name(self) -> &'static str {
        match self {
            FlowState::Live => "live",
            FlowState::Draining => "draining",
            FlowState::Idle => "idle",
            FlowState::Void(_) => "void",
        }
    }

    /// Why a void entry is void.
    pub fn reason(self) -> Option<&'static str> {
        match self {
            FlowState::Void(VoidReason::PoolFlushed) => Some("pool_flushed"),
            FlowState::Void(VoidReason::BackendGone) => Some("backend_gone"),
            FlowState::Void(VoidReason::Unhealthy) => Some("backend_unhealthy"),
            FlowState::Void(VoidReason::ServiceGone) => Some("service_gone"),
            _ => None,
        }
    }
}

/// One entry of a connection table, decoded.
#[derive(Clone, Debug)]
pub struct Flow {
    pub client: IpAddr,
    /// Source port; 0 when the service's tracking key leaves ports out.
    pub client_port: u16,
    /// The destination address the key holds (the VIP), or unspecified when the tracking key
    /// leaves it out.
    pub vip: IpAddr,
    pub port: u16,
    pub proto: u8,
    pub service_id: u32,
    pub backend_id: u32,
    /// The backend's address; None when the id is free or belongs to another backend now.
    pub backend: Option<IpAddr>,
    pub client_class: u16,
    /// Time since the flow's last packet.
    pub idle_ns: u64,
    /// Time until the entry idles out; None when the service's entries never idle out.
    pub idle_left_ns: Option<u64>,
    pub state: FlowState,
}

/// The pinned maps `lb flows` reads.
pub struct PinnedFlows {
    conntrack4: Array<MapData, Bucket4>,
    conntrack: Array<MapData, Bucket6>,
    backends: Array<MapData, Backend>,
    table_index: Array<MapData, TableRef>,
    classes_per_service: u32,
    /// Active service table: id -> record, and the keys (VIP, port, protocol) that name it.
    services: HashMap<u32, (ServiceInfo, Vec<ServiceKey>)>,
    now_ns: u64,
}

impl PinnedFlows {
    /// Opens the maps pinned in `pin_dir` (read only: nothing is written) and reads the clock.
    pub fn open(pin_dir: &Path) -> Result<Self> {
        if !pin_dir.join("CONNTRACK4").exists() {
            bail!(
                "no pinned connection tables in {} (is `lb run` running with this --pin-dir, or was it stopped with --keep-dataplane?)",
                pin_dir.display()
            );
        }
        let open = |name: &str| -> Result<Map> {
            let path = pin_dir.join(name);
            let data = MapData::from_pin(&path).with_context(|| format!("opening {}", path.display()))?;
            Ok(Map::Array(data))
        };
        let conntrack4 = Array::try_from(open("CONNTRACK4")?).context("CONNTRACK4 has another layout")?;
        let conntrack = Array::try_from(open("CONNTRACK")?).context("CONNTRACK has another layout")?;
        let backends = Array::try_from(open("BACKENDS")?).context("BACKENDS has another layout")?;
        let table_index: Array<MapData, TableRef> =
            Array::try_from(open("TABLE_INDEX")?).context("TABLE_INDEX has another layout")?;
        // TABLE_INDEX has classes_per_service rows per service id, CLASSED_SERVICES one.
        let path = pin_dir.join("CLASSED_SERVICES");
        let max_services = MapData::from_pin(&path)
            .and_then(|m| m.info())
            .with_context(|| format!("reading {}", path.display()))?
            .max_entries();
        let classes_per_service = table_index.len() / max_services.max(1);
        let services = active_services(&open("SERVICE_TABLE")?, &open("SERVICE_INDEX")?)?;
        Ok(Self {
            conntrack4,
            conntrack,
            backends,
            table_index,
            classes_per_service,
            services,
            now_ns: dataplane_now_ns()?,
        })
    }

    /// The keys (VIP, port, protocol) of each service id of the active service table.
    pub fn service_keys(&self) -> impl Iterator<Item = (u32, &[ServiceKey])> {
        self.services.iter().map(|(id, (_, keys))| (*id, keys.as_slice()))
    }

    /// Calls `f` with every entry of both tables, IPv4 first, one bucket read at a time.
    pub fn for_each(&self, mut f: impl FnMut(Flow)) -> Result<()> {
        for bucket in self.conntrack4.iter() {
            for slot in bucket.context("reading CONNTRACK4")?.slots.iter().filter(|s| is_live(*s)) {
                f(self.decode(FAMILY_V4, &slot.key().to_key(), &slot.entry()));
            }
        }
        for bucket in self.conntrack.iter() {
            for slot in bucket.context("reading CONNTRACK")?.slots.iter().filter(|s| is_live(*s)) {
                f(self.decode(FAMILY_V6, &slot.key().to_key(), &slot.entry()));
            }
        }
        Ok(())
    }

    fn decode(&self, family: u8, key: &CtKey, entry: &CtEntry) -> Flow {
        let t = &key.tuple;
        let backend = self.backends.get(&entry.backend, 0).ok();
        // The record is this entry's backend only at the entry's generation.
        let holder = backend.filter(|b| b.family != 0 && b.generation == entry.backend_gen);
        let service = self.services.get(&key.service).map(|(info, _)| info);
        let idle_ns = self.now_ns.saturating_sub(entry.last_seen_ns);
        let state = match service {
            None => FlowState::Void(VoidReason::ServiceGone),
            Some(info) => {
                let no_healthy = || {
                    let row = key.service * self.classes_per_service + entry.class as u32;
                    self.table_index.get(&row, 0).is_ok_and(|r| r.flags & table_flags::NO_HEALTHY != 0)
                };
                match decide::ct_verdict(entry, backend.as_ref(), info, t.proto, self.now_ns, no_healthy) {
                    CtVerdict::Valid if holder.is_some_and(|b| b.flags & backend_flags::REMOVED != 0) => {
                        FlowState::Draining
                    }
                    CtVerdict::Valid => FlowState::Live,
                    CtVerdict::IdleExpired => FlowState::Idle,
                    CtVerdict::PoolFlushed => FlowState::Void(VoidReason::PoolFlushed),
                    CtVerdict::BackendGone => FlowState::Void(VoidReason::BackendGone),
                    CtVerdict::Unhealthy => FlowState::Void(VoidReason::Unhealthy),
                }
            }
        };
        let idle_left_ns =
            service.filter(|info| info.idle_timeout_ns != 0).map(|info| info.idle_timeout_ns.saturating_sub(idle_ns));
        Flow {
            client: words_addr(&t.src, family),
            client_port: u16::from_be(t.sport),
            vip: words_addr(&t.dst, family),
            port: u16::from_be(t.dport),
            proto: t.proto,
            service_id: key.service,
            backend_id: entry.backend,
            backend: holder.map(|b| words_addr(&b.addr, b.family)),
            client_class: entry.class,
            idle_ns,
            idle_left_ns,
            state,
        }
    }
}

/// The active half of the pinned service table: id -> (record, keys).
fn active_services(table: &Map, index: &Map) -> Result<HashMap<u32, (ServiceInfo, Vec<ServiceKey>)>> {
    let table: Array<&MapData, ServiceSlot> = Array::try_from(table).context("SERVICE_TABLE has another layout")?;
    let index: Array<&MapData, ServiceTableRef> = Array::try_from(index).context("SERVICE_INDEX has another layout")?;
    let active = index.get(&0, 0).context("reading SERVICE_INDEX")?;
    let half = table.len() / 2;
    let mut services: HashMap<u32, (ServiceInfo, Vec<ServiceKey>)> = HashMap::new();
    for i in active.base..active.base.saturating_add(half).min(table.len()) {
        let slot = table.get(&i, 0).context("reading SERVICE_TABLE")?;
        if slot.key.family != 0 {
            services.entry(slot.info.id).or_insert_with(|| (slot.info, Vec::new())).1.push(slot.key);
        }
    }
    Ok(services)
}

/// The address in `words` (the maps' form: IPv4 in the first word, network byte order).
pub fn words_addr(words: &[u32; 4], family: u8) -> IpAddr {
    let bytes = |w: u32| w.to_ne_bytes();
    match family {
        FAMILY_V4 => IpAddr::V4(Ipv4Addr::from(bytes(words[0]))),
        _ => {
            let mut o = [0u8; 16];
            for (i, w) in words.iter().enumerate() {
                o[i * 4..i * 4 + 4].copy_from_slice(&bytes(*w));
            }
            IpAddr::V6(Ipv6Addr::from(o))
        }
    }
}

/// The data-plane clock now (see lb-ebpf `clock`): the kernel's jiffies, from
/// /proc/timer_list, times the tick length. Unlike [`super::Dataplane::now_ns`] it needs no
/// loaded program, so it works beside a daemon and on pins alone; it can lag the program's
/// clock by a tick, which only shifts the idle times shown by one tick.
pub fn dataplane_now_ns() -> Result<u64> {
    let text = std::fs::read_to_string("/proc/timer_list").context("reading /proc/timer_list (needs root)")?;
    let jiffies = text
        .lines()
        .find_map(|l| l.strip_prefix("jiffies: "))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .context("/proc/timer_list has no `jiffies:` line")?;
    Ok(jiffies.wrapping_mul(super::ns_per_jiffy()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::maps::addr_words;

    #[test]
    fn words_addr_inverts_addr_words() {
        for a in ["198.18.1.7", "2001:db8::1:2", "0.0.0.0", "::"] {
            let ip: IpAddr = a.parse().unwrap();
            let (w, family) = addr_words(ip);
            assert_eq!(words_addr(&w, family), ip);
        }
    }

    #[test]
    fn state_names_and_reasons() {
        assert_eq!(FlowState::Live.name(), "live");
        assert_eq!(FlowState::Void(VoidReason::Unhealthy).reason(), Some("backend_unhealthy"));
        assert_eq!(FlowState::Idle.reason(), None);
    }
}
