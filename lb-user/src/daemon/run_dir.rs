//! The run directory under a running daemon: if someone removes it (or the control socket in
//! it, e.g. a tmpfiles clean-up), the daemon would be unreachable while it keeps forwarding.
//! The daemon's tick notices, logs and counts it, and binds the socket anew.

use super::faults::{self, Fault};
use super::{api, state};
use std::path::Path;
use tokio::net::UnixListener;

/// A new listener when the control socket at `socket` is gone; None while it is there, or
/// when recreating it failed (logged; tried again at the next tick).
pub fn recreate_if_gone(socket: &Path) -> Option<UnixListener> {
    if std::fs::symlink_metadata(socket).is_ok() {
        return None;
    }
    faults::count(Fault::SocketRecreated);
    let dir = socket.parent().unwrap_or(Path::new("/run/lb"));
    let dir_gone = !dir.exists();
    let bound = state::check_dir(dir).and_then(|()| api::bind(socket));
    match bound {
        Ok(listener) => {
            let with = if dir_gone { format!(" with its directory {}", dir.display()) } else { String::new() };
            tracing::error!(
                "the control socket {} was removed under the running daemon{with}; bound it again",
                socket.display()
            );
            Some(listener)
        }
        Err(e) => {
            tracing::error!(
                "the control socket {} was removed under the running daemon and cannot be created again: {e:#}",
                socket.display()
            );
            None
        }
    }
}
