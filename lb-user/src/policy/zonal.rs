//! Step 2.2 (spec §1.5): zonal affinity, the GCP routing method. Client classes are the
//! configured zones (config order) followed by the non-compatible class (clients outside every
//! zone prefix, e.g. via VPN/Interconnect or from another region).

use super::{BackendState, BaseSet, ClassPlan, EligibleKind, SpillArithmetic, ZonalOutcome, ZonalParams};
use crate::model::Spillover;

/// One class per zone `0..zones`, then the non-compatible class (`client_zone: None`).
pub fn plan_classes(params: &ZonalParams, base: &BaseSet, backends: &[BackendState], zones: usize) -> Vec<ClassPlan> {
    (0..zones)
        .map(Some)
        .chain(std::iter::once(None))
        .map(|client_zone| plan_class(params, base, backends, client_zone))
        .collect()
}

/// The eligible set of clients in `client_zone` (`None` = non-compatible client).
pub fn plan_class(
    params: &ZonalParams,
    base: &BaseSet,
    backends: &[BackendState],
    client_zone: Option<usize>,
) -> ClassPlan {
    let unchanged = |outcome| ClassPlan { client_zone, outcome, eligible: base.members.clone(), spill: None };

    // Gate, in the spec's order: option enabled, compatible client, zonal match.
    let stay_within_zone = match params.spillover {
        Spillover::Disabled => return unchanged(ZonalOutcome::Disabled),
        Spillover::StayWithinZone => true,
        Spillover::SpillCrossZone => false,
    };
    let Some(zone) = client_zone else {
        return unchanged(ZonalOutcome::NotCompatible);
    };
    // E-8 drops new connections before step 2.2 runs (§1.1), so there is nothing to refine or
    // replace: zonal affinity leaves the (empty) set as it is.
    if base.kind() == EligibleKind::Drop {
        return unchanged(ZonalOutcome::Unchanged);
    }
    // K: configured backends of the relevant kind (= the active pool) in the client zone, any
    // health.
    let pool = base.pool();
    let relevant_in_zone: Vec<usize> =
        (0..backends.len()).filter(|&i| backends[i].zone == Some(zone) && pool.contains(&backends[i])).collect();
    if relevant_in_zone.is_empty() {
        return unchanged(ZonalOutcome::NoZonalMatch);
    }
    // Z: eligible backends in the client zone.
    let eligible_in_zone: Vec<usize> =
        base.members.iter().copied().filter(|&i| backends[i].zone == Some(zone)).collect();
    let refined =
        || ClassPlan { client_zone, outcome: ZonalOutcome::Refined, eligible: eligible_in_zone.clone(), spill: None };

    if stay_within_zone {
        if !eligible_in_zone.is_empty() {
            return refined();
        }
        // Z = ∅ only happens for a healthy set, so every backend of K is unhealthy; the filter
        // keeps that explicit.
        let eligible = relevant_in_zone.into_iter().filter(|&i| !backends[i].healthy).collect();
        return ClassPlan { client_zone, outcome: ZonalOutcome::Replaced, eligible, spill: None };
    }
    // SPILL_CROSS_ZONE. Last-resort sets (all backends / all primaries) are never refined.
    if !base.kind().is_healthy_set() || eligible_in_zone.is_empty() {
        return unchanged(ZonalOutcome::Unchanged);
    }
    if params.spillover_ratio == 0.0 {
        return refined();
    }
    // r = |healthy ∩ Z| / |K|; Z is a healthy set here, so |healthy ∩ Z| = |Z|. Division is
    // correctly rounded, so e.g. 4/5 compares equal to a configured 0.8.
    let healthy_in_zone = eligible_in_zone.iter().filter(|&&i| backends[i].healthy).count();
    let r = healthy_in_zone as f64 / relevant_in_zone.len() as f64;
    let spill = Some(SpillArithmetic { healthy_in_zone, relevant_in_zone: relevant_in_zone.len() });
    let outcome = if r >= params.spillover_ratio { refined() } else { unchanged(ZonalOutcome::Unchanged) };
    ClassPlan { spill, ..outcome }
}
