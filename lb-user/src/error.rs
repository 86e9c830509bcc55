//! The failures a caller branches on, typed: an invalid configuration, a change that needs a
//! restart, an unreachable daemon, missing privileges. Each has an exit code of `lb` (scripts
//! and tests branch on the code, not on the message) and travels in the daemon's error replies
//! (`daemon::api::Response::kind`).

use serde::{Deserialize, Serialize};

/// What kind of failure an error is, when a caller may act on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// The configuration file fails to read, parse or validate ([`crate::config::ConfigError`]).
    InvalidConfig,
    /// The change is refused while the daemon runs; a restart applies it ([`NeedsRestart`]).
    NeedsRestart,
    /// No daemon answers on the control socket ([`CallError::Unreachable`]).
    DaemonUnreachable,
    /// The kernel refused for want of privileges ([`NotPermitted`]).
    NotPermitted,
}

impl ErrorKind {
    /// `lb`'s exit code for this kind (1 is any other failure, 2 a usage error).
    pub fn exit_code(self) -> u8 {
        match self {
            Self::InvalidConfig => 3,
            Self::NeedsRestart => 4,
            Self::DaemonUnreachable => 5,
            Self::NotPermitted => 6,
        }
    }

    /// The kind of `err`: the first typed failure in its chain of causes.
    pub fn of(err: &anyhow::Error) -> Option<Self> {
        // A context (`.context(NotPermitted(..))`) is found by downcasting the error itself.
        if err.downcast_ref::<NotPermitted>().is_some() {
            return Some(Self::NotPermitted);
        }
        if err.downcast_ref::<NeedsRestart>().is_some() {
            return Some(Self::NeedsRestart);
        }
        err.chain().find_map(|cause| {
            if cause.is::<crate::config::ConfigError>() {
                Some(Self::InvalidConfig)
            } else if cause.is::<NeedsRestart>() {
                Some(Self::NeedsRestart)
            } else if cause.is::<NotPermitted>() {
                Some(Self::NotPermitted)
            } else {
                cause.downcast_ref::<CallError>().and_then(|c| c.kind())
            }
        })
    }
}

/// Why a request to the daemon (`daemon::api::call`) failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("cannot reach the lb daemon at {}: {source} (is `lb run` running?)", socket.display())]
    Unreachable { socket: std::path::PathBuf, source: std::io::Error },
    /// The daemon answered with an error (`kind` when it is typed).
    #[error("{message}")]
    Refused { message: String, kind: Option<ErrorKind> },
}

impl CallError {
    pub fn kind(&self) -> Option<ErrorKind> {
        match self {
            Self::Unreachable { .. } => Some(ErrorKind::DaemonUnreachable),
            Self::Refused { kind, .. } => *kind,
        }
    }
}

/// A change that takes effect only on restart: refused by a running daemon, which keeps its
/// tables (the message says what and why).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NeedsRestart(pub String);

/// The kernel refused an operation for want of privileges (root, or CAP_BPF + CAP_NET_ADMIN).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotPermitted(pub String);
