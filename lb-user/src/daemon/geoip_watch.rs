//! Notices when `[dns] geoip_database` is rewritten (a new GeoLite2 release dropped in place)
//! and asks for a reload, which reads the configuration and the database again: a good file is
//! taken, a bad one refused with the database in use kept (logged and counted like any refused
//! reload). Checked at every tick of the daemon's loop.

use crate::config::geoip::{stamp_of, Stamp};
use crate::config::Config;

/// The database stamp the last reload was asked for, so that a bad file is tried once, not at
/// every tick.
#[derive(Default)]
pub struct GeoIpWatch {
    asked: Option<Stamp>,
}

impl GeoIpWatch {
    /// Whether the running configuration's database file changed since it was read (and no
    /// reload was asked for this version of it yet).
    pub fn changed(&mut self, cfg: &Config) -> bool {
        let Some(db) = &cfg.geoip else { return false };
        let Some(now) = stamp_of(&db.path) else { return false };
        if now == db.stamp || self.asked == Some(now) {
            return false;
        }
        tracing::info!("the GeoIP database {} changed: reloading", db.path.display());
        self.asked = Some(now);
        true
    }
}
