//! The service manager's side of `lb run` under systemd (`Type=notify`, see
//! `packaging/lb.service`): READY=1 once the program is attached and the tables are written,
//! RELOADING=1 .. READY=1 around a SIGHUP reload, STOPPING=1, and watchdog pings from the
//! daemon's loop (so a stuck loop is restarted). Without `NOTIFY_SOCKET` (not started by
//! systemd) every call does nothing.

use sd_notify::NotifyState;
use std::time::Duration;

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify the service manager: {e}");
    }
}

/// Started (or reloaded): serving. `status` is shown by `systemctl status`.
pub fn ready(status: &str) {
    send(&[NotifyState::Ready, NotifyState::Status(status)]);
}

/// A reload starts (systemd shows the unit reloading until the next [`ready`]).
pub fn reloading() {
    match NotifyState::monotonic_usec_now() {
        Ok(now) => send(&[NotifyState::Reloading, now]),
        Err(_) => send(&[NotifyState::Reloading]),
    }
}

pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

pub fn watchdog() {
    send(&[NotifyState::Watchdog]);
}

/// How often the loop pings the watchdog: half of `WatchdogSec`, or None without a watchdog.
pub fn watchdog_interval() -> Option<Duration> {
    sd_notify::watchdog_enabled().map(|d| d / 2)
}
