//! `cargo xtask package`: the Debian package, with cargo-deb (installed here if missing).
//!
//! Builds `lb` (release), writes its shell completions and man page into `target/packaging`
//! (where `lb-user/Cargo.toml`'s `[package.metadata.deb]` takes them from), runs
//! `cargo deb --no-build`, then checks the package: its files and conffiles, and the `lb` it
//! holds, extracted with `dpkg-deb -x` into a scratch directory, runs `lb --version` naming the
//! commit and the eBPF object's hash. Nothing is installed on this machine.

use crate::{cargo, run};
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cargo-deb release this was verified with.
const CARGO_DEB_VERSION: &str = "3.8.0";

/// What the package must hold (paths as `dpkg-deb -c` lists them; cargo-deb gzips man pages).
const FILES: &[&str] = &[
    "./usr/bin/lb",
    "./usr/lib/systemd/system/lb.service",
    "./etc/lb/lb.toml",
    "./etc/default/lb",
    "./usr/share/bash-completion/completions/lb",
    "./usr/share/zsh/vendor-completions/_lb",
    "./usr/share/fish/vendor_completions.d/lb.fish",
    "./usr/share/man/man8/lb.8.gz",
];

pub fn package(root: &Path) -> Result<()> {
    ensure_cargo_deb()?;
    run(cargo().args(["build", "--release", "-p", "lb-user", "--bin", "lb"]))?;
    let lb = root.join("target/release/lb");
    let out = root.join("target/packaging");
    std::fs::create_dir_all(&out)?;
    for (args, file) in [
        (&["completions", "bash"][..], "lb.bash"),
        (&["completions", "zsh"], "_lb"),
        (&["completions", "fish"], "lb.fish"),
        (&["manpage"], "lb.8"),
    ] {
        let text = output(Command::new(&lb).args(args))?;
        std::fs::write(out.join(file), text).with_context(|| format!("writing {file}"))?;
    }
    let printed = output(cargo().args(["deb", "-p", "lb-user", "--no-build"]))?;
    let deb = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
    if deb.extension().and_then(|e| e.to_str()) != Some("deb") || !deb.is_file() {
        bail!("cargo deb did not name the package it wrote: {printed:?}");
    }
    check(&deb)?;
    println!("{}", deb.display());
    Ok(())
}

/// cargo-deb, from crates.io, unless this release is installed.
fn ensure_cargo_deb() -> Result<()> {
    let installed = Command::new("cargo").args(["deb", "--version"]).output().ok().filter(|o| o.status.success());
    if installed.is_some_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_DEB_VERSION)) {
        return Ok(());
    }
    eprintln!("package: installing cargo-deb {CARGO_DEB_VERSION} (a few minutes, once)");
    run(Command::new("cargo")
        .args(["install", "--locked", "cargo-deb", "--version", CARGO_DEB_VERSION])
        .current_dir(std::env::temp_dir()))
}

fn output(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The package's files and conffiles, and the version its `lb` reports.
fn check(deb: &Path) -> Result<()> {
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(deb))?;
    let files: Vec<&str> = listing.lines().filter_map(|l| l.split_whitespace().nth(5)).collect();
    for want in FILES {
        if !files.contains(want) {
            bail!("{} lacks {want}; it holds:\n{listing}", deb.display());
        }
    }
    let conffiles = output(Command::new("dpkg-deb").args(["-I"]).arg(deb).arg("conffiles"))?;
    for want in ["/etc/lb/lb.toml", "/etc/default/lb"] {
        if !conffiles.lines().any(|l| l.trim() == want) {
            bail!("{want} is not a conffile of {}: {conffiles:?}", deb.display());
        }
    }
    let scratch = std::env::temp_dir().join(format!("lb-deb-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let result = (|| {
        run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&scratch))?;
        let version = output(Command::new(scratch.join("usr/bin/lb")).arg("--version"))?;
        let commit = output(Command::new("git").args(["rev-parse", "--short=12", "HEAD"]))?;
        if !version.contains(&format!("(commit {}", commit.trim())) || !version.contains("eBPF object sha256 ") {
            bail!(
                "the packaged lb --version names neither the commit {} nor the eBPF object: {version:?}",
                commit.trim()
            );
        }
        println!("package: {} holds {} files; its lb --version: {}", deb.display(), files.len(), version.trim());
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&scratch);
    result
}
