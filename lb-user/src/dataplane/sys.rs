//! Raw system calls aya does not wrap: shared mappings of mmapable array maps, batched array
//! updates, the kernel tick length, program loading retried on EAGAIN, and an interface's MAC.

use anyhow::{bail, Context, Result};
use aya::programs::Xdp;

/// A shared mapping of a BPF_F_MMAPABLE array map (`TABLES`, `SERVICE_TABLE`): writes land in
/// the map directly. The index flip that follows is a syscall, which orders these stores
/// before it. An array map stores each element in a slot of its size rounded up to 8 bytes, so
/// element `i` is at byte `stride * i` of the mapping (a u32 in the low-address half of its
/// 8-byte slot, a 64-byte `ServiceSlot` exactly at `64 * i`).
pub(super) struct ArrayMmap<T> {
    ptr: *mut u8,
    len: usize,
    _elem: std::marker::PhantomData<T>,
}

// SAFETY: the mapping is owned by one writer and only written through `&mut self`.
unsafe impl<T> Send for ArrayMmap<T> {}

impl<T: Copy> ArrayMmap<T> {
    const STRIDE: usize = std::mem::size_of::<T>().div_ceil(8) * 8;

    fn bytes(len: usize) -> usize {
        (len * Self::STRIDE).div_ceil(4096) * 4096
    }

    /// A mapping of the first `entries` elements; None if the map was not created mmapable
    /// (e.g. pinned by an older daemon).
    pub(super) fn new(map: &aya::maps::Map, entries: usize) -> Option<Self> {
        use std::os::fd::{AsFd, AsRawFd};
        const { assert!(std::mem::align_of::<T>() <= 8) };
        let aya::maps::Map::Array(data) = map else { return None };
        // SAFETY: mapping a map fd we own; the kernel checks the size and the flag.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                Self::bytes(entries),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                data.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return None;
        }
        Some(Self { ptr: ptr as *mut u8, len: entries, _elem: std::marker::PhantomData })
    }

    pub(super) fn write(&mut self, at: usize, values: &[T]) {
        assert!(at + values.len() <= self.len, "write beyond the mapped array");
        for (i, v) in values.iter().enumerate() {
            // SAFETY: in bounds (checked), the mapping lives as long as self; the element is
            // written at the start of its own slot, which is 8-byte aligned (page-aligned base,
            // stride a multiple of 8) and at least as large as T.
            unsafe { (self.ptr.add((at + i) * Self::STRIDE) as *mut T).write(*v) };
        }
    }

    pub(super) fn read(&self, at: usize, count: usize) -> Vec<T> {
        assert!(at + count <= self.len, "read beyond the mapped array");
        // SAFETY: as in `write`.
        (at..at + count).map(|i| unsafe { (self.ptr.add(i * Self::STRIDE) as *const T).read() }).collect()
    }
}

impl<T> Drop for ArrayMmap<T> {
    fn drop(&mut self) {
        let stride = std::mem::size_of::<T>().div_ceil(8) * 8;
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, (self.len * stride).div_ceil(4096) * 4096) };
    }
}

/// Writes `values[i]` at `keys[i]` of an array map with one `BPF_MAP_UPDATE_BATCH` (Linux 5.6+)
/// instead of one syscall per entry: a 65537-entry table costs one syscall, not 65537.
pub(super) fn update_batch<V: Copy>(map: &aya::maps::Map, keys: &[u32], values: &[V]) -> Result<()> {
    use std::os::fd::{AsFd, AsRawFd};
    const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
    /// `union bpf_attr`'s `batch` member.
    #[repr(C)]
    struct BatchAttr {
        in_batch: u64,
        out_batch: u64,
        keys: u64,
        values: u64,
        count: u32,
        map_fd: u32,
        elem_flags: u64,
        flags: u64,
    }
    let aya::maps::Map::Array(data) = map else { bail!("batch update: not an array map") };
    if keys.len() != values.len() {
        bail!("batch update: {} keys, {} values", keys.len(), values.len());
    }
    let mut done = 0usize;
    // The kernel may stop early (count is written back); continue from there.
    while done < keys.len() {
        let mut attr = BatchAttr {
            in_batch: 0,
            out_batch: 0,
            keys: keys[done..].as_ptr() as u64,
            values: values[done..].as_ptr() as u64,
            count: (keys.len() - done) as u32,
            map_fd: data.fd().as_fd().as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: attr points at live key/value buffers of `count` elements each.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_UPDATE_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>() as u32,
            )
        };
        if rc != 0 {
            bail!("BPF_MAP_UPDATE_BATCH: {}", std::io::Error::last_os_error());
        }
        if attr.count == 0 {
            bail!("BPF_MAP_UPDATE_BATCH made no progress");
        }
        done += attr.count as usize;
    }
    Ok(())
}

/// The kernel's tick length in ns (`NS_PER_JIFFY` of the XDP object): the resolution of
/// CLOCK_MONOTONIC_COARSE is exactly one tick (TICK_NSEC: 4,000,000 at HZ = 250).
pub fn ns_per_jiffy() -> Result<u64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_getres writes into the timespec we own.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut ts) } != 0 {
        bail!("clock_getres(CLOCK_MONOTONIC_COARSE): {}", std::io::Error::last_os_error());
    }
    let ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    // HZ is between 24 and 10,000 on any Linux build.
    if !(100_000..=50_000_000).contains(&ns) {
        bail!("CLOCK_MONOTONIC_COARSE resolution {ns} ns is not a kernel tick length");
    }
    Ok(ns)
}

/// `BPF_PROG_LOAD` for `prog`, retried when it fails with EAGAIN: the verifier gives up with
/// EAGAIN when `signal_pending()` holds while it runs (a signal with a handler to the verifying
/// thread, or task work queued on it), which says nothing about the program. libbpf retries the
/// same way. The retries back off (10, 20, ... ms): five immediate ones were once all refused
/// in a test process, each after 33 instructions, so whatever was pending outlasted them.
pub fn load_program(prog: &mut Xdp) -> Result<(), aya::programs::ProgramError> {
    const ATTEMPTS: u64 = 10;
    let mut attempt = 1;
    loop {
        match prog.load() {
            Err(aya::programs::ProgramError::LoadError { io_error, .. })
                if io_error.raw_os_error() == Some(libc::EAGAIN) && attempt < ATTEMPTS =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10 * attempt));
                attempt += 1;
            }
            other => return other,
        }
    }
}

/// An interface's index and MAC (`SIOCGIFHWADDR`), in the calling thread's network namespace.
pub(super) fn interface_mac(ifname: &str) -> Result<(u32, [u8; 6])> {
    let name = std::ffi::CString::new(ifname).context("interface name")?;
    // SAFETY: a NUL-terminated name; if_nametoindex only reads it.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if ifindex == 0 {
        bail!("no interface {ifname}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a zeroed ifreq with the name copied in (shorter than IFNAMSIZ, checked), on a
    // socket we own and close; the ioctl writes only into the ifreq.
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        let bytes = name.as_bytes();
        if bytes.len() >= req.ifr_name.len() {
            bail!("interface name {ifname} is too long");
        }
        for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            bail!("socket: {}", std::io::Error::last_os_error());
        }
        let rc = libc::ioctl(fd, libc::SIOCGIFHWADDR, &mut req);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if rc != 0 {
            bail!("reading the MAC of {ifname}: {err}");
        }
        let data = req.ifr_ifru.ifru_hwaddr.sa_data;
        Ok((ifindex, std::array::from_fn(|i| data[i] as u8)))
    }
}

/// The interface index a bpf_link of XDP is attached to, from `BPF_OBJ_GET_INFO_BY_FD`:
/// 0 once the link is severed (its interface was removed).
pub(crate) fn xdp_link_ifindex(link: std::os::fd::BorrowedFd<'_>) -> std::io::Result<u32> {
    use std::os::fd::AsRawFd;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    /// `union bpf_attr`'s `info` member.
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // `struct bpf_link_info`: type, id, prog_id, then (8-aligned) the union whose `xdp` member
    // starts with the ifindex. A larger buffer than the kernel fills is fine (zeroed).
    let mut info = [0u64; 8];
    let mut attr = InfoAttr {
        bpf_fd: link.as_raw_fd() as u32,
        info_len: std::mem::size_of_val(&info) as u32,
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: attr points at a live buffer of info_len bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr as *mut InfoAttr,
            std::mem::size_of::<InfoAttr>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((info[2] & 0xffff_ffff) as u32)
}

/// A descriptor of the bpf_link with this id (`BPF_LINK_GET_FD_BY_ID`): as long as it is
/// open, the link (and so its attachment) lives, whatever happens to its pin.
pub(crate) fn link_fd_by_id(id: u32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
    // `union bpf_attr`'s `*_get_fd_by_id` members: the id, next_id, open_flags.
    let mut attr = [id, 0u32, 0u32];
    // SAFETY: attr is a live buffer of the size given.
    let fd = unsafe {
        libc::syscall(libc::SYS_bpf, BPF_LINK_GET_FD_BY_ID, attr.as_mut_ptr(), std::mem::size_of_val(&attr) as u32)
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel returned a new descriptor that nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}
