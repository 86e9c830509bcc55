//! Reloads read the configuration file off the event loop. A read that blocks (a FIFO, a hung
//! network mount) would otherwise stop health events and the control socket with it: the file
//! is read on a thread of its own ([`crate::config::file::read`]: a regular file, bounded size)
//! and given up after [`READ_TIMEOUT`]; the loop goes on meanwhile, and takes the text (or the
//! refusal) when it comes.

use super::api::Pending;
use super::reply::ReloadCounts;
use crate::config::{Config, HostAddrs};
use crate::error::NeedsRestart;
use anyhow::Context;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// How long a read of the configuration file may take before the reload is refused.
pub const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads still blocked after their timeout (each holds a thread): with this many, a reload is
/// refused without another attempt, so a hung mount does not pile up threads.
pub const MAX_STUCK_READS: usize = 4;

/// The file's text, or why it could not be read (the message names the file).
pub type ConfigRead = Result<String, String>;

/// Who asked for a reload: SIGHUP, or a control request (`lb reload [--dry-run]`), answered
/// when its read is done.
pub enum Origin {
    Signal,
    Request(Pending),
    /// `[dns] geoip_database` changed on disk (`geoip_watch`).
    GeoIpChanged,
}

/// The reloads waiting for a read of the configuration file, and what the reloads came to.
pub struct Reloads {
    path: PathBuf,
    /// Those the read in flight serves (None: no read in flight).
    reading: Option<Vec<Origin>>,
    /// Those that came while a read was in flight: it may have read the file before the change
    /// they were asked for, so they get a read of their own after it.
    queued: Vec<Origin>,
    done: mpsc::UnboundedSender<ConfigRead>,
    /// Reading threads still running.
    running: Arc<AtomicUsize>,
    counts: ReloadCounts,
}

impl Reloads {
    /// The reloads of the file at `path`; the receiver gets each read's result.
    pub fn new(path: &Path) -> (Self, mpsc::UnboundedReceiver<ConfigRead>) {
        let (done, rx) = mpsc::unbounded_channel();
        let reloads = Self {
            path: path.to_owned(),
            reading: None,
            queued: Vec::new(),
            done,
            running: Arc::new(AtomicUsize::new(0)),
            counts: ReloadCounts::default(),
        };
        (reloads, rx)
    }

    /// A reload is asked for: it waits for a read of the file started now, or after the read
    /// in flight.
    pub fn request(&mut self, origin: Origin) {
        if self.reading.is_some() {
            self.queued.push(origin);
        } else {
            self.start(vec![origin]);
        }
    }

    fn start(&mut self, origins: Vec<Origin>) {
        self.reading = Some(origins);
        let (path, done, running) = (self.path.clone(), self.done.clone(), self.running.clone());
        tokio::spawn(async move {
            let _ = done.send(read(path, READ_TIMEOUT, running).await);
        });
    }

    /// The read in flight ended: the reloads it serves. The queued ones get the next read.
    pub fn finished(&mut self) -> Vec<Origin> {
        let served = self.reading.take().unwrap_or_default();
        if !self.queued.is_empty() {
            let next = std::mem::take(&mut self.queued);
            self.start(next);
        }
        served
    }

    /// Counts an applied or refused reload (`lb status`).
    pub fn record<T>(&mut self, result: &anyhow::Result<T>) {
        match result {
            Ok(_) => {
                self.counts.applied += 1;
                self.counts.last_refusal = None;
            }
            Err(e) => {
                self.counts.refused += 1;
                self.counts.last_refusal = Some(format!("{e:#}"));
            }
        }
    }

    pub fn counts(&self) -> &ReloadCounts {
        &self.counts
    }
}

/// The configuration in `read` (from `path`), validated for the host the daemon runs on: no VIP
/// may be an address of its network namespace (`config::HostAddrs`).
pub fn parse(path: &Path, read: &ConfigRead) -> anyhow::Result<Config> {
    let text = text(read)?;
    let host = HostAddrs::current().context("listing this host's addresses (no VIP may be one of them)")?;
    Config::parse_file_text(path, text, Some(&host))
}

/// The text of a [`ConfigRead`], or its refusal as an error.
pub fn text(read: &ConfigRead) -> anyhow::Result<&str> {
    read.as_deref().map_err(|e| anyhow::anyhow!("{e}"))
}

/// Reads the configuration file at `path` off the loop, as a reload does (at start).
pub async fn read_once(path: &Path) -> ConfigRead {
    read(path.to_owned(), READ_TIMEOUT, Arc::new(AtomicUsize::new(0))).await
}

/// Reads the configuration file at `path` on a thread of its own, giving up after `timeout`.
async fn read(path: PathBuf, timeout: Duration, running: Arc<AtomicUsize>) -> ConfigRead {
    let file = path.clone();
    off_loop(move || crate::config::file::read(&file), timeout, running)
        .await
        .map_err(|e| format!("{}: cannot read configuration: {e}", path.display()))
}

/// Runs `f` on a new thread and waits for it at most `timeout`; a thread that does not return
/// in time is left behind (a blocked system call cannot be cancelled) and counted in `running`.
async fn off_loop<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
    timeout: Duration,
    running: Arc<AtomicUsize>,
) -> io::Result<T> {
    let stuck = running.load(Ordering::SeqCst);
    if stuck >= MAX_STUCK_READS {
        return Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "{stuck} earlier reads of it have not returned (a hung file system?); not tried again until they do"
            ),
        ));
    }
    let (tx, rx) = oneshot::channel();
    running.fetch_add(1, Ordering::SeqCst);
    let count = running.clone();
    let spawned = std::thread::Builder::new().name("lb-config-read".into()).spawn(move || {
        let result = f();
        count.fetch_sub(1, Ordering::SeqCst);
        let _ = tx.send(result);
    });
    if let Err(e) = spawned {
        running.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    match tokio::time::timeout(timeout, rx).await {
        Ok(Ok(result)) => result,
        Ok(Err(_)) => Err(io::Error::other("the reading thread ended without a result")),
        Err(_) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no data within {} s (a hung file system?)", timeout.as_secs()),
        )),
    }
}

/// Whether a reloaded configuration `cfg` can replace the running one (`running`, on a data
/// plane loaded with `now`): the settings read only at start are unchanged and it fits the
/// loaded maps. Otherwise the reload is refused (the running tables stay) and the message says
/// a restart is needed.
pub fn check_reloadable(now: &crate::dataplane::DataplaneSizes, running: &Config, cfg: &Config) -> anyhow::Result<()> {
    // The DNS front's sockets are bound at start (its GeoIP database is read at every reload).
    let listen = |c: &Config| c.dns.as_ref().map(|d| d.listen);
    if listen(cfg) != listen(running) {
        let show = |d: &Option<crate::config::DnsFront>| d.as_ref().map_or("none".to_owned(), |d| d.listen.to_string());
        return Err(NeedsRestart(format!(
            "[dns] listen takes effect only on restart (running: {}, in the file: {})",
            show(&running.dns),
            show(&cfg.dns)
        ))
        .into());
    }
    if cfg.metrics != running.metrics {
        let show = |m: &Option<crate::config::Metrics>| m.as_ref().map_or("none".to_owned(), |m| m.listen.to_string());
        return Err(NeedsRestart(format!(
            "[metrics] listen takes effect only on restart (running: {}, in the file: {})",
            show(&running.metrics),
            show(&cfg.metrics)
        ))
        .into());
    }
    // The TUN device and its table are made at start.
    let where_ = |c: &Config| c.announce.as_ref().map(|a| (a.table, a.device.clone()));
    if where_(cfg) != where_(running) {
        return Err(
            NeedsRestart("[announce] (present or not, table, device) takes effect only on restart".into()).into()
        );
    }
    crate::compile::sizes::fits_in(now, cfg)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read that never returns is given up after the timeout, and after [`MAX_STUCK_READS`]
    /// such reads no further thread is started.
    #[tokio::test]
    async fn a_blocked_read_times_out_and_stuck_reads_are_bounded() {
        let running = Arc::new(AtomicUsize::new(0));
        // Held until the end of the test: the reads block on it.
        let (release, hold) = std::sync::mpsc::channel::<()>();
        let hold = Arc::new(std::sync::Mutex::new(hold));
        for _ in 0..MAX_STUCK_READS {
            let hold = hold.clone();
            let blocked = move || {
                let _ = hold.lock().unwrap().recv();
                Ok(())
            };
            let err = off_loop(blocked, Duration::from_millis(200), running.clone()).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
            assert!(err.to_string().contains("no data within"), "{err}");
        }
        let ran = Arc::new(AtomicUsize::new(0));
        let flag = ran.clone();
        let err = off_loop(
            move || {
                flag.store(1, Ordering::SeqCst);
                Ok(())
            },
            Duration::from_secs(60),
            running.clone(),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("have not returned"), "{err}");
        assert_eq!(ran.load(Ordering::SeqCst), 0, "no thread is started past the bound");
        drop(release);
        // A read that returns in time gives its result.
        let ok = off_loop(|| Ok(7), Duration::from_secs(60), Arc::new(AtomicUsize::new(0))).await.unwrap();
        assert_eq!(ok, 7);
    }

    #[test]
    fn reload_refuses_restart_only_changes() {
        let service = |ports: usize| {
            let list: Vec<String> = (1..=ports).map(|p| p.to_string()).collect();
            format!(
                "[[service]]\nname = \"web0\"\nvip = \"198.18.0.100\"\nprotocol = \"TCP\"\nports = [{}]\n[[service.backend]]\naddress = \"198.18.11.1\"\n",
                list.join(", ")
            )
        };
        let running = Config::parse(&service(1)).unwrap();
        let sizes = crate::compile::sizes::sizes_for(&running);
        assert!(check_reloadable(&sizes, &running, &Config::parse(&service(2)).unwrap()).is_ok());
        let with_dns = Config::parse(&format!("[dns]\nlisten = \"127.0.0.1:5353\"\n{}", service(1))).unwrap();
        let err = check_reloadable(&sizes, &running, &with_dns).unwrap_err();
        assert_eq!(crate::error::ErrorKind::of(&err), Some(crate::error::ErrorKind::NeedsRestart));
        let err = err.to_string();
        assert!(err.contains("[dns] listen") && err.contains("restart") && err.contains("127.0.0.1:5353"), "{err}");
        assert!(check_reloadable(&sizes, &with_dns, &with_dns).is_ok());
        let with_metrics = Config::parse(&format!("[metrics]\nlisten = \"127.0.0.1:9405\"\n{}", service(1))).unwrap();
        let err = check_reloadable(&sizes, &running, &with_metrics).unwrap_err().to_string();
        assert!(err.contains("[metrics] listen") && err.contains("restart") && err.contains("127.0.0.1:9405"), "{err}");
        assert!(check_reloadable(&sizes, &with_metrics, &with_metrics).is_ok());
        let bigger_m = Config::parse(&format!("[dataplane]\nmaglev_table_size = 65537\n{}", service(1))).unwrap();
        assert!(check_reloadable(&sizes, &running, &bigger_m).unwrap_err().to_string().contains("maglev_table_size"));
    }
}
