//! `lb plan`: offline rendering of the policy engine's output (table or JSON).
use clap::Args;
use std::path::PathBuf;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// Configuration file.
    #[arg(long)]
    pub config: PathBuf,
    /// Backends to treat as unhealthy (comma-separated, repeatable).
    #[arg(long, value_delimiter = ',')]
    pub unhealthy: Vec<std::net::IpAddr>,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(_args: &PlanArgs) -> anyhow::Result<()> {
    anyhow::bail!("lb plan: not implemented yet")
}
