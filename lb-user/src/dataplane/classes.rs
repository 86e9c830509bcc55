//! Client-class prefixes: the `CLIENT_CLASS` trie (per service, longest prefix wins) and the
//! `CLASSED_SERVICES` flags that tell the kernel to consult it.

use std::net::{IpAddr, Ipv6Addr};

use anyhow::{bail, Context, Result};
use aya::maps::lpm_trie::Key as LpmKey;
use ipnet::IpNet;
use lb_common::maps::{addr_words, ClassKey, CLASS_KEY_SERVICE_BITS};

use super::Dataplane;

/// The 128-bit trie address of a client prefix and its prefix length: IPv4 as `::ffff:a.b.c.d`.
pub(super) fn class_prefix(net: IpNet) -> ([u32; 4], u32) {
    match net {
        IpNet::V4(n) => {
            ([0, 0, 0xffffu32.to_be(), u32::from_ne_bytes(n.network().octets())], 96 + n.prefix_len() as u32)
        }
        IpNet::V6(n) => (addr_words(IpAddr::V6(n.network())).0, n.prefix_len() as u32),
    }
}

/// The form the writer keeps a client prefix in (what reading it back from the trie gives):
/// `::ffff:198.19.0.0/112` and `198.19.0.0/16` are one trie key, so one prefix.
pub(super) fn canonical_prefix(net: IpNet) -> IpNet {
    let (addr, len) = class_prefix(net.trunc());
    trie_prefix(addr, len)
}

/// The client prefix of a trie key (inverse of [`class_prefix`]).
pub(super) fn trie_prefix(addr: [u32; 4], len: u32) -> IpNet {
    let bytes: Vec<u8> = addr.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let v6 = Ipv6Addr::from(<[u8; 16]>::try_from(bytes.as_slice()).unwrap_or([0; 16]));
    match v6.to_ipv4_mapped() {
        Some(v4) if len >= 96 => IpNet::V4(ipnet::Ipv4Net::new(v4, (len - 96) as u8).unwrap_or_default()),
        _ => IpNet::V6(ipnet::Ipv6Net::new(v6, len.min(128) as u8).unwrap_or_default()),
    }
}

impl Dataplane {
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
}
