//! Step 2.1 (spec §1.2): the service-wide eligible set, from health and the failover policy.

use super::{BackendState, EligibleKind, FailoverParams, Pool};

/// A row of the §1.2 decision table (on the wire by its id, "E-1".."E-9").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Rule {
    /// No FP, ≥1 backend healthy: all healthy backends.
    #[serde(rename = "E-1")]
    E1,
    /// No FP, none healthy: all backends (last resort).
    #[serde(rename = "E-2")]
    E2,
    /// FP, ≥1 healthy, 0 healthy primaries: healthy failover backends ("failover mode").
    #[serde(rename = "E-3")]
    E3,
    /// FP, ≥1 healthy, 0 healthy failover backends: healthy primaries ("failback mode").
    #[serde(rename = "E-4")]
    E4,
    /// FP, `failoverRatio == 0`: healthy primaries.
    #[serde(rename = "E-5")]
    E5,
    /// FP, healthy-primary ratio ≥ `failoverRatio`: healthy primaries.
    #[serde(rename = "E-6")]
    E6,
    /// FP, ratio < `failoverRatio`: healthy failover backends.
    #[serde(rename = "E-7")]
    E7,
    /// FP, none healthy, `dropTrafficIfUnhealthy`: drop.
    #[serde(rename = "E-8")]
    E8,
    /// FP, none healthy, no drop: all primaries (last resort).
    #[serde(rename = "E-9")]
    E9,
}

impl Rule {
    /// The spec's row id, e.g. "E-3".
    pub fn id(self) -> &'static str {
        match self {
            Self::E1 => "E-1",
            Self::E2 => "E-2",
            Self::E3 => "E-3",
            Self::E4 => "E-4",
            Self::E5 => "E-5",
            Self::E6 => "E-6",
            Self::E7 => "E-7",
            Self::E8 => "E-8",
            Self::E9 => "E-9",
        }
    }

    /// Why this row matched, in words.
    pub fn reason(self) -> &'static str {
        match self {
            Self::E1 => "no failover policy, at least one backend healthy",
            Self::E2 => "no failover policy, no backend healthy (last resort)",
            Self::E3 => "no healthy primary (failover mode)",
            Self::E4 => "no healthy failover backend (failback mode)",
            Self::E5 => "failover_ratio is 0 and a primary is healthy",
            Self::E6 => "healthy-primary ratio >= failover_ratio",
            Self::E7 => "healthy-primary ratio < failover_ratio",
            Self::E8 => "no healthy backend, drop_traffic_if_unhealthy",
            Self::E9 => "no healthy backend (last resort: all primaries)",
        }
    }

    pub fn kind(self) -> EligibleKind {
        match self {
            Self::E1 => EligibleKind::AllHealthy,
            Self::E2 => EligibleKind::AllBackends,
            Self::E3 | Self::E7 => EligibleKind::HealthyFailover,
            Self::E4 | Self::E5 | Self::E6 => EligibleKind::HealthyPrimary,
            Self::E8 => EligibleKind::Drop,
            Self::E9 => EligibleKind::AllPrimary,
        }
    }

    /// The active pool. E-8 has none; we report `Primary`, like E-9 in the same all-down state,
    /// so that the drop state is not a pool change of its own (entries survive it, §1.4: with no
    /// healthy backend existing connections are kept).
    pub fn pool(self) -> Pool {
        match self {
            Self::E1 | Self::E2 => Pool::All,
            Self::E3 | Self::E7 => Pool::Failover,
            Self::E4 | Self::E5 | Self::E6 | Self::E8 | Self::E9 => Pool::Primary,
        }
    }
}

/// The original eligible set of §1.2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BaseSet {
    pub rule: Rule,
    /// Indices into the service's backends, in config order.
    pub members: Vec<usize>,
}

impl BaseSet {
    pub fn kind(&self) -> EligibleKind {
        self.rule.kind()
    }

    pub fn pool(&self) -> Pool {
        self.rule.pool()
    }
}

/// Evaluate the decision table top-down; the first matching row wins.
pub fn base_set(failover: Option<&FailoverParams>, backends: &[BackendState]) -> BaseSet {
    let rule = match_rule(failover, backends);
    let pool = rule.pool();
    let members = match rule.kind() {
        EligibleKind::Drop => Vec::new(),
        EligibleKind::AllBackends | EligibleKind::AllPrimary => select(backends, |b| pool.contains(b)),
        EligibleKind::AllHealthy | EligibleKind::HealthyPrimary | EligibleKind::HealthyFailover => {
            select(backends, |b| b.healthy && pool.contains(b))
        }
    };
    BaseSet { rule, members }
}

fn match_rule(failover: Option<&FailoverParams>, backends: &[BackendState]) -> Rule {
    let any_healthy = backends.iter().any(|b| b.healthy);
    let Some(fp) = failover else {
        return if any_healthy { Rule::E1 } else { Rule::E2 };
    };
    if !any_healthy {
        return if fp.drop_traffic_if_unhealthy { Rule::E8 } else { Rule::E9 };
    }
    let primaries = backends.iter().filter(|b| !b.failover).count();
    let healthy_primaries = backends.iter().filter(|b| !b.failover && b.healthy).count();
    let healthy_failover = backends.iter().filter(|b| b.failover && b.healthy).count();
    if healthy_primaries == 0 {
        return Rule::E3;
    }
    if healthy_failover == 0 {
        return Rule::E4;
    }
    if fp.failover_ratio == 0.0 {
        return Rule::E5;
    }
    // `primaries > 0` here (a healthy primary exists). Division is correctly rounded, so a ratio
    // that equals the configured decimal (e.g. 2/4 vs 0.5) compares equal.
    let ratio = healthy_primaries as f64 / primaries as f64;
    // [AMBIG] sources disagree on "at or below" vs "less than": equality keeps the primaries.
    if ratio >= fp.failover_ratio {
        Rule::E6
    } else {
        Rule::E7
    }
}

fn select(backends: &[BackendState], keep: impl Fn(&BackendState) -> bool) -> Vec<usize> {
    backends.iter().enumerate().filter(|(_, b)| keep(b)).map(|(i, _)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(healthy: bool, failover: bool) -> BackendState {
        BackendState { zone: None, failover, healthy }
    }

    #[test]
    fn no_fp_ignores_failover_flag() {
        let set = base_set(None, &[b(true, false), b(true, true)]);
        assert_eq!(set.rule, Rule::E1);
        assert_eq!(set.members, vec![0, 1]);
    }

    #[test]
    fn e9_without_primaries_is_empty() {
        let fp = FailoverParams { failover_ratio: 0.0, drop_traffic_if_unhealthy: false };
        let set = base_set(Some(&fp), &[b(false, true)]);
        assert_eq!(set.rule, Rule::E9);
        assert!(set.members.is_empty());
    }

    #[test]
    fn ratio_one_needs_every_primary_healthy() {
        let fp = FailoverParams { failover_ratio: 1.0, drop_traffic_if_unhealthy: false };
        let all_up = base_set(Some(&fp), &[b(true, false), b(true, false), b(true, true)]);
        assert_eq!((all_up.rule, all_up.members), (Rule::E6, vec![0, 1]));
        let one_down = base_set(Some(&fp), &[b(true, false), b(false, false), b(true, true)]);
        assert_eq!((one_down.rule, one_down.members), (Rule::E7, vec![2]));
    }

    #[test]
    fn rule_table_is_consistent() {
        for r in [Rule::E1, Rule::E2, Rule::E3, Rule::E4, Rule::E5, Rule::E6, Rule::E7, Rule::E8, Rule::E9] {
            // Failover-mode rows use the failover pool, healthy-set rows are not last resorts.
            assert_eq!(r.pool() == Pool::Failover, r.kind() == EligibleKind::HealthyFailover, "{}", r.id());
            assert!(r.id().starts_with("E-"));
        }
    }
}
