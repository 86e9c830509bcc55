//! The daemon's logs: `tracing` events on stderr, one per line, at the level `RUST_LOG` asks
//! (default `info`). Journald-friendly: no ANSI colours unless stderr is a terminal, and no
//! timestamps under systemd (`JOURNAL_STREAM` set: the journal stamps each line itself).
//!
//! Operator actions (override, drain, undrain, reload; accepted or refused) and health changes
//! are logged under the target `audit`, so `RUST_LOG=audit=info` (or a journal filter on the
//! `audit:` prefix) selects them.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// Installs the subscriber; a second call changes nothing.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(true);
    let _ = if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().try_init()
    } else {
        builder.try_init()
    };
}
