//! Endpoint monitoring (spec §2.3): the probe-result -> endpoint status state machine, the
//! profile status and the status a parent sees for a nested endpoint (§2.5). The resolved probe
//! settings are configuration (`config::monitor`), re-exported here.

pub use crate::config::monitor::*;
use crate::config::Service;
use crate::model::{AdminStatus, MonitorStatus, ProfileMonitorStatus};
use std::net::IpAddr;

/// The monitor status of one probed endpoint, driven by probe results.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointMonitor {
    tolerated_failures: u32,
    /// None until the first result arrives.
    consecutive_failures: Option<u32>,
}

impl EndpointMonitor {
    /// A new or just enabled endpoint: CheckingEndpoint until the first result.
    pub fn new(tolerated_failures: u32) -> Self {
        Self { tolerated_failures, consecutive_failures: None }
    }

    /// Records one probe result and returns the new status. Degraded on failure number
    /// tolerated+1; any success resets the count (and brings a Degraded endpoint back Online).
    /// Interpretation of "CheckingEndpoint until the first result": any first result ends it,
    /// and failures within the tolerance leave the endpoint Online (vector O3).
    pub fn record(&mut self, success: bool) -> MonitorStatus {
        let failures = self.consecutive_failures.unwrap_or(0);
        self.consecutive_failures = Some(if success { 0 } else { failures + 1 });
        self.status()
    }

    pub fn status(&self) -> MonitorStatus {
        match self.consecutive_failures {
            None => MonitorStatus::CheckingEndpoint,
            Some(n) if n > self.tolerated_failures => MonitorStatus::Degraded,
            Some(_) => MonitorStatus::Online,
        }
    }

    /// The endpoint was disabled and re-enabled (or the settings changed): start over.
    pub fn reset(&mut self) {
        self.consecutive_failures = None;
    }
}

/// Profile monitor status (spec §2.3), first matching rule wins. Unmonitored endpoints count
/// as Online (**[AMBIG]** the docs do not cover them).
pub fn profile_monitor_status(
    profile: AdminStatus,
    endpoints: impl IntoIterator<Item = MonitorStatus>,
) -> ProfileMonitorStatus {
    if profile == AdminStatus::Disabled {
        return ProfileMonitorStatus::Disabled;
    }
    let (mut degraded, mut online, mut checking) = (false, false, false);
    for s in endpoints {
        match s {
            MonitorStatus::Degraded => degraded = true,
            MonitorStatus::Online | MonitorStatus::Unmonitored => online = true,
            MonitorStatus::CheckingEndpoint => checking = true,
            _ => {}
        }
    }
    if degraded {
        ProfileMonitorStatus::Degraded
    } else if online {
        ProfileMonitorStatus::Online
    } else if checking {
        ProfileMonitorStatus::CheckingEndpoints
    } else {
        ProfileMonitorStatus::Inactive
    }
}

/// The status a parent sees for a nested endpoint (spec §2.5 table), given the child profile's
/// status and how many of its endpoints are Online (Unmonitored included) or CheckingEndpoint.
pub fn nested_endpoint_status(
    child: ProfileMonitorStatus,
    online: usize,
    checking: usize,
    min_child_endpoints: u32,
) -> MonitorStatus {
    let min = min_child_endpoints as usize;
    match child {
        ProfileMonitorStatus::Disabled | ProfileMonitorStatus::Inactive => MonitorStatus::Stopped,
        _ if online >= min => MonitorStatus::Online,
        _ if online + checking >= min => MonitorStatus::CheckingEndpoint,
        _ => MonitorStatus::Degraded,
    }
}

/// Whether endpoint `addr` of Traffic Manager service `svc` is Disabled, itself or by its
/// profile.
pub fn endpoint_disabled(svc: &Service, addr: IpAddr) -> bool {
    svc.profile_status() == AdminStatus::Disabled
        || svc.backends.iter().any(|b| b.has_address(addr) && b.endpoint_status() == AdminStatus::Disabled)
}

/// The addresses of Traffic Manager service `svc` its monitor probes, each with the profile's
/// settings and its endpoint's custom headers: none when the profile is Disabled; not those of
/// nested, alwaysServe or Disabled endpoints. An endpoint given by DNS name is probed at each
/// of its resolved addresses with its name as HTTP `Host` (and so TLS SNI), unless a custom
/// header sets another.
pub fn monitored_endpoints(svc: &Service) -> Vec<(IpAddr, MonitorSettings)> {
    if svc.profile_status() == AdminStatus::Disabled {
        return Vec::new();
    }
    let Some(settings) = svc.tm().and_then(|t| t.monitor.as_ref()) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for b in &svc.backends {
        let Some(t) = b.tm() else { continue };
        if t.always_serve || t.endpoint_status == AdminStatus::Disabled {
            continue;
        }
        let mut s = settings.for_endpoint(&t.custom_headers);
        if let Some(n) = b.name_target() {
            if !s.custom_headers.iter().any(|(h, _)| h.eq_ignore_ascii_case("host")) {
                s.custom_headers.insert(0, ("Host".to_owned(), n.name.to_string()));
            }
        }
        out.extend(b.addresses().iter().map(|a| (*a, s.clone())));
    }
    out
}
