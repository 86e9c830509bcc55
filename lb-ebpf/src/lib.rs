//! What the XDP objects share: protocol constants, bounds-checked packet access and the
//! counters record. No map and no program: each binary of this crate is one object that
//! holds only its own programs and maps.
#![no_std]

pub mod consts;
pub mod counters;
pub mod packet;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
