//! A daemon that adopts its predecessor's pinned data plane starts without a picture of what
//! that one wrote: its first reconcile writes its own configuration over the maps, and
//! `Dataplane::sweep_unowned` then removes what only the previous configuration had (keys,
//! VIPs, prefixes, tables) and flags the backends it no longer uses as removed. The admission
//! check counts prefixes that are installed already once.

use lb_common::backend_flags;
use lb_user::config::Config;
use lb_user::controller::Controller;
use lb_user::daemon::sizes_for;
use lb_user::dataplane::Dataplane;

/// Two services on their own VIPs, one zone of `prefixes` client prefixes (installed for each).
fn config(services: &[&str], prefixes: usize) -> String {
    let list: Vec<String> = (0..prefixes).map(|i| format!("\"198.19.{}.{}/32\"", i / 250, i % 250)).collect();
    let mut text = format!("[[zone]]\nname = \"z\"\nclient_prefixes = [{}]\n", list.join(", "));
    for (i, name) in services.iter().enumerate() {
        text += &format!(
            "[[service]]\nname = \"{name}\"\nvip = \"198.18.0.{}\"\nprotocol = \"TCP\"\nports = [80]\n\
             [[service.backend]]\naddress = \"198.18.1{i}.1\"\nzone = \"z\"\n",
            100 + i
        );
    }
    text
}

#[test]
fn an_adopting_daemon_keeps_what_it_configures_and_removes_the_rest() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let pins = lb_tests::fixture::PinDir::new("adopt");
    // 550 prefixes for each of two services: 1100 installed, more than half of CLIENT_CLASS.
    let both = Config::parse(&config(&["web", "api"], 550)).unwrap();
    let sizes = sizes_for(&both);
    {
        let mut dp = Dataplane::load_with(sizes, Some(pins.path())).unwrap();
        Controller::new(both.clone()).reconcile(&mut dp).unwrap();
        assert_eq!(dp.installed_services().len(), 2);
    }
    // The same configuration again: admitted (the installed prefixes are not counted twice),
    // and nothing to sweep.
    {
        let mut dp = Dataplane::load_with(sizes, Some(pins.path())).unwrap();
        let mut ctl = Controller::new(both.clone());
        ctl.reconcile(&mut dp).expect("the same configuration fits the data plane it was written to");
        assert_eq!(dp.sweep_unowned(ctl.applied().unwrap(), dp.now_ns().unwrap()).unwrap(), (0, 0, 0, 0));
    }
    // Only web now: api's key, prefixes and tables go, its backend is flagged removed.
    let web = Config::parse(&config(&["web"], 550)).unwrap();
    assert_eq!(sizes_for(&web), sizes, "the sizes stay, so the pins are adopted");
    let mut dp = Dataplane::load_with(sizes, Some(pins.path())).unwrap();
    let mut ctl = Controller::new(web);
    ctl.reconcile(&mut dp).unwrap();
    let applied = ctl.applied().unwrap().clone();
    let api_id = applied.services.iter().map(|s| s.id).max().unwrap() + 1;
    let now = dp.now_ns().unwrap();
    let (keys, prefixes, tables, backends) = dp.sweep_unowned(&applied, now).unwrap();
    assert_eq!((keys, prefixes, tables, backends), (1, 550, 2, 1));
    let installed = dp.installed_services();
    assert_eq!(installed.len(), 1);
    assert_eq!(installed[0].1.id, applied.services[0].id, "web's key stays");
    assert!(dp.read_table(api_id, 0).unwrap().is_none(), "api's tables are inactive");
    let api_backend = (0..sizes.max_backends).find(|id| !applied.backends.iter().any(|(b, _)| b == id) && dp.backend(*id).unwrap().family != 0).unwrap();
    let b = dp.backend(api_backend).unwrap();
    assert_eq!((b.flags & backend_flags::REMOVED, b.drain_deadline_ns), (backend_flags::REMOVED, now));
    // A second sweep finds nothing.
    assert_eq!(dp.sweep_unowned(&applied, now).unwrap(), (0, 0, 0, 0));
    drop(dp);
    lb_user::pinning::remove_map_pins(pins.path()).unwrap();
}
