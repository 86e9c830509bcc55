//! Builds the XDP objects (`lb-ebpf`) with the nightly toolchain for `bpfel-unknown-none` and
//! hands their paths to the crate (embedded with `include_bytes_aligned!`):
//! - `LB_EBPF_OBJ`: the balancer's production object (`lb`, `clock_probe`);
//! - `LB_EBPF_DECAP_OBJ`: the decapsulator's object (`lb_decap`, for `lb decap attach`);
//! - `LB_EBPF_BENCH_OBJ`: the bench build of the balancer's object (feature `bench`: `lb` plus
//!   the bench programs), not embedded, only its path: lb-tests' `dp_bench` loads it.
//!
//! The bench build has a target directory of its own (`target/bpf-bench`), so that neither
//! build overwrites the other's `lb`; the two builds run side by side.
//! The toolchain (nightly + rust-src + bpf-linker) is installed by `cargo xtask setup`.
use std::{
    env,
    path::{Path, PathBuf},
    process::{Child, Command},
};

/// Starts `cargo +nightly build` of lb-ebpf into `target_dir` with `extra` arguments.
fn start_build(ebpf_dir: &Path, target_dir: &Path, extra: &[&str]) -> Child {
    let mut cmd = Command::new("cargo");
    // The nested cargo must not inherit this build's toolchain, flags or target settings.
    for (k, _) in env::vars() {
        if k.starts_with("CARGO")
            || k.starts_with("RUSTC")
            || k == "RUSTUP_TOOLCHAIN"
            || k == "RUSTFLAGS"
            || k == "RUSTDOCFLAGS"
        {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(ebpf_dir)
        .args(["+nightly", "build", "--release", "--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .args(extra)
        .arg("--target-dir")
        .arg(target_dir);
    cmd.spawn().unwrap_or_else(|e| panic!("running cargo +nightly for lb-ebpf: {e}"))
}

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let ebpf_dir = root.join("lb-ebpf");
    for dir in ["lb-ebpf/src", "lb-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for f in ["lb-ebpf/Cargo.toml", "lb-ebpf/Cargo.lock", "lb-common/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let production_dir = root.join("target").join("bpf");
    let bench_dir = root.join("target").join("bpf-bench");
    let builds = [
        ("the production objects", start_build(&ebpf_dir, &production_dir, &[])),
        ("the bench object", start_build(&ebpf_dir, &bench_dir, &["--features", "bench", "--bin", "lb"])),
    ];
    for (what, mut child) in builds {
        let status = child.wait().unwrap_or_else(|e| panic!("waiting for cargo +nightly for lb-ebpf: {e}"));
        if !status.success() {
            panic!(
                "building {what} of lb-ebpf failed ({status}); the eBPF toolchain (nightly, rust-src, \
                 bpf-linker) is installed by `cargo xtask setup`"
            );
        }
    }
    let obj = |dir: &Path, bin: &str| dir.join("bpfel-unknown-none/release").join(bin).display().to_string();
    println!("cargo:rustc-env=LB_EBPF_OBJ={}", obj(&production_dir, "lb"));
    println!("cargo:rustc-env=LB_EBPF_DECAP_OBJ={}", obj(&production_dir, "lb-decap"));
    println!("cargo:rustc-env=LB_EBPF_BENCH_OBJ={}", obj(&bench_dir, "lb"));
}
