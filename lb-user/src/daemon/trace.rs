//! `lb trace` on the daemon's side: the trace request (filter, rate, duration) and its check,
//! and the answer. The daemon writes the filter, attaches the traced program in place of `lb`
//! on its interfaces ([`crate::dataplane::Dataplane::set_tracing`]) and attaches `lb` again when
//! the client stops the trace, when its duration is over (a client that died cannot leave it
//! on) or when the daemon exits.

use std::net::IpAddr;

use anyhow::{bail, Result};
use lb_common::maps::{addr_words, PROTO_TCP, PROTO_UDP};
use lb_common::trace::TraceFilter;

use super::api::Proto;
pub use super::api::TraceSpec;
pub use super::reply::TraceState;

/// A trace runs this long at most; the client asks again to go on.
pub const MAX_SECONDS: u32 = 600;
/// Events per second and CPU at most.
pub const MAX_RATE: u32 = 10_000;

impl TraceSpec {
    /// The kernel's form, or what is wrong (naming the field and the allowed values).
    pub fn filter(&self) -> Result<TraceFilter> {
        if !(1..=MAX_RATE).contains(&self.rate) {
            bail!("rate {}: allowed values are 1..={MAX_RATE} events per second and CPU", self.rate);
        }
        let mut f = TraceFilter { rate_per_sec: self.rate, ..TraceFilter::default() };
        if let Some(net) = self.client {
            let net = net.trunc();
            let (words, family) = addr_words(net.network());
            (f.client, f.client_len, f.client_family) = (words, u32::from(net.prefix_len()), family);
        }
        if let Some(vip) = self.vip {
            (f.vip, f.vip_family) = addr_words(vip);
        }
        if let (Some(c), Some(v)) = (self.client, self.vip) {
            if c.addr().is_ipv4() != v.is_ipv4() {
                bail!("client {c} and vip {v}: of different address families, no packet matches both");
            }
        }
        f.port = self.port.unwrap_or(0).to_be();
        f.proto = match self.proto {
            None => 0,
            Some(Proto::Tcp) => PROTO_TCP,
            Some(Proto::Udp) => PROTO_UDP,
            // ICMPv4 and ICMPv6 have different numbers: the client's or VIP's family decides.
            Some(Proto::Icmp) => match (self.client.map(|c| c.addr()), self.vip) {
                (Some(IpAddr::V6(_)), _) | (_, Some(IpAddr::V6(_))) => libc::IPPROTO_ICMPV6 as u8,
                (Some(_), _) | (_, Some(_)) => libc::IPPROTO_ICMP as u8,
                (None, None) => bail!("proto icmp: give --client or --vip too (ICMP and ICMPv6 differ)"),
            },
        };
        Ok(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::maps::{FAMILY_V4, FAMILY_V6};

    #[test]
    fn specs_become_kernel_filters() {
        let spec = TraceSpec {
            client: Some("198.18.1.77/24".parse().unwrap()),
            vip: Some("198.18.0.100".parse().unwrap()),
            port: Some(80),
            proto: Some(Proto::Tcp),
            rate: 50,
        };
        let f = spec.filter().unwrap();
        assert_eq!((f.client_len, f.client_family, f.vip_family, f.proto), (24, FAMILY_V4, FAMILY_V4, PROTO_TCP));
        assert_eq!(f.client, addr_words("198.18.1.0".parse().unwrap()).0, "host bits cleared");
        assert_eq!((u16::from_be(f.port), f.rate_per_sec), (80, 50));
        let icmp6 = TraceSpec {
            vip: Some("2001:db8::1".parse().unwrap()),
            proto: Some(Proto::Icmp),
            rate: 1,
            ..Default::default()
        };
        let f = icmp6.filter().unwrap();
        assert_eq!((f.proto, f.vip_family), (libc::IPPROTO_ICMPV6 as u8, FAMILY_V6));
    }

    #[test]
    fn bad_specs_are_refused_naming_the_field() {
        let err = |s: TraceSpec| format!("{:#}", s.filter().unwrap_err());
        assert!(err(TraceSpec { rate: 0, ..Default::default() }).contains("rate 0: allowed values are 1..=10000"));
        let mixed = TraceSpec {
            client: Some("2001:db8::/32".parse().unwrap()),
            vip: Some("198.18.0.1".parse().unwrap()),
            rate: 1,
            ..Default::default()
        };
        assert!(err(mixed).contains("different address families"));
        assert!(
            err(TraceSpec { proto: Some(Proto::Icmp), rate: 1, ..Default::default() }).contains("--client or --vip")
        );
    }
}
