//! What the controller writes through, the [`Tables`] trait, defined here in the data plane's
//! own terms so that the dependency points from the controller to the data plane; and the
//! data plane's implementation of it, each call one of the writer's operations.

use anyhow::{Context, Result};
use ipnet::IpNet;
use lb_common::maps::{Backend, ServiceInfo, ServiceKey};

use super::classes::canonical_prefix;
use super::{Dataplane, Demand};

/// Where the controller writes. Implemented by the BPF data plane and by test recorders.
pub trait Tables {
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<()>;
    /// Write a class table into a standby slot and make it active in one update.
    fn write_table(&mut self, service: u32, class: u32, flags: u32, entries: &[u32]) -> Result<()>;
    /// Replace the service's client-class prefixes.
    fn set_class_prefixes(&mut self, service: u32, old: &[(IpNet, u32)], new: &[(IpNet, u32)]) -> Result<()>;
    /// Removes `remove`, then installs services (each under its keys), as one change: the
    /// data plane publishes its service table once per call.
    fn update_services(&mut self, set: &[(&[ServiceKey], &ServiceInfo)], remove: &[ServiceKey]) -> Result<()>;
    /// Replace the next-hop routes `old` (as last written) with `new` (prefix, route).
    fn set_next_hop_routes(&mut self, old: &[(IpNet, u32)], new: &[(IpNet, u32)]) -> Result<()> {
        let _ = (old, new);
        Ok(())
    }
    /// Release a removed service's table slots.
    fn remove_tables(&mut self, service: u32, classes: u32) -> Result<()>;
    /// The backend addresses of `service` (empty: the service is gone), for the martian check.
    fn set_backend_sources(&mut self, service: u32, addrs: &[std::net::IpAddr]) -> Result<()> {
        let _ = (service, addrs);
        Ok(())
    }
    /// Forget the backend addresses of every service but `services` (a first write after a
    /// restart that adopted another configuration's maps).
    fn keep_backend_sources(&mut self, services: &std::collections::HashSet<u32>) -> Result<()> {
        let _ = services;
        Ok(())
    }
    /// The data plane's clock (ns, see [`Dataplane::now_ns`]), for drain deadlines.
    fn now_ns(&self) -> Result<u64>;
    /// Whether a change that needs `demand` fits: asked before anything is written, so that a
    /// change beyond what the sink holds (ids, table slots, service keys, class prefixes sized
    /// at load) is refused whole instead of failing half written. A sink without limits takes
    /// everything.
    fn admit(&self, demand: &Demand) -> Result<()> {
        let _ = demand;
        Ok(())
    }
}

/// The controller writes through this; each call maps to one of the writer's operations.
impl Tables for Dataplane {
    fn set_backend(&mut self, id: u32, backend: &Backend) -> Result<()> {
        Dataplane::set_backend(self, id, *backend)
    }
    fn set_backend_sources(&mut self, service: u32, addrs: &[std::net::IpAddr]) -> Result<()> {
        Dataplane::set_backend_sources(self, service, addrs)
    }
    fn keep_backend_sources(&mut self, services: &std::collections::HashSet<u32>) -> Result<()> {
        Dataplane::keep_backend_sources(self, services)
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
    fn set_next_hop_routes(&mut self, _old: &[(IpNet, u32)], new: &[(IpNet, u32)]) -> Result<()> {
        // Against what the trie holds, not `old`: a first write after a restart finds the
        // previous daemon's routes there. Add and update first, then remove: an address never
        // falls out of a routed prefix (or out of its exemption) in between.
        let held = self.next_hop_routes()?;
        for (net, route) in new {
            if !held.contains(&(*net, *route)) {
                self.set_next_hop_route(*net, *route)?;
            }
        }
        for (net, _) in &held {
            if !new.iter().any(|(n, _)| n == net) {
                self.remove_next_hop_route(*net)?;
            }
        }
        Ok(())
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
    fn admit(&self, demand: &Demand) -> Result<()> {
        Dataplane::admit(self, demand).context("the change does not fit the data plane loaded at start (restart the daemon to size it for this configuration); nothing was written")
    }
}
