//! The XDP objects do not depend on where the checkout is: the tracked files are copied into two
//! directories of different path lengths, each builds its objects with the command
//! `lb-user/build.rs` uses (the same file, included), and every object is identical in both and
//! to the one this build embeds. (The `lb` binary, a release build each, is `cargo xtask repro`:
//! too slow for every test run.)

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

include!("../../lb-user/ebpf_build.rs");

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// A directory removed when dropped (also when the test fails).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Copies the files git tracks (as they are in the working tree; symlinks as symlinks) to `to`.
fn copy_checkout(to: &Path) {
    let out = Command::new("git")
        .current_dir(root())
        .args(["ls-files", "-z"])
        .output()
        .expect("running git ls-files: this test copies the checkout's tracked files, and needs git");
    assert!(out.status.success(), "git ls-files failed: {}", String::from_utf8_lossy(&out.stderr));
    for name in out.stdout.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = std::str::from_utf8(name).unwrap();
        let (from, dest) = (root().join(name), to.join(name));
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        let meta = match std::fs::symlink_metadata(&from) {
            Ok(meta) => meta,
            // Deleted in the working tree, not yet in the index.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("{}: {e}", from.display()),
        };
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&from).unwrap(), &dest).unwrap();
        } else {
            std::fs::copy(&from, &dest).unwrap_or_else(|e| panic!("copying {}: {e}", from.display()));
        }
    }
}

#[test]
fn the_xdp_objects_are_the_same_from_two_checkouts_in_different_directories() {
    let base = env::temp_dir().join(format!("lb-repro-{}", std::process::id()));
    let _scratch = Scratch(base.clone());
    let checkouts = [base.join("a"), base.join("a-much-longer-directory-name/b")];
    let mut objects = Vec::new();
    for dir in &checkouts {
        copy_checkout(dir);
        let ebpf_dir = dir.join("lb-ebpf");
        check_toolchain(&ebpf_dir);
        let target = dir.join("target-ebpf");
        let status = start_build(&ebpf_dir, &target, &[]).wait().unwrap();
        assert!(status.success(), "building the XDP objects in {} failed: {status}", dir.display());
        let read = |bin: &str| {
            let path = target.join("bpfel-unknown-none/release").join(bin);
            std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        };
        objects.push((read("lb"), read("lb-decap")));
    }
    assert!(objects[0].0 == objects[1].0, "the balancer's object differs between {checkouts:?}");
    assert!(objects[0].1 == objects[1].1, "the decapsulator's object differs between {checkouts:?}");
    assert!(
        objects[0].0 == lb_user::dataplane::EBPF_OBJECT,
        "the balancer's object built in {} differs from the one this build embeds",
        checkouts[0].display()
    );
    assert!(
        objects[0].1 == lb_user::cli::decap::EBPF_OBJECT,
        "the decapsulator's object differs from the embedded one"
    );
}
