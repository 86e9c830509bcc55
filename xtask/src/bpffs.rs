//! The host's bpffs around a command that pins BPF objects (tests, demo, bench): the command
//! must remove what it pins, and a bpffs that only the command mounted is unmounted again, so
//! the machine is left as it was found.
//!
//! `lb` mounts bpffs at /sys/fs/bpf when nothing is mounted there (`lb_user::pinning`), and on
//! kernels with the built-in `bpf_preload` every new bpffs starts with two files of the
//! kernel's own (`maps.debug`, `progs.debug`): those are not anybody's leftovers, and they go
//! with the unmount.

use anyhow::{bail, Context, Result};
use std::collections::BTreeSet;
use std::process::Command;

const BPFFS: &str = "/sys/fs/bpf";
/// What the kernel puts in every new bpffs (its `bpf_preload` iterators).
const KERNEL_FILES: [&str; 2] = ["maps.debug", "progs.debug"];

/// Whether a bpffs is mounted at /sys/fs/bpf.
fn mounted() -> Result<bool> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").context("reading /proc/self/mounts")?;
    Ok(mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 2 && f[1] == BPFFS && f[2] == "bpf"
    }))
}

/// The names directly under /sys/fs/bpf (empty if no bpffs is mounted there).
fn entries() -> Result<BTreeSet<String>> {
    if !mounted()? {
        return Ok(BTreeSet::new());
    }
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(BPFFS).with_context(|| format!("listing {BPFFS}"))? {
        names.insert(e?.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

/// Runs `f`, then fails if it left anything new in bpffs, and unmounts a bpffs it mounted.
/// `f`'s own error comes first.
pub fn guarded(f: impl FnOnce() -> Result<()>) -> Result<()> {
    let was_mounted = mounted()?;
    let before = entries()?;
    let result = f();
    let left: Vec<String> =
        entries()?.into_iter().filter(|n| !before.contains(n) && !KERNEL_FILES.contains(&n.as_str())).collect();
    if !was_mounted && left.is_empty() && mounted()? {
        let status = Command::new("umount").arg(BPFFS).status().context("running umount")?;
        if !status.success() {
            eprintln!("xtask: warning: could not unmount the bpffs mounted at {BPFFS} during this run ({status})");
        }
    }
    result?;
    if !left.is_empty() {
        bail!("left pinned in {BPFFS} (whatever pins must remove it, also on failure): {}", left.join(", "));
    }
    Ok(())
}
