//! How each data-plane counter (`lb_common::maps::stat::NAMES`, as `lb stats` shows them) is
//! exported to Prometheus: as a reason of one labelled family where counters are alternatives
//! (drops, passes, voided connection-table entries), else as a metric of its own with a unit
//! suffix. Families never double count: where the data plane counts a packet twice (a sub-reason
//! also counted in a broader one), the broader reason is exported without the sub-reason.

/// The labelled families: metric name (without `lb_`), help, and the counter-name prefix whose
/// counters are its reasons.
pub const FAMILIES: [(&str, &str, &str); 3] = [
    (
        "dropped_packets",
        "Packets the data plane dropped, by reason (the counter names of lb stats without drop_; \
         reasons do not overlap: each dropped packet counts once)",
        "drop_",
    ),
    ("passed_packets", "Packets to a VIP passed to the host's stack untouched, by reason", "pass_"),
    (
        "conntrack_voided_entries",
        "Connection-table entries found void by a packet (which was then treated as a new flow), by reason",
        "ct_void_",
    ),
];

/// Counters that the data plane also counts in a broader one: (sub-reason, broader reason).
/// The broader reason is exported minus the sub-reason.
pub const CONTAINED: [(&str, &str); 2] = [("drop_no_neigh", "drop_fib"), ("drop_too_big_no_df", "drop_too_big")];

/// Where one counter goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Export {
    /// Reason `reason` of the family at `FAMILIES[family]`.
    Reason { family: usize, reason: &'static str },
    /// A metric of its own (name without `lb_`, a counter: `_total` is added), with its help.
    Own { name: &'static str, help: &'static str },
}

/// The export of the counter `name`. Every counter has one (a test checks the list), so a new
/// counter gets a deliberate name and help.
pub fn export(name: &'static str) -> Option<Export> {
    let reason = |family: usize, prefix: &str| Export::Reason { family, reason: &name[prefix.len()..] };
    Some(match name {
        n if n.starts_with("drop_") => reason(0, "drop_"),
        "decap_drop_malformed" => Export::Reason { family: 0, reason: "decap_malformed" },
        n if n.starts_with("pass_") => reason(1, "pass_"),
        "ct_expired" => Export::Reason { family: 2, reason: "idle" },
        "ct_rerouted_unhealthy" => Export::Reason { family: 2, reason: "backend_unhealthy" },
        "ct_drain_expired" => Export::Reason { family: 2, reason: "drain_expired" },
        "ct_pool_flushed" => Export::Reason { family: 2, reason: "pool_flushed" },
        "rx_packets" => own("rx_packets", "Packets the balancer's XDP program received on the attached interfaces"),
        "ct_hit" => own("conntrack_hit_packets", "Packets of a VIP service that found a valid connection-table entry"),
        "ct_miss" => own("conntrack_miss_packets", "Packets of a VIP service with no valid connection-table entry"),
        "new_flow" => own(
            "new_flows",
            "New flows: packets that chose a backend from a Maglev table (a TCP connection once, at its SYN)",
        ),
        "tx" => own("tx_packets", "Packets forwarded back out of the ingress interface (XDP_TX)"),
        "redirect" => own("redirect_packets", "Packets forwarded out of another interface (bpf_redirect)"),
        "decap" => own("decap_packets", "Encapsulated packets lb_decap stripped for this host"),
        "ct_insert_busy" => own(
            "conntrack_insert_busy_packets",
            "New flows forwarded untracked because another CPU was writing their connection-table slot",
        ),
        "ct_evict_live" => own(
            "conntrack_live_evictions",
            "Confirmed live connection-table entries a new flow replaced (none since issue 35: kept at 0)",
        ),
        "ct_full_stateless" => own(
            "conntrack_full_stateless_packets",
            "Packets of flows without an entry forwarded by the stateless choice: all their candidate slots held \
             confirmed live flows",
        ),
        "ct_evict_unconfirmed" => own(
            "conntrack_unconfirmed_evictions",
            "Connection-table entries of flows that had shown one packet only, replaced by a new flow",
        ),
        "ct_syn_stateless" => own(
            "conntrack_stateless_syn_packets",
            "SYNs forwarded without reading or writing the connection table: no live entry of their Maglev slot \
             names another backend (the flow is inserted at its first ACK)",
        ),
        "ct_prev_table" => own(
            "conntrack_previous_table_packets",
            "Packets of flows without an entry sent where the table replaced moments before sent them (a \
             handshake straddling a table change)",
        ),
        "probe_sent" => own(
            "data_path_probe_packets",
            "Health-probe packets lb_probe delivered to their backend through the data path (path = VIP)",
        ),
        "icmp_too_big_sent" => own(
            "icmp_too_big_sent_packets",
            "ICMP fragmentation-needed / packet-too-big replies sent to clients whose packet would exceed the MTU",
        ),
        _ => return None,
    })
}

fn own(name: &'static str, help: &'static str) -> Export {
    Export::Own { name, help }
}

/// The value to export for counter `i` of `global` (indexed like `NAMES`): the counter, minus
/// the sub-reasons counted in it too.
pub fn exported_value(names: &[&str], global: &[u64], i: usize) -> u64 {
    let value = |name: &str| names.iter().position(|n| *n == name).and_then(|j| global.get(j)).copied().unwrap_or(0);
    let own = global.get(i).copied().unwrap_or(0);
    let inner: u64 = CONTAINED.iter().filter(|(_, outer)| *outer == names[i]).map(|(sub, _)| value(sub)).sum();
    own.saturating_sub(inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lb_common::maps::stat;

    #[test]
    fn every_counter_has_an_export_and_reasons_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for name in stat::NAMES {
            let e = export(name).unwrap_or_else(|| panic!("counter {name} has no export in daemon/exported.rs"));
            let key = match e {
                Export::Reason { family, reason } => format!("{}:{reason}", FAMILIES[family].0),
                Export::Own { name, .. } => name.to_owned(),
            };
            assert!(seen.insert(key.clone()), "{key} twice");
        }
    }

    #[test]
    fn contained_counters_are_subtracted_once() {
        let names = ["drop_fib", "drop_no_neigh", "rx_packets"];
        let global = [10, 4, 99];
        assert_eq!(exported_value(&names, &global, 0), 6);
        assert_eq!(exported_value(&names, &global, 1), 4);
        assert_eq!(exported_value(&names, &global, 2), 99);
        for (sub, outer) in CONTAINED {
            assert!(stat::NAMES.contains(&sub) && stat::NAMES.contains(&outer), "{sub} in {outer}");
        }
    }
}
