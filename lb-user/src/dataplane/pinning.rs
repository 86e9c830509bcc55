//! bpffs: mounting it when absent, and deciding whether the maps pinned by a previous daemon
//! can be reused.
//!
//! Reuse keeps the connection table across a daemon restart or upgrade. It is only safe when
//! the pinned maps have exactly the sizes this run wants (the kernel cannot resize a map, and
//! a table of another size M would be read wrongly), so a mismatch discards the old pins with a
//! warning and starts fresh.

use super::{Carried, DataplaneSizes, MAP_NAMES};
use anyhow::{bail, Context, Result};
use aya::programs::links::PinnedLink;
use std::ffi::CString;
use std::path::Path;

/// Magic number of a bpf filesystem (statfs f_type).
const BPF_FS_MAGIC: i64 = 0xcafe4a11;

/// `map_flags` bit of an array whose values start on a page (uapi `BPF_F_MMAPABLE`).
pub const BPF_F_MMAPABLE: u32 = 1 << 10;

/// Default directory for the daemon's pins.
pub const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/lb";

fn is_bpffs(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_encoded_bytes()) else { return false };
    // SAFETY: a statfs is plain integers; all zeroes is a valid value.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs writes into the struct we own; c is a valid C string.
    unsafe { libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type as i64 == BPF_FS_MAGIC }
}

/// An exclusive lock on the pin directory, held by the running daemon: a second daemon with
/// another control socket but the same pins is refused instead of taking over the first one's
/// maps and links. Released when the file closes (also when the process dies).
pub fn lock_pin_dir(pin_dir: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(pin_dir).with_context(|| format!("opening {}", pin_dir.display()))?;
    // SAFETY: flock on a file descriptor this function owns.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            bail!("another lb daemon is running with the pin directory {}", pin_dir.display());
        }
        return Err(err).with_context(|| format!("locking {}", pin_dir.display()));
    }
    Ok(dir)
}

/// Blocks until this process holds an exclusive `flock` on `path`; released when the returned
/// file closes.
fn lock_exclusive(path: &Path) -> Result<std::fs::File> {
    use std::os::fd::AsRawFd;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: flock on a file descriptor this function owns.
    while unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(err).with_context(|| format!("locking {}", path.display()));
        }
    }
    Ok(file)
}

/// Make sure `pin_dir` exists on a bpffs, mounting bpffs at /sys/fs/bpf if that is where it
/// belongs and nothing is mounted there yet.
///
/// Mounting is race-free: the check and the mount happen under an exclusive `flock` on
/// `/sys/fs` (the mount point's parent, whose inode a mount on `/sys/fs/bpf` does not hide), so
/// of several processes or threads starting at once on a machine without bpffs exactly one
/// mounts it. Without the lock each would mount its own instance over the previous one, hiding
/// the directories and pins the earlier ones had made.
pub fn ensure_pin_dir(pin_dir: &Path) -> Result<()> {
    let sys_bpf = Path::new("/sys/fs/bpf");
    if pin_dir.starts_with(sys_bpf) && !is_bpffs(sys_bpf) {
        let _guard = lock_exclusive(Path::new("/sys/fs"))?;
        if !is_bpffs(sys_bpf) {
            std::fs::create_dir_all(sys_bpf).ok();
            let src = CString::new("bpf").unwrap();
            let target = CString::new("/sys/fs/bpf").unwrap();
            // SAFETY: valid C strings; mounting a fresh bpffs instance.
            let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), src.as_ptr(), 0, std::ptr::null()) };
            if rc != 0 {
                bail!("mounting bpffs at /sys/fs/bpf: {}", std::io::Error::last_os_error());
            }
        }
    }
    std::fs::create_dir_all(pin_dir).with_context(|| format!("creating {}", pin_dir.display()))?;
    if !is_bpffs(pin_dir) {
        bail!("{} is not on a bpf filesystem (mount -t bpf bpf DIR)", pin_dir.display());
    }
    Ok(())
}

/// The pinned maps whose values are records that have changed size between versions, with
/// this version's size: the connection tables (before the set-associative tables they were
/// kernel LRU hash maps, one entry per value), the global counters (they grow when counters are
/// added), the service table (its slot grew from 64 to 128 bytes for forwarding parameters)
/// and the backend records.
const RECORD_LAYOUTS: &[(&str, usize, &str)] = &[
    ("CONNTRACK", std::mem::size_of::<lb_common::ct_table::Bucket6>(), "buckets"),
    ("CONNTRACK4", std::mem::size_of::<lb_common::ct_table::Bucket4>(), "buckets"),
    ("STATS", std::mem::size_of::<lb_common::maps::GlobalStats>(), "counter records"),
    ("SERVICE_TABLE", std::mem::size_of::<lb_common::maps::ServiceSlot>(), "service slots"),
    ("BACKENDS", std::mem::size_of::<lb_common::maps::Backend>(), "backend records"),
    ("TABLE_INDEX", std::mem::size_of::<lb_common::maps::TableRef>(), "table references"),
];

/// What `prepare_reuse` found.
#[derive(Debug)]
pub enum PinState {
    /// Nothing pinned: a fresh data plane.
    Fresh,
    /// Pinned maps match and will be reused (connections survive).
    Reused,
    /// Pinned maps had other sizes or another layout and were removed; `why` says which.
    /// `carried` holds what of them the new maps take over (None: another layout).
    Discarded { why: String, carried: Option<Box<Carried>> },
}

/// Check the maps pinned in `pin_dir` against `sizes`; remove them all if any differs.
pub fn prepare_reuse(pin_dir: &Path, sizes: &DataplaneSizes) -> Result<PinState> {
    let mut any = false;
    let mut mismatch = None;
    for (name, want) in sizes.map_max_entries() {
        let path = pin_dir.join(name);
        if !path.exists() {
            continue;
        }
        any = true;
        let info = aya::maps::MapInfo::from_pin(&path).with_context(|| format!("reading {}", path.display()))?;
        if info.max_entries() != want && mismatch.is_none() {
            mismatch = Some(format!("{name} holds {} entries, this configuration needs {want}", info.max_entries()));
        }
        // A record whose layout changed between versions (a program of this version would
        // read an older, smaller record past its end, which the verifier refuses, or misread
        // it): a pinned map of another value size is not adopted.
        if let Some((_, size, what)) = RECORD_LAYOUTS.iter().find(|(n, ..)| *n == name) {
            if info.value_size() as usize != *size && mismatch.is_none() {
                mismatch = Some(format!(
                    "{name} has another layout (values of {} bytes, this version's {what} take {size})",
                    info.value_size()
                ));
            }
        }
        let conntrack = matches!(name, "CONNTRACK" | "CONNTRACK4");
        // Made before the tables were BPF_F_MMAPABLE: their values start where the kernel's
        // array header ends (on 6.18, 8 bytes before a cache line), so each bucket spans one
        // line more than it needs and the data plane's loads of a bucket's lines (lb-ebpf
        // `conntrack::prefetch`) miss its last one. Recreated, flows carried over.
        if conntrack && info.map_flags() & BPF_F_MMAPABLE == 0 && mismatch.is_none() {
            mismatch = Some(format!("{name} was made without BPF_F_MMAPABLE (buckets not aligned to cache lines)"));
        }
    }
    if !any {
        return Ok(PinState::Fresh);
    }
    // Connection tables without their hash seed cannot be searched: start afresh.
    let tables = ["CONNTRACK", "CONNTRACK4"].iter().any(|n| pin_dir.join(n).exists());
    if tables && !pin_dir.join("CT_SEED_STORE").exists() && mismatch.is_none() {
        mismatch = Some("the connection tables are pinned without CT_SEED_STORE, their hash seed".to_string());
    }
    match mismatch {
        None => Ok(PinState::Reused),
        Some(why) => {
            // Opened before the pins go: the connection tables move into the new maps.
            let carried = Carried::open(pin_dir).map(Box::new);
            remove_map_pins(pin_dir)?;
            Ok(PinState::Discarded { why, carried })
        }
    }
}

/// Maps earlier versions pinned that this one no longer has (`SERVICES`: the service hash
/// map before `SERVICE_TABLE`; `DECAP_ADDRS`: `lb_decap`'s addresses, when the decapsulator
/// was part of the balancer's object); removed with the others, and when a daemon starts.
pub const LEGACY_MAP_NAMES: &[&str] = &["SERVICES", "DECAP_ADDRS"];

/// Remove every map pin (the maps themselves go when no program uses them any more).
pub fn remove_map_pins(pin_dir: &Path) -> Result<()> {
    remove_legacy_pins(pin_dir)?;
    for name in MAP_NAMES {
        let path = pin_dir.join(name);
        if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Where the daemon pins the link of the balancer on `ifname`.
pub fn link_pin(pin_dir: &Path, ifname: &str) -> std::path::PathBuf {
    pin_dir.join(format!("link_{ifname}"))
}

/// The interfaces with a balancer link pinned in `pin_dir` (see [`link_pin`]), sorted.
pub fn pinned_link_interfaces(pin_dir: &Path) -> Vec<String> {
    let Ok(dir) = std::fs::read_dir(pin_dir) else { return Vec::new() };
    let mut names: Vec<String> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.strip_prefix("link_").map(str::to_owned))
        .filter(|name| !name.is_empty())
        .collect();
    names.sort();
    names
}

/// Remove pins of maps this version no longer has (nothing reads them; the program that used
/// them is replaced when the new one is attached).
pub fn remove_legacy_pins(pin_dir: &Path) -> Result<()> {
    for name in LEGACY_MAP_NAMES {
        let path = pin_dir.join(name);
        if path.exists() {
            std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
        }
    }
    Ok(())
}

/// Detaches the XDP program whose bpf_link is pinned at `link_pin` (removing the pin closes
/// the last reference). Returns false if nothing was pinned there.
pub fn detach_pinned(link_pin: &Path) -> Result<bool> {
    if !link_pin.exists() {
        return Ok(false);
    }
    let pinned = PinnedLink::from_pin(link_pin).with_context(|| format!("opening {}", link_pin.display()))?;
    drop(pinned.unpin().with_context(|| format!("removing {}", link_pin.display()))?);
    Ok(true)
}

/// Refuses pins that must outlive this command (`what`) in a bpffs private to its mount
/// namespace: `ip netns exec` unshares the mount namespace and mounts its own /sys (and
/// bpffs), so everything pinned there vanishes when the command exits. The reference is PID
/// 1's mount namespace, or where that cannot be read (a sandbox), the parent's: shared means
/// the same namespace, or `pin_dir` is the same filesystem seen from the reference's root.
pub fn require_shared_bpffs(pin_dir: &Path, what: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let ns = |pid: &str| std::fs::metadata(format!("/proc/{pid}/ns/mnt")).map(|m| (m.dev(), m.ino()));
    // SAFETY: getppid has no preconditions.
    let parent = unsafe { libc::getppid() }.to_string();
    let Some((reference, theirs)) = ["1", parent.as_str()].into_iter().find_map(|pid| ns(pid).ok().map(|n| (pid, n)))
    else {
        // No process to compare with: nothing to say.
        return Ok(());
    };
    if ns("self").is_ok_and(|ours| ours == theirs) {
        return Ok(());
    }
    let ours = std::fs::metadata(pin_dir).with_context(|| format!("reading {}", pin_dir.display()))?.dev();
    let seen = Path::new("/proc").join(reference).join("root").join(pin_dir.strip_prefix("/").unwrap_or(pin_dir));
    if std::fs::metadata(&seen).is_ok_and(|m| m.dev() == ours) {
        return Ok(());
    }
    bail!(
        "{what}: {} is on a bpffs private to this command's mount namespace (as under `ip netns exec`, which mounts its own /sys), so the pins would vanish when it exits; run it with `nsenter --net=/run/netns/NAME` instead, which enters only the network namespace and keeps the host's bpffs",
        pin_dir.display()
    )
}

/// The pins of a running daemon (its maps, and the links of `interfaces`) missing from
/// `pin_dir`: removed by hand, or with the directory.
pub fn missing_pins(pin_dir: &Path, interfaces: &[String]) -> Vec<String> {
    let maps = MAP_NAMES.iter().map(|n| n.to_string());
    let links = interfaces
        .iter()
        .map(|i| link_pin(pin_dir, i).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    maps.chain(links).filter(|name| !pin_dir.join(name).exists()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pinned_links_are_named_by_their_interface() {
        let dir = std::env::temp_dir().join(format!("lb-pinned-links-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in ["link_eth1", "link_eth0", "TABLES", "link_", "state.json"] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let found = pinned_link_interfaces(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(found, vec!["eth0".to_owned(), "eth1".to_owned()]);
        assert!(pinned_link_interfaces(&dir).is_empty());
    }
}
