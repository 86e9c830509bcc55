//! `lb`: the load balancer's controller and CLI.
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "lb", version, about = "eBPF/XDP L4 pass-through load balancer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Offline: print every service's eligible backends per client zone.
    Plan(lb_user::plan::PlanArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Plan(args) => lb_user::plan::run(&args),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
#[allow(dead_code)]
fn _unused(_: PathBuf) {}
