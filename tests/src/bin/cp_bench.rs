//! Control-plane benchmark (`cargo xtask bench`, root):
//!
//! 1. Time from a health change to the new tables being live, for one service of 1,000 backends
//!    across 10 zones (M = 65537): the controller's full reaction — recompute the eligible sets,
//!    rebuild the changed Maglev tables, write them into standby slots and flip — measured
//!    around `Controller::reconcile` against the real BPF maps. Median and p99 over many
//!    alternating up/down changes of one backend. (Probe detection time is configuration:
//!    `unhealthy_threshold × check_interval_sec`, and is not included.)
//! 2. The daemon's resident memory with 1M tracked connections: a real `lb run` (no interface
//!    attached) with the same configuration; its pinned CONNTRACK map is filled with 1,000,000
//!    entries from here, then the daemon's VmRSS and the map's kernel memory are read.

use anyhow::{bail, Context, Result};
use lb_common::maps::{CtEntry, CtKey, CtKey4, FlowTuple};
use lb_user::config::Config;
use lb_user::controller::Controller;
use lb_user::dataplane::Dataplane;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const ZONES: usize = 10;
/// 1,000 backends: four services of 250 (the most one service may have, spec §1.0).
const SERVICES: usize = 4;
const PER_ZONE: usize = 25;
const CHANGES: usize = 60;
const CONNECTIONS: u32 = 1_000_000;

fn config() -> String {
    let mut s = String::from(
        "[dataplane]\nmaglev_table_size = 65537\nconntrack_entries = 1048576\nencap_source_v4 = \"198.18.0.1\"\n\n",
    );
    for z in 0..ZONES {
        s += &format!("[[zone]]\nname = \"zone-{z}\"\nclient_prefixes = [\"198.18.{z}.0/24\"]\n\n");
    }
    for svc in 0..SERVICES {
        s += &format!(
            "[[service]]\nname = \"web{svc}\"\nvip = \"198.18.200.{}\"\nprotocol = \"TCP\"\nports = [80]\n\
             [service.zonal_affinity]\nspillover = \"ZONAL_AFFINITY_SPILL_CROSS_ZONE\"\nspillover_ratio = 0.5\n\n",
            1 + svc
        );
        for z in 0..ZONES {
            for i in 0..PER_ZONE {
                s += &format!(
                    "[[service.backend]]\naddress = \"198.19.{}.{}\"\nzone = \"zone-{z}\"\n\n",
                    10 + z,
                    1 + svc * PER_ZONE + i
                );
            }
        }
    }
    s
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn reaction_time(cfg: &Config) -> Result<()> {
    let mut dp = Dataplane::load(lb_user::compile::sizes::sizes_for(cfg))?;
    let mut ctl = Controller::new(cfg.clone());
    let t = Instant::now();
    ctl.reconcile(&mut dp)?;
    println!(
        "  initial load: all {} tables written in {:.1} ms",
        SERVICES * (ZONES + 1),
        t.elapsed().as_secs_f64() * 1e3
    );
    let addr = "198.19.13.7".parse()?; // a zone-3 backend of web0
    let mut times = Vec::new();
    let mut tables = 0;
    for i in 0..CHANGES {
        ctl.set_checked("web0", addr, i % 2 == 1);
        let t = Instant::now();
        let report = ctl.reconcile(&mut dp)?;
        times.push(t.elapsed());
        tables += report.tables_written;
        if report.tables_written == 0 {
            bail!("a health change wrote no table");
        }
    }
    times.sort();
    println!(
        "  health change -> tables live (1,000 backends in 4 services, 10 zones, M=65537): median {:.2} ms, p99 {:.2} ms, max {:.2} ms ({} changes, {:.1} tables rewritten each)",
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.99).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3,
        CHANGES,
        tables as f64 / CHANGES as f64
    );
    scan_time(&mut dp)
}

/// Flow `i` of the filled connection tables: TCP to VIP 198.18.200.1:80 of `service`, 256 ports
/// per client address from 198.18.0.0.
fn flow_key(i: u32, service: u32) -> CtKey {
    let src = u32::from_ne_bytes(Ipv4Addr::from(0xc612_0000u32 + (i >> 8)).octets());
    let tuple = FlowTuple {
        src: [src, 0, 0, 0],
        dst: [u32::from_ne_bytes([198, 18, 200, 1]), 0, 0, 0],
        sport: ((i & 0xff) as u16 + 1024).to_be(),
        dport: 80u16.to_be(),
        proto: 6,
        _pad: [0; 3],
    };
    CtKey { tuple, service }
}

/// The daemon's scan for clean Maglev slots (`Dataplane::scan_clean_slots`) over a connection
/// table holding `CONNECTIONS` IPv4 flows of one service, against every table written above.
fn scan_time(dp: &mut Dataplane) -> Result<()> {
    for i in 0..CONNECTIONS {
        let backend = i % 250;
        let backend_gen = dp.backend(backend)?.generation;
        let entry = CtEntry { backend, backend_gen, last_seen_ns: dp.now_ns()?, hash: i, ..Default::default() };
        dp.conntrack_set(lb_common::maps::FAMILY_V4, &flow_key(i, 1), entry)?;
    }
    let mut times = Vec::new();
    let mut report = None;
    for _ in 0..5 {
        let t = Instant::now();
        report = Some(dp.scan_clean_slots()?);
        times.push(t.elapsed());
    }
    times.sort();
    let r = report.expect("five scans");
    println!(
        "  scan for clean Maglev slots: {} flows read, {} of {} slots dirty: median {:.0} ms, max {:.0} ms (5 scans; the \
         connection tables read through their mapping: {})",
        r.entries,
        r.dirty_slots,
        r.slots,
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        times.last().unwrap().as_secs_f64() * 1e3,
        dp.conntrack_mapped()
    );
    Ok(())
}

fn status_kib(pid: u32, field: &str) -> Result<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let line = text.lines().find(|l| l.starts_with(field)).with_context(|| format!("no {field}"))?;
    Ok(line.split_whitespace().nth(1).unwrap_or("0").parse()?)
}

fn daemon_memory(cfg_text: &str) -> Result<()> {
    let dir = std::path::PathBuf::from("/run/lb-cp-bench");
    let pins = std::path::PathBuf::from("/sys/fs/bpf/lb-cp-bench");
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&pins);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("lb.toml"), cfg_text)?;
    let lb = lb_tests::e2e::bin("lb");
    let mut child = std::process::Command::new(&lb)
        .args(["run", "--config"])
        .arg(dir.join("lb.toml"))
        .arg("--socket")
        .arg(dir.join("lb.sock"))
        .arg("--pin-dir")
        .arg(&pins)
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let result = (|| -> Result<()> {
        lb_tests::e2e::wait_for("the daemon's socket", Duration::from_secs(60), || {
            dir.join("lb.sock").exists().then_some(())
        })?;
        std::thread::sleep(Duration::from_millis(500));
        let before = status_kib(child.id(), "VmRSS:")?;
        // IPv4 flows: the CONNTRACK4 table.
        let data = aya::maps::MapData::from_pin(pins.join("CONNTRACK4"))?;
        let mut ct: aya::maps::Array<_, lb_common::ct_table::Bucket4> =
            aya::maps::Array::try_from(aya::maps::Map::Array(data))?;
        let seed = lb_user::dataplane::ct_seed(Some(&pins))?;
        for i in 0..CONNECTIONS {
            let key = flow_key(i, 0);
            let entry = CtEntry { backend: i % 250, last_seen_ns: 1, ..Default::default() };
            lb_user::dataplane::table_set(&mut ct, &CtKey4::new(&key.tuple, key.service), &entry, seed)?;
        }
        let after = status_kib(child.id(), "VmRSS:")?;
        let anon = status_kib(child.id(), "RssAnon:")?;
        let shmem = status_kib(child.id(), "RssFile:")? + status_kib(child.id(), "RssShmem:")?;
        let fdinfo = conntrack_memlock(&pins)?;
        println!(
            "  daemon resident memory with {} tracked connections: VmRSS {:.1} MiB (before filling: {:.1} MiB) = own heap (RssAnon) {:.1} MiB \
             + file-backed pages (RssFile+RssShmem: the binary and the mmapped TABLES map, kernel memory shared with the XDP program) {:.1} MiB; the connection table itself \
             is kernel memory: CONNTRACK4 (the IPv4 table) holds {:.1} MiB",
            CONNECTIONS,
            after as f64 / 1024.0,
            before as f64 / 1024.0,
            anon as f64 / 1024.0,
            shmem as f64 / 1024.0,
            fdinfo as f64 / (1024.0 * 1024.0)
        );
        Ok(())
    })();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&pins);
    result
}

/// Kernel memory charged to the pinned CONNTRACK map (`memlock` of its fdinfo).
fn conntrack_memlock(pins: &std::path::Path) -> Result<u64> {
    use std::os::fd::{AsFd, AsRawFd};
    let data = aya::maps::MapData::from_pin(pins.join("CONNTRACK4"))?;
    let fd = data.fd().as_fd().as_raw_fd();
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))?;
    let line = text.lines().find(|l| l.starts_with("memlock:")).context("no memlock in fdinfo")?;
    Ok(line.split_whitespace().nth(1).unwrap_or("0").parse()?)
}

fn main() -> Result<()> {
    let text = config();
    let cfg = Config::parse(&text)?;
    println!("Control plane:");
    reaction_time(&cfg)?;
    daemon_memory(&text)?;
    Ok(())
}
