//! `lb validate` in memory that grows by a small constant per zone (issue #31-10: 66 KiB per
//! zone, one Maglev table per zone class even when every zone had the same eligible set). The
//! peak of the heap is measured by a counting allocator; this binary holds one test only, so no
//! other test's allocations are counted.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed on to the system allocator unchanged; only sizes are counted.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's layout, passed on unchanged.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Relaxed) + layout.size();
            PEAK.fetch_max(now, Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Relaxed);
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `zones` zones of one /30 each and one zonal-affinity service whose 8 backends are in the
/// first 8 zones: every other zone's clients get the same (spill) set.
fn config(zones: usize) -> String {
    let mut s = String::new();
    for z in 0..zones {
        let a = z * 4;
        s += &format!(
            "[[zone]]\nname = \"z{z}\"\nclient_prefixes = [\"198.{}.{}.{}/30\"]\n",
            18 + (a >> 16),
            (a >> 8) & 255,
            a & 255
        );
    }
    s += "[[service]]\nname = \"web\"\nvip = \"198.19.255.100\"\nprotocol = \"TCP\"\nports = [80]\n\
          [service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\n";
    for b in 0..8 {
        s += &format!("[[service.backend]]\naddress = \"198.19.254.{}\"\nzone = \"z{b}\"\n", b + 1);
    }
    s
}

/// Peak heap bytes of `lb validate` on `zones` zones (above what was live before).
fn peak_of_validate(zones: usize) -> usize {
    let dir = std::env::temp_dir().join(format!("lb-validate-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("z{zones}.toml"));
    std::fs::write(&path, config(zones)).unwrap();
    let base = LIVE.load(Relaxed);
    PEAK.store(base, Relaxed);
    let summary = lb_user::cli::validate::check(&path).expect("the configuration is valid");
    assert!(summary.ends_with("valid (1 services, 8 backends)"), "{summary}");
    let _ = std::fs::remove_dir_all(&dir);
    PEAK.load(Relaxed) - base
}

#[test]
fn validation_memory_per_zone_is_a_small_constant() {
    let small = peak_of_validate(1_000);
    let large = peak_of_validate(5_000);
    let per_zone = large.saturating_sub(small) / 4_000;
    // Measured about 2 KiB per zone (the file's text, its TOML tree, the zone, its class);
    // one Maglev table per zone (M = 16381, 4 bytes an entry) would be 64 KiB.
    assert!(per_zone < 8 * 1024, "{per_zone} bytes per zone (peaks: {small} at 1,000 zones, {large} at 5,000)");
}
