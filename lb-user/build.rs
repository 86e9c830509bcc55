//! Builds the XDP object (`lb-ebpf`) with the nightly toolchain for `bpfel-unknown-none` and
//! hands its path to the crate as `LB_EBPF_OBJ` (embedded with `include_bytes_aligned!`).
//! The toolchain (nightly + rust-src + bpf-linker) is installed by `cargo xtask setup`.
use std::{env, path::PathBuf, process::Command};

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
    let target_dir = root.join("target").join("bpf");
    let mut cmd = Command::new("cargo");
    // The nested cargo must not inherit this build's toolchain, flags or target settings.
    for (k, _) in env::vars() {
        if k.starts_with("CARGO") || k.starts_with("RUSTC") || k == "RUSTUP_TOOLCHAIN" || k == "RUSTFLAGS" || k == "RUSTDOCFLAGS" {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(&ebpf_dir)
        .args(["+nightly", "build", "--release", "--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .arg("--target-dir")
        .arg(&target_dir);
    let status = cmd.status().unwrap_or_else(|e| panic!("running cargo +nightly for lb-ebpf: {e}"));
    if !status.success() {
        panic!(
            "building lb-ebpf failed ({status}); the eBPF toolchain (nightly, rust-src, bpf-linker) \
             is installed by `cargo xtask setup`"
        );
    }
    let obj = target_dir.join("bpfel-unknown-none/release/lb");
    println!("cargo:rustc-env=LB_EBPF_OBJ={}", obj.display());
}
