//! Tiny XDP programs written as raw BPF instructions and loaded with the `bpf` syscall, for the
//! live-traffic bench (`live_bench`): a frame generator run with `BPF_PROG_TEST_RUN` in
//! live-frames mode, an XDP_DROP sink and an XDP_PASS program. Each is a dozen instructions, so
//! they need no object file of their own (the eBPF crate's objects are the balancer's). Also
//! plain array maps and pins, for maps as an older version left them.

use anyhow::{bail, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const BPF_MAP_CREATE: i64 = 0;
const BPF_OBJ_PIN: i64 = 6;
const BPF_OBJ_GET: i64 = 7;
const BPF_PROG_GET_FD_BY_ID: i64 = 13;
const BPF_OBJ_GET_INFO_BY_FD: i64 = 15;
const BPF_PROG_LOAD: i64 = 5;
const BPF_PROG_TEST_RUN: i64 = 10;
const BPF_LINK_CREATE: i64 = 28;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_XDP: u32 = 6;
const BPF_XDP: u32 = 37;
/// `BPF_PROG_TEST_RUN` sends the frames for real: XDP_TX goes out of the ingress device.
const BPF_F_TEST_XDP_LIVE_FRAMES: u32 = 1 << 1;

pub const XDP_DROP: i32 = 1;
pub const XDP_PASS: i32 = 2;
pub const XDP_TX: i32 = 3;

/// One BPF instruction.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct Insn {
    code: u8,
    regs: u8,
    off: i16,
    imm: i32,
}

impl Insn {
    /// The same instruction with another offset (a jump patched once its target is known).
    pub fn with_off(self, off: i16) -> Insn {
        Insn { off, ..self }
    }
}

pub fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn { code, regs: dst | (src << 4), off, imm }
}

/// Opcodes used by the programs here (classes, operations and sources of the BPF ISA).
pub mod op {
    pub const ADD_K: u8 = 0x07;
    pub const ADD_X: u8 = 0x0f;
    pub const SUB_X: u8 = 0x1f;
    pub const DIV_K: u8 = 0x37;
    pub const AND_K: u8 = 0x57;
    pub const MOD_K: u8 = 0x97;
    pub const MOV_K: u8 = 0xb7;
    pub const MOV_X: u8 = 0xbf;
    /// Byte swap to big endian (imm: width in bits).
    pub const TO_BE: u8 = 0xdc;
    pub const LDX_W: u8 = 0x61;
    pub const LDX_H: u8 = 0x69;
    pub const LDX_DW: u8 = 0x79;
    pub const STX_H: u8 = 0x6b;
    pub const STX_DW: u8 = 0x7b;
    pub const ST_W: u8 = 0x62;
    pub const ST_H: u8 = 0x6a;
    pub const LD_IMM64: u8 = 0x18;
    pub const JEQ_K: u8 = 0x15;
    pub const JNE_K: u8 = 0x55;
    pub const JGT_X: u8 = 0x2d;
    pub const CALL: u8 = 0x85;
    pub const EXIT: u8 = 0x95;
}

/// `r0 = verdict; exit`.
pub fn constant(verdict: i32) -> Vec<Insn> {
    vec![insn(op::MOV_K, 0, 0, 0, verdict), insn(op::EXIT, 0, 0, 0, 0)]
}

/// The trivial XDP forwarder (the live bench's floor): an Ethernet frame carrying IPv4 gets
/// destination MAC `dst` and source MAC `src` and is redirected to `ifindex`; anything else
/// passes.
pub fn forwarder(dst: [u8; 6], src: [u8; 6], ifindex: u32) -> Vec<Insn> {
    let w = |b: &[u8]| i32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    let h = |b: &[u8]| i32::from(u16::from_le_bytes([b[0], b[1]]));
    vec![
        insn(op::LDX_W, 2, 1, 0, 0), // data
        insn(op::LDX_W, 3, 1, 4, 0), // data_end
        insn(op::MOV_X, 4, 2, 0, 0),
        insn(op::ADD_K, 4, 0, 0, 14),
        insn(op::JGT_X, 4, 3, 10, 0),           // -> pass
        insn(op::LDX_H, 5, 2, 12, 0),           // ethertype, network order
        insn(op::JNE_K, 5, 0, 8, 0x0008),       // not IPv4 -> pass
        insn(op::ST_W, 2, 0, 0, w(&dst[0..4])), // destination MAC
        insn(op::ST_H, 2, 0, 4, h(&dst[4..6])),
        insn(op::ST_H, 2, 0, 6, h(&src[0..2])), // source MAC
        insn(op::ST_W, 2, 0, 8, w(&src[2..6])),
        insn(op::MOV_K, 1, 0, 0, ifindex as i32),
        insn(op::MOV_K, 2, 0, 0, 0),
        insn(op::CALL, 0, 0, 0, 23), // bpf_redirect
        insn(op::EXIT, 0, 0, 0, 0),
        insn(op::MOV_K, 0, 0, 0, XDP_PASS), // pass
        insn(op::EXIT, 0, 0, 0, 0),
    ]
}

fn bpf(cmd: i64, attr: &mut [u64]) -> std::io::Result<i64> {
    // SAFETY: attr is a zero-padded bpf_attr of the layout `cmd` expects, alive for the call.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
}

fn fd(rc: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor to us.
    unsafe { OwnedFd::from_raw_fd(rc as i32) }
}

/// A one-entry array map of a u64 (the generator's packet counter).
pub fn counter_map() -> Result<OwnedFd> {
    array_map(8, 1, 0)
}

/// An array map of `max_entries` values of `value_size` bytes, with `map_flags`.
pub fn array_map(value_size: u32, max_entries: u32, map_flags: u32) -> Result<OwnedFd> {
    let mut attr = [0u64; 16];
    // map_type, key_size, value_size, max_entries, map_flags
    attr[0] = BPF_MAP_TYPE_ARRAY as u64 | 4 << 32;
    attr[1] = value_size as u64 | (max_entries as u64) << 32;
    attr[2] = map_flags as u64;
    Ok(fd(bpf(BPF_MAP_CREATE, &mut attr).map_err(|e| anyhow::anyhow!("creating a BPF array map: {e}"))?))
}

/// Pins `map` at `path` (on a bpffs).
pub fn pin(map: &OwnedFd, path: &std::path::Path) -> Result<()> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    let mut attr = [0u64; 16];
    // pathname, bpf_fd
    attr[0] = c.as_ptr() as u64;
    attr[1] = map.as_raw_fd() as u64;
    bpf(BPF_OBJ_PIN, &mut attr).map_err(|e| anyhow::anyhow!("pinning at {}: {e}", path.display()))?;
    Ok(())
}

/// Load an XDP program; the verifier's log is in the error.
pub fn load_xdp(insns: &[Insn]) -> Result<OwnedFd> {
    let license = c"GPL";
    let mut log = vec![0u8; 1 << 16];
    let mut attr = [0u64; 16];
    attr[0] = BPF_PROG_TYPE_XDP as u64 | (insns.len() as u64) << 32;
    attr[1] = insns.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    // log_level 1, log_size
    attr[3] = 1 | (log.len() as u64) << 32;
    attr[4] = log.as_mut_ptr() as u64;
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Ok(rc) => Ok(fd(rc)),
        Err(e) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            bail!("loading an XDP program: {e}\n{}", String::from_utf8_lossy(&log[..end]))
        }
    }
}

/// Attach `prog` to the interface `ifindex` of the calling thread's namespace (native mode,
/// a BPF link: detached when the returned descriptor closes or the interface goes away).
pub fn attach_xdp(prog: &OwnedFd, ifindex: u32) -> Result<OwnedFd> {
    let mut attr = [0u64; 8];
    // prog_fd, target_ifindex, attach_type, flags
    attr[0] = prog.as_raw_fd() as u64 | (ifindex as u64) << 32;
    attr[1] = BPF_XDP as u64;
    Ok(fd(bpf(BPF_LINK_CREATE, &mut attr).map_err(|e| anyhow::anyhow!("attaching XDP to ifindex {ifindex}: {e}"))?))
}

/// Run `prog` `repeat` times on `frame` in live-frames mode, as if received on `ifindex` (of the
/// calling thread's namespace): what it returns XDP_TX for is sent out of that device.
pub fn run_live(prog: &OwnedFd, frame: &[u8], ifindex: u32, repeat: u32) -> Result<()> {
    // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex
    let ctx: [u32; 6] = [0, frame.len() as u32, 0, ifindex, 0, 0];
    let mut attr = [0u64; 10];
    // prog_fd, retval | data_size_in, data_size_out | data_in | data_out
    attr[0] = prog.as_raw_fd() as u64;
    attr[1] = frame.len() as u64;
    attr[2] = frame.as_ptr() as u64;
    // repeat, duration | ctx_size_in, ctx_size_out | ctx_in | ctx_out | flags, cpu | batch_size
    attr[4] = repeat as u64;
    attr[5] = std::mem::size_of_val(&ctx) as u64;
    attr[6] = ctx.as_ptr() as u64;
    attr[8] = BPF_F_TEST_XDP_LIVE_FRAMES as u64;
    bpf(BPF_PROG_TEST_RUN, &mut attr).map_err(|e| anyhow::anyhow!("BPF_PROG_TEST_RUN (live frames): {e}"))?;
    Ok(())
}

/// The program attached through the bpf_link pinned at `link_pin` (a running daemon's: the
/// program with the daemon's own maps).
pub fn prog_of_pinned_link(link_pin: &std::path::Path) -> Result<OwnedFd> {
    let path = std::ffi::CString::new(link_pin.as_os_str().as_encoded_bytes())?;
    let mut attr = [0u64; 3];
    attr[0] = path.as_ptr() as u64;
    let link = fd(bpf(BPF_OBJ_GET, &mut attr).map_err(|e| anyhow::anyhow!("opening {}: {e}", link_pin.display()))?);
    // struct bpf_link_info: type, id, prog_id, ...
    let mut info = [0u32; 4];
    let mut attr = [0u64; 2];
    attr[0] = link.as_raw_fd() as u64 | (std::mem::size_of_val(&info) as u64) << 32;
    attr[1] = info.as_mut_ptr() as u64;
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr).map_err(|e| anyhow::anyhow!("reading the link's info: {e}"))?;
    let mut attr = [0u64; 2];
    attr[0] = info[2] as u64;
    Ok(fd(bpf(BPF_PROG_GET_FD_BY_ID, &mut attr).map_err(|e| anyhow::anyhow!("opening program {}: {e}", info[2]))?))
}

/// Runs `prog` once on `frame` as if received on `ifindex` (of the calling thread's
/// namespace), without sending anything; returns the XDP action.
pub fn run_once(prog: &OwnedFd, frame: &[u8], ifindex: u32) -> Result<i32> {
    let ctx: [u32; 6] = [0, frame.len() as u32, 0, ifindex, 0, 0];
    let mut attr = [0u64; 10];
    attr[0] = prog.as_raw_fd() as u64;
    attr[1] = frame.len() as u64;
    attr[2] = frame.as_ptr() as u64;
    attr[4] = 1;
    attr[5] = std::mem::size_of_val(&ctx) as u64;
    attr[6] = ctx.as_ptr() as u64;
    bpf(BPF_PROG_TEST_RUN, &mut attr).map_err(|e| anyhow::anyhow!("BPF_PROG_TEST_RUN: {e}"))?;
    Ok((attr[0] >> 32) as i32)
}

/// The instruction pair that loads the address of map `map` into `dst`.
pub fn ld_map(dst: u8, map: &OwnedFd) -> [Insn; 2] {
    [insn(op::LD_IMM64, dst, 1, 0, map.as_raw_fd()), insn(0, 0, 0, 0, 0)]
}
