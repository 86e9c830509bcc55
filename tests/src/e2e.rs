//! End-to-end harness: the real `lb` daemon on a [`Topology`], backends running `lb-testsrv`
//! (and `lb_decap` for IPIP), clients making real TCP/UDP connections to the VIP.
//!
//! Everything `lb` runs with `nsenter --net`, so its pins land in the host's bpffs under
//! per-test directories, which the guards remove (also when a test fails).

use crate::netns::{sh, ChildGuard, Netns};
use crate::topology::{Host, Topology, VIP4, VIP6};
use anyhow::{bail, Context, Result};
use lb_user::daemon::reply::{BackendStatus, Health, Status};
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A binary of this workspace (`lb`, `lb-testsrv`), next to the test executable's deps dir.
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(|d| if d.ends_with("deps") { d.parent() } else { Some(d) }).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} not built (run the tests through `cargo xtask test` or `cargo test --workspace`)",
        path.display()
    );
    path
}

/// Start the name-answering server on a backend: TCP and UDP on the VIPs and its own
/// addresses (own addresses answer health checks).
pub fn start_server(b: &Host, port: u16) -> Result<ChildGuard> {
    let srv = bin("lb-testsrv");
    b.ns.spawn(&[
        srv.to_str().unwrap(),
        &b.name,
        &format!("{VIP4}:{port}"),
        &format!("[{VIP6}]:{port}"),
        &format!("{}:{port}", b.v4),
        &format!("[{}]:{port}", b.v6),
    ])
}

/// Run `lb ARGS` inside a namespace (nsenter: host mounts, so pins outlive the command).
pub fn lb_in(ns: &Netns, args: &[&str]) -> Result<String> {
    sh(ns.nsenter().arg(bin("lb")).args(args))
}

/// `lb_decap` on every backend, pinned under `pin_dir` (removed by [`DecapGuard`]).
pub struct DecapGuard {
    pin_dir: PathBuf,
}

impl DecapGuard {
    pub fn attach(topo: &Topology, pin_dir: &Path) -> Result<Self> {
        // Leftovers of a crashed run would point at interfaces that no longer exist.
        let _ = std::fs::remove_dir_all(pin_dir);
        let guard = Self { pin_dir: pin_dir.to_owned() };
        for b in &topo.backends {
            lb_in(&b.ns, &["decap", "attach", "--interface", "eth0", "--pin-dir", pin_dir.to_str().unwrap()])
                .with_context(|| format!("attaching lb_decap on {}", b.name))?;
        }
        Ok(guard)
    }
}

impl Drop for DecapGuard {
    fn drop(&mut self) {
        // Removing the pins detaches (the links' interfaces may already be gone).
        let _ = std::fs::remove_dir_all(&self.pin_dir);
    }
}

/// The `lb` daemon running in the balancer namespace.
pub struct Daemon {
    child: Option<std::process::Child>,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub pin_dir: PathBuf,
    ns_name: String,
    keep: bool,
    /// RLIMIT_NOFILE (soft and hard) to start the daemon with; None = inherited.
    nofile: Option<u64>,
    /// The `--interface`s of the next (re)start: `eth0` unless a test changes them.
    pub interfaces: Vec<String>,
}

impl Daemon {
    /// Write `config` and start `lb run` on the balancer's eth0; waits until the control
    /// socket answers.
    pub fn start(topo: &Topology, prefix: &str, config: &str) -> Result<Self> {
        Self::start_opts(topo, prefix, config, false)
    }

    /// Like [`Daemon::start`] with `--keep-dataplane`, for restart tests.
    pub fn start_keeping(topo: &Topology, prefix: &str, config: &str) -> Result<Self> {
        Self::start_opts(topo, prefix, config, true)
    }

    /// Like [`Daemon::start`], with RLIMIT_NOFILE set to `nofile` (soft and hard).
    pub fn start_with_nofile(topo: &Topology, prefix: &str, config: &str, nofile: u64) -> Result<Self> {
        Self::start_in_opts(&topo.lb.ns, prefix, config, false, Some(nofile))
    }

    /// Like [`Daemon::start`], on the `eth0` of the balancer namespace `ns`.
    pub fn start_in(ns: &Netns, prefix: &str, config: &str) -> Result<Self> {
        Self::start_in_opts(ns, prefix, config, false, None)
    }

    fn start_opts(topo: &Topology, prefix: &str, config: &str, keep: bool) -> Result<Self> {
        Self::start_in_opts(&topo.lb.ns, prefix, config, keep, None)
    }

    fn start_in_opts(ns: &Netns, prefix: &str, config: &str, keep: bool, nofile: Option<u64>) -> Result<Self> {
        let dir = PathBuf::from(format!("/run/lb-test-{prefix}"));
        let pin_dir = PathBuf::from(format!("/sys/fs/bpf/lb-test-{prefix}"));
        // Leftovers of a crashed run: a fresh start must not adopt them.
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&pin_dir);
        std::fs::create_dir_all(&dir)?;
        let cfg = dir.join("lb.toml");
        std::fs::write(&cfg, config)?;
        let mut d = Self {
            child: None,
            socket: dir.join("lb.sock"),
            config: cfg,
            pin_dir,
            dir,
            ns_name: ns.name().to_owned(),
            keep: false,
            nofile,
            interfaces: vec!["eth0".to_owned()],
        };
        d.spawn(keep)?;
        Ok(d)
    }

    fn spawn(&mut self, keep: bool) -> Result<()> {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("lb.log"))?;
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--net=/run/netns/{}", self.ns_name))
            .arg(bin("lb"))
            .arg("run")
            .args(self.interfaces.iter().flat_map(|i| ["--interface", i.as_str()]))
            .arg("--config")
            .arg(&self.config)
            .arg("--socket")
            .arg(&self.socket)
            .arg("--pin-dir")
            .arg(&self.pin_dir)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        if keep {
            cmd.arg("--keep-dataplane");
        }
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt;
            let lim = libc::rlimit { rlim_cur: n as libc::rlim_t, rlim_max: n as libc::rlim_t };
            // SAFETY: setrlimit is async-signal-safe; it runs in the child before exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        self.keep = keep;
        self.child = Some(cmd.spawn().context("starting lb run")?);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if self.cli(&["status", "--json"]).is_ok() {
                return self.wait_first_verdicts();
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    bail!("lb run exited ({status}); log:\n{}", self.log());
                }
            }
            if Instant::now() > deadline {
                bail!("lb run did not answer on {} within 60 s; log:\n{}", self.socket.display(), self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until no backend is `unchecked` (each has its first health-check verdict), so
    /// that a test starts from the tables its backends' health gives.
    pub fn wait_first_verdicts(&self) -> Result<()> {
        wait_for("every backend's first health-check verdict", Duration::from_secs(60), || {
            let st = self.status().ok()?;
            st.services.iter().all(|s| s.backends.iter().all(|b| b.health != Health::Unchecked)).then_some(())
        })
        .with_context(|| format!("lb status:\n{}\nlog:\n{}", self.cli(&["status"]).unwrap_or_default(), self.log()))
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The daemon's resident set size in KiB (`VmRSS`).
    pub fn rss_kib(&self) -> Result<u64> {
        Ok(self.usage()?.0)
    }

    /// The daemon's resident set size in KiB and its open descriptors.
    pub fn usage(&self) -> Result<(u64, usize)> {
        crate::load::usage(self.pid().ok_or_else(|| anyhow::anyhow!("daemon not running"))?)
    }

    /// Sends `bytes` to the control socket (then half-closes) and returns the reply line as
    /// JSON: a request without starting the CLI, or a malformed one.
    pub fn raw(&self, bytes: &[u8]) -> Result<serde_json::Value> {
        let mut s = std::os::unix::net::UnixStream::connect(&self.socket)?;
        s.set_read_timeout(Some(Duration::from_secs(20)))?;
        // The daemon answers (and closes) once it has seen too much: a failed write is expected.
        let _ = s.write_all(bytes);
        let _ = s.shutdown(std::net::Shutdown::Write);
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        serde_json::from_str(&line).with_context(|| format!("reply {line:?}"))
    }

    /// The state of eth0 in `lb status` ("attached", "detached: ...").
    pub fn link_state(&self) -> Option<String> {
        let st = self.status().ok()?;
        st.links.into_iter().find(|l| l.interface == "eth0").map(|l| l.state)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("lb.log")).unwrap_or_default()
    }

    /// `lb ARGS --socket S` (the CLI talks to the daemon over the Unix socket).
    pub fn cli(&self, args: &[&str]) -> Result<String> {
        sh(Command::new(bin("lb")).args(args).arg("--socket").arg(&self.socket))
    }

    /// Runs `lb ARGS --socket` expecting a failure: its exit code and stderr.
    pub fn cli_failure(&self, args: &[&str]) -> Result<(Option<i32>, String)> {
        let out = Command::new(bin("lb")).args(args).arg("--socket").arg(&self.socket).output()?;
        anyhow::ensure!(!out.status.success(), "lb {args:?} succeeded");
        Ok((out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned()))
    }

    pub fn status(&self) -> Result<Status> {
        Ok(serde_json::from_str(&self.cli(&["status", "--json"])?)?)
    }

    /// Stop with SIGTERM and wait (the daemon detaches unless started to keep the data plane).
    pub fn stop(&mut self) -> Result<()> {
        if let Some(mut c) = self.child.take() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if c.try_wait()?.is_some() {
                    break;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    bail!("lb run ignored SIGTERM for 30 s");
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        Ok(())
    }

    /// Kill with SIGKILL (a crash: nothing of the daemon's clean-up runs) and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Whether the daemon has exited (on its own: a host drain ends in a stop).
    pub fn exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(|c| matches!(c.try_wait(), Ok(Some(_))))
    }

    /// Stop and start again. A daemon started with [`Daemon::start_keeping`] leaves the data
    /// plane running in between, and the new one adopts it.
    pub fn restart(&mut self) -> Result<()> {
        self.stop()?;
        self.spawn(self.keep)
    }

    pub fn rewrite_config(&self, config: &str) -> Result<()> {
        std::fs::write(&self.config, config)?;
        Ok(())
    }

    /// Send SIGHUP (reload the config file) to the running daemon. `nsenter` execs `lb`, so the
    /// child's pid is the daemon's.
    pub fn sighup(&self) -> Result<()> {
        let c = self.child.as_ref().ok_or_else(|| anyhow::anyhow!("daemon not running"))?;
        // SAFETY: signalling our own child.
        if unsafe { libc::kill(c.id() as i32, libc::SIGHUP) } != 0 {
            bail!("kill(SIGHUP): {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// A counter of the daemon's survived failures (`faults` in `lb status --json`).
    pub fn fault(&self, name: &str) -> Result<u64> {
        let st: serde_json::Value = serde_json::from_str(&self.cli(&["status", "--json"])?)?;
        st["faults"][name].as_u64().ok_or_else(|| anyhow::anyhow!("no fault counter {name} in {st}"))
    }

    /// One backend's entry of `lb status --json` (address as configured).
    pub fn backend_status(&self, service: &str, address: &str) -> Result<BackendStatus> {
        let st = self.status()?;
        let svc = st
            .services
            .iter()
            .find(|s| s.name == service)
            .ok_or_else(|| anyhow::anyhow!("no service {service} in status: {st:?}"))?;
        svc.backends
            .iter()
            .find(|b| b.address.to_string() == address)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no backend {address} in {svc:?}"))
    }

    /// Whether `lb status` reports the backend healthy.
    pub fn is_healthy(&self, service: &str, address: &str) -> Result<bool> {
        Ok(self.backend_status(service, address)?.health == Health::Healthy)
    }

    /// `lb backend set --health H` (healthy, unhealthy, auto).
    pub fn set_health(&self, service: &str, address: &str, health: &str) -> Result<()> {
        self.cli(&["backend", "set", "--service", service, "--address", address, "--health", health]).map(|_| ())
    }

    /// The log and counters, for failure messages.
    pub fn diagnostics(&self) -> String {
        format!("--- lb.log ---\n{}\n--- lb stats ---\n{}", self.log(), self.cli(&["stats"]).unwrap_or_default())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.stop();
        // Whatever it left (keep mode, crash): unpin links and maps.
        let _ = std::fs::remove_dir_all(&self.pin_dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Poll `f` until it returns Some, or fail after `timeout` with `what`.
pub fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Open a TCP connection from `client` to `target` and return the greeting (backend name).
pub fn tcp_hello(client: &Host, target: SocketAddr) -> Result<String> {
    client.ns.run(move || -> Result<String> {
        let s = TcpStream::connect_timeout(&target, Duration::from_secs(5))
            .with_context(|| format!("connecting to {target}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line)?;
        Ok(line.trim().to_owned())
    })?
}

/// `n` TCP connections from `client` (different source ports); the backend names seen.
pub fn tcp_spread(client: &Host, target: SocketAddr, n: usize) -> Result<Vec<String>> {
    (0..n).map(|_| tcp_hello(client, target)).collect()
}

/// One UDP request/response; the answering backend's name.
pub fn udp_hello(client: &Host, target: SocketAddr) -> Result<String> {
    client.ns.run(move || -> Result<String> {
        let bind: SocketAddr = if target.is_ipv4() { "0.0.0.0:0".parse()? } else { "[::]:0".parse()? };
        let s = UdpSocket::bind(bind)?;
        s.connect(target)?;
        s.set_read_timeout(Some(Duration::from_secs(2)))?;
        let mut buf = [0u8; 256];
        for _ in 0..5 {
            s.send(b"hello")?;
            if let Ok(n) = s.recv(&mut buf) {
                return Ok(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        bail!("no UDP answer from {target}")
    })?
}

/// `n` UDP requests, each from a new socket (a new flow); the answering backends' names.
pub fn udp_spread(client: &Host, target: SocketAddr, n: usize) -> Result<Vec<String>> {
    (0..n).map(|_| udp_hello(client, target)).collect()
}

/// A long-lived TCP connection: each `ask` sends a line and returns the backend's name.
pub struct Session {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
    pub greeting: String,
}

impl Session {
    /// The client side's address (its source port tells which way ECMP sends the flow).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.writer.local_addr()?)
    }

    pub fn open(client: &Host, target: SocketAddr) -> Result<Self> {
        let s = client.ns.run(move || TcpStream::connect_timeout(&target, Duration::from_secs(5)))??;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        let writer = s.try_clone()?;
        let mut reader = BufReader::new(s);
        let mut greeting = String::new();
        reader.read_line(&mut greeting)?;
        Ok(Self { reader, writer, greeting: greeting.trim().to_owned() })
    }

    /// Send one line; the answer is `NAME line`, return NAME.
    pub fn ask(&mut self, line: &str) -> Result<String> {
        writeln!(self.writer, "{line}")?;
        let mut answer = String::new();
        self.reader.read_line(&mut answer).context("reading the answer on an established connection")?;
        let answer = answer.trim();
        let (name, echoed) =
            answer.split_once(' ').ok_or_else(|| anyhow::anyhow!("connection closed or bad answer {answer:?}"))?;
        if echoed != line {
            bail!("answer {answer:?} does not echo {line:?}");
        }
        Ok(name.to_owned())
    }
}

/// Config text for a topology: zones with their client prefixes and a `[dataplane]` with the
/// balancer's encapsulation source.
pub fn zones_toml(n: usize) -> String {
    let mut s = String::from("[dataplane]\nencap_source_v4 = \"198.18.0.1\"\nencap_source_v6 = \"2001:db8::1\"\n\n");
    for z in 1..=n {
        let (p4, p6) = crate::topology::zone_prefixes(z);
        s += &format!("[[zone]]\nname = \"zone-{z}\"\nclient_prefixes = [\"{p4}\", \"{p6}\"]\n\n");
    }
    s
}

/// `[[service.backend]]` entries for every backend of the topology.
pub fn backends_toml(topo: &Topology, v6: bool, failover: &dyn Fn(&Host) -> bool) -> String {
    let mut s = String::new();
    for b in &topo.backends {
        s += &format!(
            "[[service.backend]]\naddress = \"{}\"\nzone = \"zone-{}\"\nmac = \"{}\"\n",
            b.addr(v6),
            b.zone,
            b.mac
        );
        if failover(b) {
            s += "failover = true\n";
        }
        s += "\n";
    }
    s
}

/// A service block: `[[service]]` named `name` on the VIP (port 80), `keys` added inside it,
/// then `tables` (sub-tables such as `[service.zonal_affinity]`), a fast TCP health check on
/// `hc_port` (1 s interval, healthy after 1 success, unhealthy after 2 failures) and every
/// backend of the topology (`failover` marks failover backends).
pub fn service_toml(
    topo: &Topology,
    name: &str,
    v6: bool,
    keys: &str,
    tables: &str,
    hc_port: u16,
    failover: &dyn Fn(&Host) -> bool,
) -> String {
    service_block(name, v6, keys, tables, hc_port, &backends_toml(topo, v6, failover))
}

/// [`service_toml`] with the `[[service.backend]]` entries given as text.
pub fn service_block(name: &str, v6: bool, keys: &str, tables: &str, hc_port: u16, backends: &str) -> String {
    format!(
        "[[service]]\nname = \"{name}\"\nvip = \"{}\"\nprotocol = \"TCP\"\nports = [80]\n{keys}\n{tables}\n\
         [service.health_check]\nprotocol = \"TCP\"\nport = {hc_port}\ncheck_interval_sec = 1\ntimeout_sec = 1\nhealthy_threshold = 1\nunhealthy_threshold = 2\n\n{backends}",
        vip(v6, 80).ip(),
    )
}

/// `[[service.backend]]` entries for the topology's backends that `include` selects.
pub fn backends_toml_where(topo: &Topology, v6: bool, include: &dyn Fn(&Host) -> bool) -> String {
    backends_toml_of(topo.backends.iter().filter(|b| include(b)), v6)
}

/// `[[service.backend]]` entries (address, zone, MAC) for `hosts`.
pub fn backends_toml_of<'a>(hosts: impl Iterator<Item = &'a Host>, v6: bool) -> String {
    let mut s = String::new();
    for b in hosts {
        s += &format!(
            "[[service.backend]]\naddress = \"{}\"\nzone = \"zone-{}\"\nmac = \"{}\"\n\n",
            b.addr(v6),
            b.zone,
            b.mac
        );
    }
    s
}

/// Backend names of a spread, counted.
pub fn tally(names: &[String]) -> std::collections::BTreeMap<String, usize> {
    let mut m = std::collections::BTreeMap::new();
    for n in names {
        *m.entry(n.clone()).or_insert(0) += 1;
    }
    m
}

pub fn vip(v6: bool, port: u16) -> SocketAddr {
    SocketAddr::new(if v6 { IpAddr::V6(VIP6) } else { IpAddr::V4(VIP4) }, port)
}
