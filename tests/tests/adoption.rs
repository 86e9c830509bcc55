//! A daemon that adopts its predecessor's pinned data plane starts without a picture of what
//! that one wrote. Before its first reconcile it sweeps what only the previous configuration
//! had (`Dataplane::sweep_unowned`: keys and VIPs, prefixes, tables), so that nothing stale
//! stays live and the new configuration finds the room it needs; after it, the backends its
//! configuration no longer has drain like ones a reload removes (`depart_unused_backends`).

use lb_common::maps::backend_flags;
use lb_user::compile::sizes::sizes_for;
use lb_user::config::Config;
use lb_user::controller::{Controller, PersistentState};
use lb_user::dataplane::{Dataplane, DataplaneSizes};

/// Services on their own VIPs (service `i`'s backends are 198.18.1i.1, .2, ... up to
/// `backends`), one zone of `prefixes` client prefixes in 198.19+`set`.x.y, installed for each.
fn config(services: &[&str], backends: usize, prefixes: usize, set: u8) -> String {
    let list: Vec<String> = (0..prefixes).map(|i| format!("\"198.{}.{}.{}/32\"", 19 + set, i / 250, i % 250)).collect();
    let mut text = format!("[[zone]]\nname = \"z\"\nclient_prefixes = [{}]\n", list.join(", "));
    for (i, name) in services.iter().enumerate() {
        text += &format!(
            "[[service]]\nname = \"{name}\"\nvip = \"198.18.0.{}\"\nprotocol = \"TCP\"\nports = [80]\n\
             [service.connection_draining]\ndraining_timeout_sec = 300\n",
            100 + i
        );
        for b in 1..=backends {
            text += &format!("[[service.backend]]\naddress = \"198.18.1{i}.{b}\"\nzone = \"z\"\n");
        }
    }
    text
}

/// What `lb run` does on adopted pins: restore, depart what left, sweep, reconcile.
fn restart(
    pins: &std::path::Path,
    sizes: DataplaneSizes,
    cfg: &str,
    state: &PersistentState,
) -> (Dataplane, Controller, (usize, usize, usize, usize), u64) {
    let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load_with(sizes, Some(pins)).unwrap());
    let mut ctl = Controller::new(Config::parse(cfg).unwrap());
    ctl.restore(state);
    let now = dp.now_ns().unwrap();
    ctl.depart_unconfigured(now);
    let next = ctl.preview(now).unwrap();
    let (keys, prefixes, tables) = dp.sweep_unowned(&next.demand(None)).unwrap();
    ctl.reconcile(&mut dp).expect("the configuration fits the data plane it is written to");
    let backends =
        dp.depart_unused_backends(&ctl.applied().unwrap().demand(None), now, &|id| ctl.drain_ns_of(id)).unwrap();
    (dp, ctl, (keys, prefixes, tables, backends), now)
}

#[test]
fn an_adopting_daemon_keeps_what_it_configures_and_removes_the_rest() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let pins = lb_tests::fixture::PinDir::new("adopt");
    // 550 prefixes for each of two services: 1100 installed, more than half of CLIENT_CLASS.
    let both = config(&["web", "api"], 2, 550, 0);
    let sizes = sizes_for(&Config::parse(&both).unwrap());
    let state = {
        let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load_with(sizes, Some(pins.path())).unwrap());
        let mut ctl = Controller::new(Config::parse(&both).unwrap());
        ctl.reconcile(&mut dp).unwrap();
        assert_eq!(dp.installed_services().len(), 2);
        ctl.persistent_state()
    };
    // The same configuration: nothing to sweep, and the installed prefixes are not counted twice.
    let (dp, ctl, swept, _) = restart(pins.path(), sizes, &both, &state);
    assert_eq!(swept, (0, 0, 0, 0));
    let state = ctl.persistent_state();
    drop(dp);
    // Every prefix replaced by another (1100 new ones; old and new would not fit together).
    let replaced = config(&["web", "api"], 2, 550, 1);
    assert_eq!(sizes_for(&Config::parse(&replaced).unwrap()), sizes, "same sizes: the pins are adopted");
    let (dp, ctl, swept, _) = restart(pins.path(), sizes, &replaced, &state);
    assert_eq!(swept, (0, 1100, 0, 0), "the old prefixes are swept before the new ones go in");
    let state = ctl.persistent_state();
    drop(dp);
    // Only web, with one backend: api's key, prefixes and tables go; its backends and web's
    // second one drain for their service's 300 s (api is gone: no drain), ids kept meanwhile.
    let web = config(&["web"], 1, 550, 1);
    assert_eq!(sizes_for(&Config::parse(&web).unwrap()), sizes);
    let (dp, ctl, swept, now) = restart(pins.path(), sizes, &web, &state);
    let applied = ctl.applied().unwrap();
    assert_eq!(swept, (1, 550, 2, 3));
    let installed = dp.installed_services();
    assert_eq!((installed.len(), installed[0].1.id), (1, applied.services[0].id), "web's key stays");
    let api_id = state.ids.services.iter().find(|(n, _)| n == "api").unwrap().1;
    assert!(dp.read_table(api_id, 0).unwrap().is_none(), "api's tables are inactive");
    let id_of = |addr: &str| state.ids.backends.iter().find(|(k, _)| k.address.to_string() == addr).unwrap().1;
    let web2 = dp.backend(id_of("198.18.10.2")).unwrap();
    assert_eq!(
        (web2.flags & backend_flags::REMOVED, web2.drain_deadline_ns),
        (backend_flags::REMOVED, now + 300_000_000_000),
        "web's removed backend drains"
    );
    let api1 = dp.backend(id_of("198.18.11.1")).unwrap();
    assert_eq!(
        (api1.flags & backend_flags::REMOVED, api1.drain_deadline_ns),
        (backend_flags::REMOVED, now),
        "a removed service's backends do not"
    );
    assert_eq!(applied.backends.len(), 1);
    drop(dp);
    lb_user::dataplane::pinning::remove_map_pins(pins.path()).unwrap();
}

/// `::ffff:198.19.0.0/112` and `198.19.0.0/16` are one trie key: read back after a restart, the
/// prefix is the same one the configuration names, not a stale one to sweep.
#[test]
fn an_ipv4_mapped_prefix_survives_adoption() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let pins = lb_tests::fixture::PinDir::new("adopt-mapped");
    let cfg =
        config(&["web"], 1, 0, 0).replace("client_prefixes = []", "client_prefixes = [\"::ffff:198.19.0.0/112\"]");
    let sizes = sizes_for(&Config::parse(&cfg).unwrap());
    let state = {
        let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load_with(sizes, Some(pins.path())).unwrap());
        let mut ctl = Controller::new(Config::parse(&cfg).unwrap());
        ctl.reconcile(&mut dp).unwrap();
        ctl.persistent_state()
    };
    let (dp, _, swept, _) = restart(pins.path(), sizes, &cfg, &state);
    assert_eq!(swept, (0, 0, 0, 0));
    drop(dp);
    lb_user::dataplane::pinning::remove_map_pins(pins.path()).unwrap();
}

/// Connection tables pinned before they were BPF_F_MMAPABLE (values not starting on a cache
/// line) are not adopted: the data plane's loads of a bucket's lines assume aligned buckets.
/// `prepare_reuse` removes them and says why (the daemon then carries their flows over, as for
/// tables of another size: `e2e_grow`). The same table with the flag passes that check.
#[test]
fn connection_tables_pinned_without_mmapable_are_recreated() {
    use lb_user::dataplane::pinning::{prepare_reuse, PinState, BPF_F_MMAPABLE};
    let sizes = lb_tests::fixture::sizes();
    let buckets = lb_common::ct_table::buckets_for(sizes.conntrack_entries);
    let value = std::mem::size_of::<lb_common::ct_table::Bucket4>() as u32;
    for (flags, aligned) in [(0, false), (BPF_F_MMAPABLE, true)] {
        let dir = lb_tests::fixture::PinDir::new(&format!("ct-flags-{flags}"));
        let pin = dir.path().join("CONNTRACK4");
        let map = lb_tests::rawbpf::array_map(value, buckets, flags).expect("an array map (needs root)");
        lb_tests::rawbpf::pin(&map, &pin).unwrap();
        let PinState::Discarded { why, .. } = prepare_reuse(dir.path(), &sizes).unwrap() else {
            panic!("a lone CONNTRACK4 cannot be reused (no CT_SEED_STORE)")
        };
        assert_eq!(why.contains("BPF_F_MMAPABLE"), !aligned, "{why}");
        assert!(aligned == why.contains("CT_SEED_STORE"), "{why}");
        assert!(!pin.exists(), "the old table's pin is removed");
    }
}
