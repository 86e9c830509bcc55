//! `lb`: the load balancer's daemon and CLI.
use clap::{CommandFactory, Parser, Subcommand};
use lb_user::cli::{self, backend_host, config_schema, decap, flows, manpages, plan, render, unload, validate};
use lb_user::daemon::api::{self, HealthOverride, Proto, Request};
use std::net::IpAddr;
use std::path::PathBuf;

/// `lb --version`: the release, the commit it was built from and the embedded XDP object's
/// SHA-256 (both from `build.rs`).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("LB_GIT_COMMIT"),
    ", eBPF object sha256 ",
    env!("LB_EBPF_SHA256"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "lb",
    version = VERSION,
    about = "eBPF/XDP L4 pass-through load balancer",
    after_long_help = "The configuration file: lb.toml(5). Exit codes: 0 success, 1 failure, 2 usage error, \
                       3 invalid configuration, 4 needs a restart, 5 no daemon on the socket, 6 not permitted."
)]
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
    /// Offline: check a configuration file; lists every problem and exits 1 if there is one.
    /// VIPs are also checked against this host's addresses (where `lb run` would be).
    Validate(ValidateArgs),
    /// Services, backends (zone, role, health, weight) and per-zone eligible sets.
    Status(Common),
    /// Data-plane counters, per service and client zone.
    Stats(Common),
    /// Which backend a flow from CLIENT gets, and why.
    Explain(ExplainArgs),
    /// The connection tables' entries: client, VIP, backend, idle time, state (from the pins).
    Flows(flows::FlowsArgs),
    /// Live per-packet verdicts of the data plane for packets matching a filter.
    Trace(cli::trace::TraceArgs),
    /// Operator actions on one backend.
    Backend {
        #[command(subcommand)]
        action: BackendAction,
    },
    /// Re-read the configuration file (an invalid one is refused and changes nothing).
    Reload(ReloadArgs),
    /// The lb_decap program, for backends whose kernel cannot decapsulate IPIP/IP6IP6.
    Decap {
        #[command(subcommand)]
        action: DecapAction,
    },
    /// On a backend: check or set up what it needs to serve VIPs behind lb (VIP on lo, ARP and
    /// rp_filter sysctls, decapsulation).
    BackendHost {
        #[command(subcommand)]
        action: backend_host::Action,
    },
    /// Print the JSON Schema of the configuration file, for editors (docs/config.md).
    ConfigSchema,
    /// Detach the data plane a stopped `lb run --keep-dataplane` (the service) left forwarding,
    /// and remove its pins and state.
    Unload(unload::UnloadArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions {
        /// The shell to complete for.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (roff): lb(8) and one per command, lb-run(8), lb-backend-set(8)...
    #[command(hide = true)]
    Manpage {
        /// The directory to write them into.
        #[arg(long)]
        dir: PathBuf,
    },
}

#[derive(clap::Args, Clone)]
struct Common {
    /// Control socket of the daemon.
    #[arg(long, env = "LB_SOCKET", default_value = api::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// Print the daemon's reply as JSON.
    #[arg(long)]
    json: bool,
}

/// `lb validate`.
#[derive(clap::Args)]
struct ValidateArgs {
    /// Configuration file to check.
    #[arg(long)]
    config: PathBuf,
}

/// `lb reload`.
#[derive(clap::Args)]
struct ReloadArgs {
    #[command(flatten)]
    common: Common,
    /// Print what the reload would change (services, backends, eligible sets, tables) without
    /// applying it.
    #[arg(long)]
    dry_run: bool,
}

/// `lb explain`: one flow of one service.
#[derive(clap::Args)]
struct ExplainArgs {
    #[command(flatten)]
    common: Common,
    /// The service's name.
    #[arg(long)]
    service: String,
    /// The client's (source) address.
    #[arg(long)]
    client: IpAddr,
    /// The flow's destination: needed for a next-hop service (a VIP service's is its VIP).
    #[arg(long)]
    dst: Option<IpAddr>,
    /// The client's source port (default 40000).
    #[arg(long)]
    sport: Option<u16>,
    /// The destination port (default: the service's first port).
    #[arg(long)]
    dport: Option<u16>,
    /// The flow's protocol (default: the service's; icmp for L3_DEFAULT services only).
    #[arg(long, value_enum)]
    proto: Option<Proto>,
    /// Offline: explain with the tables this configuration file compiles to, instead of
    /// asking the daemon (same output).
    #[arg(long)]
    config: Option<PathBuf>,
    /// With --config: backends to treat as unhealthy (comma-separated, repeatable; the others
    /// are healthy).
    #[arg(long, value_delimiter = ',', requires = "config")]
    unhealthy: Vec<IpAddr>,
}

#[derive(Subcommand)]
enum BackendAction {
    /// Override a backend's health (auto = back to the health checker's verdict).
    Set {
        #[command(flatten)]
        backend: BackendRef,
        /// The health to force, or auto to follow the health checks again.
        #[arg(long, value_enum)]
        health: HealthOverride,
    },
    /// No new flows; existing flows continue until the service's draining timeout. With
    /// `--host`: drain this whole balancer (withdraw its VIPs, forward for a grace period, stop).
    Drain(DrainArgs),
    /// Ends a drain: the backend takes new flows again (its tracked flows stay).
    Undrain(BackendRef),
}

/// One backend of one service, on the daemon behind the control socket.
#[derive(clap::Args)]
struct BackendRef {
    #[command(flatten)]
    common: Common,
    /// The service's name.
    #[arg(long)]
    service: String,
    /// The backend's address, as configured.
    #[arg(long)]
    address: IpAddr,
}

/// `lb backend drain`: one backend of one service, or (`--host`) this balancer.
#[derive(clap::Args)]
struct DrainArgs {
    #[command(flatten)]
    common: Common,
    /// The service's name.
    #[arg(long, required_unless_present = "host")]
    service: Option<String>,
    /// The backend's address, as configured.
    #[arg(long, required_unless_present = "host")]
    address: Option<IpAddr>,
    /// Drain the whole host: withdraw every announced VIP, keep forwarding, then stop.
    #[arg(long, conflicts_with_all = ["service", "address"])]
    host: bool,
    /// With --host: seconds to keep forwarding (default `[announce] drain_grace_sec`).
    #[arg(long, requires = "host")]
    grace_sec: Option<u32>,
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
        Command::Validate(ValidateArgs { config }) => validate::check(&config).map(|summary| println!("{summary}")),
        Command::Status(c) => call(&c, Request::Status, render::status),
        Command::Stats(c) => call(&c, Request::Stats, render::stats),
        Command::Explain(ExplainArgs { common, service, client, dst, sport, dport, proto, config: None, .. }) => {
            call(&common, Request::Explain { service, client, dst, sport, dport, proto }, render::explain)
        }
        Command::Explain(ExplainArgs {
            common,
            service,
            client,
            dst,
            sport,
            dport,
            proto,
            config: Some(config),
            unhealthy,
        }) => {
            let flow = cli::explain::FlowArgs { service, client, dst, sport, dport, proto };
            cli::explain::offline(&config, &unhealthy, &flow).and_then(|e| cli::print(common.json, &e, render::explain))
        }
        Command::Flows(args) => flows::run(&args),
        Command::Trace(args) => cli::trace::run(&args),
        Command::Backend {
            action: BackendAction::Set { backend: BackendRef { common, service, address }, health },
        } => call(&common, Request::BackendSet { service, address, health }, render::backend),
        Command::Backend { action: BackendAction::Drain(DrainArgs { common, host: true, grace_sec, .. }) } => {
            call(&common, Request::HostDrain { grace_sec }, render::host_drain)
        }
        Command::Backend {
            action: BackendAction::Drain(DrainArgs { common, service: Some(service), address: Some(address), .. }),
        } => call(&common, Request::BackendDrain { service, address }, render::backend),
        Command::Backend { action: BackendAction::Drain(_) } => {
            unreachable!("clap requires --service and --address without --host")
        }
        Command::Backend { action: BackendAction::Undrain(BackendRef { common, service, address }) } => {
            call(&common, Request::BackendUndrain { service, address }, render::backend)
        }
        Command::Reload(ReloadArgs { common, dry_run: false }) => call(&common, Request::Reload, render::reloaded),
        Command::Reload(ReloadArgs { common, dry_run: true }) => {
            call(&common, Request::ReloadDryRun, render::reload_plan)
        }
        Command::Decap { action: DecapAction::Attach(a) } => decap::attach(&a),
        Command::Decap { action: DecapAction::Detach(a) } => decap::detach(&a),
        Command::BackendHost { action } => backend_host::run(&action),
        Command::ConfigSchema => {
            print!("{}", config_schema::schema_text());
            Ok(())
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "lb", &mut std::io::stdout());
            Ok(())
        }
        Command::Unload(args) => unload::run(&args),
        Command::Manpage { dir } => manpages::write_all(Cli::command(), &dir).map(|_| ()),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            // Scripts branch on the kind (lb-user `error::ErrorKind`), not on the message.
            lb_user::error::ErrorKind::of(&e).map_or(std::process::ExitCode::FAILURE, |k| k.exit_code().into())
        }
    }
}

/// Send a request to the daemon behind `c`; print the reply as JSON or through `human`.
fn call<T: serde::Serialize + serde::de::DeserializeOwned>(
    c: &Common,
    req: Request,
    human: fn(&T) -> String,
) -> anyhow::Result<()> {
    cli::call(&c.socket, c.json, req, human)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag and argument of every command says what it is for (`--help`, completions,
    /// the man page).
    #[test]
    fn every_flag_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let builtin = matches!(arg.get_id().as_str(), "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "lb", &mut missing);
        assert!(missing.is_empty(), "flags without help: {missing:?}");
        Cli::command().debug_assert();
    }

    #[test]
    fn socket_defaults_to_lb_socket_from_the_environment() {
        let parse = |args: &[&str]| match Cli::try_parse_from(args).unwrap().command {
            Command::Status(c) => c.socket,
            _ => unreachable!(),
        };
        assert_eq!(parse(&["lb", "status"]), PathBuf::from(api::DEFAULT_SOCKET));
        // This test alone sets LB_SOCKET in this process.
        std::env::set_var("LB_SOCKET", "/tmp/other.sock");
        assert_eq!(parse(&["lb", "status"]), PathBuf::from("/tmp/other.sock"));
        assert_eq!(parse(&["lb", "status", "--socket", "/tmp/flag.sock"]), PathBuf::from("/tmp/flag.sock"));
        std::env::remove_var("LB_SOCKET");
    }

    #[test]
    fn proto_is_a_value_enum_with_icmp() {
        let proto = |p: &str| match Cli::try_parse_from([
            "lb",
            "explain",
            "--service",
            "web",
            "--client",
            "198.18.1.1",
            "--proto",
            p,
        ]) {
            Ok(Cli { command: Command::Explain(a) }) => Ok(a.proto),
            Ok(_) => unreachable!(),
            Err(e) => Err(e.to_string()),
        };
        assert_eq!(proto("icmp"), Ok(Some(Proto::Icmp)));
        assert_eq!(proto("udp"), Ok(Some(Proto::Udp)));
        let err = proto("sctp").unwrap_err();
        assert!(err.contains("--proto") && err.contains("tcp, udp, icmp"), "{err}");
    }

    #[test]
    fn version_names_the_commit_and_the_ebpf_object() {
        let v = Cli::command().render_version();
        assert!(v.contains(" (commit ") && v.contains("eBPF object sha256 "), "{v}");
        let hash = v.trim().trim_end_matches(')').rsplit(' ').next().unwrap();
        assert_eq!(hash.len(), 64, "{v}");
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{v}");
    }
}
