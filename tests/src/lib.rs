//! Shared helpers of the integration tests: packet builders and checksums, data-plane fixtures
//! with a private namespace for `bpf_fib_lookup` (`fixture_net`), named network namespaces and
//! the end-to-end topology; DNS queries (`dns`); load for the reliability tests (`load`), and the
//! hostile-frame generator of the fuzz test (`fuzz`); the configuration reference read as data
//! (`config_doc`); 1,000 backends checked every second (`health_load`).

pub mod bgp;
pub mod config_doc;
pub mod dns;
pub mod e2e;
pub mod fixture;
pub mod fixture_net;
pub mod fuzz;
pub mod health_load;
pub mod live;
pub mod load;
pub mod netns;
pub mod next_hop;
pub mod packet;
pub mod pinned;
pub mod rawbpf;
pub mod topology;
