//! Builds the XDP objects (`lb-ebpf`) with the nightly toolchain for `bpfel-unknown-none` and
//! hands their paths to the crate (embedded with `include_bytes_aligned!`):
//! - `LB_EBPF_OBJ`: the balancer's production object (`lb`, `clock_probe`);
//! - `LB_EBPF_DECAP_OBJ`: the decapsulator's object (`lb_decap`, for `lb decap attach`);
//! - `LB_EBPF_PROBE_OBJ`: the health prober's object (`lb_probe`, probes through the data path);
//! - `LB_EBPF_BENCH_OBJ`: the bench build of the balancer's object (feature `bench`: `lb` plus
//!   the bench programs), not embedded, only its path: lb-tests' `dp_bench` loads it.
//!
//! and, for `lb --version`, `LB_GIT_COMMIT` (the commit built, `-dirty` with local changes) and
//! `LB_EBPF_SHA256` (the production object's SHA-256).
//!
//! Everything is written under `OUT_DIR` (never into the source tree), so that
//! `cargo install --path lb-user` and `cargo deb` work like any build. The bench build has a
//! target directory of its own (`OUT_DIR/bpf-bench`), so that neither build overwrites the
//! other's `lb`; the two builds run side by side.
//!
//! The nightly is the dated one `lb-ebpf/rust-toolchain.toml` pins; it and rust-src and
//! bpf-linker are installed by `cargo xtask setup`. The objects do not depend on the checkout's
//! directory (lb-ebpf/Cargo.toml says how); tests/tests/reproducible.rs builds them from two
//! copies with the command of `ebpf_build.rs`, which this file includes.
use sha2::{Digest, Sha256};
use std::{
    env,
    path::{Path, PathBuf},
    process::{Child, Command},
};

include!("ebpf_build.rs");

/// The commit of the source tree (`-dirty` with uncommitted changes), or `unknown` outside git.
fn git_commit(root: &Path) -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    // Rebuild when HEAD moves (a commit, a checkout) or the index changes.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        for f in ["HEAD", "logs/HEAD", "index"] {
            println!("cargo:rerun-if-changed={}", Path::new(&dir).join(f).display());
        }
    }
    match git(&["rev-parse", "--short=12", "HEAD"]) {
        Some(commit) => {
            let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            format!("{commit}{}", if dirty { "-dirty" } else { "" })
        }
        None => "unknown".to_owned(),
    }
}

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    let root = manifest_dir.parent().unwrap().to_path_buf();
    let ebpf_dir = root.join("lb-ebpf");
    for dir in ["lb-ebpf/src", "lb-common/src"] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }
    for f in ["lb-ebpf/Cargo.toml", "lb-ebpf/Cargo.lock", "lb-ebpf/rust-toolchain.toml", "lb-common/Cargo.toml"] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    check_toolchain(&ebpf_dir);
    let production_dir = out_dir.join("bpf");
    let bench_dir = out_dir.join("bpf-bench");
    let builds = [
        ("the production objects", start_build(&ebpf_dir, &production_dir, &[])),
        ("the bench object", start_build(&ebpf_dir, &bench_dir, &["--features", "bench", "--bin", "lb"])),
    ];
    for (what, mut child) in builds {
        let status = child.wait().unwrap_or_else(|e| panic!("waiting for cargo (nightly) for lb-ebpf: {e}"));
        if !status.success() {
            panic!(
                "building {what} of lb-ebpf failed ({status}); the eBPF toolchain (nightly, rust-src, \
                 bpf-linker) is installed by `cargo xtask setup`"
            );
        }
    }
    let obj = |dir: &Path, bin: &str| dir.join("bpfel-unknown-none/release").join(bin);
    let production = obj(&production_dir, "lb");
    let bytes = std::fs::read(&production).unwrap_or_else(|e| panic!("reading {}: {e}", production.display()));
    let sha256: String = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
    println!("cargo:rustc-env=LB_EBPF_OBJ={}", production.display());
    println!("cargo:rustc-env=LB_EBPF_DECAP_OBJ={}", obj(&production_dir, "lb-decap").display());
    println!("cargo:rustc-env=LB_EBPF_PROBE_OBJ={}", obj(&production_dir, "lb-probe").display());
    println!("cargo:rustc-env=LB_EBPF_BENCH_OBJ={}", obj(&bench_dir, "lb").display());
    println!("cargo:rustc-env=LB_EBPF_SHA256={sha256}");
    println!("cargo:rustc-env=LB_GIT_COMMIT={}", git_commit(&root));
}
