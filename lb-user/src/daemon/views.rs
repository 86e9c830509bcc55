//! Views the daemon answers from its state alone, shared with the offline CLI so both give the
//! same answer for the same state: `lb explain` against a daemon, and `lb explain --config`.

use crate::compile::explain::{self, Explanation, Flow};
use crate::compile::Compiled;
use crate::config::Config;
use crate::daemon::api::Proto;
use crate::model::Protocol;
use anyhow::{bail, Result};
use std::net::IpAddr;

/// What a new flow of `service` from `client` gets with the tables `compiled` of `cfg`. The
/// flow's defaults: source port 40000, the service's first port, its protocol.
pub fn explain(
    cfg: &Config,
    compiled: &Compiled,
    service: &str,
    client: IpAddr,
    sport: Option<u16>,
    dport: Option<u16>,
    proto: Option<Proto>,
) -> Result<Explanation> {
    let svc = cfg
        .services
        .iter()
        .find(|s| s.name == service)
        .ok_or_else(|| anyhow::anyhow!("no service named {service:?}"))?;
    let proto =
        match (proto.unwrap_or(if svc.protocol == Protocol::Udp { Proto::Udp } else { Proto::Tcp }), svc.protocol) {
            (Proto::Tcp, _) => lb_common::maps::PROTO_TCP,
            (Proto::Udp, _) => lb_common::maps::PROTO_UDP,
            (Proto::Icmp, Protocol::L3Default) if client.is_ipv4() => libc::IPPROTO_ICMP as u8,
            (Proto::Icmp, Protocol::L3Default) => libc::IPPROTO_ICMPV6 as u8,
            (Proto::Icmp, p) => bail!(
                "--proto icmp: service {service:?} is {}; allowed values: tcp, udp (icmp for L3_DEFAULT services)",
                p.as_str()
            ),
        };
    let flow =
        Flow { client, sport: sport.unwrap_or(40000), dport: dport.or(svc.ports.first().copied()).unwrap_or(0), proto };
    explain::explain(cfg, compiled, service, &flow)
}
