//! `lb backend-host check|setup` on a backend namespace left bare (no VIP, a distribution's
//! ARP and strict rp_filter defaults, no decapsulation): the check fails naming each missing
//! piece with its fix, setup puts them in place, the check passes, and real client TCP through
//! the balancer (IPIP and IP6IP6, or L2 DSR) reaches the backend's server.

use lb_tests::e2e::*;
use lb_tests::topology::{backend_addrs, pin_neighbours, plug, Host, PinDir, Topology, TopologySpec, VIP4, VIP6};
use std::path::PathBuf;
use std::time::Duration;

/// A backend plugged into the topology's segment with nothing of the recipe done.
fn bare_backend(topo: &Topology, prefix: &str) -> Host {
    let (v4, v6) = backend_addrs(1, 0);
    let addrs = [format!("{v4}/16"), format!("{v6}/48")];
    let (ns, mac) = plug(&topo.switch, "br0", &format!("{prefix}-b1-1"), &format!("{prefix}p9"), &addrs).unwrap();
    // A distribution's defaults, whatever this machine's are: ARP answered for any local
    // address, strict reverse-path filtering.
    for s in [
        "net.ipv4.conf.all.arp_ignore=0",
        "net.ipv4.conf.all.arp_announce=0",
        "net.ipv4.conf.all.rp_filter=1",
        "net.ipv4.conf.eth0.rp_filter=1",
    ] {
        ns.exec(&["sysctl", "-qw", s]).unwrap();
    }
    let b = Host { ns, name: "b1-1".into(), zone: 1, v4, v6, mac };
    pin_neighbours(&topo.lb.ns, std::slice::from_ref(&b)).unwrap();
    b
}

/// `lb backend-host ACTION ...` on the backend: (exit status success, stdout, stderr).
fn backend_host(b: &Host, action: &str, forwarding: &str, pins: &PinDir) -> (bool, String, String) {
    let (v4, v6) = (VIP4.to_string(), VIP6.to_string());
    let out = b
        .ns
        .nsenter()
        .arg(bin("lb"))
        .args(["backend-host", action, "--vip", &v4, "--vip", &v6, "--forwarding", forwarding, "--interface", "eth0"])
        .arg("--pin-dir")
        .arg(&pins.0)
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The recipe's pieces for both forwardings (piece, the line naming its fix); IPIP adds
/// decapsulation.
const PIECES: [(&str, &str); 5] = [
    ("198.18.0.100/32 on lo", "fix: ip addr add 198.18.0.100/32 dev lo"),
    ("2001:db8::100/128 on lo", "fix: ip -6 addr add 2001:db8::100/128 dev lo nodad"),
    ("arp_ignore >= 1", "fix: sysctl -w net.ipv4.conf.all.arp_ignore=1"),
    ("arp_announce >= 2", "fix: sysctl -w net.ipv4.conf.all.arp_announce=2"),
    ("rp_filter not strict on eth0", "fix: sysctl -w net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.eth0.rp_filter=0"),
];
const DECAP: (&str, &str) = ("IPIP and IP6IP6 decapsulation", "lb decap attach --interface eth0");

#[test]
fn a_bare_ipip_backend_fails_the_check_and_serves_after_setup() {
    bare_backend_check_setup_serve("bhs", "IPIP");
}

#[test]
fn a_bare_l2_dsr_backend_fails_the_check_and_serves_after_setup() {
    bare_backend_check_setup_serve("bhd", "L2_DSR");
}

fn bare_backend_check_setup_serve(prefix: &str, forwarding: &str) {
    let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 0)], outside_clients: 0 })
        .expect("topology (needs root)");
    let b = bare_backend(&topo, prefix);
    // Removing the pin detaches lb_decap, also when the test fails.
    let pins = PinDir(PathBuf::from(format!("/sys/fs/bpf/lb-test-{prefix}-decap")));
    let _ = std::fs::remove_dir_all(&pins.0);

    let (ok, out, err) = backend_host(&b, "check", forwarding, &pins);
    assert!(!ok, "a bare backend passed the check:\n{out}");
    let mut pieces = PIECES.to_vec();
    if forwarding == "IPIP" {
        pieces.push(DECAP);
    } else {
        assert!(!out.contains("decapsulation"), "L2_DSR needs no decapsulation:\n{out}");
    }
    for (piece, fix) in &pieces {
        let line = out.lines().position(|l| l.starts_with("MISSING") && l.contains(piece));
        let line = line.unwrap_or_else(|| panic!("the check does not name {piece:?} as missing:\n{out}"));
        let next = out.lines().nth(line + 1).unwrap_or_default();
        assert!(next.contains(fix), "{piece}: fix {next:?}, expected {fix:?}\n{out}");
    }
    assert!(err.contains(&format!("not ready as an lb backend: {} missing", pieces.len())), "{err}");

    let (ok, out, err) = backend_host(&b, "setup", forwarding, &pins);
    assert!(ok, "setup failed:\n{out}\n{err}");
    let (ok, out, err) = backend_host(&b, "check", forwarding, &pins);
    assert!(ok && !out.contains("MISSING") && out.contains("ready:"), "the check after setup:\n{out}\n{err}");

    let _server = start_server(&b, 80).unwrap();
    let backends = backends_toml_of(std::iter::once(&b), false);
    let backends6 = backends_toml_of(std::iter::once(&b), true);
    let keys = format!("forwarding = \"{forwarding}\"");
    let config = zones_toml(1)
        + &service_block("web", false, &keys, "", 80, &backends)
        + &service_block("web6", true, &keys, "", 80, &backends6);
    let d = Daemon::start(&topo, prefix, &config).unwrap();
    let client = topo.clients_in_zone(1).next().unwrap();
    for v6 in [false, true] {
        let target = vip(v6, 80);
        let answer = wait_for(&format!("a TCP answer through {target}"), Duration::from_secs(30), || {
            tcp_hello(client, target).ok()
        });
        let answer = answer.unwrap_or_else(|e| panic!("{e:#}\n{}", d.diagnostics()));
        assert_eq!(answer, "b1-1", "{target}");
    }
}
