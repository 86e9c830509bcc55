//! `lb explain --config FILE`: the explanation a daemon would give, computed offline from a
//! configuration and a set of unhealthy backends (the same view function as the daemon's).

use crate::cli::plan::unhealthy_set;
use crate::compile::{compile, explain::Explanation, Ids};
use crate::config::Config;
use crate::daemon::views;
use anyhow::Result;
use std::net::IpAddr;
use std::path::Path;

pub use crate::daemon::views::FlowArgs;

/// Explains `flow` with the tables `config` compiles to when the backends at `unhealthy` are
/// unhealthy and every other one healthy (as the daemon's once its checks have run).
pub fn offline(config: &Path, unhealthy: &[IpAddr], flow: &FlowArgs) -> Result<Explanation> {
    let cfg = Config::load(config)?;
    let down = unhealthy_set(&cfg, unhealthy).map_err(|e| anyhow::anyhow!("{}: {e}", config.display()))?;
    let healthy = |si: usize, bi: usize| {
        let b = &cfg.services[si].backends[bi];
        b.address().is_none_or(|a| !down.contains(&a))
    };
    let compiled = compile(&cfg, &healthy, &mut Ids::default())?;
    views::explain(&cfg, &compiled, flow)
}
