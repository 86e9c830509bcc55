//! `lb unload`: the explicit end of a data plane that `lb run --keep-dataplane` left
//! forwarding (the packaged service always keeps it, so that restarts, reloads and upgrades
//! keep every flow): detaches the balancer from every interface it has a pinned link on and
//! removes the map pins, the pin directory and the daemon's state file (and a probe device a
//! daemon that did not stop cleanly left). Refused while a daemon
//! runs on the pin directory (stop it first: `systemctl stop lb`). The package's `prerm` runs
//! it when the package is removed.

use crate::daemon::{api, state};
use crate::dataplane::pinning;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

#[derive(clap::Args, Clone, Debug)]
pub struct UnloadArgs {
    /// bpffs directory of the pins (as given to `lb run`).
    #[arg(long, default_value = pinning::DEFAULT_PIN_DIR)]
    pub pin_dir: PathBuf,
    /// Control socket of the stopped daemon; its state file beside it is removed.
    #[arg(long, default_value = api::DEFAULT_SOCKET)]
    pub socket: PathBuf,
}

/// What [`unload`] removed, for its one line of output.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Unloaded {
    /// Interfaces the balancer was detached from (named by their link pins).
    pub detached: Vec<String>,
    /// Whether a pin directory was there.
    pub pins: bool,
    /// Whether a probe device (with its policy rule and routes) left by a daemon that did not
    /// stop cleanly was removed.
    pub probe_device: bool,
}

pub fn unload(args: &UnloadArgs) -> Result<Unloaded> {
    let mut done = Unloaded::default();
    let _ = std::fs::remove_file(state::path_for(&args.socket));
    if !args.pin_dir.exists() {
        return Ok(done);
    }
    done.pins = true;
    let _lock = pinning::lock_pin_dir(&args.pin_dir).context("stop the daemon first (systemctl stop lb)")?;
    done.probe_device = crate::daemon::probe_path::remove_leftovers();
    for ifname in link_pins(&args.pin_dir)? {
        if pinning::detach_pinned(&pinning::link_pin(&args.pin_dir, &ifname))? {
            done.detached.push(ifname);
        }
    }
    pinning::remove_map_pins(&args.pin_dir)?;
    std::fs::remove_dir(&args.pin_dir)
        .with_context(|| format!("removing {} (it holds pins lb does not know)", args.pin_dir.display()))?;
    Ok(done)
}

/// The interfaces with a link pin in `pin_dir`.
fn link_pins(pin_dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(pin_dir).with_context(|| format!("reading {}", pin_dir.display()))? {
        let name = entry?.file_name();
        if let Some(ifname) = name.to_str().and_then(|n| n.strip_prefix("link_")) {
            names.push(ifname.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

pub fn run(args: &UnloadArgs) -> Result<()> {
    let done = unload(args)?;
    if !done.pins {
        println!("nothing pinned in {}", args.pin_dir.display());
    } else if done.detached.is_empty() {
        println!("removed the pins in {} (no interface had the balancer attached)", args.pin_dir.display());
    } else {
        println!("detached from {}; removed the pins in {}", done.detached.join(", "), args.pin_dir.display());
    }
    if done.probe_device {
        println!("removed the health probes' device {} and its rule", crate::daemon::probe_path::DEVICE);
    }
    Ok(())
}
