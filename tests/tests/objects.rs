//! What each XDP object holds, read from the ELF without loading it (no BPF, no lock needed):
//! the production object exactly `lb`, its traced build `lb_traced` and `clock_probe`, the
//! decapsulator's exactly `lb_decap`,
//! and the bench build the production programs plus the bench programs `dp_bench` runs.

use std::collections::BTreeSet;

fn parse(object: &[u8]) -> aya_obj::Object {
    aya_obj::Object::parse(object).expect("parsing the XDP object")
}

fn programs(object: &[u8]) -> BTreeSet<String> {
    parse(object).programs.into_keys().collect()
}

/// The object's maps, without the sections of its globals (`.bss`, `.rodata`, `.data`).
fn maps(object: &[u8]) -> BTreeSet<String> {
    parse(object).maps.into_keys().filter(|m| !m.starts_with('.')).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

const PRODUCTION_PROGRAMS: &[&str] = &["lb", "lb_traced", "clock_probe"];

#[test]
fn the_production_object_holds_the_balancer_its_traced_build_and_clock_probe_only() {
    let object = lb_user::dataplane::EBPF_OBJECT;
    assert_eq!(programs(object), set(PRODUCTION_PROGRAMS));
    let mut expected: BTreeSet<String> = set(&lb_user::dataplane::MAP_NAMES);
    // Not pinned: the next-hop cache, the route lookup's parameter block, the clock's slot,
    // the MACs of the interfaces the balancer is attached to (each loaded object its own), the
    // ICMP replies' per-CPU rate limit, the traced build's per-CPU packet in progress.
    expected.extend(set(&["NEXT_HOPS", "FIB_PARAMS", "CLOCK_PROBE", "LOCAL_MACS", "ICMP_RATE", "TRACE_SCRATCH"]));
    assert_eq!(maps(object), expected);
    assert!(!lb_user::dataplane::MAP_NAMES.contains(&"DECAP_ADDRS"));
}

#[test]
fn the_decap_object_holds_lb_decap_and_its_own_maps_only() {
    let object = lb_user::cli::decap::EBPF_OBJECT;
    assert_eq!(programs(object), set(&["lb_decap"]));
    assert_eq!(maps(object), set(&["DECAP_ADDRS", "STATS"]));
}

#[test]
fn the_bench_object_adds_the_bench_programs_to_the_production_ones() {
    let object = std::fs::read(lb_user::dataplane::BENCH_OBJECT_PATH).expect("reading the bench object");
    let mut expected = set(PRODUCTION_PROGRAMS);
    expected.extend(set(&[
        "bench_empty",
        "bench_mac_swap",
        "bench_ct_insert",
        "bench_ct_insert_new",
        "bench_ct_lookup",
        "bench_restore_only",
        "bench_helper_calls",
        "bench_lb",
        "bench_stage1",
        "bench_stage2",
        "bench_stage3",
        "bench_stage4",
    ]));
    assert_eq!(programs(&object), expected);
    // The same maps as the production object: dp_bench loads it with the data plane's sizes.
    assert_eq!(maps(&object), maps(lb_user::dataplane::EBPF_OBJECT));
}

/// Each object says its licence to the kernel, and says the eBPF crates' one: `bpf_fib_lookup`
/// is GPL-only (tests/license.rs shows the verifier refusing `lb` under another licence), so
/// it is dual MIT / GPL, as lb-ebpf's and lb-common's `license` fields say.
#[test]
fn every_object_carries_the_dual_mit_gpl_license() {
    let bench = std::fs::read(lb_user::dataplane::BENCH_OBJECT_PATH).expect("reading the bench object");
    for object in [lb_user::dataplane::EBPF_OBJECT, lb_user::cli::decap::EBPF_OBJECT, &bench] {
        // Without a `license` section aya would tell the kernel "GPL".
        assert_eq!(parse(object).license.to_str().unwrap(), "Dual MIT/GPL");
    }
    for manifest in ["lb-ebpf/Cargo.toml", "lb-common/Cargo.toml"] {
        let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(manifest))
            .unwrap();
        assert!(text.contains("license = \"MIT OR GPL-2.0-only\""), "{manifest} is not dual MIT / GPL-2.0");
    }
}
