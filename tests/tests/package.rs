//! The Debian package through an upgrade, as a host would run it: two versions of one release
//! build (`cargo xtask package --deb-version`), the first installed with `dpkg -i`, the daemon
//! run the way the installed unit runs it (its ExecStartPre and ExecStart lines, with
//! /etc/default/lb's LB_OPTS; ExecReload for a reload), 200 live TCP connections through it, the
//! second installed with `dpkg -i` and the service restarted as its maintainer scripts ask
//! systemd to (`try-restart`: SIGTERM, as systemd stops it, then a start), a reload, and not one
//! connection broken; then `dpkg --purge` (after the stop its prerm asks systemd for) leaves no
//! pin, no attached program and no file behind. And the packaged `lb` is the same, byte for
//! byte, when the commit is built in another directory (issue #32-5: reproducible builds).
//!
//! No systemd runs here: the unit's lines are executed as systemd would (the package's
//! maintainer scripts run for real through dpkg, and skip their systemctl calls). Installs and
//! purges `lb` on this machine: refuses to run where `lb` is already installed.

use lb_tests::e2e::*;
use lb_tests::load::Fleet;
use lb_tests::netns::sh;
use lb_tests::topology::{Topology, TopologySpec};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PREFIX: &str = "pkg";
const HC_PORT: u16 = 81;
const VERSIONS: [&str; 2] = ["0.1.0+pkgtest1", "0.1.0+pkgtest2"];
const UNIT: &str = "/usr/lib/systemd/system/lb.service";
const PIN_DIR: &str = "/sys/fs/bpf/lb-test-pkg";
const RUN_DIR: &str = "/run/lb-test-pkg";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// The two packages, built once for the tests of this file (the second waits for the first).
fn packages() -> &'static [PathBuf] {
    static PACKAGES: std::sync::OnceLock<Vec<PathBuf>> = std::sync::OnceLock::new();
    PACKAGES.get_or_init(build_packages)
}

/// The two packages: `cargo xtask package` (a release build, then cargo-deb) per version.
fn build_packages() -> Vec<PathBuf> {
    VERSIONS
        .iter()
        .map(|v| {
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let out = Command::new(cargo)
                .current_dir(root())
                .args(["run", "-q", "-p", "xtask", "--", "package", "--deb-version", v])
                // A target directory of its own: the one of this `cargo test` stays locked.
                .env("CARGO_TARGET_DIR", root().join("target/package-test"))
                .stderr(Stdio::inherit())
                .output()
                .expect("running cargo xtask package");
            assert!(out.status.success(), "cargo xtask package --deb-version {v} failed");
            let printed = String::from_utf8_lossy(&out.stdout);
            let built = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
            // cargo-deb clears its output directory for the next package: keep each apart.
            let kept = root().join("target/package-test/debs");
            std::fs::create_dir_all(&kept).unwrap();
            let kept = kept.join(built.file_name().expect("cargo deb names a file"));
            std::fs::copy(&built, &kept).unwrap_or_else(|e| panic!("copying {}: {e}", built.display()));
            kept
        })
        .collect()
}

fn installed_version() -> Option<String> {
    let out = Command::new("dpkg-query").args(["-W", "-f", "${Status} ${Version}", "lb"]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.starts_with("install ok installed").then(|| text.rsplit(' ').next().unwrap_or_default().to_owned())
}

/// The values of `Key=` lines of the installed unit, in order.
fn unit_lines(key: &str) -> Vec<String> {
    let unit = std::fs::read_to_string(UNIT).expect("reading the installed unit");
    unit.lines().filter_map(|l| l.strip_prefix(&format!("{key}="))).map(str::to_owned).collect()
}

/// The service as systemd runs it: ExecStartPre lines (a `+` prefix only lifts the sandbox),
/// then ExecStart, each through a shell that has read /etc/default/lb (EnvironmentFile=), in
/// the balancer's network namespace; `$LB_OPTS` splits into words as systemd splits it.
/// RuntimeDirectory= is made first (here the socket's directory LB_OPTS names, mode 0700).
struct Service {
    ns: String,
    main: Option<std::process::Child>,
}

impl Service {
    fn start(&mut self) {
        std::fs::create_dir_all(RUN_DIR).unwrap();
        sh(Command::new("chmod").args(["0700", RUN_DIR])).unwrap();
        let env = ". /etc/default/lb; ";
        for pre in unit_lines("ExecStartPre") {
            let line = pre.trim_start_matches(['+', '-']);
            sh(Command::new("nsenter")
                .arg(format!("--net=/run/netns/{}", self.ns))
                .args(["sh", "-c"])
                .arg(env.to_owned() + line))
            .unwrap_or_else(|e| panic!("ExecStartPre={pre}: {e:#}"));
        }
        let start = unit_lines("ExecStart").pop().expect("the unit has an ExecStart");
        assert!(start.contains("--keep-dataplane"), "the unit's ExecStart does not keep the data plane: {start}");
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(Path::new(RUN_DIR).join("daemon.log")).unwrap();
        // `exec`: the shell becomes nsenter, which execs lb: the child's pid is MAINPID.
        let child = Command::new("nsenter")
            .arg(format!("--net=/run/netns/{}", self.ns))
            .args(["sh", "-c"])
            .arg(format!("{env}exec {start}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting ExecStart");
        self.main = Some(child);
        wait_for("the service to answer on its socket", Duration::from_secs(90), || {
            lb(&["status", "--json", "--socket", &format!("{RUN_DIR}/lb.sock")]).ok()
        })
        .unwrap_or_else(|e| panic!("{e:#}\n{}", self.log()));
    }

    /// systemd's stop: SIGTERM to the main process (no ExecStop=), then wait for it.
    fn stop(&mut self) {
        if let Some(mut c) = self.main.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(60);
            while c.try_wait().unwrap().is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                    panic!("the service ignored SIGTERM for 60 s\n{}", self.log());
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// ExecReload with $MAINPID.
    fn reload(&self) {
        let pid = self.main.as_ref().expect("service running").id().to_string();
        for line in unit_lines("ExecReload") {
            sh(Command::new("sh").arg("-c").arg(line.replace("$MAINPID", &pid))).unwrap();
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(Path::new(RUN_DIR).join("daemon.log")).unwrap_or_default()
    }
}

fn lb(args: &[&str]) -> anyhow::Result<String> {
    sh(Command::new("/usr/bin/lb").args(args))
}

/// Whatever the test leaves, also when it fails: the service stopped, the package purged, the
/// pins and the run directory removed.
struct Cleanup<'a>(&'a mut Service);

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.main.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if installed_version().is_some() {
            let _ = Command::new("dpkg").args(["--purge", "lb"]).status();
        }
        let _ = std::fs::remove_dir_all(PIN_DIR);
        let _ = std::fs::remove_dir_all(RUN_DIR);
    }
}

fn dpkg(args: &[&str], deb: Option<&Path>) {
    let mut cmd = Command::new("dpkg");
    cmd.args(args).env("DEBIAN_FRONTEND", "noninteractive");
    if let Some(deb) = deb {
        cmd.arg(deb);
    }
    sh(&mut cmd).unwrap_or_else(|e| panic!("dpkg {args:?}: {e:#}"));
}

#[test]
fn an_upgrade_and_its_restart_keep_200_connections_and_purge_leaves_nothing() {
    if let Some(v) = installed_version() {
        panic!("the package lb {v} is installed on this machine; this test installs and purges it: remove it first");
    }
    lb_user::daemon::limits::raise_nofile().expect("raising RLIMIT_NOFILE");
    let debs = packages();
    let topo = Topology::build(&TopologySpec { prefix: PREFIX.into(), zones: vec![(1, 4)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _checks: Vec<_> = topo.backends.iter().map(|b| start_server(b, HC_PORT).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, Path::new("/sys/fs/bpf/lb-test-pkg-decap")).unwrap();
    let mut service = Service { ns: topo.lb.ns.name().to_owned(), main: None };
    let service = Cleanup(&mut service);
    let _ = std::fs::remove_dir_all(PIN_DIR);

    // 1. Install the first version; configure it as an operator would.
    dpkg(&["-i"], Some(&debs[0]));
    assert_eq!(installed_version().as_deref(), Some(VERSIONS[0]));
    let example = std::fs::read_to_string("/etc/lb/lb.toml").unwrap();
    assert!(example.contains("EXAMPLE") && example.contains("192.0.2."), "the shipped lb.toml is not the example");
    std::fs::write("/etc/lb/lb.toml", zones_toml(1) + &service_toml(&topo, "web", false, "", "", HC_PORT, &|_| false))
        .unwrap();
    std::fs::write(
        "/etc/default/lb",
        format!("LB_OPTS=\"--interface eth0 --pin-dir {PIN_DIR} --socket {RUN_DIR}/lb.sock\"\n"),
    )
    .unwrap();
    service.0.start();

    // 2. 200 connections, each exchanging a line every second (10 s to answer).
    let client = topo.clients_in_zone(1).next().unwrap();
    let mut fleet = Fleet::start(client, vip(false, 80), 200, Duration::from_secs(1), Duration::from_secs(10))
        .unwrap_or_else(|e| panic!("{e:#}\n{}", service.0.log()));

    // 3. The second version. Its postinst asks systemd for `try-restart` (which dpkg skips
    //    here, with no systemd), its prerm stops the service only on removal: the daemon runs
    //    on through the upgrade, then restarts as systemd would restart it.
    dpkg(&["-i", "--force-confold"], Some(&debs[1]));
    assert_eq!(installed_version().as_deref(), Some(VERSIONS[1]));
    let postinst = std::fs::read_to_string("/var/lib/dpkg/info/lb.postinst").unwrap();
    assert!(postinst.contains("deb-systemd-invoke try-restart lb.service"), "postinst:\n{postinst}");
    let prerm = std::fs::read_to_string("/var/lib/dpkg/info/lb.prerm").unwrap();
    assert!(prerm.contains("[ \"$1\" = remove ]; then\n\tdeb-systemd-invoke stop"), "prerm:\n{prerm}");
    let before = fleet.exchanges();
    service.0.stop();
    service.0.start();
    assert!(service.0.log().contains("adopting the pinned data plane"), "{}", service.0.log());
    service.0.reload();
    // Every connection exchanges through the new daemon's tables a few times.
    wait_for("exchanges after the restart", Duration::from_secs(120), || {
        (fleet.exchanges() >= before + 200 * 5).then_some(())
    })
    .unwrap_or_else(|e| panic!("{e:#}\n{}", service.0.log()));
    let breaks = fleet.stop().unwrap();
    assert!(
        breaks.is_empty(),
        "{} of 200 connections broke: {:?}\n{}",
        breaks.len(),
        &breaks[..breaks.len().min(5)],
        service.0.log()
    );

    // 4. Purge: systemd would stop the service first (prerm), then prerm unloads the data plane.
    service.0.stop();
    assert!(Path::new(PIN_DIR).exists(), "the stop kept the data plane pinned");
    dpkg(&["--purge"], Some(Path::new("lb")));
    assert_eq!(installed_version(), None);
    assert!(!Path::new(PIN_DIR).exists(), "pins left in {PIN_DIR}");
    let link = topo.lb.ns.ip(&["-d", "link", "show", "eth0"]).unwrap();
    assert!(!link.contains("xdp"), "the balancer is still attached to eth0:\n{link}");
    for path in ["/usr/bin/lb", UNIT, "/etc/lb", "/etc/default/lb", "/usr/share/doc/lb", "/usr/share/lb"] {
        assert!(!Path::new(path).exists(), "{path} left behind by dpkg --purge");
    }
    assert!(!Path::new(RUN_DIR).join("state.json").exists(), "the daemon's state file left behind");
}

/// Removes the git worktrees and their directory when dropped (also on failure).
struct Worktrees(PathBuf, Vec<PathBuf>);

impl Drop for Worktrees {
    fn drop(&mut self) {
        for dir in &self.1 {
            let _ = Command::new("git").current_dir(root()).args(["worktree", "remove", "--force"]).arg(dir).status();
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A release `lb` of HEAD built in a worktree at `dir` with a target directory of its own.
fn build_elsewhere(trees: &mut Worktrees, dir: &Path) -> Vec<u8> {
    std::fs::create_dir_all(dir.parent().unwrap()).unwrap();
    sh(Command::new("git").current_dir(root()).args(["worktree", "add", "--detach"]).arg(dir).arg("HEAD")).unwrap();
    trees.1.push(dir.to_owned());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(dir)
        .args(["build", "--release", "-q", "-p", "lb-user", "--bin", "lb"])
        .env_remove("CARGO_TARGET_DIR")
        .status()
        .expect("running cargo build");
    assert!(status.success(), "cargo build --release in {} failed", dir.display());
    std::fs::read(dir.join("target/release/lb")).unwrap()
}

#[test]
fn the_packaged_lb_is_identical_when_built_in_another_directory() {
    packages();
    let ours = root().join("target/package-test/release/lb");
    let version = sh(Command::new(&ours).arg("--version")).unwrap();
    let base = std::env::temp_dir().join(format!("lb-repro-{}", std::process::id()));
    let mut trees = Worktrees(base.clone(), Vec::new());
    let other = build_elsewhere(&mut trees, &base.join("a-much-longer-directory-name/b"));
    // A build of a working tree with changes (`-dirty`) is not a commit's: then a second
    // checkout of HEAD, in a directory of another length, is the reference.
    let (reference, what) = if version.contains("-dirty") {
        (build_elsewhere(&mut trees, &base.join("a")), "a build of HEAD in another directory")
    } else {
        (std::fs::read(&ours).unwrap(), "the packaged lb")
    };
    let differing = reference.iter().zip(&other).filter(|(a, b)| a != b).count();
    assert!(
        reference == other,
        "lb built in {} differs from {what}: {} and {} bytes, {differing} bytes differ",
        base.join("a-much-longer-directory-name/b").display(),
        other.len(),
        reference.len()
    );
}
