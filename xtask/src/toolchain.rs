//! The nightly that builds the eBPF objects, pinned by date in one place: the `channel` of
//! `lb-ebpf/rust-toolchain.toml` (`nightly-YYYY-MM-DD`), which rustup selects for every cargo
//! run in `lb-ebpf` (so `lb-user/build.rs` uses it, whatever `nightly` is on the machine).
//!
//! `cargo xtask setup` makes that toolchain present: already installed; else `rustup toolchain
//! install` (needs static.rust-lang.org); else, offline, an installed nightly of the same date
//! (its rustup channel manifest says which build it is) is given the dated name, as rustup
//! would have named it. Otherwise it fails with the commands that would fix it.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The file holding the pin, relative to the workspace root.
pub const PIN_FILE: &str = "lb-ebpf/rust-toolchain.toml";

/// The pinned channel, `nightly-YYYY-MM-DD`, read from `toml` (the text of [`PIN_FILE`]).
pub fn parse_channel(toml: &str) -> Result<String> {
    let channel = toml
        .lines()
        .filter_map(|l| l.trim().strip_prefix("channel"))
        .filter_map(|rest| rest.trim_start().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .next()
        .with_context(|| format!("{PIN_FILE} has no `channel = \"nightly-YYYY-MM-DD\"`"))?;
    let date = channel.strip_prefix("nightly-").unwrap_or_default();
    let dated = date.len() == 10 && date.chars().enumerate().all(|(i, c)| (i == 4 || i == 7) == (c == '-'));
    if !dated || !date.chars().filter(|c| *c != '-').all(|c| c.is_ascii_digit()) {
        bail!("{PIN_FILE}: channel {channel:?} is not a dated nightly; allowed values: nightly-YYYY-MM-DD");
    }
    Ok(channel)
}

pub fn pinned_channel(root: &Path) -> Result<String> {
    let file = root.join(PIN_FILE);
    parse_channel(&std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?)
}

/// The date of the rustup channel manifest in a toolchain directory (`date = "..."`), if any.
pub fn manifest_date(toolchain_dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(toolchain_dir.join("lib/rustlib/multirust-channel-manifest.toml")).ok()?;
    text.lines().find_map(|l| {
        Some(l.trim().strip_prefix("date")?.trim_start().strip_prefix('=')?.trim().trim_matches('"').to_owned())
    })
}

/// Among the toolchain directories in `toolchains`, a nightly built on `date` (not a link
/// made by an earlier run: its target is what counts).
pub fn find_same_date(toolchains: &Path, date: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(toolchains).ok()?.filter_map(|e| Some(e.ok()?.path())).collect();
    dirs.sort();
    dirs.into_iter().find(|d| {
        let name = d.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        name.starts_with("nightly") && !d.is_symlink() && manifest_date(d).as_deref() == Some(date)
    })
}

fn rustup_home() -> PathBuf {
    std::env::var_os("RUSTUP_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".rustup"))
}

fn host_triple() -> Result<String> {
    let out = Command::new("rustc").arg("-vV").output().context("running rustc -vV")?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| l.strip_prefix("host: ")).map(str::to_owned).context("rustc -vV names no host")
}

/// `rustc -V` of `channel`, if rustup has it (never downloading).
fn installed(channel: &str) -> Option<String> {
    let out =
        Command::new("rustc").arg(format!("+{channel}")).arg("-V").env("RUSTUP_AUTO_INSTALL", "0").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Makes the pinned nightly present (see the module's comment); returns its channel name.
pub fn ensure(root: &Path) -> Result<String> {
    let channel = pinned_channel(root)?;
    if installed(&channel).is_some() {
        return Ok(channel);
    }
    eprintln!("setup: installing the pinned toolchain {channel} (from {PIN_FILE})");
    let online = Command::new("rustup")
        .args(["toolchain", "install", &channel, "--profile", "minimal", "--component", "rust-src"])
        .status()
        .is_ok_and(|s| s.success());
    if online && installed(&channel).is_some() {
        return Ok(channel);
    }
    let date = channel.trim_start_matches("nightly-");
    let toolchains = rustup_home().join("toolchains");
    let name = format!("{channel}-{}", host_triple()?);
    let Some(same) = find_same_date(&toolchains, date) else {
        bail!(
            "the eBPF objects are built with {channel} ({PIN_FILE}), which is not installed and rustup could \
             not download it. Run `rustup toolchain install {channel} --component rust-src` where \
             static.rust-lang.org is reachable, or copy that toolchain's directory to {}",
            toolchains.join(&name).display()
        );
    };
    // What `rustup toolchain install` would have put there; `rustup toolchain link` refuses
    // official names, a symlink in rustup's own layout does not.
    let link = toolchains.join(&name);
    eprintln!("setup: offline; {} is the {date} nightly: linking it as {}", same.display(), link.display());
    std::os::unix::fs::symlink(&same, &link).with_context(|| format!("linking {}", link.display()))?;
    if installed(&channel).is_none() {
        bail!("linked {} to {}, but rustup still does not run {channel}", link.display(), same.display());
    }
    Ok(channel)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pin_is_a_dated_nightly() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let channel = pinned_channel(root).unwrap();
        assert!(channel.starts_with("nightly-20"), "{channel}");
        assert_eq!(parse_channel("[toolchain]\nchannel = \"nightly-2026-05-20\"\n").unwrap(), "nightly-2026-05-20");
        for bad in ["channel = \"nightly\"", "channel = \"stable\"", "channel = \"nightly-2026-5-20\"", ""] {
            let err = parse_channel(bad).unwrap_err().to_string();
            assert!(err.contains("nightly-YYYY-MM-DD"), "{bad}: {err}");
        }
    }

    #[test]
    fn an_installed_nightly_of_the_pinned_date_is_found_by_its_manifest() {
        let dir = std::env::temp_dir().join(format!("lb-toolchains-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (name, date) in [("nightly-a", "2026-05-19"), ("nightly-b", "2026-05-20"), ("stable-c", "2026-05-20")] {
            let lib = dir.join(name).join("lib/rustlib");
            std::fs::create_dir_all(&lib).unwrap();
            std::fs::write(
                lib.join("multirust-channel-manifest.toml"),
                format!("manifest-version = \"2\"\ndate = \"{date}\"\n"),
            )
            .unwrap();
        }
        assert_eq!(find_same_date(&dir, "2026-05-20"), Some(dir.join("nightly-b")));
        assert_eq!(find_same_date(&dir, "2026-05-21"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
