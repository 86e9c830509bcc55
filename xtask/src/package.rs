//! `cargo xtask package`: the Debian package, with cargo-deb (installed here if missing).
//!
//! Builds `lb` (release), writes its shell completions and man pages into `target/packaging`
//! (where `lb-user/Cargo.toml`'s `[package.metadata.deb]` takes them from), runs
//! `cargo deb --no-build`, then checks the package: its files and conffiles, a man page for
//! every command and no reference in them to a page it lacks, the unit's
//! `systemd-analyze security` exposure, and the `lb` it holds, extracted with `dpkg-deb -x`
//! into a scratch directory, runs `lb --version` naming the commit and the eBPF object's hash.
//! Nothing is installed on this machine.

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
    "./usr/share/man/man8/lb-run.8.gz",
    "./usr/share/man/man5/lb.toml.5.gz",
    "./usr/share/lb/grafana/lb-zonal-spill.json",
    "./usr/share/doc/lb/copyright",
    "./usr/share/doc/lb/LICENSE-MIT",
    "./usr/share/doc/lb/examples/zonal.toml",
];

/// The highest `systemd-analyze security` exposure the unit may have.
const MAX_EXPOSURE: f64 = 3.0;

/// Builds and checks the package; `deb_version` overrides its version (the package test
/// installs two versions of one build).
pub fn package(root: &Path, deb_version: Option<&str>) -> Result<PathBuf> {
    ensure_cargo_deb()?;
    run(cargo().args(["build", "--release", "-p", "lb-user", "--bin", "lb"]))?;
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from);
    let lb = target.join("release/lb");
    let out = root.join("target/packaging");
    std::fs::create_dir_all(&out)?;
    for (args, file) in [
        (&["completions", "bash"][..], "lb.bash"),
        (&["completions", "zsh"], "_lb"),
        (&["completions", "fish"], "lb.fish"),
    ] {
        let text = output(Command::new(&lb).args(args))?;
        std::fs::write(out.join(file), text).with_context(|| format!("writing {file}"))?;
    }
    let man = out.join("man");
    let _ = std::fs::remove_dir_all(&man);
    run(Command::new(&lb).args(["manpage", "--dir"]).arg(&man))?;
    unit_exposure(&root.join("packaging/lb.service"))?;
    let mut deb_cmd = cargo();
    deb_cmd.args(["deb", "-p", "lb-user", "--no-build"]);
    if let Some(version) = deb_version {
        deb_cmd.args(["--deb-version", version]);
    }
    let printed = output(&mut deb_cmd)?;
    let deb = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
    if deb.extension().and_then(|e| e.to_str()) != Some("deb") || !deb.is_file() {
        bail!("cargo deb did not name the package it wrote: {printed:?}");
    }
    check(&deb)?;
    println!("{}", deb.display());
    Ok(deb)
}

/// `systemd-analyze security --offline=true` of the unit, at most [`MAX_EXPOSURE`].
fn unit_exposure(unit: &Path) -> Result<()> {
    let text = output(Command::new("systemd-analyze").args(["security", "--offline=true"]).arg(unit))?;
    let exposure = text
        .lines()
        .find_map(|l| {
            l.split("exposure level for").nth(1)?.split(':').nth(1)?.split_whitespace().next()?.parse::<f64>().ok()
        })
        .with_context(|| format!("no exposure level in systemd-analyze's output:\n{text}"))?;
    if exposure > MAX_EXPOSURE {
        bail!("{}: systemd-analyze security exposure {exposure} > {MAX_EXPOSURE}:\n{text}", unit.display());
    }
    println!("package: {} exposure {exposure} (at most {MAX_EXPOSURE})", unit.display());
    Ok(())
}

/// Every command of `lb` (as its help lists them, recursively) has a page among the package's
/// (extracted under `tree`), and every `lb-*(8)` page a page names is one of them.
fn check_man_pages(tree: &Path) -> Result<()> {
    let dir = tree.join("usr/share/man/man8");
    let mut pages = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let Some(page) = name.strip_suffix(".8.gz") else { continue };
        let roff = output(Command::new("gzip").arg("-dc").arg(&path))?;
        pages.insert(page.to_owned(), roff.replace("\\-", "-").replace("\\fB", "").replace("\\fR", ""));
    }
    let lb = tree.join("usr/bin/lb");
    let mut commands = vec![Vec::<String>::new()];
    let mut i = 0;
    while i < commands.len() {
        let help = output(Command::new(&lb).args(&commands[i]).arg("--help"))?;
        let subs = help.split("\nCommands:\n").nth(1).unwrap_or_default();
        for line in subs.lines().take_while(|l| l.starts_with("  ")) {
            let name = line.split_whitespace().next().unwrap_or_default();
            if name != "help" {
                commands.push([commands[i].clone(), vec![name.to_owned()]].concat());
            }
        }
        i += 1;
    }
    for command in &commands {
        let page = ["lb".to_owned()].iter().chain(command).cloned().collect::<Vec<_>>().join("-");
        if !pages.contains_key(&page) {
            bail!("no man page {page}.8 for `lb {}`; the package has {:?}", command.join(" "), pages.keys());
        }
    }
    for (page, text) in &pages {
        for (at, _) in text.match_indices("(8)") {
            let name = text[..at].rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '-')).next().unwrap_or_default();
            if name.starts_with("lb") && !pages.contains_key(name) {
                bail!("{page}(8) refers to {name}(8), which the package does not hold");
            }
        }
    }
    println!("package: {} man pages, one per command, every reference shipped", pages.len());
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
        check_man_pages(&scratch)?;
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
