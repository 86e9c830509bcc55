//! End to end: operator actions are durable or refused. With the state directory on a tiny
//! tmpfs that is full, `lb backend drain` fails with the reason (non-zero exit, message printed)
//! and nothing changes; with room again it is applied and saved. A run directory removed under
//! the running daemon is noticed: logged, counted, and the control socket comes back.
use lb_tests::e2e::*;
use lb_tests::netns::sh;
use lb_tests::topology::{Topology, TopologySpec};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A tmpfs mounted on a directory, unmounted when dropped (also when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Self {
        sh(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755"), "tmpfs"]).arg(dir))
            .expect("mounting a tmpfs (needs root)");
        Self(dir.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn config(topo: &Topology) -> String {
    zones_toml(1) + &service_toml(topo, "web", false, "", "", 80, &|_| false)
}

#[test]
fn a_drain_that_cannot_be_saved_is_refused() {
    let topo = Topology::build(&TopologySpec { prefix: "dur".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    // Backends decapsulate: health probes reach them through the data path (IPIP).
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-dur-decap")).unwrap();
    let mut d = Daemon::start(&topo, "dur", &config(&topo)).unwrap();
    d.stop().unwrap();
    let _tmpfs = Tmpfs::mount(&d.dir, "256k");
    d.rewrite_config(&config(&topo)).unwrap();
    d.restart().unwrap();
    let fail = |e: anyhow::Error, d: &Daemon| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let addr = topo.backends[0].addr(false).to_string();
    let state = d.dir.join("state.json");
    let saved = std::fs::read_to_string(&state).unwrap();

    // Fill the state directory: dd stops at ENOSPC.
    let filler = d.dir.join("filler");
    let _ = Command::new("dd").arg("if=/dev/zero").arg(format!("of={}", filler.display())).arg("bs=4k").output();
    let err = d
        .cli(&["backend", "drain", "--service", "web", "--address", &addr])
        .expect_err("a drain that cannot be saved is refused");
    let err = format!("{err:#}");
    assert!(err.contains("could not be made durable") && err.contains("No space left"), "{err}");
    assert!(!d.backend_status("web", &addr).unwrap_or_else(|e| fail(e, &d)).draining, "not applied");
    assert_eq!(std::fs::read_to_string(&state).unwrap(), saved, "the saved state is untouched");
    assert!(d.fault("state_save_failed").unwrap() >= 1);

    // Room again: the drain is applied and saved.
    std::fs::remove_file(&filler).unwrap();
    d.cli(&["backend", "drain", "--service", "web", "--address", &addr]).unwrap_or_else(|e| fail(e, &d));
    assert!(d.backend_status("web", &addr).unwrap().draining);
    let now = std::fs::read_to_string(&state).unwrap();
    assert!(now.contains(&addr), "the drain is in the state file: {now}");
}

#[test]
fn a_removed_run_directory_is_noticed_and_the_socket_comes_back() {
    let topo = Topology::build(&TopologySpec { prefix: "rund".into(), zones: vec![(1, 1)], outside_clients: 0 })
        .expect("topology (needs root)");
    // Backends decapsulate: health probes reach them through the data path (IPIP).
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-rund-decap")).unwrap();
    let d = Daemon::start(&topo, "rund", &config(&topo)).unwrap();
    let pid = d.pid().unwrap();
    // The daemon may be saving its state into the directory at this instant (its first health
    // verdicts): a removal that meets the new file is retried.
    wait_for("the run directory to be removed", Duration::from_secs(30), || std::fs::remove_dir_all(&d.dir).ok())
        .unwrap_or_else(|e| panic!("{e:#}"));
    wait_for("the control socket to come back", Duration::from_secs(60), || d.cli(&["status"]).ok())
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert_eq!(d.fault("control_socket_recreated").unwrap(), 1);
    assert!(d.dir.join("state.json").exists(), "the state is saved again");
    // The log file went with the directory; the daemon still writes to it.
    let log = std::fs::read_to_string(format!("/proc/{pid}/fd/2")).unwrap();
    assert!(log.contains("was removed under the running daemon with its directory"), "{log}");
}
