// How the XDP objects are built: included by `build.rs` and by lb-tests' reproducibility test
// (tests/tests/reproducible.rs), so that the test builds them exactly as the crate does.
// Expects `std::env`, `std::path::Path` and `std::process::{Child, Command}` in scope.

/// A command for the nightly toolchain of `lb-ebpf` (the dated channel of its
/// `rust-toolchain.toml`), without this build's toolchain, flags or target settings, and never
/// downloading a toolchain (a build must not hang on the network; `cargo xtask setup` installs).
fn nightly(program: &str, ebpf_dir: &Path) -> Command {
    let mut cmd = Command::new(program);
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
    cmd.env("RUSTUP_AUTO_INSTALL", "0");
    cmd.current_dir(ebpf_dir);
    cmd
}

/// Fails, with the commands that fix it, when the pinned nightly is not installed.
fn check_toolchain(ebpf_dir: &Path) {
    let out =
        nightly("rustc", ebpf_dir).arg("-V").output().unwrap_or_else(|e| panic!("running rustc for lb-ebpf: {e}"));
    if !out.status.success() {
        let pin = std::fs::read_to_string(ebpf_dir.join("rust-toolchain.toml")).unwrap_or_default();
        let channel = pin
            .lines()
            .find_map(|l| l.trim().strip_prefix("channel")?.trim_start().strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| "the pinned nightly".to_owned());
        panic!(
            "lb-ebpf is built with {channel} (lb-ebpf/rust-toolchain.toml), which is not installed: {}. \
             Run `cargo xtask setup` (it installs it, or offline gives an installed nightly of that date \
             its name), or `rustup toolchain install {channel} --component rust-src`",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
}

/// Starts `cargo build` of lb-ebpf (the pinned nightly) into `target_dir` with `extra` arguments.
fn start_build(ebpf_dir: &Path, target_dir: &Path, extra: &[&str]) -> Child {
    let mut cmd = nightly("cargo", ebpf_dir);
    cmd.args(["build", "--release", "--target", "bpfel-unknown-none", "-Z", "build-std=core"])
        .args(extra)
        .arg("--target-dir")
        .arg(target_dir);
    cmd.spawn().unwrap_or_else(|e| panic!("running cargo (nightly) for lb-ebpf: {e}"))
}
