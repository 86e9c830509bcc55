//! Shared helpers of the integration tests: packet builders, checksums, a private network
//! namespace with a known route and neighbour for `bpf_fib_lookup`, and data-plane fixtures.

pub mod fixture;
pub mod netns;
pub mod packet;
