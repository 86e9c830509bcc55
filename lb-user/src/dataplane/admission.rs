//! Admission: whether a change fits the data plane loaded at start, checked before anything
//! is written, and what an adopted data plane keeps. Both speak of a [`Demand`]: what a state
//! occupies in the data plane, in its own terms.

use std::collections::HashSet;

use anyhow::{bail, Context, Result};
use ipnet::IpNet;
use lb_common::maps::{AddrKey, ServiceInfo, ServiceKey};

use super::classes::canonical_prefix;
use super::{addr_key, Dataplane};

/// What a state of the tables occupies in the data plane, in its own terms: service ids and
/// keys, client-class prefixes, table slots and backend ids. A change is admitted against the
/// demand of its new state ([`Dataplane::admit`]); an adopted data plane keeps what the demand
/// of the configuration it is about to run has ([`Dataplane::sweep_unowned`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Demand<'a> {
    pub services: Vec<ServiceDemand<'a>>,
    /// Backend ids in use.
    pub backends: Vec<u32>,
    /// The (service id, class) tables written to reach this state, in write order: each write
    /// takes a free slot, and frees the one it replaces.
    pub table_writes: Vec<(u32, u32)>,
}

/// One service of a [`Demand`].
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceDemand<'a> {
    /// For messages only.
    pub name: &'a str,
    pub id: u32,
    /// Its service keys, each leading to `info`.
    pub keys: &'a [ServiceKey],
    pub info: &'a ServiceInfo,
    /// (client prefix, class).
    pub class_prefixes: &'a [(IpNet, u32)],
    /// The classes it has a table for.
    pub classes: Vec<u32>,
}

impl Demand<'_> {
    /// Every (service id, client prefix), as `CLIENT_CLASS` keys them.
    fn prefixes(&self) -> impl Iterator<Item = (u32, IpNet)> + '_ {
        self.services.iter().flat_map(|s| s.class_prefixes.iter().map(move |(net, _)| (s.id, canonical_prefix(*net))))
    }
}

impl Dataplane {
    /// Whether a change that needs `demand` fits the sizes and free room of this data plane,
    /// checked before any of it is written: ids, table slots (simulating the writes in order),
    /// service keys (the service table's own build, dry), `VIPS` and `CLIENT_CLASS` entries.
    pub fn admit(&self, demand: &Demand) -> Result<()> {
        let s = &self.sizes;
        for svc in &demand.services {
            if svc.id >= s.max_services {
                bail!(
                    "service {:?} would get id {}; the data plane holds ids below {} (max_services)",
                    svc.name,
                    svc.id,
                    s.max_services
                );
            }
            if let Some(class) = svc.classes.iter().find(|&&c| c >= s.classes_per_service) {
                bail!(
                    "service {:?} has client class {class}; the data plane holds {} classes per service",
                    svc.name,
                    s.classes_per_service
                );
            }
        }
        if let Some(id) = demand.backends.iter().find(|&&id| id >= s.max_backends) {
            bail!("a backend would get id {id}; the data plane holds ids below {} (max_backends)", s.max_backends);
        }
        // A table of a new (service, class) takes a free slot for good; a rewrite takes one and
        // frees its old one.
        let mut free = self.free_slots.len();
        for table in &demand.table_writes {
            if free == 0 {
                bail!(
                    "the new tables need more Maglev table slots than the {} the data plane has (table_slots)",
                    s.table_slots
                );
            }
            if !self.active_slots.contains_key(table) {
                free -= 1;
            }
        }
        let keys = demand.services.iter().flat_map(|svc| svc.keys.iter().map(move |k| (k, svc.info)));
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
        prefixes.extend(demand.prefixes());
        let prefix_capacity =
            self.sizes.map_max_entries().iter().find(|(n, _)| *n == "CLIENT_CLASS").map_or(0, |(_, c)| *c);
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
    /// that `kept` (what the controller is about to write needs) does not have, which the controller,
    /// starting without a picture of it, cannot diff away, and which would otherwise take room
    /// the new configuration needs: service keys (and with them VIPs), client-class prefixes,
    /// tables. Returns (keys, prefixes, tables) removed. (Its backends are flagged only once the
    /// new tables are written, [`Dataplane::depart_unused_backends`]: if the start fails before,
    /// their flows go on.)
    pub fn sweep_unowned(&mut self, kept: &Demand) -> Result<(usize, usize, usize)> {
        let keys: HashSet<[u32; 5]> = kept.services.iter().flat_map(|s| s.keys.iter().map(|k| k.words())).collect();
        let stale_keys: Vec<ServiceKey> =
            self.services.installed().map(|(k, _)| *k).filter(|k| !keys.contains(&k.words())).collect();
        if !stale_keys.is_empty() {
            self.update_services(&[], &stale_keys)?;
        }
        let prefixes: HashSet<(u32, IpNet)> = kept.prefixes().collect();
        let stale_prefixes: Vec<(u32, IpNet)> =
            self.class_prefixes.iter().filter(|p| !prefixes.contains(p)).copied().collect();
        for (service, net) in &stale_prefixes {
            self.remove_class_prefix(*service, *net)?;
        }
        let tables: HashSet<(u32, u32)> =
            kept.services.iter().flat_map(|s| s.classes.iter().map(move |c| (s.id, *c))).collect();
        let stale_tables: Vec<(u32, u32)> = self.active_slots.keys().filter(|p| !tables.contains(p)).copied().collect();
        for (service, class) in &stale_tables {
            self.remove_table(*service, *class)?;
        }
        Ok((stale_keys.len(), stale_prefixes.len(), stale_tables.len()))
    }

    /// After the first reconcile on an adopted data plane: flags the backend records of ids
    /// `kept` (what the controller wrote needs) does not use as REMOVED, draining until
    /// `now + drain_ns(id)`; one that was draining already keeps its deadline. Returns how many.
    pub fn depart_unused_backends(&mut self, kept: &Demand, now: u64, drain_ns: &dyn Fn(u32) -> u64) -> Result<usize> {
        let used: HashSet<u32> = kept.backends.iter().copied().collect();
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
}
