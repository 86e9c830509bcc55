//! `cargo xtask soak`: the long versions of the reliability tests that CI runs short. Each part
//! is a function with flags of its own; run it under the suite lock
//! (`flock /tmp/lb-suite.lock cargo xtask soak`), as it loads BPF programs.
//!
//! Hostile input (`fuzz`): the packet fuzz (tests/fuzz_packets.rs, CI: 1,000,000 frames of one
//! fixed seed) with more frames and fresh seeds, and the configuration mutations
//! (tests/hostile_config.rs, CI: 2,000 cases) with more cases. Seeds are printed before each
//! run, so a failure is replayed with `LB_FUZZ_SEED=... cargo test -p lb-tests --test NAME`.
//!
//! Change under load, the DNS front under garbage, the daemon under churn (`load`): the same
//! tests CI runs, at their soak sizes (`LB_SOAK=1`: 500 reloads and 10 health flaps under 1,000
//! connections; 200,000 garbage messages; 1,000 reloads, 100,000 control requests and 20
//! interface cycles; the connection-table flood for a minute), one at a time, printing their
//! tables and measurements.

use anyhow::Result;

use crate::{cargo, run};

#[derive(clap::Args)]
pub struct Args {
    /// Run only this part (default: all of them, hostile input first).
    #[arg(long, value_enum)]
    pub only: Option<Part>,
    #[command(flatten)]
    pub fuzz: FuzzArgs,
}

#[derive(Clone, Copy, PartialEq, clap::ValueEnum)]
pub enum Part {
    Fuzz,
    Load,
}

pub fn soak(args: &Args) -> Result<()> {
    crate::require_root("cargo xtask soak")?;
    crate::bpffs::guarded(|| {
        if args.only != Some(Part::Load) {
            fuzz(&args.fuzz)?;
        }
        if args.only != Some(Part::Fuzz) {
            load()?;
        }
        Ok(())
    })
}

fn load() -> Result<()> {
    let mut cmd = cargo();
    cmd.env("LB_SOAK", "1").args(["test", "-p", "lb-tests"]);
    for t in ["e2e_change_under_load", "e2e_dns_garbage", "e2e_churn", "e2e_ct_flood"] {
        cmd.args(["--test", t]);
    }
    run(cmd.args(["--", "--nocapture", "--test-threads=1"]))
}

#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Frames per seed of the packet fuzz.
    #[arg(long, default_value_t = 20_000_000)]
    pub fuzz_frames: u64,
    /// Configuration mutations per seed.
    #[arg(long, default_value_t = 50_000)]
    pub fuzz_config_cases: u64,
    /// Seeds to run (repeatable); without it, `--fuzz-rounds` fresh ones.
    #[arg(long = "fuzz-seed")]
    pub fuzz_seeds: Vec<u64>,
    /// Fresh seeds to run when no `--fuzz-seed` is given.
    #[arg(long, default_value_t = 3)]
    pub fuzz_rounds: u32,
}

/// The packet fuzz and the configuration mutations, once per seed (release build: several
/// times the debug build's frames per second).
fn fuzz(args: &FuzzArgs) -> Result<()> {
    let seeds = if args.fuzz_seeds.is_empty() { fresh_seeds(args.fuzz_rounds) } else { args.fuzz_seeds.clone() };
    // hostile_config's refused-reload part starts the daemon built beside the tests.
    run(cargo().args(["build", "--release", "-q", "-p", "lb-user", "--bin", "lb"]))?;
    for seed in seeds {
        println!("soak fuzz: LB_FUZZ_SEED={seed:#x}");
        for test in ["fuzz_packets", "hostile_config"] {
            run(cargo()
                .args(["test", "--release", "-p", "lb-tests", "--test", test, "--", "--nocapture"])
                .env("LB_FUZZ_SEED", format!("{seed:#x}"))
                .env("LB_FUZZ_FRAMES", args.fuzz_frames.to_string())
                .env("LB_FUZZ_CASES", args.fuzz_config_cases.to_string()))?;
        }
    }
    Ok(())
}

/// Seeds from the clock and the process id, mixed (SplitMix64's finalizer).
fn fresh_seeds(n: u32) -> Vec<u64> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64);
    let base = now.unwrap_or(0) ^ (u64::from(std::process::id()) << 32);
    (1..=u64::from(n))
        .map(|i| {
            let mut z = base.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        })
        .collect()
}
