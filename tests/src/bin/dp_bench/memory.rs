//! The physical floor of a cold hit (issue 35 item 4): one memory round trip, measured as a
//! chase of dependent loads over a buffer as large as the connection table, in a random cyclic
//! order of its cache lines, so that every load misses the caches (and the TLB) and must wait
//! for the one before it. A cold hit reads its flow's line from memory at least once; its
//! target is the hot hit plus this round trip plus 30 ns.
//!
//! The buffer is mapped with 4 KiB pages, as the kernel maps a BPF array (vmalloc), whatever
//! the host's transparent huge page setting. `--cold-by-slot` also chases with 2 MiB pages
//! (what a table on huge pages would save: the page walks) and with a second, independent
//! line loaded per step (what a hit that needs a second line costs beyond the first, when
//! both loads are issued together as the search issues a bucket's).

use lb_user::rng::{Rng, SplitMix64};

/// Bytes per cache line.
const LINE: usize = 64;
/// Lines per 4 KiB page.
const PAGE_LINES: usize = 4096 / LINE;
/// Loads timed per measurement (after one pass over part of the buffer to fault its pages in).
const STEPS: usize = 1 << 21;
const HUGE_PAGE: usize = 2 << 20;

/// What a chase step loads besides the line that names the next one.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Also {
    Nothing,
    /// A line of the same 4 KiB page, half a page away.
    SamePage,
    /// A line of a random other page.
    OtherPage,
}

/// How the chase's buffer is mapped and what each step loads.
#[derive(Clone, Copy)]
pub struct Chase {
    pub huge_pages: bool,
    pub also: Also,
}

impl Chase {
    /// The cold hit's floor: one line per step, 4 KiB pages.
    pub const ROUND_TRIP: Chase = Chase { huge_pages: false, also: Also::Nothing };
}

/// ns per dependent load over `bytes` of memory: the median of `runs` chases.
pub fn round_trip_ns(bytes: usize, runs: usize) -> f64 {
    chase_ns(bytes, runs, Chase::ROUND_TRIP).0
}

/// ns per step of `chase` over `bytes` of memory, the median of `runs` chases; and the share of
/// the buffer the kernel backed with huge pages (0 for 4 KiB pages; below 1 if it could not
/// find enough 2 MiB blocks).
pub fn chase_ns(bytes: usize, runs: usize, chase: Chase) -> (f64, f64) {
    let lines = (bytes / LINE).max(2 * PAGE_LINES);
    let words = LINE / std::mem::size_of::<u64>();
    let mut buffer = Buffer::new(lines * LINE, chase.huge_pages);
    // next[i * words] (at the start of line i) is the line the chase visits after i: one
    // cycle through every line (Sattolo's shuffle), so no line repeats before all were visited.
    // Every other word is 0: the extra load's value, added to the next index, changes nothing
    // but makes the step wait for it.
    let mut order: Vec<u32> = (0..lines as u32).collect();
    let mut rng = SplitMix64(0x00c0_ffee);
    for i in (1..lines).rev() {
        let j = rng.below(i as u64) as usize;
        order.swap(i, j);
    }
    let next = buffer.words();
    for k in 0..lines {
        next[order[k] as usize * words] = order[(k + 1) % lines] as u64;
    }
    drop(order);
    let huge_share = buffer.huge_share();
    let next = buffer.words();
    // The extra line's index from the step's own (not from memory: both loads issue together).
    let also = |at: usize| match chase.also {
        Also::Nothing => at,
        Also::SamePage => (at & !(PAGE_LINES - 1)) | ((at + PAGE_LINES / 2) & (PAGE_LINES - 1)),
        Also::OtherPage => (at.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 17) % lines,
    };
    let mut times: Vec<f64> = (0..runs.max(1))
        .map(|_| {
            let mut at = 0usize;
            let start = std::time::Instant::now();
            for _ in 0..STEPS {
                let extra = if chase.also == Also::Nothing { 0 } else { next[also(at) * words + 1] };
                at = (next[at * words] + extra) as usize;
            }
            let ns = start.elapsed().as_nanos() as f64 / STEPS as f64;
            std::hint::black_box(at);
            ns
        })
        .collect();
    times.sort_unstable_by(f64::total_cmp);
    (times[times.len() / 2], huge_share)
}

/// An anonymous mapping, 2 MiB aligned, advised to use huge pages or not to.
struct Buffer {
    map: *mut libc::c_void,
    map_len: usize,
    start: *mut u64,
    len: usize,
}

impl Buffer {
    fn new(len: usize, huge_pages: bool) -> Self {
        let map_len = len + HUGE_PAGE;
        // SAFETY: a fresh private anonymous mapping; checked below.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert!(map != libc::MAP_FAILED, "mmap of {map_len} bytes: {}", std::io::Error::last_os_error());
        let start = (map as usize).next_multiple_of(HUGE_PAGE) as *mut u64;
        let advice = if huge_pages { libc::MADV_HUGEPAGE } else { libc::MADV_NOHUGEPAGE };
        // SAFETY: a range inside the mapping. EINVAL: a kernel without transparent huge pages,
        // whose pages are all 4 KiB (`huge_share` tells).
        if unsafe { libc::madvise(start.cast(), len, advice) } != 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "madvise: {e}");
        }
        Buffer { map, map_len, start, len }
    }

    /// The buffer's words (zero until written).
    fn words(&mut self) -> &mut [u64] {
        // SAFETY: the range lies in the mapping, which lives as long as `self`.
        unsafe { std::slice::from_raw_parts_mut(self.start, self.len / 8) }
    }

    /// The share of the buffer backed by huge pages (its pages are all touched by then).
    fn huge_share(&self) -> f64 {
        let start = self.start as usize;
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else { return f64::NAN };
        let mut inside = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ') {
                if let Some((a, b)) = range.split_once('-') {
                    if let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) {
                        inside = a <= start && start < b;
                        continue;
                    }
                }
            }
            if inside {
                if let Some(kb) = line.strip_prefix("AnonHugePages:") {
                    let kb: f64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(f64::NAN);
                    return (kb * 1024.0 / self.len as f64).min(1.0);
                }
            }
        }
        f64::NAN
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, not used after this.
        unsafe { libc::munmap(self.map, self.map_len) };
    }
}
