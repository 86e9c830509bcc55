//! End to end, issue 35 item 3: a flood of single-packet flows with spoofed sources (SYN and
//! ACK to a TCP service, datagrams to a UDP service on the same VIP), hundreds of times the
//! connection table's slots, run through the daemon's own program (`BPF_PROG_TEST_RUN` on the
//! program of its pinned link, in the balancer's namespace: the real maps, nothing sent),
//! while 200 TCP connections exchange a line every 100 ms. A reload adds a backend during the
//! flood (the tables change once its first health check passes, the flood still running) and
//! another reload adds one right after it. No connection may break: a flood of single packets
//! cannot evict a flow that has sent two (`lb_common::ct_table`), so no established flow is
//! re-hashed onto the changed tables. The counters account for every flood packet.
//!
//! CI floods for the few seconds the changes take; `cargo xtask soak` floods for a minute.
use lb_tests::e2e::*;
use lb_tests::load::{soak, Fleet};
use lb_tests::packet::{ethernet, tcp4, udp4, ETH_P_IP, TCP_ACK, TCP_SYN, V4};
use lb_tests::rawbpf;
use lb_tests::topology::{Host, Topology, TopologySpec, VIP4};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const HC_PORT: u16 = 81;
const CONNS: usize = 200;
/// `dataplane.conntrack_entries`: 512 slots per family (`ct_table::buckets_for`).
const ENTRIES: u32 = 256;
const SLOTS: u64 = 2 * ENTRIES as u64;
const UDP_PORT: u16 = 53;

/// Backends b1-1 .. b1-`n` in both services; the TCP service "web" on port 80, the UDP
/// service "dns" on port 53 of the same VIP.
fn config(topo: &Topology, n: usize) -> String {
    let backends = backends_toml_where(topo, false, &|b: &Host| b.name.as_str() <= format!("b1-{n}").as_str());
    let web = service_block("web", false, "", "", HC_PORT, &backends);
    let dns = service_block("dns", false, "", "", HC_PORT, &backends).replacen(
        "protocol = \"TCP\"\nports = [80]",
        &format!("protocol = \"UDP\"\nports = [{UDP_PORT}]"),
        1,
    );
    let dataplane = format!("[dataplane]\nconntrack_entries = {ENTRIES}\n");
    zones_toml(1).replacen("[dataplane]\n", &dataplane, 1) + &web + "\n" + &dns
}

/// Flood packet `i`: a SYN, an ACK or a UDP datagram (in turn) from a source address and port
/// no other packet of the flood uses (198.19.0.0/16, ports from 1024).
fn flood_frame(i: u64, lb_mac: [u8; 6]) -> Vec<u8> {
    let src = Ipv4Addr::from(0xc613_0000 | (i as u32 & 0xffff));
    let sport = 1024 + ((i >> 16) % 60_000) as u16;
    let ip = match i % 3 {
        0 => V4::new(src, VIP4, 6).build(&tcp4(src, VIP4, sport, 80, TCP_SYN, b"")),
        1 => V4::new(src, VIP4, 6).build(&tcp4(src, VIP4, sport, 80, TCP_ACK, b"x")),
        _ => V4::new(src, VIP4, 17).build(&udp4(src, VIP4, sport, UDP_PORT, b"x")),
    };
    ethernet(lb_mac, [0x02, 0xf1, 0, 0, 0, 1], ETH_P_IP, &ip)
}

/// The flood, on a thread in the balancer's namespace until `stop`.
struct Flood {
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<anyhow::Result<anyhow::Result<u64>>>>,
}

impl Flood {
    fn start(topo: &Topology, pin_dir: &std::path::Path) -> Self {
        let prog = rawbpf::prog_of_pinned_link(&pin_dir.join("link_eth0")).expect("the daemon's program");
        let lb_mac = mac(&topo.lb.mac);
        let (sent, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let (s, st) = (sent.clone(), stop.clone());
        let thread = topo.lb.ns.spawn_thread(move || -> anyhow::Result<u64> {
            let name = std::ffi::CString::new("eth0")?;
            // SAFETY: a valid NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            anyhow::ensure!(ifindex != 0, "no eth0 in the balancer's namespace");
            let mut i = 0u64;
            while !st.load(Ordering::Relaxed) {
                let action = rawbpf::run_once(&prog, &flood_frame(i, lb_mac), ifindex)?;
                // XDP_TX or XDP_REDIRECT: forwarded.
                anyhow::ensure!(action == rawbpf::XDP_TX || action == 4, "flood packet {i}: XDP action {action}");
                i += 1;
                s.store(i, Ordering::Relaxed);
            }
            Ok(i)
        });
        Self { sent, stop, thread: Some(thread) }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Stops the flood; the packets sent.
    fn stop(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        let t = self.thread.take().expect("stopped once");
        t.join().expect("the flood's thread panicked").expect("entering the namespace").expect("the flood")
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn mac(s: &str) -> [u8; 6] {
    let b: Vec<u8> = s.split(':').map(|h| u8::from_str_radix(h, 16).expect("a MAC")).collect();
    b.try_into().expect("6 bytes")
}

/// The global counters of `lb stats --json`.
fn counters(d: &Daemon) -> serde_json::Value {
    let stats: serde_json::Value = serde_json::from_str(&d.cli(&["stats", "--json"]).unwrap()).unwrap();
    stats["global"].clone()
}

#[test]
fn a_single_packet_flood_with_reloads_breaks_no_connection() {
    lb_user::daemon::limits::raise_nofile().expect("raising RLIMIT_NOFILE");
    let topo = Topology::build(&TopologySpec { prefix: "ctf".into(), zones: vec![(1, 4)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _checks: Vec<_> = topo.backends.iter().map(|b| start_server(b, HC_PORT).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-ctf-decap")).unwrap();
    let d = Daemon::start(&topo, "ctf", &config(&topo, 2)).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let addr = |name: &str| topo.backend(name).unwrap().v4.to_string();
    let healthy = |name: &str| {
        wait_for(&format!("{name} to pass its first health check"), Duration::from_secs(60), || {
            d.is_healthy("web", &addr(name)).ok().filter(|h| *h).map(|_| ())
        })
        .unwrap_or_else(|e| fail(e))
    };

    let client = topo.clients.first().unwrap();
    let mut fleet = Fleet::start(client, vip(false, 80), CONNS, Duration::from_millis(100), Duration::from_secs(10))
        .unwrap_or_else(|e| fail(e));
    println!("{CONNS} connections, per backend: {:?}", tally(&fleet.backends));
    // Every connection has exchanged lines: its entry is confirmed.
    std::thread::sleep(Duration::from_secs(1));

    let before = counters(&d);
    let mut flood = Flood::start(&topo, &d.pin_dir);
    wait_for("the flood to pass 8 times the table's slots", Duration::from_secs(120), || {
        (flood.sent() >= 8 * SLOTS).then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    // Reload during the flood: b1-3 joins, and the tables change once it passes its check.
    d.rewrite_config(&config(&topo, 3)).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e));
    healthy("b1-3");
    let until = Instant::now() + if soak() { Duration::from_secs(60) } else { Duration::from_secs(2) };
    while Instant::now() < until {
        std::thread::sleep(Duration::from_millis(200));
    }
    let flooded = flood.stop();
    let after = counters(&d);
    // Right after it: b1-4 joins.
    d.rewrite_config(&config(&topo, 4)).unwrap();
    d.cli(&["reload"]).unwrap_or_else(|e| fail(e));
    healthy("b1-4");
    std::thread::sleep(Duration::from_secs(2));

    let exchanges = fleet.exchanges();
    let breaks = fleet.stop().unwrap_or_else(|e| fail(e));
    let delta = |name: &str| after[name].as_u64().unwrap() - before[name].as_u64().unwrap();
    println!(
        "{flooded} flood packets ({:.0} x the table's {SLOTS} slots); ct_evict_unconfirmed {}, ct_full_stateless {}, \
         ct_insert_busy {}; {exchanges} echoes checked, {} connections broken",
        flooded as f64 / SLOTS as f64,
        delta("ct_evict_unconfirmed"),
        delta("ct_full_stateless"),
        delta("ct_insert_busy"),
        breaks.len()
    );
    assert!(breaks.is_empty(), "{} connections broke (first: {:?})\n{}", breaks.len(), breaks.first(), d.diagnostics());
    assert!(exchanges > 0);
    // Every flood packet missed and was forwarded (checked per packet above), and nothing else
    // missed: the connections' packets all found their entries. Every SYN and datagram is a
    // new flow; a TCP connection is counted at its SYN, so the ACKs (every third packet) are not.
    let acks = (flooded + 1) / 3;
    assert_eq!(delta("new_flow"), flooded - acks, "{after}");
    assert_eq!(delta("ct_miss"), flooded, "{after}");
    assert_eq!(delta("ct_evict_live"), 0);
    // The flood replaced its own entries (the table turned over many times) or went without one.
    let fates = delta("ct_evict_unconfirmed") + delta("ct_full_stateless") + delta("ct_insert_busy");
    assert!(fates <= flooded && delta("ct_evict_unconfirmed") > flooded / 2, "{after}");
}
