//! The DNS front (`[dns] listen`): answers A/AAAA queries for the Traffic Manager services'
//! `dns_name`s with the same engine as the data plane (`tm::resolve_dns`), from the
//! controller's latest state. UDP and TCP on the same address.
//!
//! Answers (spec §2.2, §2.4):
//! - client location = the EDNS Client Subnet address when present, else the query's source;
//! - one record for PRIORITY/WEIGHTED/PERFORMANCE/GEOGRAPHIC/SUBNET, up to `max_return`
//!   distinct ones for MULTIVALUE; TTL = the service's `ttl` (default [`DEFAULT_TTL`]);
//! - an endpoint given by DNS name (`target`) is answered with a CNAME to that name, for every
//!   query type (A and AAAA included: a resolver follows it to the name's own records);
//! - NODATA (NOERROR, empty answer) when the method returns nothing or the record type does
//!   not match; NXDOMAIN for a Disabled profile (O6);
//! - names that are no service's `dns_name`: REFUSED. This server is authoritative for the
//!   configured names only, not for a zone around them, so it cannot claim that any other
//!   name does not exist (NXDOMAIN); REFUSED tells a resolver to ask elsewhere.
//!
//! Messages are parsed and built with `hickory-proto`; nothing is hand-parsed.

use crate::config::{canonical_dns_name, Config};
use crate::daemon::metrics::Metrics;
use crate::policy::tm::{
    location_address, resolve_dns, Client, DnsAnswer, ProbeStatuses, QueryType, Rng, SplitMix64, Statuses,
};
use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::opt::{ClientSubnet, EdnsCode, EdnsOption};
use hickory_proto::rr::rdata::{A, AAAA, CNAME, SOA};
use hickory_proto::rr::{DNSClass, Name, RData, Record, RecordType};
use ipnet::IpNet;
use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinHandle;

/// TTL when a service sets none. **[choice]** spec §2.1 gives only the range; 60 s keeps
/// failover reasonably quick without a flood of queries.
pub const DEFAULT_TTL: u32 = 60;
/// EDNS UDP payload size we advertise (the DNS flag day 2020 value).
const EDNS_PAYLOAD: u16 = 1232;

/// What answers are computed from: the configuration the tables were compiled from and the
/// endpoints' monitor statuses. The daemon publishes a new one after every reconcile.
#[derive(Clone, Debug)]
pub struct RoutingView {
    pub cfg: Config,
    pub probes: ProbeStatuses,
}

impl RoutingView {
    pub fn new(cfg: Config, probes: ProbeStatuses) -> Self {
        Self { cfg, probes }
    }

    /// The current view of a controller.
    pub fn of(ctl: &crate::controller::Controller) -> Self {
        let (cfg, probes) = ctl.routing_view();
        Self { cfg, probes }
    }

    /// Index of the service answering for `name` (case-insensitive, trailing dot optional).
    pub fn service_for(&self, name: &str) -> Option<usize> {
        let wanted = canonical_dns_name(name);
        self.cfg
            .services
            .iter()
            .position(|s| s.tm().and_then(|t| t.dns_name.as_deref()).is_some_and(|n| canonical_dns_name(n) == wanted))
    }
}

/// How long a DNS-over-TCP connection may sit without a complete query before it is closed.
const TCP_IDLE: std::time::Duration = std::time::Duration::from_secs(10);

/// The daemon's handle: publishes views to the running server tasks.
pub type ViewSender = watch::Sender<Arc<RoutingView>>;
pub type ViewReceiver = watch::Receiver<Arc<RoutingView>>;

/// Answers one query message received from `source` over TCP. None = nothing to send (not a
/// query, or too short to carry an id).
pub fn answer(view: &RoutingView, query: &[u8], source: IpAddr, rng: &mut impl Rng) -> Option<Vec<u8>> {
    answer_within(view, query, source, rng, false)
}

/// [`answer`] for a UDP query: an answer longer than the client takes (512 bytes, or its EDNS
/// payload size) goes out without records and with TC set, so that it retries over TCP
/// (RFC 1035 §4.2.1, RFC 6891 §6.2.5).
pub fn answer_udp(view: &RoutingView, query: &[u8], source: IpAddr, rng: &mut impl Rng) -> Option<Vec<u8>> {
    answer_within(view, query, source, rng, true)
}

fn answer_within(view: &RoutingView, query: &[u8], source: IpAddr, rng: &mut impl Rng, udp: bool) -> Option<Vec<u8>> {
    let req = match Message::from_vec(query) {
        Ok(m) => m,
        Err(_) => {
            // Unparsable: FORMERR if an id can be echoed.
            let id = u16::from_be_bytes([*query.first()?, *query.get(1)?]);
            return Message::error_msg(id, OpCode::Query, ResponseCode::FormErr).to_vec().ok();
        }
    };
    if req.metadata.message_type != MessageType::Query {
        return None;
    }
    let mut resp = respond(view, &req, source, rng);
    let out = resp.to_vec().ok()?;
    let limit = match &req.edns {
        Some(e) => usize::from(e.max_payload()).max(512),
        None => 512,
    };
    if udp && out.len() > limit {
        resp.answers.clear();
        resp.metadata.truncation = true;
        return resp.to_vec().ok();
    }
    Some(out)
}

fn respond(view: &RoutingView, req: &Message, source: IpAddr, rng: &mut impl Rng) -> Message {
    let mut resp = Message::response(req.metadata.id, req.metadata.op_code);
    resp.metadata.recursion_desired = req.metadata.recursion_desired;
    let ecs = req.edns.as_ref().and_then(|e| match e.option(EdnsCode::Subnet) {
        Some(EdnsOption::Subnet(cs)) => Some(*cs),
        _ => None,
    });
    if req.edns.is_some() {
        let mut edns = Edns::new();
        edns.set_max_payload(EDNS_PAYLOAD);
        if let Some(cs) = &ecs {
            // RFC 7871 §7.2.1: echo the option; the answer holds for the whole source prefix.
            edns.options_mut().insert(EdnsOption::Subnet(ClientSubnet::new(
                cs.addr(),
                cs.source_prefix(),
                cs.source_prefix(),
            )));
        }
        resp.set_edns(edns);
    }
    if req.metadata.op_code != OpCode::Query {
        resp.metadata.response_code = ResponseCode::NotImp;
        return resp;
    }
    let [q] = req.queries.as_slice() else {
        resp.metadata.response_code = ResponseCode::FormErr;
        return resp;
    };
    resp.add_query(q.clone());
    let Some(si) = view.service_for(&q.name().to_ascii()) else {
        resp.metadata.response_code = ResponseCode::Refused;
        return resp;
    };
    if !matches!(q.query_class(), DNSClass::IN | DNSClass::ANY) {
        resp.metadata.response_code = ResponseCode::Refused;
        return resp;
    }
    resp.metadata.authoritative = true;
    let qtype = match q.query_type() {
        RecordType::A => QueryType::A,
        RecordType::AAAA => QueryType::Aaaa,
        RecordType::CNAME => QueryType::Cname,
        RecordType::ANY => QueryType::Any,
        // The name exists but holds no record of another type: NODATA (unless the profile
        // is Disabled, which `resolve_dns` turns into NXDOMAIN for every type).
        _ => QueryType::Cname,
    };
    // Source prefix 0: the resolver gives no client information (RFC 7871 §7.1.2), so the
    // resolver's own address locates the client, as without the option.
    let ecs_net = ecs
        .filter(|cs| cs.source_prefix() > 0)
        .and_then(|cs| IpNet::new(cs.addr(), cs.source_prefix()).ok())
        .map(|n| n.trunc());
    let location = location_address(source.to_canonical(), ecs_net);
    let client = Client::locate(&view.cfg, location);
    let svc = &view.cfg.services[si];
    let ttl = svc.tm().and_then(|t| t.ttl).unwrap_or(DEFAULT_TTL);
    match resolve_dns(&Statuses::new(&view.cfg, &view.probes), si, &client, qtype, rng) {
        DnsAnswer::NxDomain => {
            resp.metadata.response_code = ResponseCode::NXDomain;
            resp.add_authority(negative_soa(q.name(), ttl));
        }
        DnsAnswer::NoData => {
            resp.add_authority(negative_soa(q.name(), ttl));
        }
        DnsAnswer::Records(records) => {
            for r in records {
                let data = match r.address {
                    IpAddr::V4(a) => RData::A(A(a)),
                    IpAddr::V6(a) => RData::AAAA(AAAA(a)),
                };
                resp.add_answer(Record::from_rdata(q.name().clone(), ttl, data));
            }
        }
        DnsAnswer::Cname(c) => match Name::from_ascii(c.target.as_str()) {
            // Absolute: the target is a full name, not one under the query's zone.
            Ok(mut target) => {
                target.set_fqdn(true);
                resp.add_answer(Record::from_rdata(q.name().clone(), ttl, RData::CNAME(CNAME(target))));
            }
            // Validated at load (`DnsName`): not reached; SERVFAIL rather than a wrong answer.
            Err(_) => {
                resp.metadata.response_code = ResponseCode::ServFail;
            }
        },
    }
    resp
}

/// The SOA record a negative answer carries (RFC 2308 §3), so that resolvers may cache it for
/// the service's TTL: the name is its own zone apex here; the SOA's fields other than the
/// negative TTL only need to be well formed.
fn negative_soa(name: &Name, ttl: u32) -> Record {
    let apex = name.to_lowercase();
    let rname =
        Name::from_ascii("hostmaster").ok().and_then(|h| h.append_domain(&apex).ok()).unwrap_or_else(|| apex.clone());
    Record::from_rdata(apex.clone(), ttl, RData::SOA(SOA::new(apex, rname, 1, 3600, 600, 86400, ttl)))
}

fn seeded_rng() -> SplitMix64 {
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
    SplitMix64(nanos ^ u64::from(std::process::id()).rotate_left(32))
}

/// Caps on the DNS-over-TCP connections open at once: in all and per source address. A
/// connection beyond either is closed at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpLimits {
    pub total: usize,
    pub per_source: usize,
}

/// The open connections per source address; a [`SourceSlot`] gives its place back on drop.
#[derive(Default)]
struct Sources(Mutex<HashMap<IpAddr, usize>>);

struct SourceSlot(Arc<Sources>, IpAddr);

impl Sources {
    fn take(self: &Arc<Self>, source: IpAddr, limit: usize) -> Option<SourceSlot> {
        let mut open = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(source).or_insert(0);
        if *n >= limit {
            return None;
        }
        *n += 1;
        Some(SourceSlot(self.clone(), source))
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.0 .0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.1);
            }
        }
    }
}

/// Binds UDP and TCP on `listen` (errors surface here) and serves until the tasks are aborted
/// or the view sender is dropped; every answer sent is counted in `metrics`. Returns the bound
/// address (useful with port 0) and tasks.
pub async fn serve(
    listen: SocketAddr,
    view: ViewReceiver,
    limits: TcpLimits,
    metrics: Metrics,
) -> std::io::Result<(SocketAddr, Vec<JoinHandle<()>>)> {
    let udp = UdpSocket::bind(listen).await?;
    let bound = udp.local_addr()?;
    // TCP on the same port (a query whose answer would not fit UDP is retried over TCP).
    let tcp = TcpListener::bind(bound).await?;
    let udp_view = view.clone();
    let udp_metrics = metrics.clone();
    let udp_task = tokio::spawn(async move {
        let mut rng = seeded_rng();
        let mut buf = vec![0u8; 4096];
        loop {
            let Ok((n, peer)) = udp.recv_from(&mut buf).await else { continue };
            let current = udp_view.borrow().clone();
            if let Some(out) = answer_udp(&current, &buf[..n], peer.ip(), &mut rng) {
                udp_metrics.dns_answer(&out);
                let _ = udp.send_to(&out, peer).await;
            }
        }
    });
    let tcp_task = tokio::spawn(async move {
        let slots = Arc::new(Semaphore::new(limits.total));
        let sources = Arc::new(Sources::default());
        loop {
            let (mut stream, peer) = match tcp.accept().await {
                Ok(accepted) => accepted,
                Err(_) => {
                    // Out of descriptors (EMFILE) or the like: the pending connection stays in
                    // the backlog and accept would fail again at once; wait instead of spinning.
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Beyond the caps: closed at once (a resolver retries or falls back to UDP).
            let Ok(permit) = slots.clone().try_acquire_owned() else { continue };
            let Some(slot) = sources.take(peer.ip(), limits.per_source) else { continue };
            let (view, metrics) = (view.clone(), metrics.clone());
            tokio::spawn(async move {
                let _held = (permit, slot);
                let mut rng = seeded_rng();
                // RFC 1035 §4.2.2: two-byte length prefix; several queries per connection. A
                // connection idle (or stalled mid-query) for TCP_IDLE is closed (RFC 7766 §6.2.3).
                loop {
                    let read = async {
                        let len = stream.read_u16().await?;
                        let mut msg = vec![0u8; len as usize];
                        stream.read_exact(&mut msg).await?;
                        Ok::<_, std::io::Error>(msg)
                    };
                    let Ok(Ok(msg)) = tokio::time::timeout(TCP_IDLE, read).await else { return };
                    let current = view.borrow().clone();
                    let Some(out) = answer(&current, &msg, peer.ip(), &mut rng) else { return };
                    let Ok(out_len) = u16::try_from(out.len()) else { return };
                    metrics.dns_answer(&out);
                    // A client that does not read its answers is closed as well.
                    let write = async {
                        stream.write_u16(out_len).await?;
                        stream.write_all(&out).await
                    };
                    if !matches!(tokio::time::timeout(TCP_IDLE, write).await, Ok(Ok(()))) {
                        return;
                    }
                }
            });
        }
    });
    Ok((bound, vec![udp_task, tcp_task]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::MonitorStatus;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;

    const CFG: &str = r#"
        [[latency]]
        client_prefixes = ["198.18.1.0/24"]
        regions = ["westeurope"]
        [[service]]
        name = "prio"
        vip = "198.18.0.1"
        protocol = "TCP"
        ports = [80]
        routing_method = "PRIORITY"
        dns_name = "Prio.TM.example"
        ttl = 30
        [[service.backend]]
        name = "p1"
        address = "198.18.10.1"
        [[service.backend]]
        name = "p2"
        address = "198.18.10.2"
        [[service]]
        name = "off"
        vip = "198.18.0.2"
        protocol = "TCP"
        routing_method = "PRIORITY"
        profile_status = "Disabled"
        dns_name = "off.tm.example"
        [[service.backend]]
        address = "198.18.10.3"
        [[service]]
        name = "sub"
        vip = "198.18.0.3"
        protocol = "TCP"
        routing_method = "SUBNET"
        dns_name = "sub.tm.example"
        [[service.backend]]
        name = "s1"
        address = "198.18.11.1"
        subnets = ["10.0.0.0/8"]
    "#;

    fn view() -> RoutingView {
        let cfg = Config::parse(CFG).unwrap();
        let probes = ProbeStatuses::new(&cfg, MonitorStatus::Online);
        RoutingView::new(cfg, probes)
    }

    fn query(name: &str, qtype: RecordType, ecs: Option<&str>) -> Vec<u8> {
        let mut m = Message::query();
        m.metadata.id = 4242;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if let Some(net) = ecs {
            let mut e = Edns::new();
            e.options_mut().insert(EdnsOption::Subnet(net.parse::<ClientSubnet>().unwrap()));
            m.set_edns(e);
        }
        m.to_vec().unwrap()
    }

    fn ask(view: &RoutingView, q: &[u8], src: &str) -> Message {
        let out = answer(view, q, src.parse().unwrap(), &mut SplitMix64(1)).unwrap();
        Message::from_vec(&out).unwrap()
    }

    fn addrs(m: &Message) -> Vec<String> {
        m.answers.iter().map(|r| r.data.to_string()).collect()
    }

    #[test]
    fn answers_a_with_the_service_ttl_case_insensitively() {
        let v = view();
        let m = ask(&v, &query("prio.tm.example.", RecordType::A, None), "127.0.0.1");
        assert_eq!(m.metadata.id, 4242);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.metadata.authoritative);
        assert_eq!(addrs(&m), ["198.18.10.1"]);
        assert_eq!(m.answers[0].ttl, 30);
    }

    #[test]
    fn aaaa_for_v4_endpoint_is_nodata_and_unknown_name_refused() {
        let v = view();
        let m = ask(&v, &query("prio.tm.example.", RecordType::AAAA, None), "127.0.0.1");
        assert_eq!((m.metadata.response_code, m.answers.len()), (ResponseCode::NoError, 0));
        let m = ask(&v, &query("other.tm.example.", RecordType::A, None), "127.0.0.1");
        assert_eq!(m.metadata.response_code, ResponseCode::Refused);
        let m = ask(&v, &query("prio.tm.example.", RecordType::MX, None), "127.0.0.1");
        assert_eq!((m.metadata.response_code, m.answers.len()), (ResponseCode::NoError, 0), "MX: NODATA");
    }

    /// Issue #34-1: a profile whose chosen endpoint is given by DNS name answers a CNAME to that
    /// name with the profile's TTL, in the answer section of A, AAAA and CNAME queries alike
    /// (a resolver follows it to the name's own records); a Degraded name endpoint is passed
    /// over as an address would be.
    #[test]
    fn a_name_endpoint_is_answered_with_a_cname() {
        let text = r#"
            [[service]]
            name = "ext"
            vip = "198.18.0.9"
            protocol = "TCP"
            ports = [80]
            routing_method = "PRIORITY"
            dns_name = "ext.tm.example"
            ttl = 45
            [[service.backend]]
            name = "first"
            target = "App.Example.NET"
            [[service.backend]]
            name = "second"
            target = "backup.example.net."
        "#;
        let cfg = Config::parse(text).unwrap();
        let mut probes = ProbeStatuses::new(&cfg, MonitorStatus::Online);
        let v = RoutingView::new(cfg.clone(), probes.clone());
        for qtype in [RecordType::A, RecordType::AAAA, RecordType::CNAME, RecordType::ANY] {
            let m = ask(&v, &query("ext.tm.example.", qtype, None), "127.0.0.1");
            assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{qtype}");
            assert!(m.metadata.authoritative);
            assert_eq!(m.answers.len(), 1, "{qtype}");
            let r = &m.answers[0];
            assert_eq!(r.record_type(), RecordType::CNAME, "{qtype}");
            assert_eq!(r.name.to_ascii(), "ext.tm.example.");
            assert_eq!(r.data.to_string(), "app.example.net.");
            assert_eq!(r.ttl, 45);
            assert!(m.authorities.is_empty(), "a positive answer: no SOA");
        }
        probes.set(&cfg, "ext", "first", MonitorStatus::Degraded).unwrap();
        let v = RoutingView::new(cfg, probes);
        let m = ask(&v, &query("ext.tm.example.", RecordType::A, None), "127.0.0.1");
        assert_eq!(addrs(&m), ["backup.example.net."]);
        // The wire form round-trips through a UDP answer as well.
        let out = answer_udp(
            &v,
            &query("EXT.tm.example.", RecordType::AAAA, None),
            "127.0.0.1".parse().unwrap(),
            &mut SplitMix64(1),
        );
        let m = Message::from_vec(&out.unwrap()).unwrap();
        assert_eq!(addrs(&m), ["backup.example.net."]);
    }

    #[test]
    fn o6_disabled_profile_is_nxdomain() {
        let m = ask(&view(), &query("off.tm.example.", RecordType::A, None), "127.0.0.1");
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }

    /// RFC 2308: negative answers carry the SOA whose minimum is the negative-caching TTL.
    #[test]
    fn negative_answers_carry_an_soa_with_the_service_ttl() {
        let v = view();
        let nodata = ask(&v, &query("prio.tm.example.", RecordType::AAAA, None), "127.0.0.1");
        let nx = ask(&v, &query("off.tm.example.", RecordType::A, None), "127.0.0.1");
        for (m, ttl) in [(&nodata, 30), (&nx, 60)] {
            let [soa] = m.authorities.as_slice() else { panic!("one SOA: {m:?}") };
            match &soa.data {
                RData::SOA(s) => assert_eq!((s.minimum, soa.ttl, s.mname.to_ascii()), (ttl, ttl, soa.name.to_ascii())),
                other => panic!("{other:?}"),
            }
        }
        let found = ask(&v, &query("prio.tm.example.", RecordType::A, None), "127.0.0.1");
        assert!(found.authorities.is_empty(), "a positive answer has no SOA");
    }

    #[test]
    fn n4_client_subnet_wins_over_the_source_and_is_echoed() {
        let v = view();
        let m = ask(&v, &query("sub.tm.example.", RecordType::A, None), "127.0.0.1");
        assert_eq!(addrs(&m), Vec::<String>::new(), "127.0.0.1 matches no range and there is no fallback");
        let m = ask(&v, &query("sub.tm.example.", RecordType::A, Some("10.9.0.0/16")), "127.0.0.1");
        assert_eq!(addrs(&m), ["198.18.11.1"]);
        match m.edns.as_ref().and_then(|e| e.option(EdnsCode::Subnet)) {
            Some(EdnsOption::Subnet(cs)) => assert_eq!((cs.source_prefix(), cs.scope_prefix()), (16, 16)),
            other => panic!("ECS not echoed: {other:?}"),
        }
        let m = ask(&v, &query("sub.tm.example.", RecordType::A, None), "10.1.2.3");
        assert_eq!(addrs(&m), ["198.18.11.1"], "no ECS: the source address locates the client");
        // Source prefix 0 carries no client information: the resolver's address counts.
        let m = ask(&v, &query("sub.tm.example.", RecordType::A, Some("0.0.0.0/0")), "10.1.2.3");
        assert_eq!(addrs(&m), ["198.18.11.1"], "ECS /0: as without the option");
    }

    #[test]
    fn udp_answer_beyond_512_bytes_is_truncated_without_edns() {
        // Ten AAAA records under a 240-character name: about 560 bytes.
        let label = "a".repeat(60);
        let name = format!("{label}.{label}.{label}.{}.example", &label[..48]);
        let backends: String =
            (1..=10).map(|i| format!("[[service.backend]]\naddress = \"2001:db8:20::{i}\"\n")).collect();
        let cfg = Config::parse(&format!(
            "[[service]]\nname = \"mv\"\nvip = \"2001:db8::9\"\nprotocol = \"TCP\"\nrouting_method = \"MULTIVALUE\"\nmax_return = 10\ndns_name = \"{name}\"\n{backends}"
        ))
        .unwrap();
        let probes = ProbeStatuses::new(&cfg, MonitorStatus::Online);
        let v = RoutingView::new(cfg, probes);
        let q = query(&format!("{name}."), RecordType::AAAA, None);
        let src = "127.0.0.1".parse().unwrap();
        let tcp = Message::from_vec(&answer(&v, &q, src, &mut SplitMix64(1)).unwrap()).unwrap();
        assert_eq!((tcp.answers.len(), tcp.metadata.truncation), (10, false), "TCP carries it whole");
        let out = answer_udp(&v, &q, src, &mut SplitMix64(1)).unwrap();
        assert!(out.len() <= 512, "{} bytes", out.len());
        let udp = Message::from_vec(&out).unwrap();
        assert_eq!((udp.answers.len(), udp.metadata.truncation), (0, true), "TC: retry over TCP");
        // With EDNS the client's (larger) payload size applies.
        let mut m = Message::from_vec(&q).unwrap();
        let mut e = Edns::new();
        e.set_max_payload(1232);
        m.set_edns(e);
        let q = m.to_vec().unwrap();
        let udp = Message::from_vec(&answer_udp(&v, &q, src, &mut SplitMix64(1)).unwrap()).unwrap();
        assert_eq!((udp.answers.len(), udp.metadata.truncation), (10, false));
    }

    /// A flood from one source takes at most `per_source` connections; another source and
    /// UDP are still answered, and a closed connection gives its place back.
    #[tokio::test]
    async fn tcp_connections_are_capped_in_all_and_per_source() {
        let (_tx, rx) = watch::channel(Arc::new(view()));
        let limits = TcpLimits { total: 6, per_source: 4 };
        let (addr, tasks) = serve("127.0.0.1:0".parse().unwrap(), rx, limits, Metrics::default()).await.unwrap();
        let q = query("prio.tm.example.", RecordType::A, None);
        let ask_tcp = |from: &'static str| {
            let q = q.clone();
            async move {
                let sock = tokio::net::TcpSocket::new_v4().unwrap();
                sock.bind(format!("{from}:0").parse().unwrap()).unwrap();
                let mut s = sock.connect(addr).await.unwrap();
                s.write_u16(q.len() as u16).await.unwrap();
                s.write_all(&q).await.unwrap();
                let ok = tokio::time::timeout(std::time::Duration::from_secs(2), s.read_u16())
                    .await
                    .map(|r| r.is_ok())
                    .unwrap_or(false);
                (s, ok)
            }
        };
        let mut held = Vec::new();
        for _ in 0..4 {
            let (s, ok) = ask_tcp("127.0.0.1").await;
            assert!(ok, "within the per-source cap");
            held.push(s);
        }
        let (_, ok) = ask_tcp("127.0.0.1").await;
        assert!(!ok, "a fifth connection from one source is closed");
        for _ in 0..2 {
            let (s, ok) = ask_tcp("127.0.0.2").await;
            assert!(ok, "another source");
            held.push(s);
        }
        let (_, ok) = ask_tcp("127.0.0.3").await;
        assert!(!ok, "beyond the total cap");
        let udp = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        udp.send_to(&q, addr).await.unwrap();
        let mut buf = [0u8; 512];
        tokio::time::timeout(std::time::Duration::from_secs(2), udp.recv_from(&mut buf))
            .await
            .expect("UDP answered")
            .unwrap();
        held.truncate(3);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let (_, ok) = ask_tcp("127.0.0.1").await;
        assert!(ok, "a closed connection gives its place back");
        for t in tasks {
            t.abort();
        }
    }

    #[test]
    fn garbage_gets_formerr_and_responses_are_ignored() {
        let v = view();
        let out = answer(&v, &[0x12, 0x34, 0xff], "127.0.0.1".parse().unwrap(), &mut SplitMix64(1)).unwrap();
        let m = Message::from_vec(&out).unwrap();
        assert_eq!((m.metadata.id, m.metadata.response_code), (0x1234, ResponseCode::FormErr));
        let mut resp = Message::from_vec(&query("prio.tm.example.", RecordType::A, None)).unwrap();
        resp.metadata.message_type = MessageType::Response;
        assert!(answer(&v, &resp.to_vec().unwrap(), "127.0.0.1".parse().unwrap(), &mut SplitMix64(1)).is_none());
    }
}
