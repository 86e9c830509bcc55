//! The GCP vectors of spec §1.6 ("Eligible set" G1–G9, "Zonal affinity" Z1–Z17), one test each,
//! plus edge cases. Backends are written as in the spec: `name:zone:H|U[:P|F]` (zone `-` = none).

use lb_user::config::Config;
use lb_user::model::MonitorStatus;
use lb_user::model::Spillover::{self, Disabled, SpillCrossZone as Spill, StayWithinZone as Stay};
use lb_user::policy::tm::ProbeStatuses;
use lb_user::policy::{
    plan_config, plan_service, BackendState, EligibleKind, FailoverParams, Pool, Rule, ZonalOutcome, ZonalPlan,
    ZonalPolicy,
};

/// Every vector runs with the same client zones; "D" never has backends.
const ZONES: [&str; 6] = ["A", "B", "C", "D", "1", "2"];

fn zone_index(name: &str) -> usize {
    ZONES.iter().position(|z| *z == name).unwrap_or_else(|| panic!("unknown test zone {name}"))
}

/// Parse "a1:A:H b1:B:U:F" into names and states.
fn parse_backends(spec: &str) -> (Vec<String>, Vec<BackendState>) {
    spec.split_whitespace()
        .map(|tok| {
            let f: Vec<&str> = tok.split(':').collect();
            assert!(f.len() == 3 || f.len() == 4, "bad backend {tok}");
            let zone = if f[1] == "-" { None } else { Some(zone_index(f[1])) };
            let healthy = match f[2] {
                "H" => true,
                "U" => false,
                x => panic!("bad health {x} in {tok}"),
            };
            let failover = match f.get(3) {
                None | Some(&"P") => false,
                Some(&"F") => true,
                Some(x) => panic!("bad role {x} in {tok}"),
            };
            (f[0].to_string(), BackendState { zone, failover, healthy })
        })
        .unzip()
}

fn no_fp() -> Option<FailoverParams> {
    None
}
fn fp(failover_ratio: f64) -> Option<FailoverParams> {
    Some(FailoverParams { failover_ratio, drop_traffic_if_unhealthy: false })
}
fn fp_drop(failover_ratio: f64) -> Option<FailoverParams> {
    Some(FailoverParams { failover_ratio, drop_traffic_if_unhealthy: true })
}

fn plan(failover: Option<FailoverParams>, spill: (Spillover, f64), spec: &str) -> (Vec<String>, ZonalPlan) {
    let (names, backends) = parse_backends(spec);
    let policy = ZonalPolicy::new(failover, spill.0, spill.1);
    (names, plan_service(&policy, &backends, ZONES.len()))
}

fn names_of(names: &[String], idx: &[usize]) -> Vec<String> {
    idx.iter().map(|&i| names[i].clone()).collect()
}

/// Check one vector: base kind and rule, and the class of `client` (`None` = non-compatible).
#[allow(clippy::too_many_arguments)]
fn check(
    failover: Option<FailoverParams>,
    spill: (Spillover, f64),
    spec: &str,
    kind: EligibleKind,
    rule: Rule,
    client: Option<&str>,
    outcome: ZonalOutcome,
    expected: &str,
) {
    let (names, plan) = plan(failover, spill, spec);
    assert_eq!((plan.kind, plan.rule), (kind, rule), "eligible kind / rule");
    // Shape: one class per zone in order, then the non-compatible class.
    let class_zones: Vec<Option<usize>> = plan.classes.iter().map(|c| c.client_zone).collect();
    let mut want_zones: Vec<Option<usize>> = (0..ZONES.len()).map(Some).collect();
    want_zones.push(None);
    assert_eq!(class_zones, want_zones, "class order");

    let class = plan.classes.iter().find(|c| c.client_zone == client.map(zone_index)).expect("client class present");
    let expected: Vec<String> = expected.split_whitespace().map(String::from).collect();
    assert_eq!(names_of(&names, &class.eligible), expected, "eligible set");
    assert_eq!(class.outcome, outcome, "zonal outcome");

    // With zonal affinity disabled every class sees the original set unchanged.
    if spill.0 == Disabled {
        for c in &plan.classes {
            assert_eq!((c.outcome, &c.eligible), (ZonalOutcome::Disabled, &class.eligible));
        }
    }
}

macro_rules! vectors {
    ($($id:ident: $fp:expr, $spill:expr, $backends:literal => $kind:ident $rule:ident,
       client $client:expr, $outcome:ident $expected:literal;)*) => {$(
        #[test]
        fn $id() {
            check($fp, $spill, $backends, EligibleKind::$kind, Rule::$rule, $client,
                  ZonalOutcome::$outcome, $expected);
        }
    )*};
}

const OFF: (Spillover, f64) = (Disabled, 0.0);
const STAY: (Spillover, f64) = (Stay, 0.0);
const A: Option<&str> = Some("A");
const VPN: Option<&str> = None;

// §1.6 "Eligible set", zonal affinity DISABLED (client in zone A).
vectors! {
    g1_e1_no_fp_some_healthy: no_fp(), OFF, "a1:A:H b1:B:U"
        => AllHealthy E1, client A, Disabled "a1";
    g2_e2_no_fp_none_healthy: no_fp(), OFF, "a1:A:U b1:B:U"
        => AllBackends E2, client A, Disabled "a1 b1";
    g3_e3_failover_mode: fp(0.5), OFF, "p1:A:U:P p2:B:U:P f1:C:H:F f2:C:U:F"
        => HealthyFailover E3, client A, Disabled "f1";
    g4_e4_failback_no_healthy_failover: fp(0.75),  OFF,
        "p1:A:H:P p2:B:U:P p3:B:U:P p4:B:U:P f1:C:U:F f2:C:U:F"
        => HealthyPrimary E4, client A, Disabled "p1";
    g5_e5_ratio_zero: fp(0.0), OFF, "p1:A:H:P p2:A:U:P f1:C:H:F"
        => HealthyPrimary E5, client A, Disabled "p1";
    g6_e6_equality_keeps_primaries: fp(0.5), OFF, "p1:A:H:P p2:B:U:P f1:C:H:F"
        => HealthyPrimary E6, client A, Disabled "p1";
    g7_e7_below_ratio: fp(0.75), OFF, "p1:A:H:P p2:A:H:P p3:B:U:P p4:B:U:P f1:C:H:F f2:C:H:F"
        => HealthyFailover E7, client A, Disabled "f1 f2";
    g8_e8_drop: fp_drop(0.0), OFF, "p1:A:U:P p2:B:U:P f1:C:U:F"
        => Drop E8, client A, Disabled "";
    g9_e9_all_primaries: fp(0.0), OFF, "p1:A:U:P p2:A:U:P f1:C:U:F"
        => AllPrimary E9, client A, Disabled "p1 p2";
}

// §1.6 "Zonal affinity" (client VM in zone A unless noted).
vectors! {
    z1_disabled: no_fp(), OFF, "a1:A:H b1:B:H"
        => AllHealthy E1, client A, Disabled "a1 b1";
    z2_stay_refine: no_fp(), STAY, "a1:A:H a2:A:U b1:B:H"
        => AllHealthy E1, client A, Refined "a1";
    z3_stay_replace: no_fp(), STAY, "a1:A:U a2:A:U b1:B:H"
        => AllHealthy E1, client A, Replaced "a1 a2";
    z4_stay_all_down_refine: no_fp(), STAY, "a1:A:U b1:B:U"
        => AllBackends E2, client A, Refined "a1";
    z5_stay_failback_replace_ignores_failover: fp(0.0), STAY, "pa:A:U:P pb:B:H:P fa:A:H:F"
        => HealthyPrimary E5, client A, Replaced "pa";
    z6_stay_failover_replace: fp(0.0), STAY, "pb1:B:U:P pb2:B:U:P fa:A:U:F fb:B:H:F"
        => HealthyFailover E3, client A, Replaced "fa";
    z7_stay_all_down_all_primaries: fp(0.0), STAY, "pa:A:U:P pb:B:U:P fb:B:U:F"
        => AllPrimary E9, client A, Refined "pa";
    z8_stay_no_primary_in_zone: fp(0.0), STAY, "pb:B:H:P pc:C:H:P fa:A:H:F"
        => HealthyPrimary E5, client A, NoZonalMatch "pb pc";
    z9_stay_client_via_vpn: no_fp(), STAY, "a1:A:H b1:B:H"
        => AllHealthy E1, client VPN, NotCompatible "a1 b1";
    z10_spill0_refine: no_fp(), (Spill, 0.0), "a1:A:H a2:A:U b1:B:H"
        => AllHealthy E1, client A, Refined "a1";
    z11_spill0_zone_down_spills: no_fp(), (Spill, 0.0), "a1:A:U b1:B:H b2:B:H"
        => AllHealthy E1, client A, Unchanged "b1 b2";
    z12_spill0_last_resort_unchanged: no_fp(), (Spill, 0.0), "a1:A:U b1:B:U"
        => AllBackends E2, client A, Unchanged "a1 b1";
    z13a_spill08_zone1_refine: no_fp(), (Spill, 0.8),
        "z1-1:1:H z1-2:1:H z1-3:1:H z1-4:1:H z1-5:1:H z2-1:2:H z2-2:2:H z2-3:2:H z2-4:2:U z2-5:2:U"
        => AllHealthy E1, client Some("1"), Refined "z1-1 z1-2 z1-3 z1-4 z1-5";
    z13b_spill08_zone2_unchanged: no_fp(), (Spill, 0.8),
        "z1-1:1:H z1-2:1:H z1-3:1:H z1-4:1:H z1-5:1:H z2-1:2:H z2-2:2:H z2-3:2:H z2-4:2:U z2-5:2:U"
        => AllHealthy E1, client Some("2"),
           Unchanged "z1-1 z1-2 z1-3 z1-4 z1-5 z2-1 z2-2 z2-3";
    z14_spill1_not_all_healthy: no_fp(), (Spill, 1.0), "a1:A:H a2:A:U b1:B:H"
        => AllHealthy E1, client A, Unchanged "a1 b1";
    z15_spill05_failback_refine: fp(0.0), (Spill, 0.5), "pa1:A:H:P pa2:A:U:P pb:B:H:P fa:A:H:F"
        => HealthyPrimary E5, client A, Refined "pa1";
    z16_spill05_failover_unchanged: fp(0.0), (Spill, 0.5),
        "pa:A:U:P fa1:A:H:F fa2:A:U:F fa3:A:U:F fb:B:H:F"
        => HealthyFailover E3, client A, Unchanged "fa1 fb";
    z17_spill03_all_down_unchanged: fp(0.0), (Spill, 0.3), "pa:A:U:P pb:B:U:P"
        => AllPrimary E9, client A, Unchanged "pa pb";
}

// Edge cases beyond the spec table.
vectors! {
    edge_spill1_every_zone_backend_healthy_refines: no_fp(), (Spill, 1.0), "a1:A:H a2:A:H b1:B:H"
        => AllHealthy E1, client A, Refined "a1 a2";
    edge_spill_ratio_exact_equality_refines: no_fp(), (Spill, 0.5), "a1:A:H a2:A:U b1:B:H"
        => AllHealthy E1, client A, Refined "a1";
    edge_zone_without_backends_no_zonal_match: no_fp(), STAY, "a1:A:H b1:B:U"
        => AllHealthy E1, client Some("D"), NoZonalMatch "a1";
    edge_zoneless_backend_kept_out_of_refine: no_fp(), STAY, "a1:A:H n1:-:H"
        => AllHealthy E1, client A, Refined "a1";
    edge_zoneless_backend_kept_without_match: no_fp(), STAY, "a1:A:H n1:-:H"
        => AllHealthy E1, client Some("B"), NoZonalMatch "a1 n1";
    edge_drop_is_not_replaced: fp_drop(0.0), STAY, "pa:A:U:P fa:A:U:F"
        => Drop E8, client A, Unchanged "";
    edge_disabled_beats_not_compatible: no_fp(), OFF, "a1:A:H"
        => AllHealthy E1, client VPN, Disabled "a1";
    edge_spill_not_compatible: fp(0.0), (Spill, 0.0), "pa:A:H:P pb:B:H:P fa:A:H:F"
        => HealthyPrimary E5, client VPN, NotCompatible "pa pb";
    edge_stay_failover_zone_has_only_primaries: fp(0.0), STAY, "pa:A:U:P fb:B:H:F"
        => HealthyFailover E3, client A, NoZonalMatch "fb";
    edge_no_fp_failover_flag_ignored: no_fp(), STAY, "a1:A:H:F b1:B:H"
        => AllHealthy E1, client A, Refined "a1";
}

#[test]
fn active_pool_follows_the_rule() {
    let pool = |failover, spec| plan(failover, OFF, spec).1.active_pool;
    assert_eq!(pool(no_fp(), "a1:A:H"), Pool::All);
    assert_eq!(pool(no_fp(), "a1:A:U"), Pool::All);
    assert_eq!(pool(fp(0.5), "p1:A:U:P f1:C:H:F"), Pool::Failover); // E-3
    assert_eq!(pool(fp(0.75), "p1:A:H:P p2:A:U:P f1:C:H:F"), Pool::Failover); // E-7
    assert_eq!(pool(fp(0.5), "p1:A:H:P p2:A:U:P f1:C:H:F"), Pool::Primary); // E-6
    assert_eq!(pool(fp(0.0), "p1:A:U:P f1:C:U:F"), Pool::Primary); // E-9
}

#[test]
fn plan_config_maps_zones_failover_and_health() {
    let cfg = Config::parse(
        r#"
        [[zone]]
        name = "zone-a"
        client_prefixes = ["198.18.1.0/24"]
        [[zone]]
        name = "zone-b"
        client_prefixes = ["198.18.2.0/24"]

        [[service]]
        name = "web"
        vip = "198.18.0.100"
        protocol = "TCP"
        [service.zonal_affinity]
        spillover = "ZONAL_AFFINITY_STAY_WITHIN_ZONE"
        [service.failover_policy]
        failover_ratio = 0.5
        [[service.backend]]
        address = "198.18.1.10"
        zone = "zone-a"
        [[service.backend]]
        address = "198.18.2.10"
        zone = "zone-b"
        [[service.backend]]
        address = "198.18.2.20"
        zone = "zone-b"
        failover = true

        [[service]]
        name = "dns"
        vip = "198.18.0.53"
        protocol = "UDP"
        [[service.backend]]
        address = "198.18.1.53"
        zone = "zone-a"
        "#,
    )
    .expect("valid config");
    // web: primary in zone-a down, so 1/2 primaries healthy = ratio 0.5 → E-6, primaries.
    let probes = ProbeStatuses::new(&cfg, MonitorStatus::Online);
    let plans = plan_config(&cfg, &|s, b| !(s == 0 && b == 0), &probes);
    assert_eq!(plans.len(), 2);
    let web = plans[0].zonal().expect("a zonal service");
    assert_eq!((web.kind, web.rule, web.active_pool), (EligibleKind::HealthyPrimary, Rule::E6, Pool::Primary));
    let classes: Vec<_> = web.classes.iter().map(|c| (c.client_zone, c.outcome, c.eligible.clone())).collect();
    assert_eq!(
        classes,
        vec![
            (Some(0), ZonalOutcome::Replaced, vec![0]),
            (Some(1), ZonalOutcome::Refined, vec![1]),
            (None, ZonalOutcome::NotCompatible, vec![1]),
        ]
    );
    let dns = plans[1].zonal().expect("a zonal service");
    assert_eq!((dns.kind, dns.active_pool), (EligibleKind::AllHealthy, Pool::All));
    assert!(dns.classes.iter().all(|c| c.outcome == ZonalOutcome::Disabled && c.eligible == vec![0]));
}
