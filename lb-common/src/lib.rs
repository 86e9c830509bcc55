//! Types and functions shared by the XDP program (`lb-ebpf`) and the controller (`lb-user`).
//!
//! Everything that both worlds compute lives here exactly once: the map layouts, the flow hash
//! and the Maglev slot function, so userspace can predict the kernel's choice bit for bit.
#![no_std]
// `ct_table`'s compiler barrier: inline asm on the BPF target (nightly only; the eBPF crate is
// built with nightly anyway).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

/// `aya::Pod` and `bytemuck::Pod` for `#[repr(C)]` map records without implicit padding
/// (the layout guards beside each type check the sizes).
#[cfg(feature = "user")]
macro_rules! pod {
    ($($t:ty),*) => {$(
        // SAFETY: `#[repr(C)]`, only integer fields and arrays of them, no implicit padding
        // (checked by the size assertions next to the type): every bit pattern is valid.
        unsafe impl aya::Pod for $t {}
        // SAFETY: as above; all zeroes is a valid value.
        unsafe impl bytemuck::Zeroable for $t {}
        // SAFETY: as above.
        unsafe impl bytemuck::Pod for $t {}
    )*};
}
#[cfg(feature = "user")]
pub(crate) use pod;

pub mod ct_table;
pub mod decide;
pub mod hash;
pub mod maps;
pub mod trace;
