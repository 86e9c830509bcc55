//! `cargo xtask setup`: make this machine able to build and test the project.
//!
//! Idempotent: every step checks first and does nothing when its result is already there, so a
//! second run finishes in seconds.
//!
//! - the nightly pinned in `lb-ebpf/rust-toolchain.toml` (`toolchain`) and its `rust-src` (for
//!   `-Z build-std=core`) and clippy (`cargo xtask test` lints the eBPF crate with it);
//! - `bpf-linker` built against the LLVM that ships inside that nightly (there is no
//!   prebuilt download that matches it): a prefix folder whose `lib/` holds `libLLVM.so` and the
//!   soname file, both linking to the toolchain's library, then
//!   `LLVM_PREFIX=<prefix> cargo +nightly-DATE install bpf-linker --features llvm-<major>`.
//!   The prefix lives under /opt because the installed binary keeps an rpath to it;
//! - the Debian packages the tests and demo call (iproute2, ethtool, dnsutils; bird2 for the
//!   scale-out tests' BGP speakers).

use crate::run;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the LLVM prefix for bpf-linker lives (kept: the binary's rpath points here).
const LLVM_PREFIX: &str = "/opt/lb-toolchain/llvm";
/// The bpf-linker release verified with this nightly.
const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian packages and a command each provides, checked before installing.
/// (`bird2`: the scale-out tests; `prometheus`: the metrics test scrapes the daemon with the
/// real server; `nftables`: the live bench's nftables DNAT side and its smoke test.)
const DEBIAN_PACKAGES: &[(&str, &str)] = &[
    ("iproute2", "ip"),
    ("ethtool", "ethtool"),
    ("dnsutils", "dig"),
    ("bird2", "bird"),
    ("prometheus", "prometheus"),
    ("nftables", "nft"),
];

pub fn ensure() -> Result<()> {
    let channel = crate::toolchain::ensure(&crate::workspace_root())?;
    rust_src(&channel)?;
    nightly_clippy(&channel)?;
    bpf_linker(&channel)?;
    debian_packages()?;
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `-Z build-std=core` needs the standard library's source in the pinned toolchain.
fn rust_src(channel: &str) -> Result<()> {
    let sysroot = output(Command::new("rustc").arg(format!("+{channel}")).args(["--print", "sysroot"]))?;
    if Path::new(sysroot.trim()).join("lib/rustlib/src/rust/library/core").is_dir() {
        return Ok(());
    }
    eprintln!("setup: adding rust-src to {channel}");
    run(Command::new("rustup").args(["component", "add", "rust-src", "--toolchain", channel]))
}

/// `cargo xtask test` lints the eBPF crate with the pinned nightly's clippy (the crate builds
/// only for the BPF target, with that toolchain).
fn nightly_clippy(channel: &str) -> Result<()> {
    let present = Command::new("cargo").arg(format!("+{channel}")).args(["clippy", "--version"]).output();
    if present.is_ok_and(|o| o.status.success()) {
        return Ok(());
    }
    eprintln!("setup: adding clippy to {channel}");
    run(Command::new("rustup").args(["component", "add", "clippy", "--toolchain", channel]))
}

fn nightly_llvm_library(channel: &str) -> Result<PathBuf> {
    let sysroot = output(Command::new("rustc").arg(format!("+{channel}")).args(["--print", "sysroot"]))?;
    let lib = Path::new(sysroot.trim()).join("lib");
    for entry in std::fs::read_dir(&lib).with_context(|| format!("reading {}", lib.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if name.starts_with("libLLVM.so.") {
            return Ok(path);
        }
    }
    bail!("no libLLVM.so.* in {}: the nightly toolchain ships without LLVM?", lib.display())
}

/// `libLLVM.so.22.1-rust-...` → 22.
fn llvm_major(lib: &Path) -> Result<String> {
    let name = lib.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let version = name.trim_start_matches("libLLVM.so.");
    let major = version.split('.').next().unwrap_or_default();
    if major.is_empty() || !major.chars().all(|c| c.is_ascii_digit()) {
        bail!("cannot read the LLVM version from {name}");
    }
    Ok(major.to_owned())
}

fn bpf_linker_works(llvm: &Path) -> bool {
    let Ok(out) = Command::new("bpf-linker").arg("--version").output() else { return false };
    if !out.status.success() {
        return false;
    }
    // The binary must load the nightly's LLVM through our prefix (a stale one would fail here).
    match Command::new("ldd").arg(which("bpf-linker").unwrap_or_default()).output() {
        Ok(ldd) => {
            let text = String::from_utf8_lossy(&ldd.stdout);
            let soname = llvm.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            text.lines().any(|l| l.contains(soname) && !l.contains("not found"))
        }
        Err(_) => true,
    }
}

fn which(cmd: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(cmd)).find(|p| p.is_file())
}

fn bpf_linker(channel: &str) -> Result<()> {
    let llvm = nightly_llvm_library(channel)?;
    if bpf_linker_works(&llvm) {
        return Ok(());
    }
    let major = llvm_major(&llvm)?;
    let libdir = Path::new(LLVM_PREFIX).join("lib");
    std::fs::create_dir_all(&libdir).with_context(|| format!("creating {}", libdir.display()))?;
    for link in ["libLLVM.so".to_owned(), llvm.file_name().unwrap().to_string_lossy().into_owned()] {
        let at = libdir.join(link);
        let _ = std::fs::remove_file(&at);
        std::os::unix::fs::symlink(&llvm, &at).with_context(|| format!("linking {}", at.display()))?;
    }
    eprintln!("setup: building bpf-linker against {} (about a minute)", llvm.display());
    run(Command::new("cargo")
        .arg(format!("+{channel}"))
        .args(["install", "bpf-linker", "--version", BPF_LINKER_VERSION, "--no-default-features", "--features"])
        .arg(format!("llvm-{major}"))
        .env("LLVM_PREFIX", LLVM_PREFIX)
        // Build outside the workspace so its config and target dir do not apply.
        .current_dir(std::env::temp_dir()))?;
    if !bpf_linker_works(&llvm) {
        bail!("bpf-linker was installed but does not run against {}", llvm.display());
    }
    Ok(())
}

fn debian_packages() -> Result<()> {
    let missing: Vec<&str> = DEBIAN_PACKAGES
        .iter()
        .filter(|(_, cmd)| which(cmd).is_none() && which_sbin(cmd).is_none())
        .map(|(p, _)| *p)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing Debian packages {}", missing.join(" "));
    run(Command::new("apt-get").arg("update").arg("-q"))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-q", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

/// PATH of a non-login root shell may lack /usr/sbin.
fn which_sbin(cmd: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/sbin"].iter().map(|d| Path::new(d).join(cmd)).find(|p| p.is_file())
}
