//! `lb backend-host check|setup`: what a Linux backend needs to serve a VIP behind lb, checked
//! and, on request, put in place (README "Preparing a backend" lists the same steps by hand):
//!
//! - the VIP on `lo`, so the backend accepts packets to it and answers from it (direct server
//!   return);
//! - for IPv4 VIPs, `arp_ignore` >= 1 and `arp_announce` = 2, so it never answers ARP for the VIP
//!   on the segment nor uses it as an ARP source (IPv6 answers neighbour solicitations only for
//!   the receiving interface's addresses: nothing to set);
//! - for IPv4 VIPs, no strict `rp_filter` on the receiving interface (and `tunl0`): clients'
//!   packets arrive through the balancer or a tunnel, not on the route back to the client;
//! - with IPIP forwarding, decapsulation: the kernel's fallback tunnel device (`tunl0` of the
//!   `ipip` module, `ip6tnl0` of `ip6_tunnel`) up, or else `lb_decap` on the interface
//!   (`lb decap attach`), for kernels without those modules.
//!
//! Everything is read and changed in the caller's network namespace: sysctls through
//! `/proc/sys/net` (per namespace), links and addresses with `ip` (netlink), never `/sys/class/net`
//! (which shows the namespace that mounted `/sys`).

use crate::cli::decap::{self, DecapArgs};
use crate::model::Forwarding;
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::Command;

#[derive(clap::Subcommand, Clone, Debug)]
pub enum Action {
    /// Report what this host lacks to serve the VIPs as an lb backend (exit 1 if anything),
    /// with the command that fixes each piece.
    Check(Args),
    /// Put the missing pieces in place (until reboot: see README "Preparing a backend"), then
    /// check again.
    Setup(Args),
}

#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// A VIP this backend serves (IPv4 or IPv6; repeat for several).
    #[arg(long = "vip", required = true)]
    pub vips: Vec<IpAddr>,
    /// The services' forwarding: IPIP (the backend decapsulates) or L2_DSR.
    #[arg(long, default_value = "IPIP")]
    pub forwarding: Forwarding,
    /// The interface the balancer's packets arrive on (default: the one of the default route).
    #[arg(long)]
    pub interface: Option<String>,
    /// bpffs directory of lb_decap's pinned link, where it is the decapsulator.
    #[arg(long, default_value = "/sys/fs/bpf/lb-decap")]
    pub pin_dir: PathBuf,
}

pub fn run(action: &Action) -> Result<()> {
    match action {
        Action::Check(args) => check(args),
        Action::Setup(args) => setup(args),
    }
}

/// How a missing piece is put in place.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Fix {
    /// `ip` with these arguments.
    Ip(Vec<String>),
    /// Sysctls (dotted name, value).
    Sysctls(Vec<(String, u32)>),
    /// Decapsulation for these tunnel kinds, on this interface.
    Decap { v4: bool, v6: bool, interface: String },
}

impl Fix {
    /// The command an operator would type.
    fn command(&self) -> String {
        match self {
            Fix::Ip(args) => format!("ip {}", args.join(" ")),
            Fix::Sysctls(set) => {
                let pairs: Vec<String> = set.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("sysctl -w {}", pairs.join(" "))
            }
            Fix::Decap { v4, v6, interface } => {
                let mut kernel = Vec::new();
                if *v4 {
                    kernel.push(format!("modprobe ipip && ip link set {TUNL_V4} up"));
                }
                if *v6 {
                    kernel.push(format!("modprobe ip6_tunnel && ip link set {TUNL_V6} up"));
                }
                format!("{}; without the module: lb decap attach --interface {interface}", kernel.join(" && "))
            }
        }
    }
}

/// One piece of the recipe as found on this host.
#[derive(Clone, Debug)]
struct Finding {
    /// What is needed, e.g. "198.18.0.100/32 on lo".
    what: String,
    /// None = in place; else what is there instead and the fix.
    missing: Option<(String, Fix)>,
}

/// The kernel's fallback tunnel devices, which take IPIP / IP6IP6 packets to any local address.
const TUNL_V4: &str = "tunl0";
const TUNL_V6: &str = "ip6tnl0";
/// `lb_decap`'s program name (as the kernel reports it).
const DECAP_PROGRAM: &str = "lb_decap";

fn host_len(vip: &IpAddr) -> u8 {
    if vip.is_ipv4() {
        32
    } else {
        128
    }
}

/// The file of a sysctl named as sysctl(8) does: dots separate, a '/' stands for a dot in an
/// interface name (`net.ipv4.conf.eth0/100.rp_filter`).
fn sysctl_path(name: &str) -> String {
    let path: String = name
        .chars()
        .map(|c| {
            if c == '.' {
                '/'
            } else if c == '/' {
                '.'
            } else {
                c
            }
        })
        .collect();
    format!("/proc/sys/{path}")
}

/// The sysctl(8) name of an interface's IPv4 setting.
fn conf_name(dev: &str, key: &str) -> String {
    format!("net.ipv4.conf.{}.{key}", dev.replace('.', "/"))
}

/// The value of a sysctl (sysctl(8)'s name).
fn sysctl(name: &str) -> Result<u32> {
    let path = sysctl_path(name);
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.trim().parse().with_context(|| format!("{path}: {text:?} is not a number"))
}

fn set_sysctl(name: &str, value: u32) -> Result<()> {
    let path = sysctl_path(name);
    std::fs::write(&path, format!("{value}\n")).with_context(|| format!("writing {value} to {path}"))
}

/// Runs `ip ARGS`; its stderr on failure.
fn ip(args: &[&str]) -> Result<String> {
    let out = Command::new("ip").args(args).output().context("running ip (iproute2)")?;
    if !out.status.success() {
        bail!("ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `ip -j -d link show dev NAME` as JSON; None if there is no such link.
fn link(name: &str) -> Result<Option<serde_json::Value>> {
    // if_nametoindex asks this namespace's kernel (not /sys), so "absent" is told apart from
    // a failing `ip`.
    let cname = std::ffi::CString::new(name).context("interface name")?;
    // SAFETY: a valid NUL-terminated string; the call only reads it.
    if unsafe { libc::if_nametoindex(cname.as_ptr()) } == 0 {
        return Ok(None);
    }
    let text = ip(&["-j", "-d", "link", "show", "dev", name])?;
    let mut list: Vec<serde_json::Value> = serde_json::from_str(&text).context("parsing `ip -j link` output")?;
    Ok(list.pop())
}

fn is_up(link: &serde_json::Value) -> bool {
    link["flags"].as_array().is_some_and(|f| f.iter().any(|x| x == "UP"))
}

/// Whether `lb_decap` is the XDP program of the link (any mode).
fn has_lb_decap(link: &serde_json::Value) -> bool {
    link["xdp"]["prog"]["name"] == DECAP_PROGRAM
        || link["xdp"]["attached"].as_array().is_some_and(|a| a.iter().any(|p| p["prog"]["name"] == DECAP_PROGRAM))
}

/// The interface of the default route (IPv4, else IPv6).
fn default_route_interface() -> Result<String> {
    for family in ["-4", "-6"] {
        let text = ip(&["-j", family, "route", "show", "default"])?;
        let routes: Vec<serde_json::Value> = serde_json::from_str(&text).context("parsing `ip -j route` output")?;
        if let Some(dev) = routes.iter().find_map(|r| r["dev"].as_str()) {
            return Ok(dev.to_owned());
        }
    }
    bail!("no default route to take the interface from: give --interface (the one the balancer's packets arrive on)")
}

fn interface(args: &Args) -> Result<String> {
    let name = match &args.interface {
        Some(i) => i.clone(),
        None => default_route_interface()?,
    };
    if link(&name)?.is_none() {
        bail!("--interface {name}: no such interface in this network namespace");
    }
    Ok(name)
}

/// Every piece of the recipe for `args`, in the order they are set up.
fn inspect(args: &Args, interface: &str) -> Result<Vec<Finding>> {
    let mut out = Vec::new();
    let on_lo = decap::interface_addresses("lo")?;
    for vip in &args.vips {
        let prefix = format!("{vip}/{}", host_len(vip));
        let mut add: Vec<String> = ["addr", "add", &prefix, "dev", "lo"].map(String::from).to_vec();
        if vip.is_ipv6() {
            add.insert(0, "-6".into());
            add.push("nodad".into());
        }
        out.push(Finding {
            what: format!("{prefix} on lo"),
            missing: (!on_lo.contains(vip)).then(|| ("not on lo".to_owned(), Fix::Ip(add))),
        });
    }
    let v4 = args.vips.iter().any(IpAddr::is_ipv4);
    let v6 = args.vips.iter().any(IpAddr::is_ipv6);
    if v4 {
        // The kernel uses the larger of `all` and the interface's value for these three.
        let effective = |key: &str, dev: &str| -> Result<(u32, u32)> {
            Ok((sysctl(&conf_name("all", key))?, sysctl(&conf_name(dev, key))?))
        };
        for (key, least, why) in [
            ("arp_ignore", 1, "no ARP replies for the VIP on the segment"),
            ("arp_announce", 2, "the VIP is never an ARP source"),
        ] {
            let (all, dev) = effective(key, interface)?;
            let value = all.max(dev);
            out.push(Finding {
                what: format!("{key} >= {least} ({why})"),
                missing: (value < least).then(|| {
                    (
                        format!("{key} is {value} (all {all}, {interface} {dev})"),
                        Fix::Sysctls(vec![(conf_name("all", key), least)]),
                    )
                }),
            });
        }
        let mut devices = vec![interface.to_owned()];
        if args.forwarding == Forwarding::Ipip && link(TUNL_V4)?.is_some() {
            devices.push(TUNL_V4.into());
        }
        for dev in devices {
            let (all, own) = effective("rp_filter", &dev)?;
            // 1 is strict; 0 (off) and 2 (loose) accept a client's packet from anywhere routable.
            let mut set = Vec::new();
            if all == 1 {
                set.push((conf_name("all", "rp_filter"), 0));
            }
            if own == 1 {
                set.push((conf_name(&dev, "rp_filter"), 0));
            }
            out.push(Finding {
                what: format!("rp_filter not strict on {dev} (clients' packets arrive off their route back)"),
                missing: (!set.is_empty())
                    .then(|| (format!("rp_filter is strict (all {all}, {dev} {own})"), Fix::Sysctls(set))),
            });
        }
    }
    if args.forwarding == Forwarding::Ipip {
        let xdp = link(interface)?.is_some_and(|l| has_lb_decap(&l));
        let kernel = |name: &str| -> Result<bool> { Ok(link(name)?.is_some_and(|l| is_up(&l))) };
        let need_v4 = v4 && !xdp && !kernel(TUNL_V4)?;
        let need_v6 = v6 && !xdp && !kernel(TUNL_V6)?;
        let kinds = match (v4, v6) {
            (true, true) => "IPIP and IP6IP6",
            (true, false) => "IPIP",
            _ => "IP6IP6",
        };
        out.push(Finding {
            what: format!("{kinds} decapsulation ({TUNL_V4}/{TUNL_V6} up, or {DECAP_PROGRAM} on {interface})"),
            missing: (need_v4 || need_v6).then(|| {
                (
                    format!("no decapsulation: no {DECAP_PROGRAM} on {interface} and no kernel tunnel device up"),
                    Fix::Decap { v4: need_v4, v6: need_v6, interface: interface.to_owned() },
                )
            }),
        });
    }
    Ok(out)
}

/// The findings as lines: `ok`/`MISSING`, and the fix under each missing one.
fn report(findings: &[Finding]) -> String {
    let mut s = String::new();
    for f in findings {
        match &f.missing {
            None => writeln!(s, "ok       {}", f.what),
            Some((found, fix)) => writeln!(s, "MISSING  {}: {found}\n         fix: {}", f.what, fix.command()),
        }
        .expect("writing to a String");
    }
    s
}

pub fn check(args: &Args) -> Result<()> {
    let interface = interface(args)?;
    let findings = inspect(args, &interface)?;
    print!("{}", report(&findings));
    let missing = findings.iter().filter(|f| f.missing.is_some()).count();
    if missing > 0 {
        bail!(
            "this host is not ready as an lb backend: {missing} missing (MISSING above, each with its fix); \
             `lb backend-host setup` with the same arguments puts them in place"
        );
    }
    println!("ready: this host serves {} as an lb backend ({})", vips_text(&args.vips), args.forwarding);
    Ok(())
}

fn vips_text(vips: &[IpAddr]) -> String {
    vips.iter().map(IpAddr::to_string).collect::<Vec<_>>().join(", ")
}

/// Brings up the kernel's fallback tunnel device `dev` (loading `module` if needed); false if
/// this kernel has no such module.
fn kernel_tunnel(module: &str, dev: &str) -> Result<bool> {
    if link(dev)?.is_none() {
        // modprobe may be absent or the module not built; either way lb_decap takes over.
        let loaded = Command::new("modprobe").arg(module).output().is_ok_and(|o| o.status.success());
        if !loaded || link(dev)?.is_none() {
            return Ok(false);
        }
    }
    ip(&["link", "set", dev, "up"])?;
    Ok(true)
}

fn apply(fix: &Fix, pin_dir: &std::path::Path) -> Result<String> {
    match fix {
        Fix::Ip(args) => {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            ip(&args)?;
        }
        Fix::Sysctls(set) => {
            for (k, v) in set {
                set_sysctl(k, *v)?;
            }
        }
        Fix::Decap { v4, v6, interface } => {
            let kernel_v4 = !v4 || kernel_tunnel("ipip", TUNL_V4)?;
            let kernel_v6 = !v6 || kernel_tunnel("ip6_tunnel", TUNL_V6)?;
            if kernel_v4 && kernel_v6 {
                return Ok("decapsulation by the kernel's tunnel devices".into());
            }
            // lb_decap takes both families, for the interface's own addresses.
            decap::attach(&DecapArgs { interface: interface.clone(), addresses: Vec::new(), pin_dir: pin_dir.into() })
                .context("no kernel tunnel module: attaching lb_decap")?;
            return Ok(format!("lb decap attach --interface {interface}"));
        }
    }
    Ok(fix.command())
}

pub fn setup(args: &Args) -> Result<()> {
    let interface = interface(args)?;
    // A kernel tunnel device brought up in the first pass has its own rp_filter, which the
    // second finds.
    for _pass in 0..2 {
        for f in inspect(args, &interface)? {
            if let Some((_, fix)) = &f.missing {
                let done = apply(fix, &args.pin_dir).with_context(|| format!("setting up {}", f.what))?;
                println!("done     {}: {done}", f.what);
            }
        }
    }
    check(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixes_read_as_commands() {
        assert_eq!(
            Fix::Ip(["-6", "addr", "add", "2001:db8::100/128", "dev", "lo", "nodad"].map(String::from).to_vec())
                .command(),
            "ip -6 addr add 2001:db8::100/128 dev lo nodad"
        );
        assert_eq!(
            Fix::Sysctls(vec![("net.ipv4.conf.all.rp_filter".into(), 0), ("net.ipv4.conf.eth0.rp_filter".into(), 0)])
                .command(),
            "sysctl -w net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0"
        );
        let decap = Fix::Decap { v4: true, v6: false, interface: "eth0".into() }.command();
        assert_eq!(
            decap,
            "modprobe ipip && ip link set tunl0 up; without the module: lb decap attach --interface eth0"
        );
    }

    #[test]
    fn sysctl_names_follow_sysctl8() {
        assert_eq!(conf_name("eth0.100", "rp_filter"), "net.ipv4.conf.eth0/100.rp_filter");
        assert_eq!(sysctl_path(&conf_name("eth0.100", "rp_filter")), "/proc/sys/net/ipv4/conf/eth0.100/rp_filter");
        assert_eq!(sysctl_path("net.ipv4.conf.all.arp_ignore"), "/proc/sys/net/ipv4/conf/all/arp_ignore");
    }

    #[test]
    fn xdp_program_is_found_in_both_ip_forms() {
        let single: serde_json::Value = serde_json::json!({"xdp": {"mode": 2, "prog": {"id": 7, "name": "lb_decap"}}});
        let multi = serde_json::json!({"xdp": {"attached": [{"mode": 1, "prog": {"name": "lb_decap"}}]}});
        let other = serde_json::json!({"xdp": {"mode": 1, "prog": {"name": "lb"}}});
        assert!(has_lb_decap(&single) && has_lb_decap(&multi));
        assert!(!has_lb_decap(&other) && !has_lb_decap(&serde_json::json!({})));
    }
}
