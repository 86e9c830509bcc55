//! `lb`: the load balancer's daemon and CLI.
use clap::{Parser, Subcommand};
use lb_user::cli::{self, decap, plan, render};
use lb_user::daemon::api::{self, HealthOverride, Request};
use std::net::IpAddr;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "lb", version, about = "eBPF/XDP L4 pass-through load balancer")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: load and attach the data plane, health-check, serve the control socket.
    Run(lb_user::daemon::RunArgs),
    /// Offline: print every service's eligible backends per client zone.
    Plan(plan::PlanArgs),
    /// Services, backends (zone, role, health, weight) and per-zone eligible sets.
    Status(Common),
    /// Data-plane counters, per service and client zone.
    Stats(Common),
    /// Which backend a flow from CLIENT gets, and why.
    Explain(ExplainArgs),
    /// Operator actions on one backend.
    Backend {
        #[command(subcommand)]
        action: BackendAction,
    },
    /// Re-read the configuration file (an invalid one is refused and changes nothing).
    Reload(Common),
    /// The lb_decap program, for backends whose kernel cannot decapsulate IPIP/IP6IP6.
    Decap {
        #[command(subcommand)]
        action: DecapAction,
    },
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Control socket of the daemon.
    #[arg(long, default_value = api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// `lb explain`: one flow of one service.
#[derive(clap::Args)]
struct ExplainArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    service: String,
    #[arg(long)]
    client: IpAddr,
    #[arg(long)]
    sport: Option<u16>,
    #[arg(long)]
    dport: Option<u16>,
    /// tcp or udp (default: the service's protocol).
    #[arg(long)]
    proto: Option<String>,
}

#[derive(Subcommand)]
enum BackendAction {
    /// Override a backend's health (auto = back to the health checker's verdict).
    Set {
        #[command(flatten)]
        backend: BackendRef,
        #[arg(long, value_enum)]
        health: HealthOverride,
    },
    /// No new flows; existing flows continue until the service's draining timeout.
    Drain(BackendRef),
    /// Ends a drain: the backend takes new flows again (its tracked flows stay).
    Undrain(BackendRef),
}

/// One backend of one service, on the daemon behind the control socket.
#[derive(clap::Args)]
struct BackendRef {
    #[command(flatten)]
    common: Common,
    #[arg(long)]
    service: String,
    #[arg(long)]
    address: IpAddr,
}

#[derive(Subcommand)]
enum DecapAction {
    /// Attach lb_decap to an interface (stays attached after this command exits).
    Attach(decap::DecapArgs),
    /// Detach lb_decap from an interface.
    Detach(decap::DecapArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => {
            lb_user::daemon::logging::init();
            cli::runtime().and_then(|rt| rt.block_on(lb_user::daemon::run(args)))
        }
        Command::Plan(args) => plan::run(&args),
        Command::Status(c) => call(&c, Request::Status, render::status),
        Command::Stats(c) => call(&c, Request::Stats, render::stats),
        Command::Explain(ExplainArgs { common, service, client, sport, dport, proto }) => {
            call(&common, Request::Explain { service, client, sport, dport, proto }, render::explain)
        }
        Command::Backend { action: BackendAction::Set { backend: BackendRef { common, service, address }, health } } => {
            call(&common, Request::BackendSet { service, address, health }, render::backend)
        }
        Command::Backend { action: BackendAction::Drain(BackendRef { common, service, address }) } => {
            call(&common, Request::BackendDrain { service, address }, render::backend)
        }
        Command::Backend { action: BackendAction::Undrain(BackendRef { common, service, address }) } => {
            call(&common, Request::BackendUndrain { service, address }, render::backend)
        }
        Command::Reload(c) => call(&c, Request::Reload, render::reloaded),
        Command::Decap { action: DecapAction::Attach(a) } => decap::attach(&a),
        Command::Decap { action: DecapAction::Detach(a) } => decap::detach(&a),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Send a request to the daemon behind `c`; print the reply as JSON or through `human`.
fn call<T: serde::Serialize + serde::de::DeserializeOwned>(c: &Common, req: Request, human: fn(&T) -> String) -> anyhow::Result<()> {
    cli::call(&c.socket, c.json, req, human)
}
