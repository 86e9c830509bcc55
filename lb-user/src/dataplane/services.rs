//! Services: their keys in `SERVICE_TABLE` (through [`ServiceTable`]) and their addresses in
//! `VIPS`, kept in step (a next-hop service's keys hold a route, not an address, and have none).

use std::collections::HashMap as StdHashMap;

use anyhow::{bail, Result};
use lb_common::maps::{AddrKey, ServiceInfo, ServiceKey, FAMILY_NEXT_HOP};

use super::service_table::ServiceTable;
use super::{addr_key, Dataplane};

impl Dataplane {
    /// The service keys in the active half of `SERVICE_TABLE`, with their services, as the
    /// kernel reads them (after a restart: what the previous daemon installed).
    pub fn installed_services(&self) -> Vec<(ServiceKey, ServiceInfo)> {
        self.services.read_active().unwrap_or_default()
    }

    /// Whether service table halves are written through a shared mapping.
    pub fn service_table_mapped(&self) -> bool {
        self.services.mapped()
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
            // A next-hop service's key holds a route, not an address: nothing goes to VIPS.
            for key in keys.iter().filter(|k| k.family != FAMILY_NEXT_HOP) {
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
}

/// Service keys per VIP address of the installed keys.
pub(super) fn vip_refs(services: &ServiceTable) -> StdHashMap<AddrKey, usize> {
    let mut refs = StdHashMap::new();
    for (key, _) in services.installed().filter(|(k, _)| k.family != FAMILY_NEXT_HOP) {
        *refs.entry(addr_key(key.addr, key.family)).or_default() += 1;
    }
    refs
}
