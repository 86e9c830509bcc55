//! `lb decap attach|detach`: the `lb_decap` XDP program on a backend host, which strips the
//! outer IPIP/IP6IP6 header of packets addressed to the host and passes the inner packet up
//! (for kernels without the `ipip`/`ip6_tunnel` modules). The attachment is pinned in bpffs,
//! so it outlives this command; the pin name includes the network namespace, because hosts in
//! different namespaces often share interface names.

use crate::dataplane::{self, Dataplane, DataplaneSizes, Program};
use crate::dataplane::pinning;
use anyhow::{bail, Context, Result};
use std::net::IpAddr;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

#[derive(clap::Args, Clone, Debug)]
pub struct DecapArgs {
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
    let addresses = if args.addresses.is_empty() { interface_addresses(&args.interface)? } else { args.addresses.clone() };
    if addresses.is_empty() {
        bail!("interface {} has no addresses; give --address", args.interface);
    }
    // Only DECAP_ADDRS matters to lb_decap: the balancer's maps get minimal sizes.
    let sizes = DataplaneSizes { table_size_m: 2, conntrack_entries: 1, max_services: 1, classes_per_service: 1, max_backends: 1, table_slots: 1 };
    let mut dp = Dataplane::load(sizes)?;
    for a in &addresses {
        dp.add_decap_address(*a)?;
    }
    let pin = link_pin(args)?;
    // A re-attach replaces the program (and so its address set) atomically.
    let mode = dp.attach_pinned(&args.interface, Program::Decap, &pin)?;
    let shown: Vec<String> = addresses.iter().map(|a| a.to_string()).collect();
    println!("lb_decap on {} ({mode:?}) for {}", args.interface, shown.join(", "));
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
