//! The programs of the object: attaching them to interfaces (directly or through a pinned
//! bpf_link, each interface registered in `LOCAL_MACS` first), and running them once with
//! `BPF_PROG_TEST_RUN` (the clock probe, tests).

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use aya::programs::links::{FdLink, PinnedLink};
use aya::programs::xdp::XdpLink;
use aya::programs::{TestRun, TestRunOptions, Xdp, XdpMode};
use aya::Ebpf;
use lb_common::maps::{local_mac_slot, LocalMac, LOCAL_MAC_SLOTS};

use super::sys::{interface_mac, link_fd_by_id, load_program, xdp_link_ifindex};
use super::Dataplane;

/// The programs of the balancer's object. (The backend-side decapsulator is an object of its
/// own, loaded by `lb decap` with `verify`, `attach` and `attach_pinned` from here.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Program {
    /// The balancer.
    Lb,
    /// The balancer with packet tracing (`lb trace`): attached in place of `Lb` only while a
    /// trace runs.
    LbTraced,
    /// Writes the data-plane clock for [`Dataplane::now_ns`]; never attached.
    ClockProbe,
}

impl Program {
    pub(super) fn name(self) -> &'static str {
        match self {
            Program::Lb => "lb",
            Program::LbTraced => "lb_traced",
            Program::ClockProbe => "clock_probe",
        }
    }
}

/// Result of one `BPF_PROG_TEST_RUN`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestOutput {
    /// XDP action (`XDP_DROP` = 1, `XDP_PASS` = 2, `XDP_TX` = 3, `XDP_REDIRECT` = 4).
    pub action: u32,
    /// The packet as the program left it.
    pub data: Vec<u8>,
}

// XDP actions, for tests and tools that run programs (feature `test-helpers`).
#[cfg(feature = "test-helpers")]
pub const XDP_ABORTED: u32 = 0;

#[cfg(feature = "test-helpers")]
pub const XDP_DROP: u32 = 1;

#[cfg(feature = "test-helpers")]
pub const XDP_PASS: u32 = 2;

#[cfg(feature = "test-helpers")]
pub const XDP_TX: u32 = 3;

#[cfg(feature = "test-helpers")]
pub const XDP_REDIRECT: u32 = 4;

impl Dataplane {
    /// Registers `ifindex` as an interface `lb` balances on, with its MAC: `lb` balances only
    /// frames sent to the ingress device's registered MAC (others pass, counted as
    /// `pass_not_our_mac`). Refuses a second interface in the same `LOCAL_MACS` slot.
    pub fn set_local_mac(&mut self, ifindex: u32, mac: [u8; 6]) -> Result<()> {
        let slot = local_mac_slot(ifindex);
        let old = self.local_macs.get(&slot, 0).context("reading LOCAL_MACS")?;
        if old.ifindex != 0 && old.ifindex != ifindex {
            bail!(
                "interfaces {} and {ifindex} share slot {slot} of LOCAL_MACS (ifindexes equal modulo {})",
                old.ifindex,
                LOCAL_MAC_SLOTS
            );
        }
        self.local_macs.set(slot, LocalMac { ifindex, mac, _pad: [0; 2] }, 0).context("writing LOCAL_MACS")
    }

    /// Registers `ifname` (its index and current MAC, see [`Dataplane::set_local_mac`]).
    pub fn register_interface(&mut self, ifname: &str) -> Result<()> {
        let (ifindex, mac) = interface_mac(ifname)?;
        self.set_local_mac(ifindex, mac)
    }

    /// Follows a change of `ifname`'s MAC (`ip link set IF address`, a bond or VRRP taking over):
    /// if the interface registered at its index holds another MAC than the interface has now,
    /// the entry is rewritten, so frames sent to the new MAC are balanced instead of passing as
    /// `pass_not_our_mac`. Returns the (old, new) MAC when it changed. An interface not
    /// registered at its index (not attached yet, or recreated) is left to the attach path.
    pub fn follow_mac(&mut self, ifname: &str) -> Result<Option<([u8; 6], [u8; 6])>> {
        let (ifindex, mac) = interface_mac(ifname)?;
        let old = self.local_macs.get(&local_mac_slot(ifindex), 0).context("reading LOCAL_MACS")?;
        if old.ifindex != ifindex || old.mac == mac {
            return Ok(None);
        }
        self.set_local_mac(ifindex, mac)?;
        Ok(Some((old.mac, mac)))
    }

    /// Attaches a program to an interface, native (driver) mode first, else generic.
    /// Returns the mode used. The attachment lives as long as this `Dataplane`. The interface
    /// is registered first (`set_local_mac`), so the first packet already finds its MAC.
    pub fn attach(&mut self, ifname: &str, p: Program) -> Result<XdpMode> {
        self.register_interface(ifname)?;
        attach(&mut self.ebpf, p.name(), ifname)
    }

    /// Attaches a program to an interface through a bpf_link pinned at `link_pin`, so that it
    /// stays attached when this process exits. If a link is already pinned there (a previous
    /// daemon), its program is replaced atomically: no packet sees the interface without XDP.
    /// While a trace runs ([`Dataplane::set_tracing`]), `Program::Lb` means its traced build.
    pub fn attach_pinned(&mut self, ifname: &str, p: Program, link_pin: &Path) -> Result<Attached> {
        let p = if p == Program::Lb && self.tracing { Program::LbTraced } else { p };
        self.register_interface(ifname)?;
        let (how, link) = attach_pinned(&mut self.ebpf, p.name(), ifname, link_pin)?;
        self.links.insert(ifname.to_owned(), link);
        Ok(how)
    }

    /// Whether the link [`Dataplane::attach_pinned`] made on `ifname` is attached: false if
    /// there is none, or it was severed (its interface was removed).
    pub fn link_attached(&self, ifname: &str) -> bool {
        self.links.get(ifname).is_some_and(|fd| xdp_link_ifindex(fd.as_fd()).is_ok_and(|i| i != 0))
    }

    /// The data-plane clock now (ns; jiffies times the tick length, the kernel's jiffies epoch),
    /// read by running `clock_probe`, so it is exactly the clock the balancer stamps entries
    /// and compares drain deadlines with.
    pub fn now_ns(&self) -> Result<u64> {
        run_test(&self.ebpf, Program::ClockProbe.name(), &[0u8; 64], 0).context("running clock_probe")?;
        self.clock_probe.get(&0, 0).context("reading CLOCK_PROBE")
    }

    /// Runs a program once on `packet` with `BPF_PROG_TEST_RUN` (feature `test-helpers`).
    /// `ingress_ifindex` 0 means the loopback device of the calling thread's network namespace.
    #[cfg(feature = "test-helpers")]
    pub fn run_test(&self, p: Program, packet: &[u8], ingress_ifindex: u32) -> Result<TestOutput> {
        run_test(&self.ebpf, p.name(), packet, ingress_ifindex)
    }
}

/// Verifies (loads into the kernel) the XDP program `name` of `ebpf`.
pub(crate) fn verify(ebpf: &mut Ebpf, name: &str) -> Result<()> {
    load_program(xdp_mut(ebpf, name)?).with_context(|| format!("verifying program {name}"))
}

fn xdp_mut<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut Xdp> {
    Ok(ebpf.program_mut(name).ok_or_else(|| anyhow!("program {name} missing"))?.try_into()?)
}

/// Attaches the program `name` of `ebpf` to an interface, native (driver) mode first, else
/// generic. Returns the mode used. The attachment lives as long as `ebpf`.
pub(crate) fn attach(ebpf: &mut Ebpf, name: &str, ifname: &str) -> Result<XdpMode> {
    let prog = xdp_mut(ebpf, name)?;
    match prog.attach(ifname, XdpMode::Driver) {
        Ok(_) => Ok(XdpMode::Driver),
        Err(native) => {
            prog.attach(ifname, XdpMode::Skb)
                .with_context(|| format!("attaching {name} to {ifname} (native mode failed: {native})"))?;
            Ok(XdpMode::Skb)
        }
    }
}

/// How [`attach_pinned`] attached a program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attached {
    /// A new link in this mode (`Driver`: native XDP; `Skb`: generic, slower).
    New(XdpMode),
    /// The program was swapped into the link pinned there (kept attached across a restart).
    Replaced,
    /// The link pinned there was severed (its interface had been removed): a new link in this
    /// mode took its place.
    Renewed(XdpMode),
}

impl Attached {
    /// The mode of a new link; None when the program went into an existing one.
    pub fn mode(self) -> Option<XdpMode> {
        match self {
            Attached::New(m) | Attached::Renewed(m) => Some(m),
            Attached::Replaced => None,
        }
    }
}

impl std::fmt::Display for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mode = |m: &XdpMode| {
            if *m == XdpMode::Skb {
                "generic (skb) mode, which is slower: the driver refused native XDP"
            } else {
                "native XDP"
            }
        };
        match self {
            Attached::New(m) => write!(f, "attached ({})", mode(m)),
            Attached::Replaced => {
                write!(f, "replaced the program in its pinned link (kept attached across the restart)")
            }
            Attached::Renewed(m) => {
                write!(f, "the pinned link was severed (its interface had been removed); attached anew ({})", mode(m))
            }
        }
    }
}

/// Attaches the program `name` of `ebpf` to an interface through a bpf_link pinned at
/// `link_pin`, so that it stays attached when this process exits. If a link is already pinned
/// there, its program is replaced atomically: no packet sees the interface without XDP; if
/// that link was severed (its interface was removed since), a new one replaces its pin.
/// Returns how, and a descriptor of the link that keeps it alive while held, also if its pin
/// is removed.
pub(crate) fn attach_pinned(ebpf: &mut Ebpf, name: &str, ifname: &str, link_pin: &Path) -> Result<(Attached, OwnedFd)> {
    let prog = xdp_mut(ebpf, name)?;
    let mut severed = false;
    if link_pin.exists() {
        let pinned =
            FdLink::from(PinnedLink::from_pin(link_pin).with_context(|| format!("opening {}", link_pin.display()))?);
        let held = held_fd(&pinned)?;
        if xdp_link_ifindex(held.as_fd())
            .with_context(|| format!("reading the link pinned at {}", link_pin.display()))?
            != 0
        {
            let link = XdpLink::try_from(pinned).context("pinned link is not an XDP link")?;
            let id = prog.attach_to_link(link).with_context(|| format!("replacing the program on {ifname}"))?;
            // The pin and `held` keep the link (and so the attachment); aya's fd to it can go.
            drop(prog.take_link(id)?);
            return Ok((Attached::Replaced, held));
        }
        // Severed: bpf_link_update would fail with ENOLINK. The pin goes; the link itself
        // goes with its last descriptor.
        std::fs::remove_file(link_pin)
            .with_context(|| format!("removing the severed link pinned at {}", link_pin.display()))?;
        severed = true;
    }
    let (id, mode) = match prog.attach(ifname, XdpMode::Driver) {
        Ok(id) => (id, XdpMode::Driver),
        Err(native) => {
            let id = prog
                .attach(ifname, XdpMode::Skb)
                .with_context(|| format!("attaching {name} to {ifname} (native mode failed: {native})"))?;
            (id, XdpMode::Skb)
        }
    };
    let link =
        FdLink::try_from(prog.take_link(id)?).context("the kernel gave no bpf_link for XDP (needs Linux 5.9+)")?;
    let held = held_fd(&link)?;
    link.pin(link_pin).with_context(|| format!("pinning the XDP link at {}", link_pin.display()))?;
    Ok((if severed { Attached::Renewed(mode) } else { Attached::New(mode) }, held))
}

/// A descriptor of `link` of our own (aya does not lend its descriptor out).
fn held_fd(link: &FdLink) -> Result<OwnedFd> {
    let id = link.info().context("reading a bpf_link's id")?.id();
    link_fd_by_id(id).with_context(|| format!("opening bpf_link {id}"))
}

/// Runs the program `name` of `ebpf` once on `packet` with `BPF_PROG_TEST_RUN`.
/// `ingress_ifindex` 0 means the loopback device of the calling thread's network namespace.
pub(crate) fn run_test(ebpf: &Ebpf, name: &str, packet: &[u8], ingress_ifindex: u32) -> Result<TestOutput> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex.
    let mut ctx = [0u8; 24];
    ctx[4..8].copy_from_slice(&(packet.len() as u32).to_ne_bytes());
    ctx[12..16].copy_from_slice(&ingress_ifindex.to_ne_bytes());
    // Room for the headers an encapsulation adds.
    let mut out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ctx_in: if ingress_ifindex != 0 { Some(&ctx) } else { None },
        repeat: 1,
        ..Default::default()
    };
    let prog: &Xdp = ebpf.program(name).ok_or_else(|| anyhow!("program {name} missing"))?.try_into()?;
    let r = prog.test_run(opts).context("BPF_PROG_TEST_RUN")?;
    out.truncate(r.data_size_out as usize);
    Ok(TestOutput { action: r.return_value, data: out })
}
