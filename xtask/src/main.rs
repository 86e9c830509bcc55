//! `cargo xtask setup|build|test|soak|bench|demo`: the project's one entry point for tooling.
//!
//! Every command first runs `setup`, which is idempotent and takes seconds once the toolchain
//! is in place, so that a fresh machine needs nothing but this repository.

mod bpffs;
mod package;
mod repro;
mod setup;
mod soak;
mod toolchain;

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Parser)]
#[command(name = "xtask", about = "Build, test and benchmark the load balancer")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Install the eBPF toolchain (the pinned nightly, rust-src, bpf-linker) and the Debian tools the tests use.
    Setup,
    /// Build the eBPF object and the `lb` binary (release).
    Build,
    /// Run every test suite (needs root for the BPF and network-namespace tests).
    Test {
        /// Extra arguments for `cargo test` (e.g. a test name filter after `--`).
        #[arg(trailing_var_arg = true)]
        args: Vec<String>,
    },
    /// Only the checks that gate the tests: rustfmt and clippy over every crate, lb-ebpf included.
    Lint,
    /// The long versions of the reliability tests (needs root; run under the suite lock).
    Soak(soak::Args),
    /// Print the benchmark figures (Maglev build time, data-plane per-packet cost).
    Bench {
        /// Instead: live traffic through `lb` against nftables DNAT in namespaces (BENCHMARKS.md).
        #[arg(long)]
        live: bool,
        /// Instead: what checking 1,000 backends every second costs the daemon (BENCHMARKS.md).
        #[arg(long, conflicts_with_all = ["live", "katran"])]
        health_load: bool,
        /// Extra arguments for `live_bench` (`--quick`, `--rounds N`, `--secs S`) or
        /// `health_load` (`--secs S`, `--check TCP|HTTP`, `--path VIP|DIRECT`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
        /// Instead, compare the data plane with Katran's, side by side: the path of a
        /// `balancer.bpf.o` built from Katran's source (BENCHMARKS.md says how to get it).
        #[arg(long, value_name = "BALANCER_BPF_O", conflicts_with = "live")]
        katran: Option<PathBuf>,
    },
    /// Build the Debian package (target/debian/lb_*.deb) with cargo-deb, and check it.
    Package {
        /// The package's version instead of the crate's (e.g. two versions of one build).
        #[arg(long)]
        deb_version: Option<String>,
    },
    /// Build `lb` (release) from two checkouts of HEAD in different directories; they must be identical.
    Repro,
    /// The live demo (see README.md): `zonal` (default), `scale-out` or `next-hop`.
    Demo {
        #[arg(value_enum, default_value = "zonal")]
        scene: Scene,
    },
}

fn main() -> Result<()> {
    let mut cli = Cli::parse();
    // Paths given on the command line are relative to where xtask was started, not the root.
    if let Cmd::Bench { katran: Some(object), .. } = &mut cli.command {
        *object = std::path::absolute(&*object)?;
    }
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    survive_interrupts();
    add_sbin_to_path();
    setup::ensure()?;
    match cli.command {
        Cmd::Setup => Ok(()),
        Cmd::Build => build(),
        Cmd::Test { args } => test(&args),
        Cmd::Lint => lint(),
        Cmd::Soak(args) => soak::soak(&args),
        Cmd::Bench { live: true, args, .. } => bench_live(&args),
        Cmd::Bench { health_load: true, args, .. } => bench_health_load(&args),
        Cmd::Bench { args, .. } if !args.is_empty() => {
            bail!("arguments {args:?} are for `bench --live` or `bench --health-load`")
        }
        Cmd::Bench { katran: Some(object), .. } => bench_katran(&object),
        Cmd::Bench { .. } => bench(),
        Cmd::Package { deb_version } => package::package(&root, deb_version.as_deref()).map(|_| ()),
        Cmd::Repro => repro::repro(&root),
        Cmd::Demo { scene } => demo(scene),
    }
}

/// Ctrl-C reaches the whole foreground process group: the command running under xtask (the
/// demo, a test binary) handles it or dies of it, and xtask goes on to its clean-up (the bpffs
/// guard) instead of dying first. SIGINT only: a SIGTERM sent to xtask alone still stops it. A
/// handler rather than SIG_IGN, so that the commands it starts begin with the default
/// disposition.
fn survive_interrupts() {
    extern "C" fn noted(_: libc::c_int) {}
    // SAFETY: installing an async-signal-safe (empty) handler.
    unsafe { libc::signal(libc::SIGINT, noted as extern "C" fn(libc::c_int) as libc::sighandler_t) };
}

/// The tests and the demo run `ip`, `sysctl` and `ethtool` by name; a non-login root shell's
/// PATH may lack the sbin directories they live in.
fn add_sbin_to_path() {
    let path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_owned());
    let mut dirs: Vec<&str> = path.split(':').filter(|d| !d.is_empty()).collect();
    for d in ["/usr/local/sbin", "/usr/sbin", "/sbin"] {
        if !dirs.contains(&d) {
            dirs.push(d);
        }
    }
    std::env::set_var("PATH", dirs.join(":"));
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// Run a command, failing with its command line if it does not succeed.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {shown}"))?;
    if !status.success() {
        bail!("{shown} failed: {status}");
    }
    Ok(())
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn require_root(what: &str) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        bail!("{what} needs root (BPF programs, network namespaces); run it as root");
    }
    Ok(())
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

fn build() -> Result<()> {
    run(cargo().args(["build", "--release", "-p", "lb-user", "--bin", "lb"]))?;
    println!("built target/release/lb (the eBPF objects are embedded; `lb --version` names their hash)");
    Ok(())
}

fn test(extra: &[String]) -> Result<()> {
    require_root("cargo xtask test")?;
    lint()?;
    let mut cmd = cargo();
    cmd.args(["test", "--workspace", "--no-fail-fast"]).args(extra);
    bpffs::guarded(|| run(&mut cmd))
}

/// Formatting and lints gate the tests: `cargo fmt --check` over the workspace and over the
/// eBPF crate (its own workspace; rustfmt needs no target to check it), and clippy with every
/// warning an error over the workspace's targets and over the eBPF crate, as aya lints its
/// own: for the BPF target with the pinned nightly and `-Z build-std=core`, both objects (the
/// production build and the bench build). Clippy's check builds go to their own target
/// directory so they never touch the objects `lb-user/build.rs` builds.
fn lint() -> Result<()> {
    run(cargo().args(["fmt", "--all", "--check"]))?;
    run(cargo().args(["fmt", "--manifest-path", "lb-ebpf/Cargo.toml", "--all", "--check"]))?;
    run(cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))?;
    let ebpf = workspace_root().join("lb-ebpf");
    let target_dir = workspace_root().join("target/ebpf-clippy");
    for features in [&[][..], &["--features", "bench"][..]] {
        // In lb-ebpf, rustup picks the pinned nightly (its rust-toolchain.toml); this cargo's
        // toolchain, flags and target settings must not leak into it (as in
        // lb-user/ebpf_build.rs).
        let mut cmd = Command::new("cargo");
        for (k, _) in std::env::vars() {
            let leaks = k.starts_with("CARGO") || k.starts_with("RUSTC") || k == "RUSTUP_TOOLCHAIN";
            if leaks || k == "RUSTFLAGS" || k == "RUSTDOCFLAGS" {
                cmd.env_remove(k);
            }
        }
        cmd.current_dir(&ebpf)
            .args(["clippy", "--target", "bpfel-unknown-none", "-Z", "build-std=core", "--bins", "--lib"])
            .args(features)
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--", "-D", "warnings"]);
        run(&mut cmd)?;
    }
    Ok(())
}

fn bench() -> Result<()> {
    run(cargo().args(["run", "--release", "-q", "-p", "lb-user", "--example", "maglev_bench"]))?;
    // Data-plane per-packet cost with BPF_PROG_TEST_RUN (method: BENCHMARKS.md).
    require_root("cargo xtask bench (data-plane part)")?;
    bpffs::guarded(|| {
        run(cargo().args(["run", "--release", "-q", "-p", "lb-tests", "--bin", "dp_bench"]))?;
        // What packet tracing costs while a trace runs (without one, nothing: BENCHMARKS.md).
        run(cargo().args(["run", "--release", "-q", "-p", "lb-tests", "--bin", "dp_bench", "--", "--trace"]))?;
        // Control plane: health change to live tables, daemon memory with 1M tracked connections.
        run(cargo().args(["build", "--release", "-q", "-p", "lb-user", "--bin", "lb"]))?;
        run(cargo().args(["run", "--release", "-q", "-p", "lb-tests", "--bin", "cp_bench"]))
    })
}

/// Live traffic, `lb` against nftables DNAT (`tests/src/bin/live_bench.rs`). The dev profile
/// suffices: the kernel does all the per-packet work, and it reuses the test build's cache.
fn bench_live(args: &[String]) -> Result<()> {
    require_root("cargo xtask bench --live")?;
    // The bench starts the `lb` daemon, built next to it.
    run(cargo().args(["build", "-q", "-p", "lb-user", "--bin", "lb"]))?;
    run(cargo().args(["build", "-q", "-p", "lb-tests", "--bin", "live_bench"]))?;
    bpffs::guarded(|| run(Command::new(workspace_root().join("target/debug/live_bench")).args(args)))
}

/// 1,000 backends checked every second: the daemon's CPU share, descriptors and memory
/// (`tests/src/bin/health_load.rs`). The dev profile, as the tests run the daemon (and their
/// build's cache): BENCHMARKS.md's figures are that build's.
fn bench_health_load(args: &[String]) -> Result<()> {
    require_root("cargo xtask bench --health-load")?;
    // The bench starts the `lb` daemon built next to it.
    run(cargo().args(["build", "-q", "-p", "lb-user", "--bin", "lb"]))?;
    run(cargo().args(["build", "-q", "-p", "lb-tests", "--bin", "health_load"]))?;
    bpffs::guarded(|| run(Command::new(workspace_root().join("target/debug/health_load")).args(args)))
}

/// `dp_bench --katran`: the headline cases and the hot hit, `lb` and Katran side by side.
fn bench_katran(object: &Path) -> Result<()> {
    require_root("cargo xtask bench --katran")?;
    bpffs::guarded(|| {
        run(cargo()
            .args(["run", "--release", "-q", "-p", "lb-tests", "--bin", "dp_bench", "--", "--katran"])
            .arg(object))
    })
}

/// Scenes of the demo.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Scene {
    /// Zonal affinity with spill-over, one balancer.
    Zonal,
    /// Three balancers behind ECMP with BIRD; one is killed.
    ScaleOut,
    /// The balancer as a route's next hop, stateful firewalls behind it; one fails.
    NextHop,
}

fn demo(scene: Scene) -> Result<()> {
    require_root("cargo xtask demo")?;
    build()?;
    // The demo drives the `lb` binary and the `lb-testsrv` backends, built next to it.
    run(cargo().args(["build", "--release", "-q", "-p", "lb-tests", "--bins"]))?;
    let scene = match scene {
        Scene::Zonal => "zonal",
        Scene::ScaleOut => "scale-out",
        Scene::NextHop => "next-hop",
    };
    bpffs::guarded(|| run(Command::new(workspace_root().join("target/release/demo")).arg(scene)))
}
