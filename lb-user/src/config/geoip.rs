//! `[dns] geoip_database`: a MaxMind DB (GeoLite2/GeoIP2 Country or City) that locates clients
//! for GEOGRAPHIC routing where no `[[geo]]` prefix does (the prefixes win where given). Read
//! with the `maxminddb` crate when the configuration is loaded (start, SIGHUP, `lb reload`, and
//! when the file changes: `daemon::geoip_watch`); a file that cannot be read or is not a MaxMind
//! DB refuses the configuration, so a reload keeps the database in use.
//!
//! A record's location is the most specific code of the built-in hierarchy it names: the
//! country's ISO code with its first subdivision ("US-CA", "GB-SCT") where the hierarchy has
//! that state, else the country ("IE"). A country the hierarchy does not know locates nobody.

use super::regions::RegionTree;
use ipnet::IpNet;
use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

/// A file's modification time and length: what tells a rewritten file.
pub type Stamp = (Option<std::time::SystemTime>, u64);

/// `path`'s stamp now (None if it cannot be read).
pub fn stamp_of(path: &Path) -> Option<Stamp> {
    std::fs::metadata(path).ok().map(|m| (m.modified().ok(), m.len()))
}

/// The most a database may take (GeoLite2-City is about 60 MiB).
pub const MAX_DATABASE_BYTES: u64 = 256 << 20;

/// A loaded database: the reader for single lookups (DNS queries) and every network with the
/// region it locates (the data plane's client classes are built from them).
pub struct GeoIp {
    pub path: PathBuf,
    /// `database_type` and `build_epoch` of the file's metadata (status, logs, comparisons).
    pub database_type: String,
    pub build_epoch: u64,
    /// The file's modification time and length when it was read (`daemon::geoip_watch`).
    pub stamp: Stamp,
    /// Networks that locate a client, with the region code, in the database's order.
    pub networks: Vec<(IpNet, String)>,
    reader: maxminddb::Reader<Vec<u8>>,
}

/// The fields of a Country or City record that locate a client.
#[derive(Deserialize)]
struct Record {
    #[serde(default)]
    country: Option<Iso>,
    #[serde(default)]
    subdivisions: Vec<Iso>,
}

#[derive(Deserialize)]
struct Iso {
    #[serde(default)]
    iso_code: Option<String>,
}

/// Where a database located one address: the network that matched and the record's codes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Located {
    pub network: IpNet,
    pub region: String,
    pub country: String,
    pub subdivision: Option<String>,
}

impl Record {
    /// The most specific region of the hierarchy the record names.
    fn locate(&self) -> Option<(String, String, Option<String>)> {
        let country = self.country.as_ref()?.iso_code.clone()?;
        let subdivision = self.subdivisions.first().and_then(|s| s.iso_code.clone());
        let tree = RegionTree::builtin();
        let state = subdivision.as_ref().map(|s| format!("{country}-{s}")).filter(|code| tree.contains(code));
        let region = state.or_else(|| tree.contains(&country).then(|| country.clone()))?;
        Some((region, country, subdivision))
    }
}

impl GeoIp {
    /// Reads and indexes the database at `path`; the error says what is wrong with it.
    pub fn load(path: &Path) -> Result<GeoIp, String> {
        let meta = std::fs::metadata(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        if !meta.is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        if meta.len() > MAX_DATABASE_BYTES {
            return Err(format!("{} is {} bytes, above the limit of {MAX_DATABASE_BYTES}", path.display(), meta.len()));
        }
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let reader = maxminddb::Reader::from_source(bytes)
            .map_err(|e| format!("{} is not a MaxMind DB: {e}", path.display()))?;
        let mut networks = Vec::new();
        let all = reader.networks(Default::default()).map_err(|e| format!("{}: {e}", path.display()))?;
        for item in all {
            let item = item.map_err(|e| format!("{}: {e}", path.display()))?;
            let network = item.network().map_err(|e| format!("{}: {e}", path.display()))?;
            let Some(record) = item.decode::<Record>().map_err(|e| format!("{}: {e}", path.display()))? else {
                continue;
            };
            let Some((region, _, _)) = record.locate() else { continue };
            let net: IpNet =
                network.to_string().parse().map_err(|e| format!("{}: network {network}: {e}", path.display()))?;
            networks.push((net.trunc(), region));
        }
        Ok(GeoIp {
            path: path.to_path_buf(),
            database_type: reader.metadata().database_type.clone(),
            build_epoch: reader.metadata().build_epoch,
            stamp: (meta.modified().ok(), meta.len()),
            networks,
            reader,
        })
    }

    /// The region of `addr`, and what in the database said so.
    pub fn locate(&self, addr: IpAddr) -> Option<Located> {
        let found = self.reader.lookup(addr).ok()?;
        let record = found.decode::<Record>().ok()??;
        let (region, country, subdivision) = record.locate()?;
        let network: IpNet = found.network().ok()?.to_string().parse().ok()?;
        Some(Located { network: network.trunc(), region, country, subdivision })
    }
}

impl std::fmt::Debug for GeoIp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GeoIp")
            .field("path", &self.path)
            .field("database_type", &self.database_type)
            .field("build_epoch", &self.build_epoch)
            .field("networks", &self.networks.len())
            .finish()
    }
}

/// Two loads are the same database when they hold the same networks (a rewritten file with the
/// same content changes nothing).
impl PartialEq for GeoIp {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.build_epoch == other.build_epoch && self.networks == other.networks
    }
}
