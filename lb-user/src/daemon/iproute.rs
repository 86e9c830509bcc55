//! Running iproute2's `ip` for the links, rules and routes the daemon owns (its VIP device
//! and routing table, its probe device and policy rule).

use anyhow::{bail, Context, Result};
use std::process::Command;

/// Run `ip ARGS` (iproute2; /usr/sbin may be missing from a service's PATH).
pub fn ip(args: &[&str]) -> Result<()> {
    let prog = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or("ip");
    let out = Command::new(prog).args(args).output().with_context(|| format!("running ip {}", args.join(" ")))?;
    if !out.status.success() {
        bail!("ip {} failed: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(())
}
