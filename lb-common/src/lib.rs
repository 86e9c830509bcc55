//! Types and functions shared by the XDP program (`lb-ebpf`) and the controller (`lb-user`).
//!
//! Everything that both worlds compute lives here exactly once: the map layouts, the flow hash
//! and the Maglev slot function, so userspace can predict the kernel's choice bit for bit.
#![no_std]
// `ct_table`'s compiler barrier: inline asm on the BPF target (nightly only; the eBPF crate is
// built with nightly anyway).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

pub mod ct_table;
pub mod decide;
pub mod hash;
pub mod maps;
pub mod trace;
