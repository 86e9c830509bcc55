//! The live-traffic bench's harness works (`live_bench`, BENCHMARKS.md "Live traffic"): one
//! tiny round of each system (lb, nftables, the trivial XDP forwarder) through the same namespaces. Asserts that frames reached the
//! sinks and that `lb` tracked them (misses that made entries) and found them (connection-table hits); no speed.
//! Needs root and `nft` (Debian `nftables`, installed by `cargo xtask setup`).

use lb_tests::live::{round, Case, Flows, LiveTopology, Proto, System};

#[test]
fn every_system_forwards_generated_flows_to_the_sinks() {
    let topo = LiveTopology::build("lvs", 4).expect("live topology (needs root and nftables)");
    for proto in [Proto::Udp, Proto::Tcp] {
        let case = Case { proto, flows: Flows::Established(100) };
        let g = topo.generator(case).expect("generator");
        for system in [System::Lb, System::Nft, System::Fwd] {
            let r = round(&topo, &g, case, system, 0.2).expect("round");
            assert!(r.forwarded > 0, "{} {}: nothing reached the sinks: {r:?}", system.name(), case.name());
            if let Some(c) = &r.lb_counters {
                let n = |k: &str| c[k].as_u64().unwrap_or(0);
                // Each flow's first packet missed and made its entry (the generated TCP flows
                // have no SYN, so they are no new connections: `new_flow` counts SYNs).
                assert!(n("ct_miss") >= 100, "{}: lb tracked no new flows: {c}", case.name());
                assert!(n("ct_hit") > 0, "{}: lb counted no connection-table hits: {c}", case.name());
                assert!(n("tx") + n("redirect") > 0, "{}: lb forwarded nothing: {c}", case.name());
            }
        }
    }
}
