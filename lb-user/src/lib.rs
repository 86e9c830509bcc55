//! The `lb` controller: configuration, backend-selection semantics, Maglev tables and the
//! data-plane writer. `model`, `config`, `policy` and `maglev` are pure Rust and know nothing of
//! BPF; `dataplane` knows nothing of policy, only of tables to write.

pub mod announce;
pub mod api;
pub mod compile;
pub mod config;
pub mod controller;
pub mod daemon;
pub mod decap;
pub mod dns;
pub mod dataplane;
pub mod explain;
pub mod health;
pub mod maglev;
pub mod model;
pub mod pinning;
pub mod plan;
pub mod policy;
pub mod render;
pub mod service_table;
pub mod tm;
