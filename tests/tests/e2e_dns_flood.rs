//! End to end: a DNS-over-TCP connection flood (1,500 connections from one source, against a
//! daemon with 1,024 descriptors) neither starves the health probes (no verdict changes, no
//! table rewrites) nor stops the DNS front answering, over UDP and TCP.
use lb_tests::dns;
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

const DNS: &str = "127.0.0.1:5300";

/// A query for `web.test.` A (the front answers REFUSED: any answer will do).
fn query() -> Vec<u8> {
    dns::query(0x1234, &["web", "test"], None)
}

fn ask_udp(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
    dns::ask_udp(addr, &query(), 1)
}

/// A TCP connection to `to` (IPv4) from `from` (another source than the flood's).
fn connect_from(from: std::net::Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let SocketAddr::V4(to) = to else { unreachable!("IPv4 only") };
    let sockaddr = |ip: std::net::Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr { s_addr: u32::from(ip).to_be() },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream at once; valid sockaddr_in structs.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let s = TcpStream::from_raw_fd(fd);
        let (local, remote) = (sockaddr(from, 0), sockaddr(*to.ip(), to.port()));
        if libc::bind(fd, &local as *const _ as *const libc::sockaddr, len) != 0
            || libc::connect(fd, &remote as *const _ as *const libc::sockaddr, len) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
        Ok(s)
    }
}

fn ask_tcp(addr: SocketAddr) -> std::io::Result<Vec<u8>> {
    dns::ask_on(connect_from("127.0.0.2".parse().unwrap(), addr)?, &query())
}

#[test]
fn tcp_flood_leaves_health_and_the_dns_front_alone() {
    let topo = Topology::build(&TopologySpec { prefix: "dfl".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    // Backends decapsulate: health probes reach them through the data path (IPIP).
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-dfl-decap")).unwrap();
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    // Health checks every second, unhealthy after 2 failures (`service_toml`).
    let cfg = format!("[dns]\nlisten = \"{DNS}\"\n")
        + &zones_toml(1)
        + &service_toml(&topo, "web", false, "", "", 80, &|_| false);
    let d = Daemon::start_with_nofile(&topo, "dfl", &cfg, 1024).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let addr: SocketAddr = DNS.parse().unwrap();
    let log_before = d.log();
    let updates_before = log_before.matches("tables updated").count();

    let (flood, udp_ok, tcp_ok) = topo
        .lb
        .ns
        .run(move || {
            let started = Instant::now();
            let mut held = Vec::new();
            for _ in 0..1500 {
                if let Ok(s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
                    held.push(s);
                }
            }
            assert!(started.elapsed() < Duration::from_secs(30), "the flood took {:?}", started.elapsed());
            // Three health-check intervals under the flood.
            std::thread::sleep(Duration::from_secs(4));
            let udp = ask_udp(addr).map(|m| m[..2] == [0x12, 0x34]).unwrap_or(false);
            let tcp = ask_tcp(addr).map(|m| m[..2] == [0x12, 0x34]).unwrap_or(false);
            (held.len(), udp, tcp)
        })
        .unwrap_or_else(|e| fail(e));
    assert!(flood > 0, "no flood connection was made");
    assert!(udp_ok, "the DNS front answers over UDP under the flood\n{}", d.diagnostics());
    assert!(tcp_ok, "the DNS front answers another source over TCP under the flood\n{}", d.diagnostics());
    for b in &topo.backends {
        assert!(
            d.is_healthy("web", &b.v4.to_string()).unwrap_or_else(|e| fail(e)),
            "{} stays healthy\n{}",
            b.name,
            d.diagnostics()
        );
    }
    let log = d.log();
    assert!(
        !log.contains("Too many open files") && !log.contains("is now unhealthy"),
        "no probe failed for want of descriptors:\n{log}"
    );
    assert_eq!(log.matches("tables updated").count(), updates_before, "no table rewrites:\n{log}");
}
