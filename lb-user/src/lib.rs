//! The `lb` controller, laid out by layer; each layer uses only the ones above it in this list:
//!
//! - `model` (API enums) and `config` (TOML parse + validate): the vocabulary;
//! - `policy` (eligible sets, zonal affinity and Traffic Manager routing; pure);
//! - `compile` (config + health -> data-plane tables: ids, Maglev, table cache; pure);
//! - `controller` (desired state, diffed writes through the `Tables` trait);
//! - `daemon` (`lb run`: reconcile loop, control socket API, health checks, DNS front);
//! - `cli` (offline `plan`, human rendering, `decap`), on top, for `main.rs`.
//!
//! `rng` (a seeded generator) is neutral, used by `policy` and by `dataplane`'s tests.
//!
//! `dataplane` (BPF objects, maps, pinning) sits apart: it depends on `lb-common` and neutral
//! types only, never on policy, compile, controller or config; the controller drives it through
//! the `Tables` trait, which `dataplane` defines (with `Demand`, what a change needs, which
//! `compile` produces).

pub mod cli;
pub mod compile;
pub mod config;
pub mod controller;
pub mod daemon;
pub mod dataplane;
pub mod error;
pub mod model;
pub mod policy;
pub mod rng;
