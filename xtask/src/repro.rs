//! `cargo xtask repro`: is the `lb` binary reproducible? HEAD is checked out twice (git
//! worktrees in two directories of different path lengths), `lb` is built in release in each,
//! with a target directory of its own, and the two binaries must be identical byte for byte.
//! Two release builds from scratch: minutes, so not part of `cargo xtask test` (which checks
//! the XDP objects, tests/reproducible.rs).

use crate::{cargo, run};
use anyhow::{bail, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Removes the worktrees when dropped (also on failure).
struct Worktrees<'a>(&'a Path, Vec<PathBuf>);

impl Drop for Worktrees<'_> {
    fn drop(&mut self) {
        for dir in &self.1 {
            let _ = Command::new("git").current_dir(self.0).args(["worktree", "remove", "--force"]).arg(dir).status();
        }
    }
}

pub fn repro(root: &Path) -> Result<()> {
    let base = std::env::temp_dir().join(format!("lb-repro-{}", std::process::id()));
    let dirs = [base.join("a"), base.join("a-much-longer-directory-name/b")];
    let mut trees = Worktrees(root, Vec::new());
    let mut binaries = Vec::new();
    for dir in &dirs {
        std::fs::create_dir_all(dir.parent().unwrap())?;
        run(Command::new("git").current_dir(root).args(["worktree", "add", "--detach"]).arg(dir).arg("HEAD"))?;
        trees.1.push(dir.clone());
        run(cargo()
            .current_dir(dir)
            .args(["build", "--release", "-p", "lb-user", "--bin", "lb"])
            .env_remove("CARGO_TARGET_DIR"))?;
        binaries.push(std::fs::read(dir.join("target/release/lb"))?);
    }
    let _ = std::fs::remove_dir_all(&base);
    if binaries[0] != binaries[1] {
        let differing = binaries[0].iter().zip(&binaries[1]).filter(|(a, b)| a != b).count();
        bail!(
            "lb differs between {} and {}: {} and {} bytes, {differing} differing",
            dirs[0].display(),
            dirs[1].display(),
            binaries[0].len(),
            binaries[1].len()
        );
    }
    println!(
        "repro: lb built from {} and {} is identical ({} bytes)",
        dirs[0].display(),
        dirs[1].display(),
        binaries[0].len()
    );
    Ok(())
}
