//! Configurations that are large or deeply nested validate and compile with work that grows
//! polynomially: the tests count evaluations (never time them).

use lb_user::config::{Config, ConfigError, MAX_VIOLATIONS};

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
