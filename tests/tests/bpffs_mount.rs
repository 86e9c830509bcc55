//! Mounting bpffs on a machine that has none is race-free: of several callers of
//! `ensure_pin_dir` starting at once, exactly one mounts, and every caller's directory stays
//! visible (a second, stacked mount used to hide the first caller's directory and pins).
//!
//! The test runs in a private mount namespace of its own thread (so it can start from "nothing
//! mounted at /sys/fs/bpf" whatever the host has, and everything it mounts vanishes with the
//! thread); the threads it starts inherit that namespace.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Barrier};

const SYS_BPF: &str = "/sys/fs/bpf";

/// The bpffs mounts at /sys/fs/bpf in the calling thread's mount namespace.
fn bpffs_mounts_at_sys_bpf() -> usize {
    let info = std::fs::read_to_string("/proc/thread-self/mountinfo").expect("reading mountinfo");
    info.lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let dash = f.iter().position(|x| *x == "-");
            f.len() > 4 && f[4] == SYS_BPF && dash.is_some_and(|d| f.get(d + 1) == Some(&"bpf"))
        })
        .count()
}

fn sys(rc: libc::c_int, what: &str) {
    assert!(rc == 0, "{what}: {} (this test needs root)", std::io::Error::last_os_error());
}

/// Rounds of the race, each from no bpffs: the old, unlocked code lost it in about one round of
/// six here, so twenty rounds make a regression all but certain to show.
const ROUNDS: usize = 20;

#[test]
fn concurrent_first_mounts_make_one_bpffs_and_keep_every_directory() {
    for round in 0..ROUNDS {
        let (mounts, missing) = race_once(round);
        assert_eq!(mounts, 1, "round {round}: exactly one bpffs is mounted at {SYS_BPF}");
        assert!(missing.is_empty(), "round {round}: directories hidden by a later mount: {missing:?}");
    }
}

/// One race in a fresh private mount namespace: the number of bpffs mounts at /sys/fs/bpf
/// afterwards, and the callers' directories that are no longer visible.
fn race_once(round: usize) -> (usize, Vec<String>) {
    std::thread::spawn(move || {
        // SAFETY: plain syscalls on this thread; unshare(CLONE_NEWNS) affects this thread only.
        unsafe {
            sys(libc::unshare(libc::CLONE_NEWNS), "unshare(CLONE_NEWNS)");
            let root = c"/";
            sys(
                libc::mount(
                    std::ptr::null(),
                    root.as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                ),
                "making / private",
            );
            let target = c"/sys/fs/bpf";
            while bpffs_mounts_at_sys_bpf() > 0 {
                sys(libc::umount2(target.as_ptr(), libc::MNT_DETACH), "unmounting /sys/fs/bpf");
            }
        }
        assert_eq!(bpffs_mounts_at_sys_bpf(), 0, "the test starts from no bpffs at {SYS_BPF}");

        const CALLERS: usize = 16;
        let barrier = Arc::new(Barrier::new(CALLERS));
        let dirs: Vec<PathBuf> = (0..CALLERS)
            .map(|i| PathBuf::from(format!("{SYS_BPF}/lb-test-race-{}-{round}-{i}", std::process::id())))
            .collect();
        let results: Vec<_> = dirs
            .iter()
            .cloned()
            .map(|dir| {
                let barrier = barrier.clone();
                std::thread::spawn(move || {
                    barrier.wait();
                    lb_user::dataplane::pinning::ensure_pin_dir(&dir).map_err(|e| format!("{}: {e:#}", dir.display()))
                })
            })
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().expect("caller thread"))
            .collect();
        for r in &results {
            assert!(r.is_ok(), "ensure_pin_dir failed: {r:?}");
        }
        let mounts = bpffs_mounts_at_sys_bpf();
        let missing: Vec<&Path> = dirs.iter().map(PathBuf::as_path).filter(|d| !d.is_dir()).collect();
        (mounts, missing.iter().map(|d| d.display().to_string()).collect::<Vec<_>>())
    })
    .join()
    .expect("the test thread")
}
