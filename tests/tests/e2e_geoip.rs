//! `[dns] geoip_database` under a running daemon: the DNS front answers a GEOGRAPHIC name by
//! the database's record for the querying address; a new database written in place is taken
//! without a signal (the daemon notices the file changed), a broken one is refused (the reload
//! counted as refused, the database in use kept, also on SIGHUP), and a good one is taken again.

use lb_tests::dns;
use lb_tests::e2e::*;
use lb_tests::topology::{Topology, TopologySpec};
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

const DNS: &str = "127.0.0.1:5301";

#[derive(serde::Serialize)]
struct Iso {
    iso_code: &'static str,
}

#[derive(serde::Serialize)]
struct Record {
    country: Iso,
    subdivisions: Vec<Iso>,
}

/// Writes a database locating the loopback (the queries' source) in `country`-`state`,
/// through a temporary file renamed over `path` (as a package update replaces it).
fn write_database(path: &Path, country: &'static str, state: Option<&'static str>) {
    let mut w = mmdb_writer::Writer::new("GeoLite2-City");
    let record = Record {
        country: Iso { iso_code: country },
        subdivisions: state.map(|s| Iso { iso_code: s }).into_iter().collect(),
    };
    w.insert("127.0.0.0/8".parse::<ipnet::IpNet>().unwrap(), &record).unwrap();
    let tmp = path.with_extension("new");
    std::fs::write(&tmp, w.to_bytes().unwrap()).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The A record the front answers for `geo.tm.test` (None: no or another answer).
fn answer(id: u16) -> Option<Ipv4Addr> {
    let msg = dns::ask_udp(DNS.parse().unwrap(), &dns::query(id, &["geo", "tm", "test"], None), 3).ok()?;
    let ok = msg.len() >= 16 && msg[..2] == id.to_be_bytes() && msg[3] & 0x0f == 0 && msg[6..8] == [0, 1];
    ok.then(|| Ipv4Addr::new(msg[msg.len() - 4], msg[msg.len() - 3], msg[msg.len() - 2], msg[msg.len() - 1]))
}

#[test]
fn a_rewritten_database_is_followed_and_a_broken_one_refused() {
    let topo = Topology::build(&TopologySpec { prefix: "geo".into(), zones: vec![(1, 2)], outside_clients: 0 })
        .expect("topology (needs root)");
    let (ca, ie) = (topo.backends[0].v4, topo.backends[1].v4);
    let dir = std::env::temp_dir().join(format!("lb-e2e-geoip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("GeoLite2-City.mmdb");
    write_database(&db, "US", Some("CA"));
    let cfg = format!(
        "[dns]\nlisten = \"{DNS}\"\ngeoip_database = \"{}\"\n\n[[service]]\nname = \"geo\"\nvip = \"198.18.0.100\"\n\
         protocol = \"TCP\"\nports = [80]\nrouting_method = \"GEOGRAPHIC\"\ndns_name = \"geo.tm.test\"\n\n\
         [[service.backend]]\nname = \"ca\"\naddress = \"{ca}\"\ngeo_mapping = [\"US-CA\"]\n\n\
         [[service.backend]]\nname = \"ie\"\naddress = \"{ie}\"\ngeo_mapping = [\"IE\"]\n",
        db.display()
    );
    let d = Daemon::start(&topo, "geo", &cfg).unwrap();
    let fail = |e: anyhow::Error| -> ! {
        let _ = std::fs::remove_dir_all(&dir);
        panic!("{e:#}\n{}", d.diagnostics())
    };
    let answers = |want: Ipv4Addr, what: &str| {
        wait_for(what, Duration::from_secs(60), || topo.lb.ns.run(|| answer(7)).ok().flatten().filter(|a| *a == want))
    };
    answers(ca, "the US-CA endpoint from the first database").unwrap_or_else(|e| fail(e));

    // A new release written in place: taken at the daemon's next look at the file.
    write_database(&db, "IE", None);
    answers(ie, "the IE endpoint after the database changed").unwrap_or_else(|e| fail(e));
    let applied = d.status().unwrap_or_else(|e| fail(e)).reloads.applied;
    assert!(applied >= 1, "the change was applied as a reload");

    // A broken file: refused, the database in use kept; SIGHUP refuses it again.
    std::fs::write(&db, b"truncated download").unwrap();
    let refused = wait_for("the broken database refused", Duration::from_secs(60), || {
        let r = d.status().ok()?.reloads;
        (r.refused >= 1).then_some(r)
    })
    .unwrap_or_else(|e| fail(e));
    assert!(refused.last_refusal.as_deref().unwrap_or_default().contains("dns.geoip_database"), "{refused:?}");
    assert_eq!(topo.lb.ns.run(|| answer(8)).unwrap(), Some(ie), "the database in use stays");
    d.sighup().unwrap_or_else(|e| fail(e));
    wait_for("the SIGHUP refused as well", Duration::from_secs(60), || {
        (d.status().ok()?.reloads.refused > refused.refused).then_some(())
    })
    .unwrap_or_else(|e| fail(e));
    assert_eq!(topo.lb.ns.run(|| answer(9)).unwrap(), Some(ie));

    // A good file again: taken.
    write_database(&db, "US", Some("CA"));
    answers(ca, "the US-CA endpoint after the good database returned").unwrap_or_else(|e| fail(e));
    let _ = std::fs::remove_dir_all(&dir);
}
