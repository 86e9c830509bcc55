//! Shared helpers of the integration tests: packet builders, fixtures, namespace topology.
