//! `BACKEND_SOURCES`: each service's backend addresses, for the data plane's martian check (a
//! new flow of a service from one of its own backends is dropped: a backend reaches its own
//! service's VIP locally, so only a spoofer sends such a packet through the balancer).

use std::collections::HashSet;
use std::net::IpAddr;

use anyhow::{Context, Result};
use lb_common::maps::{addr_words, SourceKey};

use super::Dataplane;

fn source_key(service: u32, addr: IpAddr) -> SourceKey {
    let (addr, family) = addr_words(addr);
    SourceKey { addr, service, family, _pad: [0; 3] }
}

impl Dataplane {
    /// Sets the backend addresses of `service` (empty when the service is gone): the new ones
    /// are added before the old ones are removed. A nested endpoint's unspecified address is
    /// no source.
    pub fn set_backend_sources(&mut self, service: u32, addrs: &[IpAddr]) -> Result<()> {
        let new: HashSet<SourceKey> =
            addrs.iter().filter(|a| !a.is_unspecified()).map(|a| source_key(service, *a)).collect();
        let old = self.backend_sources_of.remove(&service).unwrap_or_default();
        // Until both steps are done, the bookkeeping holds both sets: a failure is retried whole.
        self.backend_sources_of.insert(service, old.union(&new).copied().collect());
        for k in new.difference(&old) {
            self.backend_sources.insert(k, 1, 0).context("writing BACKEND_SOURCES")?;
        }
        for k in old.difference(&new) {
            // Gone already (another writer's clean-up): nothing to do.
            let _ = self.backend_sources.remove(k);
        }
        if new.is_empty() {
            self.backend_sources_of.remove(&service);
        } else {
            self.backend_sources_of.insert(service, new);
        }
        Ok(())
    }

    /// Removes the sources of every service not in `services` (after a restart: what only the
    /// previous configuration had).
    pub fn keep_backend_sources(&mut self, services: &HashSet<u32>) -> Result<()> {
        let gone: Vec<u32> = self.backend_sources_of.keys().filter(|s| !services.contains(s)).copied().collect();
        for service in gone {
            self.set_backend_sources(service, &[])?;
        }
        Ok(())
    }

    /// The bookkeeping of `BACKEND_SOURCES` rebuilt from the map (a restart adopting it).
    pub(super) fn recover_backend_sources(&mut self) {
        self.backend_sources_of.clear();
        for key in self.backend_sources.keys().filter_map(|k| k.ok()) {
            self.backend_sources_of.entry(key.service).or_default().insert(key);
        }
    }
}
