//! Data-plane fixtures: sizes, service keys and backends built from addresses.

use std::net::IpAddr;

use lb_common::maps::{backend_flags, Backend, ServiceKey, PROTO_ANY};
use lb_user::dataplane::{addr_words, Dataplane, DataplaneSizes};

/// Small prime M keeps table writes fast in tests.
pub const TEST_M: u32 = 257;

pub fn sizes() -> DataplaneSizes {
    DataplaneSizes {
        table_size_m: TEST_M,
        conntrack_entries: 65536,
        max_services: 8,
        classes_per_service: 4,
        max_backends: 64,
        table_slots: 40,
    }
}

/// Table changes take effect at once for every flow without an entry (no handshake window,
/// `Dataplane::set_handshake_window`): the tests of the window set one themselves.
pub fn load() -> Dataplane {
    let mut dp = Dataplane::load(sizes()).expect("loading the data plane (tests must run as root)");
    dp.set_handshake_window(0);
    register_interfaces(dp)
}

/// Registers the interfaces test frames arrive on (`Dataplane::set_local_mac`), as the daemon
/// does on attach: `lo` (`BPF_PROG_TEST_RUN` without an ingress device; its frames are sent to
/// `fixture_net::LB_MAC`) and, where the calling thread's namespace has them, `lbv0` and
/// `lbv2` of `fixture_net` with their own MACs.
pub fn register_interfaces(mut dp: Dataplane) -> Dataplane {
    const LOOPBACK_IFINDEX: u32 = 1;
    dp.set_local_mac(LOOPBACK_IFINDEX, crate::fixture_net::LB_MAC).expect("registering lo");
    for name in ["lbv0", "lbv2"] {
        if interface_exists(name) {
            dp.register_interface(name).unwrap_or_else(|e| panic!("registering {name}: {e:#}"));
        }
    }
    dp
}

fn interface_exists(name: &str) -> bool {
    let c = std::ffi::CString::new(name).expect("interface name");
    // SAFETY: a NUL-terminated name, only read.
    unsafe { libc::if_nametoindex(c.as_ptr()) != 0 }
}

pub fn service_key(vip: IpAddr, port: u16, proto: u8) -> ServiceKey {
    let (addr, family) = addr_words(vip);
    ServiceKey { addr, port: port.to_be(), proto, family }
}

pub fn l3_default_key(vip: IpAddr) -> ServiceKey {
    service_key(vip, 0, PROTO_ANY)
}

pub fn backend(addr: IpAddr, mac: [u8; 6], zone_class: u16) -> Backend {
    let (a, family) = addr_words(addr);
    Backend {
        addr: a,
        family,
        flags: backend_flags::HEALTHY,
        zone_class,
        mac,
        generation: 0,
        _pad: [0; 4],
        drain_deadline_ns: 0,
    }
}

/// A table that sends every flow to `id`.
pub fn uniform(id: u32) -> Vec<u32> {
    vec![id; TEST_M as usize]
}

/// MAC derived from a backend id, for L2 DSR fixtures.
pub fn backend_mac(id: u32) -> [u8; 6] {
    [0x02, 0xbe, 0, 0, (id >> 8) as u8, id as u8]
}

/// A service with the given policy bits; persistence flags from the spec's table
/// (DEFAULT_FOR_PROTOCOL unless the caller changes `flags`).
pub fn service_info(id: u32, affinity: u8, tracking: u8, forwarding: u8) -> lb_common::maps::ServiceInfo {
    let flags =
        lb_common::decide::persistence_flags(lb_common::maps::persistence::DEFAULT_FOR_PROTOCOL, tracking, affinity)
            .expect("valid persistence configuration");
    lb_common::maps::ServiceInfo {
        id,
        affinity,
        tracking,
        forwarding,
        flags,
        idle_timeout_ns: 600_000_000_000,
        pool_gen: 0,
        encap_src_hash_mask: 0,
        encap_src: [0; 4],
        forward_params: Default::default(),
    }
}

/// The kernel's flow hash for a packet, predicted with lb-common's functions.
pub fn predicted_hash(
    affinity: u8,
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    proto: u8,
    ports_valid: bool,
) -> u32 {
    let full = lb_common::maps::FlowTuple {
        src: addr_words(src).0,
        dst: addr_words(dst).0,
        sport: if ports_valid { sport.to_be() } else { 0 },
        dport: if ports_valid { dport.to_be() } else { 0 },
        proto,
        _pad: [0; 3],
    };
    lb_common::hash::flow_hash(&lb_common::decide::hash_tuple(affinity, &full, ports_valid))
}

/// A bpffs directory for one test's pinned maps (`/sys/fs/bpf/lb-test-NAME-PID`), removed with
/// everything in it when dropped: also when the test fails halfway.
pub struct PinDir(std::path::PathBuf);

impl PinDir {
    pub fn new(name: &str) -> Self {
        let dir = std::path::PathBuf::from(format!("/sys/fs/bpf/lb-test-{name}-{}", std::process::id()));
        // Mounts bpffs at /sys/fs/bpf first if nothing is mounted there, as `lb` does.
        lb_user::dataplane::pinning::ensure_pin_dir(&dir)
            .expect("a pin directory on bpffs at /sys/fs/bpf (tests must run as root)");
        PinDir(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for PinDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
