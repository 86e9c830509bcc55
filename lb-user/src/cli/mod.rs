//! The command line's work beyond argument parsing (`main.rs` is clap only): offline `plan` and
//! `validate`, human rendering of the daemon's answers, `decap`, `backend-host`, and the
//! control-socket round trip.

pub mod backend_host;
pub mod config_schema;
pub mod decap;
pub mod explain;
pub mod flows;
pub mod manpages;
pub mod plan;
pub mod render;
pub mod trace;
pub mod unload;
pub mod validate;

use crate::daemon::api::{self, Request};
use std::path::Path;

/// A multi-threaded runtime for the daemon.
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

/// Send a request to the daemon; print its reply `T` (see `daemon::reply`) as JSON or through
/// `human`.
pub fn call<T: serde::Serialize + serde::de::DeserializeOwned>(
    socket: &Path,
    json: bool,
    req: Request,
    human: fn(&T) -> String,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let value: T = rt.block_on(api::call(socket, &req))?;
    print(json, &value, human)
}

/// Print `value` as JSON or through `human`: the form of every answer, from a daemon or offline.
pub fn print<T: serde::Serialize>(json: bool, value: &T, human: fn(&T) -> String) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        print!("{}", human(value));
    }
    Ok(())
}
