//! Network namespaces for tests and the demo: created with `ip netns add`, deleted on drop (also
//! when a test panics), plus helpers to run commands and Rust closures inside them.

use anyhow::{bail, Context, Result};
use std::process::{Child, Command, Stdio};

/// A named network namespace that is deleted when dropped.
#[derive(Debug)]
pub struct Netns {
    name: String,
}

impl Netns {
    /// Create `name`, deleting a stale namespace of that name left by a crashed run.
    pub fn new(name: &str) -> Result<Self> {
        let _ = Command::new("ip").args(["netns", "del", name]).stderr(Stdio::null()).status();
        sh(Command::new("ip").args(["netns", "add", name]))
            .with_context(|| format!("creating network namespace {name} (tests need root)"))?;
        let ns = Self { name: name.to_owned() };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME args...`
    pub fn ip(&self, args: &[&str]) -> Result<String> {
        sh(Command::new("ip").arg("-n").arg(&self.name).args(args))
    }

    /// Run a program inside the namespace and return its stdout.
    pub fn exec(&self, args: &[&str]) -> Result<String> {
        sh(Command::new("ip").args(["netns", "exec", &self.name]).args(args))
    }

    /// `nsenter --net=...`: run a program in this network namespace only. Unlike
    /// `ip netns exec` it keeps the caller's mounts, so /sys/fs/bpf stays the host's bpffs
    /// and pins made inside outlive the program.
    pub fn nsenter(&self) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.name));
        c
    }

    /// Start a long-running program inside the namespace; it is killed when the guard drops.
    pub fn spawn(&self, args: &[&str]) -> Result<ChildGuard> {
        let child = Command::new("ip")
            .args(["netns", "exec", &self.name])
            .args(args)
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {args:?} in {}", self.name))?;
        Ok(ChildGuard(Some(child)))
    }

    /// Run `f` on a fresh thread that has entered this namespace (sockets it opens live there).
    pub fn run<F, R>(&self, f: F) -> Result<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        self.spawn_thread(f).join().map_err(|_| anyhow::anyhow!("thread in namespace panicked"))?
    }

    /// Start `f` on a fresh thread that has entered this namespace, without waiting for it
    /// (a load generator running while the test goes on).
    pub fn spawn_thread<F, R>(&self, f: F) -> std::thread::JoinHandle<Result<R>>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        let path = format!("/run/netns/{}", self.name);
        std::thread::spawn(move || -> Result<R> {
            let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
            use std::os::fd::AsRawFd;
            // SAFETY: setns on a valid namespace fd; affects only this thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                bail!("setns({path}): {}", std::io::Error::last_os_error());
            }
            Ok(f())
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        // Kill what still runs inside, then delete.
        if let Ok(out) = Command::new("ip").args(["netns", "pids", &self.name]).output() {
            for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).stderr(Stdio::null()).status();
    }
}

/// A child process killed (and reaped) on drop.
#[derive(Debug)]
pub struct ChildGuard(Option<Child>);

impl ChildGuard {
    /// Guard a child started elsewhere (e.g. with its output redirected).
    pub fn new(child: Child) -> Self {
        Self(Some(child))
    }

    pub fn id(&self) -> u32 {
        self.0.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Stop it now (SIGKILL) and wait.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Has it exited on its own?
    pub fn exited(&mut self) -> bool {
        self.0.as_mut().map(|c| matches!(c.try_wait(), Ok(Some(_)))).unwrap_or(true)
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Run a command; on failure the error carries its stderr.
pub fn sh(cmd: &mut Command) -> Result<String> {
    let shown = format!("{cmd:?}");
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("starting {shown}"))?;
    if !out.status.success() {
        bail!("{shown} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
