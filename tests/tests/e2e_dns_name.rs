//! Issue #34-1 end to end: a Traffic Manager endpoint given by DNS name (`target`), resolved
//! by the daemon through a real DNS server in the balancer's namespace (`[resolver] servers`),
//! while 60 connections exchange a line every 100 ms. The name's records change under load
//! and the tables follow (new connections go to the new addresses; established ones, on an
//! address that left, drain and keep working); the server fails (SERVFAIL) and the last answer
//! is kept for `keep_last_answer_sec`, then the endpoint has no address and is Degraded (new
//! connections fail, established ones still drain); the name resolves again and traffic
//! returns. The DNS front answers the profile's name with a CNAME to the endpoint's name.

use hickory_proto::op::{Message, MessageType, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use lb_tests::e2e::*;
use lb_tests::load::Fleet;
use lb_tests::topology::{Topology, TopologySpec};
use std::net::{Ipv4Addr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The authoritative server of `app.ext.test` (in the balancer's namespace).
const AUTH: &str = "127.0.0.1:5355";
/// The daemon's DNS front.
const FRONT: &str = "127.0.0.1:5356";
const KEEP_SEC: u64 = 4;

/// The name's A records (TTL 1 s); None = SERVFAIL.
type Records = Arc<Mutex<Option<Vec<Ipv4Addr>>>>;

/// Answers A queries for `app.ext.test` from `records` until `stop` is set.
fn serve(sock: UdpSocket, records: Records, stop: Arc<AtomicBool>) {
    let mut buf = [0u8; 1500];
    let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
    while !stop.load(Ordering::Relaxed) {
        let Ok((n, peer)) = sock.recv_from(&mut buf) else { continue };
        let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
        let mut m = Message::response(q.metadata.id, q.metadata.op_code);
        m.metadata.message_type = MessageType::Response;
        m.metadata.authoritative = true;
        m.add_queries(q.queries.clone());
        let current = records.lock().unwrap_or_else(|e| e.into_inner()).clone();
        match (current, q.queries.first()) {
            (None, _) => m.metadata.response_code = ResponseCode::ServFail,
            (Some(list), Some(query))
                if query.query_type() == RecordType::A
                    && query.name().to_ascii().eq_ignore_ascii_case("app.ext.test.") =>
            {
                for a in list {
                    m.add_answer(Record::from_rdata(query.name().clone(), 1, RData::A(A(a))));
                }
            }
            // AAAA and other names: NODATA / nothing.
            _ => {}
        }
        if let Ok(out) = m.to_vec() {
            let _ = sock.send_to(&out, peer);
        }
    }
}

fn config() -> String {
    format!(
        "[dataplane]\nencap_source_v4 = \"198.18.0.1\"\n\n\
         [dns]\nlisten = \"{FRONT}\"\n\n\
         [resolver]\nservers = [\"{AUTH}\"]\nmin_ttl_sec = 1\nmax_ttl_sec = 5\nkeep_last_answer_sec = {KEEP_SEC}\n\n\
         [[service]]\nname = \"ext\"\nvip = \"{VIP4}\"\nprotocol = \"TCP\"\nports = [80]\n\
         routing_method = \"PRIORITY\"\ndns_name = \"ext.tm.test\"\nttl = 20\n\
         [service.connection_draining]\ndraining_timeout_sec = 600\n\n\
         [[service.backend]]\nname = \"app\"\ntarget = \"app.ext.test\"\n",
        VIP4 = lb_tests::topology::VIP4
    )
}

/// The name endpoint as `lb status` shows it: (resolution, addresses, monitor status).
fn name_state(d: &Daemon) -> Option<(String, Vec<String>, String)> {
    let st = d.status().ok()?;
    let n = st.services.iter().find(|s| s.name == "ext")?.names.first()?.clone();
    Some((n.resolution, n.addresses.iter().map(ToString::to_string).collect(), n.monitor_status))
}

#[test]
fn a_name_endpoint_follows_its_records_under_load() {
    let topo = Topology::build(&TopologySpec { prefix: "dnsn".into(), zones: vec![(1, 3)], outside_clients: 0 })
        .expect("topology (needs root)");
    let _servers: Vec<_> = topo.backends.iter().map(|b| start_server(b, 80).unwrap()).collect();
    let _decap = DecapGuard::attach(&topo, std::path::Path::new("/sys/fs/bpf/lb-test-dnsn-decap")).unwrap();
    let ip = |name: &str| topo.backend(name).unwrap().v4;
    let records: Records = Arc::new(Mutex::new(Some(vec![ip("b1-1"), ip("b1-2")])));
    let sock = topo.lb.ns.run(|| UdpSocket::bind(AUTH)).unwrap().expect("binding the authoritative server");
    let (r, stop) = (records.clone(), Arc::new(AtomicBool::new(false)));
    let stopper = stop.clone();
    let server = std::thread::spawn(move || serve(sock, r, stopper));
    let set = |list: Option<Vec<Ipv4Addr>>| *records.lock().unwrap() = list;

    let d = Daemon::start(&topo, "dnsn", &config()).unwrap();
    let fail = |e: anyhow::Error| -> ! { panic!("{e:#}\n{}", d.diagnostics()) };
    let client = &topo.clients[0];
    let vip = vip(false, 80);
    let resolved = |want: &[&str], what: &str| {
        let want: Vec<String> = want.iter().map(|n| ip(n).to_string()).collect();
        wait_for(what, Duration::from_secs(30), || {
            name_state(&d).filter(|(r, a, _)| r == "resolved" && *a == want).map(|_| ())
        })
        .unwrap_or_else(|e| fail(e))
    };
    // New connections spread over exactly the name's addresses.
    let spread_over = |want: &[&str]| {
        let seen = tally(&tcp_spread(client, vip, 40).unwrap_or_else(|e| fail(e)));
        let names: Vec<&str> = seen.keys().map(String::as_str).collect();
        assert_eq!(names, want, "new connections go to the name's addresses: {seen:?}");
    };
    resolved(&["b1-1", "b1-2"], "the first answer in the tables");
    spread_over(&["b1-1", "b1-2"]);

    // The DNS front: a CNAME to the endpoint's name, with the profile's TTL.
    let mut q = Message::query();
    q.metadata.id = 77;
    q.add_query(Query::query(Name::from_ascii("ext.tm.test.").unwrap(), RecordType::A));
    let wire = q.to_vec().unwrap();
    let answer = topo.lb.ns.run(move || lb_tests::dns::ask_udp(FRONT.parse().unwrap(), &wire, 3)).unwrap().unwrap();
    let m = Message::from_vec(&answer).unwrap();
    assert_eq!(m.answers.len(), 1, "{m:?}");
    assert_eq!((m.answers[0].record_type(), m.answers[0].ttl), (RecordType::CNAME, 20));
    assert_eq!(m.answers[0].data.to_string(), "app.ext.test.");

    // Under load: the records change; the tables follow, no connection breaks (those on
    // b1-1 drain).
    let mut fleet =
        Fleet::start(client, vip, 60, Duration::from_millis(100), Duration::from_secs(5)).unwrap_or_else(|e| fail(e));
    let on_first = fleet.backends.iter().filter(|b| *b == "b1-1").count();
    assert!(on_first > 0, "some connections on b1-1: {:?}", tally(&fleet.backends));
    set(Some(vec![ip("b1-2"), ip("b1-3")]));
    resolved(&["b1-2", "b1-3"], "the changed answer in the tables");
    spread_over(&["b1-2", "b1-3"]);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(fleet.breaks().len(), 0, "{:?}", fleet.breaks());

    // The server fails: the last answer is kept for a while, then the endpoint has no address
    // and is Degraded; established connections keep draining.
    set(None);
    wait_for("the last answer kept", Duration::from_secs(20), || {
        name_state(&d).filter(|(r, a, _)| r.starts_with("kept") && a.len() == 2).map(|_| ())
    })
    .unwrap_or_else(|e| fail(e));
    tcp_hello(client, vip).unwrap_or_else(|e| fail(e));
    let (resolution, _, monitor) =
        wait_for("the name failed and the endpoint Degraded", Duration::from_secs(KEEP_SEC + 20), || {
            name_state(&d).filter(|(r, a, _)| r.starts_with("failed") && a.is_empty())
        })
        .unwrap_or_else(|e| fail(e));
    assert_eq!(monitor, "Degraded", "{resolution}");
    assert!(tcp_hello(client, vip).is_err(), "no address: a new connection goes nowhere");
    assert!(d.log().contains("endpoint name app.ext.test does not resolve"), "logged:\n{}", d.log());
    let text = d.cli(&["status"]).unwrap_or_else(|e| fail(e));
    assert!(text.contains("endpoint app -> app.ext.test: failed"), "{text}");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(fleet.breaks().len(), 0, "{:?}", fleet.breaks());

    // It resolves again: traffic returns.
    set(Some(vec![ip("b1-3")]));
    resolved(&["b1-3"], "the name resolving again");
    spread_over(&["b1-3"]);
    let breaks = fleet.stop().unwrap_or_else(|e| fail(e));
    assert!(breaks.is_empty(), "no established connection broke: {breaks:?}");
    assert!(fleet.exchanges() > 0);
    drop(d);
    stop.store(true, Ordering::Relaxed);
    server.join().unwrap();
}
