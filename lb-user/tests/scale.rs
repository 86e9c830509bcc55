//! Configurations that are large or deeply nested validate and compile with work that grows
//! polynomially: the tests count evaluations (never time them).

use lb_user::compile::{compile, Ids};
use lb_user::config::{Config, ConfigError, MAX_VIOLATIONS};
use lb_user::model::MonitorStatus;
use lb_user::policy::tm::{eligible, Client, ProbeStatuses, Statuses};

/// `levels` levels of four WEIGHTED services; each nests all four of the next level, the last
/// level has two leaf endpoints each.
fn nested_tree(levels: usize) -> String {
    let mut text = String::new();
    for level in 0..levels {
        for k in 0..4 {
            let s = level * 4 + k;
            text.push_str(&format!(
                "\n[[service]]\nname = \"l{level}s{k}\"\nvip = \"198.18.0.{}\"\nprotocol = \"TCP\"\n\
                 ports = [80]\nrouting_method = \"WEIGHTED\"\n",
                s + 1
            ));
            if level + 1 < levels {
                for c in 0..4 {
                    text.push_str(&format!(
                        "\n[[service.backend]]\nname = \"n{c}\"\ntarget_service = \"l{}s{c}\"\n",
                        level + 1
                    ));
                }
            } else {
                for b in 1..=2 {
                    text.push_str(&format!("\n[[service.backend]]\naddress = \"198.19.{s}.{b}\"\n"));
                }
            }
        }
    }
    text
}

#[test]
fn forty_services_nesting_four_children_each_evaluate_each_status_once() {
    // 10 levels: 4^9 paths from a top service to each bottom one.
    let cfg = Config::parse(&nested_tree(10)).expect("a valid tree of 40 services");
    let probes = ProbeStatuses::new(&cfg, MonitorStatus::Online);
    let st = Statuses::new(&cfg, &probes);
    assert_eq!(st.endpoint_status(0, 0), MonitorStatus::Online);
    let set = eligible(&st, 0, &Client::default());
    assert_eq!(set.backends.len(), 8, "{:?}", set.backends);
    assert!(set.backends.iter().all(|b| b.weight == 1));
    // Per service: its endpoints' statuses for each record type, its profile status and one
    // selection step: a few hundred evaluations, where the unmemoized recursion makes ~8^9.
    assert!(st.work() <= 40 * (4 * 3 + 2), "{} evaluations", st.work());
    assert!(set.reason.len() < 40 * 200, "reason of {} bytes", set.reason.len());
    // The whole configuration compiles (every service, with its own view).
    let compiled = compile(&cfg, &|_, _| true, &mut Ids::default()).expect("compiles");
    assert_eq!(compiled.services.len(), 40);
}

/// `n` services with distinct names on one VIP and port.
fn same_listener(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "\n[[service]]\nname = \"s{i}\"\nvip = \"198.18.0.1\"\nprotocol = \"TCP\"\nports = [80]\n\
                 [[service.backend]]\naddress = \"198.18.1.1\"\n"
            )
        })
        .collect()
}

#[test]
fn two_thousand_services_on_one_listener_give_one_message() {
    let err = Config::parse(&same_listener(2000)).expect_err("clash");
    let v = err.downcast_ref::<ConfigError>().expect("ConfigError").violations();
    assert_eq!(v.len(), 1, "{err}");
    assert_eq!(v[0].service(), Some("s1"));
    assert_eq!(v[0].field, "ports[0]");
    for needle in ["service \"s0\"", "2000 services on 198.18.0.1", "\"s7\" and 1992 more", "reported once"] {
        assert!(v[0].problem.contains(needle), "{needle:?} missing: {}", v[0].problem);
    }
}

#[test]
fn separate_clash_groups_are_reported_once_each() {
    // Two groups on one VIP (ports 80 and 443) and one pair on another VIP.
    let mut text = same_listener(5);
    text.push_str(&same_listener(3).replace("name = \"s", "name = \"t").replace("[80]", "[443]"));
    text.push_str(&same_listener(2).replace("name = \"s", "name = \"u").replace("198.18.0.1\"", "198.18.0.2\""));
    let err = Config::parse(&text).expect_err("clashes");
    let v = err.downcast_ref::<ConfigError>().expect("ConfigError").violations();
    let on: Vec<&str> = v.iter().filter_map(|v| v.service()).collect();
    assert_eq!(on, ["s1", "t1", "u1"], "{err}");
}

#[test]
fn violations_are_capped_with_a_count_of_the_rest() {
    // 3,000 services with an empty name each: one violation apiece, capped.
    let text: String = (0..3000)
        .map(|i| {
            format!(
                "\n[[service]]\nname = \"\"\nvip = \"198.18.{}.{}\"\nprotocol = \"TCP\"\nports = [80]\n\
                 [[service.backend]]\naddress = \"198.19.0.1\"\n",
                i / 200,
                i % 200 + 1
            )
        })
        .collect();
    let err = Config::parse(&text).expect_err("empty names");
    let v = err.downcast_ref::<ConfigError>().expect("ConfigError").violations();
    assert_eq!(v.len(), MAX_VIOLATIONS + 1, "{err}");
    let last = err.to_string().lines().last().unwrap().to_string();
    assert!(last.contains("2900 more problems not listed"), "{last}");
}
