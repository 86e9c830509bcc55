//! Issue #30 item 5: the real daemon checking 1,000 backends every second, and what that costs
//! it. Shared by the CI test (`tests/e2e_health_load.rs`, short, asserts bounds) and the
//! measurement (`health_load`, `cargo xtask bench --health-load`, BENCHMARKS.md's figures).
//!
//! One backend host holds the 1,000 addresses on its eth0 (routed to it by the balancer: one
//! neighbour, not a thousand), decapsulates (`lb_decap`), and runs one [`Server`] on 0.0.0.0:80
//! that answers every connection with `HTTP/1.1 200 OK` and counts what it accepted (the probes
//! that reached it). The daemon serves four services of 250 backends (the per-service limit),
//! each checked on port 80 every second (timeout 1 s, thresholds 1 / 2), by TCP or HTTP, through
//! the data path (`path = "VIP"`, the default) or directly.
//!
//! Once every backend is healthy, [`sample`] reads /proc once a second for the daemon's CPU time,
//! descriptors and resident memory, without asking the daemon anything (a status request would
//! be work of its own); verdict changes meanwhile are counted from its audit log afterwards.

use crate::e2e::{wait_for, Daemon, DecapGuard};
use crate::netns::Netns;
use crate::topology::{Topology, TopologySpec, LB4, VIP4};
use anyhow::{bail, Context, Result};
use lb_user::daemon::reply::Health;
use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const BACKENDS: u32 = 1000;
/// Services of at most 250 backends each (the per-service limit): ports 80 to 83, all checked
/// on port 80.
pub const SERVICES: u32 = 4;
/// The port every backend is checked on (the server's).
pub const PORT: u16 = 80;

/// The i-th backend address: 198.18.200.0 onwards (a /22), on no segment: routed.
pub fn address(i: u32) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 200, 0)) + i)
}

/// The health check's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The connection is accepted (then closed).
    Tcp,
    /// `GET /` answers 200.
    Http,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Check::Tcp => "TCP",
            Check::Http => "HTTP",
        }
    }
}

/// The daemon's configuration: [`SERVICES`] services totalling [`BACKENDS`] backends, checked
/// with `check` every second along `path` (`VIP` or `DIRECT`).
pub fn config(check: Check, path: &str) -> String {
    let mut s = format!("[dataplane]\nencap_source_v4 = \"{LB4}\"\n\n");
    let per = BACKENDS / SERVICES;
    for k in 0..SERVICES {
        s += &format!(
            "[[service]]\nname = \"load{k}\"\nvip = \"{VIP4}\"\nprotocol = \"TCP\"\nports = [{}]\n\
             [service.health_check]\nprotocol = \"{}\"\nport = {PORT}\npath = \"{path}\"\ncheck_interval_sec = 1\n\
             timeout_sec = 1\nhealthy_threshold = 1\nunhealthy_threshold = 2\n\n",
            80 + k,
            check.name()
        );
        for i in k * per..(k + 1) * per {
            s += &format!("[[service.backend]]\naddress = \"{}\"\n", address(i));
        }
    }
    s
}

/// The namespaces: a balancer and one backend host holding the [`BACKENDS`] addresses, with
/// `lb_decap` on its eth0; removed on drop (also when a test panics).
pub struct Bed {
    _decap: DecapGuard,
    pub topo: Topology,
    pub prefix: String,
}

impl Bed {
    /// `prefix`: at most 4 characters, names the namespaces and pin directories.
    pub fn build(prefix: &str) -> Result<Self> {
        let topo = Topology::build(&TopologySpec { prefix: prefix.into(), zones: vec![(1, 1)], outside_clients: 0 })
            .context("topology (needs root)")?;
        // The 1,000 addresses on the backend's eth0 (one batch), routed to it by the balancer.
        let backend = &topo.backends[0];
        let batch = std::env::temp_dir().join(format!("lb-test-{prefix}-addrs"));
        let lines: String = (0..BACKENDS).map(|i| format!("addr add {}/32 dev eth0\n", address(i))).collect();
        std::fs::write(&batch, lines)?;
        let added = backend.ns.ip(&["-batch", batch.to_str().unwrap()]);
        let _ = std::fs::remove_file(&batch);
        added?;
        let range = format!("{}/22", address(0));
        topo.lb.ns.ip(&["route", "add", &range, "via", &backend.v4.to_string()])?;
        // lb_decap for the probes through the data path (the interface's addresses and VIPs).
        let decap = DecapGuard::attach(&topo, &PathBuf::from(format!("/sys/fs/bpf/lb-test-{prefix}-decap")))?;
        Ok(Self { _decap: decap, topo, prefix: prefix.into() })
    }

    /// The backend host's namespace.
    pub fn backend_ns(&self) -> &Netns {
        &self.topo.backends[0].ns
    }
}

/// What the server answers to anything (an HTTP probe's request; nothing, for a TCP probe).
const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";

/// A server on 0.0.0.0:[`PORT`] in a namespace: each accepted connection on a thread of its
/// own, which reads the request (up to its blank line, or EOF), answers [`ANSWER`] and closes.
/// Stopped (listener closed, connections refused) by [`Server::stop`] or on drop.
pub struct Server {
    stop: Arc<AtomicBool>,
    accepted: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<Result<()>>>>,
}

impl Server {
    pub fn start(ns: &Netns) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let accepted = Arc::new(AtomicU64::new(0));
        let (ready, bound) = mpsc::channel();
        let (st, acc) = (stop.clone(), accepted.clone());
        let thread = ns.spawn_thread(move || -> Result<()> {
            let listener = match bind(PORT) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready.send(Err(format!("{e:#}")));
                    return Err(e);
                }
            };
            let _ = ready.send(Ok(()));
            while !st.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((s, _)) => {
                        acc.fetch_add(1, Ordering::Relaxed);
                        std::thread::spawn(move || answer(s));
                    }
                    // Nothing waiting (non-blocking, to see `stop`), or out of descriptors.
                    Err(_) => std::thread::sleep(Duration::from_millis(1)),
                }
            }
            Ok(())
        });
        let mut server = Self { stop, accepted, thread: Some(thread) };
        match bound.recv_timeout(Duration::from_secs(20)) {
            Ok(Ok(())) => Ok(server),
            Ok(Err(e)) => bail!("server: {e}"),
            Err(_) => {
                server.stop();
                bail!("server: not listening after 20 s")
            }
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Close the listener (new connections are refused) and wait for its thread.
    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Listen on 0.0.0.0:`port`, non-blocking (retries briefly: the namespace may be settling).
fn bind(port: u16) -> Result<TcpListener> {
    let mut last = None;
    for _ in 0..50 {
        match TcpListener::bind((Ipv4Addr::UNSPECIFIED, port)) {
            Ok(l) => {
                l.set_nonblocking(true)?;
                return Ok(l);
            }
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last.unwrap()).with_context(|| format!("binding 0.0.0.0:{port}"))
}

fn answer(mut s: TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = [0u8; 4096];
    let mut n = 0;
    loop {
        match s.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                if n == buf.len() || buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
    if n > 0 {
        let _ = s.write_all(ANSWER);
    }
}

/// User + system CPU seconds of process `pid` so far (/proc/PID/stat).
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The fields after the command name (which may hold spaces and parentheses): state is
    // field 3, utime 14, stime 15.
    let rest = stat.get(stat.rfind(')').context("/proc/PID/stat")? + 2..).context("/proc/PID/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
    // SAFETY: sysconf has no preconditions.
    Ok(ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64)
}

/// (healthy, not healthy) backends over the `load*` services, from one `lb status`.
pub fn verdicts(d: &Daemon) -> Option<(usize, usize)> {
    let st = d.status().ok()?;
    let backends = st.services.iter().filter(|s| s.name.starts_with("load")).flat_map(|s| s.backends.iter());
    let (mut healthy, mut not) = (0, 0);
    for b in backends {
        if b.health == Health::Healthy {
            healthy += 1;
        } else {
            not += 1;
        }
    }
    Some((healthy, not))
}

/// Waits (up to `timeout`) until `lb status` shows `healthy` of the [`BACKENDS`] healthy.
pub fn wait_healthy(d: &Daemon, healthy: usize, timeout: Duration) -> Result<()> {
    let what = format!("{healthy} of the {BACKENDS} backends healthy");
    let mut last = None;
    wait_for(&what, timeout, || {
        last = verdicts(d);
        last.filter(|(h, _)| *h == healthy)
    })
    .with_context(|| format!("last seen (healthy, not): {last:?}\n{}", d.diagnostics()))
    .map(|_| ())
}

/// TCP sockets in TIME_WAIT in namespace `ns` (/proc/net/sockstat there).
pub fn time_wait(ns: &Netns) -> Result<u64> {
    let sockstat = ns.run(|| std::fs::read_to_string("/proc/thread-self/net/sockstat"))??;
    let tcp = sockstat.lines().find_map(|l| l.strip_prefix("TCP:")).context("no TCP line in sockstat")?;
    let mut words = tcp.split_whitespace();
    while let Some(w) = words.next() {
        if w == "tw" {
            return Ok(words.next().context("sockstat: tw")?.parse()?);
        }
    }
    bail!("no tw in sockstat: {tcp}")
}

/// Verdict changes the daemon has logged so far (its audit line per change).
pub fn verdict_changes(d: &Daemon) -> usize {
    d.log().matches(" is now healthy").count() + d.log().matches(" is now unhealthy").count()
}

/// Starts the daemon with [`config`] and waits until all [`BACKENDS`] are healthy (the server
/// must be running): the daemon and the seconds that took.
pub fn start(bed: &Bed, check: Check, path: &str) -> Result<(Daemon, f64)> {
    let started = Instant::now();
    let d = Daemon::start(&bed.topo, &bed.prefix, &config(check, path))?;
    wait_healthy(&d, BACKENDS as usize, Duration::from_secs(180))?;
    Ok((d, started.elapsed().as_secs_f64()))
}

/// One run's figures.
#[derive(Clone, Debug)]
pub struct Figures {
    pub check: Check,
    pub path: String,
    /// Seconds from the daemon's start until `lb status` showed every backend healthy.
    pub settled: f64,
    /// Length of the sampling, seconds.
    pub secs: f64,
    /// The daemon's user + system CPU time over the sampling, % of one core.
    pub cpu_pct: f64,
    /// The most descriptors the daemon held at a sample (/proc/PID/fd).
    pub max_fds: usize,
    /// The most resident memory at a sample (VmRSS), KiB.
    pub max_rss_kib: u64,
    /// The most TCP sockets in TIME_WAIT in the balancer's namespace at a sample (each holds a
    /// port: the probes through the data path all leave from one source address).
    pub max_time_wait: u64,
    /// Connections the server accepted per second over the sampling (the probes that reached it).
    pub probes_per_sec: f64,
    /// Verdict changes the daemon logged during the sampling (0: every backend stayed healthy).
    pub changes: usize,
}

impl Figures {
    /// The daemon's CPU time per probe, microseconds.
    pub fn cpu_us_per_probe(&self) -> f64 {
        self.cpu_pct / 100.0 / self.probes_per_sec * 1e6
    }
}

/// Samples the daemon's usage once a second for `secs` seconds (all backends healthy, the
/// server running). `each` sees every sample (RSS KiB, descriptors, TIME_WAIT sockets).
#[allow(clippy::too_many_arguments)]
pub fn sample(
    bed: &Bed,
    d: &Daemon,
    server: &Server,
    check: Check,
    path: &str,
    settled: f64,
    secs: u64,
    mut each: impl FnMut(u64, usize, u64),
) -> Result<Figures> {
    let pid = d.pid().context("daemon not running")?;
    let changes0 = verdict_changes(d);
    let (cpu0, accepted0, t0) = (cpu_seconds(pid)?, server.accepted(), Instant::now());
    let (mut max_rss_kib, mut max_fds, mut max_time_wait) = (0u64, 0usize, 0u64);
    for k in 1..=secs {
        // On the second (not after it): the sampling's own cost does not stretch it.
        if let Some(wait) = (t0 + Duration::from_secs(k)).checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let (rss, fds) = d.usage()?;
        let tw = time_wait(&bed.topo.lb.ns)?;
        each(rss, fds, tw);
        (max_rss_kib, max_fds, max_time_wait) = (max_rss_kib.max(rss), max_fds.max(fds), max_time_wait.max(tw));
    }
    let (cpu, accepted, wall) = (cpu_seconds(pid)?, server.accepted(), t0.elapsed().as_secs_f64());
    Ok(Figures {
        check,
        path: path.into(),
        settled,
        secs: wall,
        cpu_pct: (cpu - cpu0) / wall * 100.0,
        max_fds,
        max_rss_kib,
        max_time_wait,
        probes_per_sec: (accepted - accepted0) as f64 / wall,
        changes: verdict_changes(d) - changes0,
    })
}

/// The figures as a table (Markdown, as BENCHMARKS.md shows them).
pub fn table(rows: &[Figures]) -> String {
    let mut s = String::from(
        "| check | path | all healthy after | probes/s | daemon CPU, % of one core | CPU per probe | descriptors, max | VmRSS, max | TIME_WAIT, max | verdict changes |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | `{}` | {:.1} s | {:.0} | {:.1} | {:.0} µs | {} | {:.0} MiB | {} | {} |\n",
            r.check.name(),
            r.path,
            r.settled,
            r.probes_per_sec,
            r.cpu_pct,
            r.cpu_us_per_probe(),
            r.max_fds,
            r.max_rss_kib as f64 / 1024.0,
            r.max_time_wait,
            r.changes
        );
    }
    s
}
