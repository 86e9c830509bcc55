//! A Traffic Manager profile's monitor settings (spec §2.3), resolved from `[service.monitor]`
//! with defaults and limits, and the custom headers' syntax. Validation and the health checker
//! share them; the status state machine is policy (`policy::tm::monitor`).

use crate::config::raw::Monitor;
use crate::model::MonitorProtocol;

/// The only probing intervals Traffic Manager offers: normal (30 s) and fast (10 s).
pub const ALLOWED_INTERVALS_SEC: [u32; 2] = [30, 10];
pub const MIN_TIMEOUT_SEC: u32 = 5;
pub const MAX_TOLERATED_FAILURES: u32 = 9;
pub const DEFAULT_TOLERATED_FAILURES: u32 = 3;
pub const MAX_STATUS_RANGES: usize = 8;
pub const MAX_CUSTOM_HEADERS: usize = 8;

/// Longest allowed probe timeout for an interval: 10 s at 30 s, 9 s at 10 s. It is also the
/// default timeout.
pub fn max_timeout_sec(interval_sec: u32) -> u32 {
    if interval_sec == 10 {
        9
    } else {
        10
    }
}

/// `[service.monitor]` with every default applied.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonitorSettings {
    pub protocol: MonitorProtocol,
    pub port: u16,
    /// HTTP/HTTPS only.
    pub path: Option<String>,
    pub interval_sec: u32,
    pub timeout_sec: u32,
    pub tolerated_failures: u32,
    /// Inclusive status ranges counting as success (HTTP/HTTPS); default 200 only.
    pub expected_status: Vec<(u16, u16)>,
    pub custom_headers: Vec<(String, String)>,
}

/// One broken monitor rule: (field under `monitor.`, problem).
pub type MonitorProblem = (&'static str, String);

/// `"200-299"` or `"200"`, codes 100..=599, min <= max.
pub fn parse_status_range(text: &str) -> Result<(u16, u16), String> {
    let code = |s: &str| -> Result<u16, String> {
        match s.trim().parse::<u16>() {
            Ok(c) if (100..=599).contains(&c) => Ok(c),
            _ => Err(format!("{text:?} is not a status range: expected \"min-max\" or a code, codes in 100..=599")),
        }
    };
    let (min, max) = match text.split_once('-') {
        Some((a, b)) => (code(a)?, code(b)?),
        None => {
            let c = code(text)?;
            (c, c)
        }
    };
    if min > max {
        return Err(format!("{text:?}: min must not be above max"));
    }
    Ok((min, max))
}

impl MonitorSettings {
    /// Resolves defaults and checks every rule of spec §2.3; all problems are reported.
    pub fn from_config(m: &Monitor) -> Result<MonitorSettings, Vec<MonitorProblem>> {
        let mut problems: Vec<MonitorProblem> = Vec::new();
        let http = m.protocol != MonitorProtocol::Tcp;
        let port = match m.port {
            Some(p) if p != 0 => p,
            Some(_) => {
                problems.push(("port", "0 is not allowed: ports are 1..=65535".into()));
                0
            }
            None => {
                problems.push(("port", "required: the port to probe, 1..=65535".into()));
                0
            }
        };
        match (&m.path, http) {
            (Some(_), false) => {
                problems.push(("path", format!("not allowed with protocol = {}: remove it", MonitorProtocol::Tcp)))
            }
            (None, true) => {
                problems.push(("path", format!("required with protocol = {}: the probed path, e.g. \"/\"", m.protocol)))
            }
            (Some(p), true) if !p.starts_with('/') => problems.push(("path", format!("{p:?} must start with '/'"))),
            (Some(p), true) if !p.bytes().all(|c| c.is_ascii_graphic()) => problems.push((
                "path",
                format!(
                    "{p:?} contains a space, control character (CR, LF, ...) or non-ASCII byte: \
                     allowed printable ASCII only (percent-encode the rest, e.g. %20)"
                ),
            )),
            _ => {}
        }
        let interval_ok = ALLOWED_INTERVALS_SEC.contains(&m.interval_sec);
        if !interval_ok {
            problems
                .push(("interval_sec", format!("{} is not allowed: allowed 30 (normal) or 10 (fast)", m.interval_sec)));
        }
        let max_timeout = max_timeout_sec(m.interval_sec);
        let timeout_sec = m.timeout_sec.unwrap_or(max_timeout);
        if interval_ok && !(MIN_TIMEOUT_SEC..=max_timeout).contains(&timeout_sec) {
            problems.push((
                "timeout_sec",
                format!(
                    "{timeout_sec} is out of range for interval_sec = {}: allowed \
                     {MIN_TIMEOUT_SEC}..={max_timeout} (default {max_timeout})",
                    m.interval_sec
                ),
            ));
        }
        if m.tolerated_failures > MAX_TOLERATED_FAILURES {
            problems.push((
                "tolerated_failures",
                format!(
                    "{} is out of range: allowed 0..={MAX_TOLERATED_FAILURES} (default \
                     {DEFAULT_TOLERATED_FAILURES})",
                    m.tolerated_failures
                ),
            ));
        }
        let mut expected_status = Vec::new();
        if !m.expected_status_ranges.is_empty() && !http {
            problems.push((
                "expected_status_ranges",
                format!("only allowed with protocol = HTTP or HTTPS (here {})", m.protocol),
            ));
        } else if m.expected_status_ranges.len() > MAX_STATUS_RANGES {
            problems.push((
                "expected_status_ranges",
                format!("{} ranges given: at most {MAX_STATUS_RANGES}", m.expected_status_ranges.len()),
            ));
        } else {
            for text in &m.expected_status_ranges {
                match parse_status_range(text) {
                    Ok(r) => expected_status.push(r),
                    Err(e) => problems.push(("expected_status_ranges", e)),
                }
            }
        }
        if expected_status.is_empty() {
            expected_status.push((200, 200));
        }
        let mut custom_headers = Vec::new();
        if !m.custom_headers.is_empty() && !http {
            problems
                .push(("custom_headers", format!("only allowed with protocol = HTTP or HTTPS (here {})", m.protocol)));
        } else if m.custom_headers.len() > MAX_CUSTOM_HEADERS {
            problems.push((
                "custom_headers",
                format!("{} headers given: at most {MAX_CUSTOM_HEADERS}", m.custom_headers.len()),
            ));
        } else {
            match parse_custom_headers(&m.custom_headers) {
                Ok(h) => custom_headers = h,
                Err(e) => problems.push(("custom_headers", e)),
            }
        }
        if problems.is_empty() {
            Ok(MonitorSettings {
                protocol: m.protocol,
                port,
                path: m.path.clone(),
                interval_sec: m.interval_sec,
                timeout_sec,
                tolerated_failures: m.tolerated_failures,
                expected_status,
                custom_headers,
            })
        } else {
            Err(problems)
        }
    }

    /// These settings for one endpoint: its own `custom_headers` (already validated) added,
    /// replacing a profile header of the same name (spec §2.3: "endpoint wins").
    pub fn for_endpoint(&self, endpoint_headers: &[(String, String)]) -> MonitorSettings {
        let mut s = self.clone();
        s.custom_headers.retain(|(n, _)| !endpoint_headers.iter().any(|(e, _)| e.eq_ignore_ascii_case(n)));
        s.custom_headers.extend(endpoint_headers.iter().cloned());
        s
    }

    /// Whether one probe succeeded. HTTP(S): a status in the expected ranges within the
    /// timeout (so 301/302 fail by default); TCP: the connection was accepted in time.
    pub fn probe_succeeded(&self, outcome: ProbeOutcome) -> bool {
        match (outcome, self.protocol) {
            (ProbeOutcome::Failed, _) => false,
            (ProbeOutcome::Connected, MonitorProtocol::Tcp) => true,
            (ProbeOutcome::Connected, _) => false,
            // A TCP probe only needs the handshake; a response proves it.
            (ProbeOutcome::HttpStatus(_), MonitorProtocol::Tcp) => true,
            (ProbeOutcome::HttpStatus(code), _) => {
                self.expected_status.iter().any(|&(lo, hi)| (lo..=hi).contains(&code))
            }
        }
    }
}

/// What one probe observed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Timeout, refused or reset.
    Failed,
    /// TCP handshake completed within the timeout.
    Connected,
    /// HTTP(S) response status received within the timeout.
    HttpStatus(u16),
}

/// `custom_headers` entries ("name:value", at most [`MAX_CUSTOM_HEADERS`]) as pairs.
pub fn parse_custom_headers(list: &[String]) -> Result<Vec<(String, String)>, String> {
    if list.len() > MAX_CUSTOM_HEADERS {
        return Err(format!("{} headers given: at most {MAX_CUSTOM_HEADERS}", list.len()));
    }
    list.iter()
        .map(|h| match h.split_once(':') {
            Some((name, value)) if !name.trim().is_empty() => Ok((name.trim().to_string(), value.trim().to_string())),
            _ => Err(format!("{h:?} is malformed: expected \"name:value\"")),
        })
        .collect()
}
