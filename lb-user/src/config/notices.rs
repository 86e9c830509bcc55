//! Settings a configuration accepts that have no effect in it: each one a warning (`lb
//! validate` prints them, the daemon logs them at start and at every reload), never silently
//! ignored. They are warnings, not errors, because each applies only with something else in the
//! file (a forwarding method, a section, a routing method): refusing them would make an operator
//! delete and retype them to switch a service's forwarding or to stage a section. Settings that
//! could never take effect are refused instead (`validate`: `subsetting`, Traffic Manager
//! weights and TTLs).

use super::{Config, Scope, Violation};
use crate::model::{Forwarding, RoutingMethod, Spillover};

/// The warnings of `cfg`, in file order.
pub fn notices(cfg: &Config) -> Vec<Violation> {
    let mut out = Vec::new();
    let ipip = |v4: bool| {
        cfg.services.iter().any(|s| s.forwarding == Forwarding::Ipip && s.vip().is_some_and(|v| v.is_ipv4() == v4))
    };
    for (field, set, v4) in [
        ("dataplane.encap_source_v4", cfg.dataplane.encap_source_v4.is_some(), true),
        ("dataplane.encap_source_v6", cfg.dataplane.encap_source_v6.is_some(), false),
    ] {
        if set && !ipip(v4) {
            let family = if v4 { "IPv4" } else { "IPv6" };
            out.push(Violation {
                scope: Scope::Dataplane,
                field: field.into(),
                problem: format!("has no effect: no {family} service forwards with IPIP"),
            });
        }
    }
    let method_used = |m: RoutingMethod| cfg.services.iter().any(|s| s.routing_method() == m);
    if !cfg.latency.is_empty() && !method_used(RoutingMethod::Performance) {
        out.push(Violation {
            scope: Scope::Latency { index: 0 },
            field: "latency".into(),
            problem: "has no effect: no service uses routing_method PERFORMANCE".into(),
        });
    }
    if !cfg.geo.is_empty() && !method_used(RoutingMethod::Geographic) {
        out.push(Violation {
            scope: Scope::Geo { index: 0 },
            field: "geo".into(),
            problem: "has no effect: no service uses routing_method GEOGRAPHIC".into(),
        });
    }
    let named = cfg.services.iter().any(|s| s.backends.iter().any(|b| b.name_target().is_some()));
    if cfg.resolver != super::Resolver::default() && !named {
        out.push(Violation {
            scope: Scope::Resolver,
            field: "resolver".into(),
            problem: "has no effect: no endpoint is given by DNS name (target)".into(),
        });
    }
    for (index, s) in cfg.services.iter().enumerate() {
        let scope = || Scope::Service { index, name: s.name.clone() };
        if s.tm().is_some_and(|t| t.dns_name.is_some()) && cfg.dns.is_none() {
            out.push(Violation {
                scope: scope(),
                field: "dns_name".into(),
                problem: "has no effect without a [dns] section (nothing answers for the name)".into(),
            });
        }
        // The spec (§1.5, Compatibility): symmetric only if both directions use zonal affinity
        // (one service here: they do) and senders talk only to receivers of their own zone,
        // which no configuration shows.
        let zonal_affinity = s.zonal().is_some_and(|z| z.zonal_affinity.spillover != Spillover::Disabled);
        if s.next_hop().is_some_and(|n| n.symmetric) && zonal_affinity && !cfg.zones.is_empty() {
            out.push(Violation {
                scope: scope(),
                field: "next_hop.symmetric".into(),
                problem: "holds only for flows between hosts of one zone: with zonal affinity each direction \
                          chooses from its sender's zone, so the two directions of a cross-zone flow may \
                          cross different appliances (lb validate cannot see where traffic goes)"
                    .into(),
            });
        }
        if s.forwarding != Forwarding::L2Dsr {
            for (b, backend) in s.backends.iter().enumerate() {
                if backend.mac.is_some() {
                    out.push(Violation {
                        scope: scope(),
                        field: format!("backend[{b}].mac"),
                        problem: format!(
                            "has no effect: only forwarding = \"L2_DSR\" sends to a backend's MAC (this service forwards with {})",
                            s.forwarding.as_str()
                        ),
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notes(text: &str) -> Vec<String> {
        notices(&Config::parse(text).unwrap()).iter().map(|v| v.to_string()).collect()
    }

    const WEB: &str = "[[service]]\nname = \"web\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [80]\n";

    #[test]
    fn settings_without_effect_are_named() {
        let text = format!(
            "[dataplane]\nencap_source_v4 = \"198.18.0.1\"\nencap_source_v6 = \"2001:db8::1\"\n\
             [[geo]]\nclient_prefixes = [\"198.18.1.0/24\"]\nregion = \"DE\"\n{WEB}routing_method = \"PRIORITY\"\n\
             dns_name = \"web.example.net\"\nforwarding = \"L2_DSR\"\n\
             [[service.backend]]\naddress = \"198.18.11.1\"\nmac = \"02:00:00:00:00:01\"\n\
             [[service]]\nname = \"db\"\nvip = \"198.18.0.101\"\nprotocol = \"TCP\"\nports = [5432]\n\
             [[service.backend]]\naddress = \"198.18.11.2\"\nmac = \"02:00:00:00:00:02\"\n"
        );
        let got = notes(&text);
        let want = [
            "dataplane.encap_source_v6: has no effect: no IPv6 service forwards with IPIP",
            "geo[0]: geo: has no effect: no service uses routing_method GEOGRAPHIC",
            "service \"web\": dns_name: has no effect without a [dns] section (nothing answers for the name)",
            "service \"db\": backend[0].mac: has no effect: only forwarding = \"L2_DSR\" sends to a backend's MAC (this service forwards with IPIP)",
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn symmetric_hashing_with_zonal_affinity_is_flagged() {
        let fw = "[[zone]]\nname = \"z1\"\nclient_prefixes = [\"198.18.10.0/24\"]\n\
                  [[service]]\nname = \"fw\"\nprotocol = \"L3_DEFAULT\"\n\
                  [service.next_hop]\ndestinations = [\"0.0.0.0/0\"]\n\
                  [service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_STAY_WITHIN_ZONE\"\n\
                  [[service.backend]]\naddress = \"198.18.3.1\"\nzone = \"z1\"\n";
        let got = notes(fw);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("service \"fw\": next_hop.symmetric: holds only for flows between hosts of one zone")
        );
        assert!(notes(
            &fw.replace("destinations = [\"0.0.0.0/0\"]", "destinations = [\"0.0.0.0/0\"]\nsymmetric = false")
        )
        .is_empty());
    }

    #[test]
    fn a_resolver_section_without_name_endpoints_is_flagged() {
        let tm = format!("{WEB}routing_method = \"PRIORITY\"\n[[service.backend]]\n");
        let resolver = "[resolver]\nservers = [\"198.18.0.53\"]\n";
        assert_eq!(
            notes(&format!("{resolver}{tm}address = \"198.18.11.1\"\n")),
            ["resolver: has no effect: no endpoint is given by DNS name (target)"]
        );
        assert!(notes(&format!("{resolver}{tm}target = \"app.example.net\"\n")).is_empty());
    }

    #[test]
    fn a_configuration_whose_settings_all_apply_has_none() {
        let text = format!(
            "[dataplane]\nencap_source_v4 = \"198.18.0.1\"\n{WEB}[[service.backend]]\naddress = \"198.18.11.1\"\n"
        );
        assert!(notes(&text).is_empty());
    }
}
