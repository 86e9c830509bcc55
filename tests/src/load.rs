//! Load for the reliability tests: a fleet of long-lived TCP connections from one client
//! namespace, each sending a line every interval and checking the echo of `lb-testsrv` (which
//! names its backend), driven by a tokio runtime on a thread inside the namespace; a timeline
//! of the events a test causes, to which each broken connection is attributed; and whether the
//! long (soak) versions run.

use crate::topology::Host;
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// `LB_SOAK=1` (set by `cargo xtask soak`): the long versions of the reliability tests.
pub fn soak() -> bool {
    std::env::var("LB_SOAK").is_ok_and(|v| v == "1")
}

/// CI's count, or the soak's under `cargo xtask soak`.
pub fn scale(ci: usize, soak_count: usize) -> usize {
    if soak() {
        soak_count
    } else {
        ci
    }
}

/// A connection that stopped working: an error, EOF or reset, no echo within the timeout, or
/// an echo from another backend than the one that greeted it.
#[derive(Clone, Debug)]
pub struct Break {
    pub conn: usize,
    /// The backend that greeted the connection.
    pub backend: String,
    /// When the failed exchange was sent (what the break is attributed by).
    pub at: Instant,
    pub reason: String,
}

#[derive(Default)]
struct Shared {
    breaks: Mutex<Vec<Break>>,
    stop: AtomicBool,
    exchanges: AtomicU64,
}

/// `conns` connections from `client` to `target`, each exchanging a line every `interval`.
pub struct Fleet {
    shared: Arc<Shared>,
    /// The greeting backend of each connection.
    pub backends: Vec<String>,
    thread: Option<std::thread::JoinHandle<Result<Result<()>>>>,
}

impl Fleet {
    /// Opens every connection (a few at a time, each with its greeting) and returns once all
    /// are open; they then run until [`Fleet::stop`]. `timeout` bounds each exchange.
    pub fn start(
        client: &Host,
        target: SocketAddr,
        conns: usize,
        interval: Duration,
        timeout: Duration,
    ) -> Result<Self> {
        let shared = Arc::new(Shared::default());
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Vec<String>>>();
        let sh = shared.clone();
        let thread = client.ns.spawn_thread(move || -> Result<()> {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(async move {
                let opened = match open_all(target, conns, timeout).await {
                    Ok(o) => o,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return Ok(());
                    }
                };
                let names: Vec<String> = opened.iter().map(|(_, n)| n.clone()).collect();
                let _ = ready_tx.send(Ok(names));
                let tasks: Vec<_> = opened
                    .into_iter()
                    .enumerate()
                    .map(|(i, (stream, name))| {
                        // Spread the connections over the interval.
                        let first = tokio::time::Instant::now() + interval.mul_f64(i as f64 / conns as f64);
                        tokio::spawn(converse(i, stream, name, first, interval, timeout, sh.clone()))
                    })
                    .collect();
                for t in tasks {
                    t.await?;
                }
                Ok(())
            })
        });
        let backends = ready_rx
            .recv_timeout(Duration::from_secs(300))
            .context("the fleet did not open its connections within 300 s")?
            .with_context(|| format!("opening {conns} connections from {}", client.name))?;
        Ok(Self { shared, backends, thread: Some(thread) })
    }

    /// Exchanges that succeeded so far.
    pub fn exchanges(&self) -> u64 {
        self.shared.exchanges.load(Ordering::Relaxed)
    }

    /// Connections broken so far.
    pub fn breaks(&self) -> Vec<Break> {
        self.shared.breaks.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Ends every connection after its exchange in flight (which may still fail and count)
    /// and returns all breaks.
    pub fn stop(&mut self) -> Result<Vec<Break>> {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().map_err(|_| anyhow::anyhow!("the fleet's thread panicked"))???;
        }
        Ok(self.breaks())
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

async fn open_all(target: SocketAddr, conns: usize, timeout: Duration) -> Result<Vec<(TcpStream, String)>> {
    // 32 at a time: the backends' accept backlogs are 128.
    let gate = Arc::new(tokio::sync::Semaphore::new(32));
    let opens: Vec<_> = (0..conns)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move {
                let _permit = gate.acquire_owned().await?;
                let mut last = None;
                for _ in 0..3 {
                    match tokio::time::timeout(timeout, open(target)).await {
                        Ok(Ok(opened)) => return Ok(opened),
                        Ok(Err(e)) => last = Some(e),
                        Err(_) => last = Some(anyhow::anyhow!("no greeting within {timeout:?}")),
                    }
                }
                Err(last.unwrap_or_else(|| anyhow::anyhow!("connecting")))
            })
        })
        .collect();
    let mut out = Vec::with_capacity(conns);
    for o in opens {
        out.push(o.await??);
    }
    Ok(out)
}

async fn open(target: SocketAddr) -> Result<(TcpStream, String)> {
    let mut stream = BufReader::new(TcpStream::connect(target).await?);
    let mut greeting = String::new();
    if stream.read_line(&mut greeting).await? == 0 {
        bail!("closed before the greeting");
    }
    Ok((stream.into_inner(), greeting.trim().to_owned()))
}

async fn converse(
    i: usize,
    stream: TcpStream,
    name: String,
    first: tokio::time::Instant,
    interval: Duration,
    timeout: Duration,
    shared: Arc<Shared>,
) {
    let (read, mut write) = stream.into_split();
    let mut read = BufReader::new(read);
    let mut tick = tokio::time::interval_at(first, interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut line = String::new();
    for n in 0u64.. {
        tick.tick().await;
        if shared.stop.load(Ordering::Relaxed) {
            return;
        }
        let at = Instant::now();
        let msg = format!("{i}.{n}");
        line.clear();
        let exchange = async {
            write.write_all(format!("{msg}\n").as_bytes()).await?;
            read.read_line(&mut line).await
        };
        let reason = match tokio::time::timeout(timeout, exchange).await {
            Err(_) => Some(format!("no echo within {timeout:?}")),
            Ok(Err(e)) => Some(e.to_string()),
            Ok(Ok(0)) => Some("closed (EOF)".to_owned()),
            Ok(Ok(_)) => match line.trim().split_once(' ') {
                Some((who, echoed)) if who == name && echoed == msg => None,
                Some((who, _)) if who != name => Some(format!("answered by {who}")),
                _ => Some(format!("bad echo {:?}", line.trim())),
            },
        };
        match reason {
            None => {
                shared.exchanges.fetch_add(1, Ordering::Relaxed);
            }
            Some(reason) => {
                let b = Break { conn: i, backend: name, at, reason };
                shared.breaks.lock().unwrap_or_else(|e| e.into_inner()).push(b);
                return;
            }
        }
    }
}

/// The events a test causes, in order; a break belongs to the last event begun before its
/// failed exchange was sent ("steady" before the first).
#[derive(Default)]
pub struct Timeline {
    events: Vec<(String, Instant)>,
}

/// Broken connections of one event: on backends the test left alone ("kept": healthy and
/// configured throughout) and on the others ("touched").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    pub event: String,
    pub kept: usize,
    pub touched: usize,
}

impl Timeline {
    /// An event begins now.
    pub fn mark(&mut self, event: impl Into<String>) {
        self.events.push((event.into(), Instant::now()));
    }

    /// Breaks per event, in order; `kept(backend)` says whether the test left that backend
    /// alone.
    pub fn rows(&self, breaks: &[Break], kept: &dyn Fn(&str) -> bool) -> Vec<Row> {
        let mut rows: Vec<Row> = std::iter::once("steady".to_owned())
            .chain(self.events.iter().map(|(e, _)| e.clone()))
            .map(|event| Row { event, kept: 0, touched: 0 })
            .collect();
        for b in breaks {
            let idx = self.events.iter().rposition(|(_, t)| *t <= b.at).map_or(0, |i| i + 1);
            if kept(&b.backend) {
                rows[idx].kept += 1;
            } else {
                rows[idx].touched += 1;
            }
        }
        rows
    }

    /// The rows as a table for the test output.
    pub fn table(rows: &[Row]) -> String {
        let width = rows.iter().map(|r| r.event.len()).max().unwrap_or(5).max(5);
        let mut s = format!("{:<width$}  {:>12}  {:>15}\n", "event", "broken(kept)", "broken(touched)");
        for r in rows {
            s += &format!("{:<width$}  {:>12}  {:>15}\n", r.event, r.kept, r.touched);
        }
        let (k, t) = rows.iter().fold((0, 0), |(k, t), r| (k + r.kept, t + r.touched));
        s += &format!("{:<width$}  {:>12}  {:>15}\n", "total", k, t);
        s
    }
}

/// A process's resident set size (KiB) and open descriptors, from /proc.
pub fn usage(pid: u32) -> Result<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .ok_or_else(|| anyhow::anyhow!("no VmRSS for {pid}"))?
        .parse()?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((rss, fds))
}
