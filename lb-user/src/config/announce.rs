//! `[announce]`: which routes tell a routing daemon (BIRD) that this host serves its VIPs.
//!
//! The daemon puts a host route for every VIP it can serve into a dedicated kernel routing
//! table, through a TUN device that only lives as long as the daemon's process (see
//! `crate::daemon::announce`). BIRD imports that table (`protocol kernel { kernel table N; learn; }`)
//! and announces the routes over BGP.

use super::error::Scope;
use super::error::{Report, Sink};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Default kernel routing table of the VIP routes.
pub const DEFAULT_TABLE: u32 = 100;
/// Default name of the daemon's TUN device.
pub const DEFAULT_DEVICE: &str = "lb-vips";
/// Default grace period of a host drain: forwarding continues this long after the withdrawal.
pub const DEFAULT_DRAIN_GRACE_SEC: u32 = 10;
/// Longest allowed grace period (like `connection_draining.draining_timeout_sec`).
pub const MAX_DRAIN_GRACE_SEC: u32 = 3600;
/// Tables the kernel itself uses: unspec (0), default (253), main (254), local (255).
const RESERVED_TABLES: [u32; 4] = [0, 253, 254, 255];

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Announce {
    /// Kernel routing table the VIP routes go into; no `ip rule` should point at it (the host
    /// itself must not route by it), only the routing daemon reads it.
    pub table: u32,
    /// Name of the TUN device the routes point through (at most 15 bytes).
    pub device: String,
    /// Announce a VIP only while one of its services has a healthy, undrained backend.
    pub require_healthy_backend: bool,
    /// `lb backend drain --host`: seconds between the withdrawal and the stop.
    pub drain_grace_sec: u32,
}

impl Default for Announce {
    fn default() -> Self {
        Self {
            table: DEFAULT_TABLE,
            device: DEFAULT_DEVICE.to_owned(),
            require_healthy_backend: true,
            drain_grace_sec: DEFAULT_DRAIN_GRACE_SEC,
        }
    }
}

/// Whether `name` is a usable interface name (the kernel's `dev_valid_name`).
fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < libc::IFNAMSIZ
        && name != "."
        && name != ".."
        && !name.bytes().any(|b| b == b'/' || b == b':' || b.is_ascii_whitespace() || b == 0)
}

pub(super) fn check(a: &Announce, out: &mut Sink) {
    let mut r = Report { out, scope: Scope::Announce };
    let mut push = |field: &str, problem: String| r.push(field, problem);
    if RESERVED_TABLES.contains(&a.table) {
        push(
            "announce.table",
            format!("{} is not allowed: must be a table of its own, in [1, 252] or [256, 4294967295]", a.table),
        );
    }
    if !valid_ifname(&a.device) {
        push(
            "announce.device",
            format!(
                "{:?} is not allowed: must be an interface name of 1 to 15 bytes without '/', ':' or spaces",
                a.device
            ),
        );
    }
    if a.drain_grace_sec > MAX_DRAIN_GRACE_SEC {
        push(
            "announce.drain_grace_sec",
            format!("{} is not allowed: must be in [0, {MAX_DRAIN_GRACE_SEC}]", a.drain_grace_sec),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{Config, ConfigErrorKind};

    fn violations(text: &str) -> Vec<String> {
        match Config::parse_text(text) {
            Ok(_) => Vec::new(),
            Err(ConfigErrorKind::Invalid(v)) => v.iter().map(|v| v.to_string()).collect(),
            Err(other) => panic!("not a validation error: {other:?}"),
        }
    }

    #[test]
    fn defaults_and_absent_section() {
        assert_eq!(Config::parse("").unwrap().announce, None);
        let a = Config::parse("[announce]\n").unwrap().announce.unwrap();
        assert_eq!(
            (a.table, a.device.as_str(), a.require_healthy_backend, a.drain_grace_sec),
            (100, "lb-vips", true, 10)
        );
    }

    #[test]
    fn rejects_reserved_tables_bad_devices_and_long_grace() {
        assert_eq!(
            violations("[announce]\ntable = 254\n"),
            ["announce.table: 254 is not allowed: must be a table of its own, in [1, 252] or [256, 4294967295]"]
        );
        assert_eq!(violations("[announce]\ntable = 0\n").len(), 1);
        assert!(violations("[announce]\ntable = 1000\n").is_empty());
        for bad in ["", "a-name-that-is-too-long", "a/b", "a b", "vip:0"] {
            let v = violations(&format!("[announce]\ndevice = {bad:?}\n"));
            assert!(v.len() == 1 && v[0].starts_with("announce.device"), "{bad:?}: {v:?}");
        }
        assert!(violations("[announce]\ndevice = \"lb-vips0123456\"\n").is_empty());
        assert!(violations("[announce]\ndrain_grace_sec = 3601\n")[0].starts_with("announce.drain_grace_sec"));
    }

    #[test]
    fn unknown_keys_are_syntax_errors() {
        assert!(matches!(Config::parse_text("[announce]\ntabel = 7\n"), Err(ConfigErrorKind::Syntax(_))));
    }
}
