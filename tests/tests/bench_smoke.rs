//! `cargo xtask bench` keeps working: `dp_bench --quick --no-single` loads every bench program
//! of the object (the wrapper, the stage programs) and checks each run's verdict, counter
//! deltas and the frame it leaves itself, failing if any iteration took another path. The
//! headline cases (cold hits, new flows into a full table) run too, on a table of 4096 flows.

#[test]
fn dp_bench_quick_run_passes_its_own_checks() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dp_bench"))
        .args(["--quick", "--no-single"])
        .output()
        .expect("running dp_bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "dp_bench failed:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    for row in [
        "lb, cold hit (one of many established flows)",
        "lb, new flow into a full table",
        "lb, conntrack hit (TCP ACK), incl. wrapper",
        "lb, new flow (TCP SYN), incl. wrapper",
        "CONNTRACK4 insert, new key, filled table",
        "lb L2 DSR, conntrack hit, incl. wrapper",
        "lb L2 DSR, conntrack hit, no wrapper",
        "two bpf_xdp_adjust_head calls, delta 0",
        "the wrapper's own overhead on an IPIP case, estimated",
        "target IPv4 conntrack hit <= 70 ns above the floor: IPIP incl. wrapper",
        "the production program alone (L2 DSR, no wrapper)",
    ] {
        assert!(text.contains(row), "missing row {row:?} in:\n{text}");
    }
}
