//! `lb decap attach|detach`: the `lb_decap` XDP program on a backend host, which strips the
//! outer IPIP/IP6IP6 header of packets addressed to the host and passes the inner packet up
//! (for kernels without the `ipip`/`ip6_tunnel` modules). The attachment is pinned in bpffs,
//! so it outlives this command; the pin name includes the network namespace, because hosts in
//! different namespaces often share interface names.
//!
//! `lb_decap` is an object of its own (lb-ebpf's `lb-decap`), with only its own maps
//! (`DECAP_ADDRS`, `STATS`) at their built-in sizes: nothing of the balancer is loaded.

use crate::dataplane::pinning;
use crate::dataplane::{self, addr_key, addr_words, global_counters, take, Stats};
use anyhow::{bail, Context, Result};
use aya::maps::{HashMap, MapData, PerCpuArray};
use aya::programs::XdpMode;
use aya::Ebpf;
use lb_common::maps::{AddrKey, GlobalStats};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The decapsulator's XDP object (built by `build.rs`): `lb_decap`, nothing else.
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(env!("LB_EBPF_DECAP_OBJ"));

/// The program's name in [`EBPF_OBJECT`].
const PROGRAM: &str = "lb_decap";

/// A loaded `lb_decap` and its maps.
pub struct Decapsulator {
    ebpf: Ebpf,
    addrs: HashMap<MapData, AddrKey, u32>,
    stats: PerCpuArray<MapData, GlobalStats>,
}

impl Decapsulator {
    /// Loads and verifies the decapsulator's object. Needs CAP_BPF/CAP_NET_ADMIN (root).
    pub fn load() -> Result<Self> {
        let mut ebpf = Ebpf::load(EBPF_OBJECT)
            .context("loading the decapsulator's XDP object (root, or CAP_BPF + CAP_NET_ADMIN, is required)")?;
        dataplane::verify(&mut ebpf, PROGRAM)?;
        Ok(Self { addrs: take(&mut ebpf, "DECAP_ADDRS")?, stats: take(&mut ebpf, "STATS")?, ebpf })
    }

    /// Adds an address this host decapsulates for.
    pub fn add_decap_address(&mut self, addr: IpAddr) -> Result<()> {
        let (words, family) = addr_words(addr);
        self.addrs.insert(addr_key(words, family), 1, 0).context("writing DECAP_ADDRS")?;
        Ok(())
    }

    /// Attaches `lb_decap` to an interface, native (driver) mode first, else generic; for as
    /// long as this `Decapsulator` lives.
    pub fn attach(&mut self, ifname: &str) -> Result<XdpMode> {
        dataplane::attach(&mut self.ebpf, PROGRAM, ifname)
    }

    /// Attaches `lb_decap` through a bpf_link pinned at `link_pin` (see
    /// [`dataplane::Dataplane::attach_pinned`]): it stays attached when this process exits.
    pub fn attach_pinned(&mut self, ifname: &str, link_pin: &Path) -> Result<dataplane::Attached> {
        dataplane::attach_pinned(&mut self.ebpf, PROGRAM, ifname, link_pin).map(|(how, _held)| how)
    }

    /// Runs `lb_decap` once on `packet` with `BPF_PROG_TEST_RUN` (feature `test-helpers`).
    #[cfg(feature = "test-helpers")]
    pub fn run_test(&self, packet: &[u8], ingress_ifindex: u32) -> Result<dataplane::TestOutput> {
        dataplane::run_test(&self.ebpf, PROGRAM, packet, ingress_ifindex)
    }

    /// The counters (only `stat::DECAP` and `stat::DECAP_DROP_MALFORMED` count here), summed
    /// over CPUs; no class counters.
    pub fn stats(&self) -> Result<Stats> {
        Ok(Stats { global: global_counters(&self.stats)?, classes: Vec::new() })
    }
}

#[derive(clap::Args, Clone, Debug)]
pub struct DecapArgs {
    /// The interface to attach lb_decap to (or detach it from).
    #[arg(long)]
    pub interface: String,
    /// Tunnel endpoint addresses to decapsulate for (default: the interface's addresses).
    #[arg(long = "address")]
    pub addresses: Vec<IpAddr>,
    /// bpffs directory for the pinned link.
    #[arg(long, default_value = "/sys/fs/bpf/lb-decap")]
    pub pin_dir: PathBuf,
}

fn link_pin(args: &DecapArgs) -> Result<PathBuf> {
    let netns = std::fs::metadata("/proc/self/ns/net").context("reading /proc/self/ns/net")?.ino();
    Ok(args.pin_dir.join(format!("netns{netns}_{}", args.interface)))
}

/// Addresses configured on `ifname` (IPv4 and IPv6).
pub fn interface_addresses(ifname: &str) -> Result<Vec<IpAddr>> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free with freeifaddrs.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            bail!("getifaddrs: {}", std::io::Error::last_os_error());
        }
        let mut cur = head;
        while !cur.is_null() {
            let ifa = &*cur;
            let name = std::ffi::CStr::from_ptr(ifa.ifa_name).to_string_lossy();
            if name == ifname && !ifa.ifa_addr.is_null() {
                match (*ifa.ifa_addr).sa_family as i32 {
                    libc::AF_INET => {
                        let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                        out.push(IpAddr::from(u32::from_be(sa.sin_addr.s_addr).to_be_bytes()));
                    }
                    libc::AF_INET6 => {
                        let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                        out.push(IpAddr::from(sa.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = ifa.ifa_next;
        }
        libc::freeifaddrs(head);
    }
    Ok(out)
}

pub fn attach(args: &DecapArgs) -> Result<()> {
    pinning::ensure_pin_dir(&args.pin_dir)?;
    // The attachment outlives this command only through its pin.
    pinning::require_shared_bpffs(&args.pin_dir, "lb decap attach")?;
    let addresses =
        if args.addresses.is_empty() { interface_addresses(&args.interface)? } else { args.addresses.clone() };
    if addresses.is_empty() {
        bail!("interface {} has no addresses; give --address", args.interface);
    }
    let mut decap = Decapsulator::load()?;
    for a in &addresses {
        decap.add_decap_address(*a)?;
    }
    let pin = link_pin(args)?;
    // A re-attach replaces the program (and so its address set) atomically.
    let how = decap.attach_pinned(&args.interface, &pin)?;
    let shown: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
    println!("lb_decap on {}: {how}; for {}", args.interface, shown.join(", "));
    Ok(())
}

pub fn detach(args: &DecapArgs) -> Result<()> {
    if !args.addresses.is_empty() {
        bail!("--address applies to `lb decap attach` only: detach removes the program from the interface, whatever it decapsulated for");
    }
    if dataplane::detach_pinned(&link_pin(args)?)? {
        println!("lb_decap detached from {}", args.interface);
        Ok(())
    } else {
        bail!("lb_decap is not attached to {} by lb (no pin in {})", args.interface, args.pin_dir.display())
    }
}
