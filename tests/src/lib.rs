//! Shared helpers of the integration tests: network namespaces and the end-to-end topology.

pub mod netns;
pub mod topology;
