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

/// `dp_bench --katran OBJECT` (BENCHMARKS.md) takes an object the operator built from Katran's
/// source; a missing file, a file that is not a BPF object, or a BPF object that is not Katran's
/// balancer is refused before anything is loaded, with a message saying what was expected.
#[test]
fn dp_bench_refuses_a_missing_or_foreign_katran_object() {
    let not_bpf = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    for (object, expected) in [
        ("/nonexistent/balancer.bpf.o", "github.com/facebookincubator/katran"),
        (not_bpf, "is not a BPF object"),
        (lb_user::dataplane::BENCH_OBJECT_PATH, "has no program balancer_ingress"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dp_bench"))
            .args(["--katran", object])
            .output()
            .expect("running dp_bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "dp_bench --katran {object} succeeded");
        assert!(stderr.contains(expected), "dp_bench --katran {object}: {expected:?} missing in:\n{stderr}");
    }
}

/// dp_bench's arguments go through clap (issue 28): a bad value is refused before anything is
/// loaded, naming the option and what it allows.
#[test]
fn dp_bench_refuses_bad_arguments_naming_them() {
    for (args, expected) in [
        (&["--profile", "v5-hit"][..], "possible values: v4-hit"),
        (&["--ct-entries", "5"][..], "5 is not in 1024..=16777216"),
        (&["--rounds", "3"][..], "--compare <OBJECT>|--compare-cold <OBJECT>"),
        (&["--trace", "--stages"][..], "'--trace' cannot be used with '--stages'"),
    ] {
        let out =
            std::process::Command::new(env!("CARGO_BIN_EXE_dp_bench")).args(args).output().expect("running dp_bench");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "dp_bench {args:?}: {stderr}");
        assert!(stderr.contains(expected), "dp_bench {args:?}: {expected:?} missing in:\n{stderr}");
    }
}
