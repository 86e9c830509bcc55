//! Raw bytes of a daemon's pinned maps, for "nothing changed" assertions: every key and value
//! of every map pinned in a directory, read with `BPF_MAP_GET_NEXT_KEY` / `BPF_MAP_LOOKUP_ELEM`
//! (any map type, LPM tries included, whatever the value type).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, AsRawFd};
use std::path::Path;

use anyhow::{bail, Context, Result};

const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_GET_NEXT_KEY: libc::c_long = 4;
const PERCPU_TYPES: [u32; 3] = [5, 6, 10]; // PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH

/// `union bpf_attr` for the element commands.
#[repr(C)]
struct ElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value_or_next: u64,
    flags: u64,
}

fn bpf(cmd: libc::c_long, attr: &mut ElemAttr) -> std::io::Result<()> {
    // SAFETY: attr points at live key/value buffers sized from the map's info.
    let rc =
        unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut ElemAttr, std::mem::size_of::<ElemAttr>() as u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Map name -> its (key, value) pairs in iteration order.
pub type Dump = BTreeMap<String, Vec<(Vec<u8>, Vec<u8>)>>;

/// Map name -> its (key, value) pairs in iteration order, for every map pinned directly in
/// `dir` whose name is not in `skip` (counters and other maps the kernel writes per packet).
/// `bpf_map_type` of a ring buffer.
const BPF_MAP_TYPE_RINGBUF: u32 = 27;

pub fn dump(dir: &Path, skip: &[&str]) -> Result<Dump> {
    let mut out = BTreeMap::new();
    let cpus = aya::util::nr_cpus().map_err(|(_, e)| e)?;
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let path = entry?.path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if skip.contains(&name.as_str()) || !path.is_file() {
            continue;
        }
        // Links and programs are pinned there too, and the kernel answers a map-info request
        // on a link's descriptor as well: a map's fdinfo is what tells them apart.
        let Ok(data) = aya::maps::MapData::from_pin(&path) else { continue };
        let fd = data.fd().as_fd().as_raw_fd() as u32;
        let fdinfo = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).unwrap_or_default();
        if !fdinfo.lines().any(|l| l.starts_with("map_type:")) {
            continue;
        }
        let info = data.info().with_context(|| format!("reading the map info of {}", path.display()))?;
        // A ring buffer (`TRACE_EVENTS`) has no keys to walk: its content is a stream.
        if info.map_type().map(|t| t as u32).unwrap_or(0) == BPF_MAP_TYPE_RINGBUF {
            continue;
        }
        let key_size = info.key_size() as usize;
        let mut value_size = info.value_size() as usize;
        if PERCPU_TYPES.contains(&(info.map_type().map(|t| t as u32).unwrap_or(0))) {
            value_size = value_size.div_ceil(8) * 8 * cpus;
        }
        let mut pairs = Vec::new();
        let mut key: Option<Vec<u8>> = None;
        loop {
            let mut next = vec![0u8; key_size];
            let mut attr = ElemAttr {
                map_fd: fd,
                _pad: 0,
                key: key.as_ref().map_or(0, |k| k.as_ptr() as u64),
                value_or_next: next.as_mut_ptr() as u64,
                flags: 0,
            };
            match bpf(BPF_MAP_GET_NEXT_KEY, &mut attr) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => break,
                Err(e) => bail!("{name}: BPF_MAP_GET_NEXT_KEY: {e}"),
            }
            let mut value = vec![0u8; value_size];
            let mut attr = ElemAttr {
                map_fd: fd,
                _pad: 0,
                key: next.as_ptr() as u64,
                value_or_next: value.as_mut_ptr() as u64,
                flags: 0,
            };
            match bpf(BPF_MAP_LOOKUP_ELEM, &mut attr) {
                Ok(()) => pairs.push((next.clone(), value)),
                // Deleted between the two calls (hash maps): nothing to compare.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(e) => bail!("{name}: BPF_MAP_LOOKUP_ELEM: {e}"),
            }
            key = Some(next);
        }
        out.insert(name, pairs);
    }
    Ok(out)
}
