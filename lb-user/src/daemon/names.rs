//! Traffic Manager endpoints given by DNS name (`target`): the daemon resolves each name for the
//! per-packet path and the monitors (the DNS front does not: it answers a CNAME).
//!
//! One task per name resolves it through the host's resolvers (`/etc/resolv.conf`) or
//! `[resolver] servers`, A and AAAA, and reports every result to the daemon's loop, which
//! fills the name's endpoints (`Controller::set_resolved`) and reconciles when they changed:
//! a changed answer is a table change like a reload's (addresses that left depart with their
//! service's draining time). The next resolution comes when the answer's TTL runs out, raised
//! to `min_ttl_sec` and lowered to `max_ttl_sec`. A failed one (timeout, SERVFAIL, NXDOMAIN,
//! no address) keeps the last good answer for `keep_last_answer_sec` from the first failure,
//! retried every `min_ttl_sec`; then the name's endpoints have no address and are Degraded,
//! until it resolves again.

use crate::config::{DnsName, Resolution, Resolved, Resolver};
use hickory_resolver::config::{LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::Name;
use hickory_resolver::TokioResolver;
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How long one resolution may take, retries over the servers included.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// One resolution's result for the daemon's loop.
#[derive(Clone, Debug, PartialEq)]
pub struct NameEvent {
    pub name: DnsName,
    pub resolved: Resolved,
    /// This resolution failed (also while the last answer is kept): why.
    pub error: Option<String>,
}

/// The resolver tasks of the names the configuration has.
pub struct Names {
    events: mpsc::Sender<NameEvent>,
    /// The settings the tasks run with (None before the first `follow`).
    settings: Option<Resolver>,
    resolver: Result<Arc<TokioResolver>, String>,
    tasks: BTreeMap<DnsName, JoinHandle<()>>,
}

impl Names {
    pub fn new(events: mpsc::Sender<NameEvent>) -> Self {
        Self { events, settings: None, resolver: Err("not started".into()), tasks: BTreeMap::new() }
    }

    /// Resolves `names` with `settings` from now on: tasks of names no longer configured
    /// stop, new names get one; changed settings start every task over.
    pub fn follow(&mut self, names: &[DnsName], settings: &Resolver) {
        if self.settings.as_ref() != Some(settings) {
            for (_, task) in std::mem::take(&mut self.tasks) {
                task.abort();
            }
            self.resolver = build(settings).map(Arc::new);
            if let Err(e) = &self.resolver {
                tracing::error!("cannot set up the resolver of the endpoints given by DNS name: {e}");
            }
            self.settings = Some(settings.clone());
        }
        self.tasks.retain(|name, task| {
            let keep = names.contains(name) && !task.is_finished();
            if !keep {
                task.abort();
            }
            keep
        });
        for name in names {
            if !self.tasks.contains_key(name) {
                let task = tokio::spawn(follow_name(
                    name.clone(),
                    self.resolver.clone(),
                    settings.clone(),
                    self.events.clone(),
                ));
                self.tasks.insert(name.clone(), task);
            }
        }
    }

    pub fn stop(&mut self) {
        for (_, task) in std::mem::take(&mut self.tasks) {
            task.abort();
        }
    }
}

impl Drop for Names {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Logs what a changed resolution means for the name's endpoints.
pub fn log_result(ev: &NameEvent) {
    let list = |a: &[IpAddr]| a.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
    match &ev.resolved.state {
        Resolution::Pending => {}
        Resolution::Answered => {
            tracing::info!(target: "audit", "endpoint name {} resolves to [{}]", ev.name, list(&ev.resolved.addresses))
        }
        Resolution::Kept(why) => tracing::warn!(
            "endpoint name {} does not resolve ({why}): its last answer [{}] stays in use for now \
             ([resolver] keep_last_answer_sec)",
            ev.name,
            list(&ev.resolved.addresses)
        ),
        Resolution::Failed(why) => tracing::error!(
            "endpoint name {} does not resolve ({why}): its endpoints have no address and are Degraded",
            ev.name
        ),
    }
}

/// The resolver `settings` ask for: its servers (UDP, TCP on truncation), else the host's.
fn build(settings: &Resolver) -> Result<TokioResolver, String> {
    let provider = TokioRuntimeProvider::default();
    let mut builder = if settings.servers.is_empty() {
        TokioResolver::builder(provider).map_err(|e| format!("reading the host's resolver configuration: {e}"))?
    } else {
        let servers = settings
            .servers
            .iter()
            .map(|s| {
                let mut ns = NameServerConfig::udp_and_tcp(s.ip());
                for c in &mut ns.connections {
                    c.port = s.port();
                }
                ns
            })
            .collect();
        let mut b = TokioResolver::builder_with_config(ResolverConfig::from_parts(None, Vec::new(), servers), provider);
        // Only the servers given answer (not /etc/hosts).
        b.options_mut().use_hosts_file = ResolveHosts::Never;
        b
    };
    let opts = builder.options_mut();
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    opts.timeout = Duration::from_secs(2);
    opts.attempts = 2;
    // The resolver's cache holds an answer no longer than this module uses it.
    opts.positive_max_ttl = Some(Duration::from_secs(u64::from(settings.max_ttl_sec)));
    opts.negative_max_ttl = Some(Duration::from_secs(u64::from(settings.min_ttl_sec)));
    builder.build().map_err(|e| e.to_string())
}

/// One resolution of `name` (absolute: no search domains): its addresses, sorted, and how long
/// they are valid.
async fn lookup(resolver: &TokioResolver, name: &DnsName) -> Result<(Vec<IpAddr>, Duration), String> {
    let mut fqdn = Name::from_ascii(name.as_str()).map_err(|e| e.to_string())?;
    fqdn.set_fqdn(true);
    let found = tokio::time::timeout(LOOKUP_TIMEOUT, resolver.lookup_ip(fqdn))
        .await
        .map_err(|_| format!("no answer within {LOOKUP_TIMEOUT:?}"))?
        .map_err(|e| e.to_string())?;
    let mut addrs: Vec<IpAddr> = found.iter().collect();
    addrs.sort();
    addrs.dedup();
    if addrs.is_empty() {
        return Err("no A or AAAA record".into());
    }
    Ok((addrs, found.valid_until().saturating_duration_since(Instant::now())))
}

/// What a name's task holds between resolutions.
#[derive(Clone, Debug, Default)]
struct Follow {
    /// The last good answer.
    last: Option<Vec<IpAddr>>,
    /// When the failures since the last good answer began.
    failing_since: Option<Instant>,
}

impl Follow {
    /// The endpoint's state after one resolution's `result` at `now`, the failure if it
    /// failed, and when to resolve next.
    fn step(
        &mut self,
        result: Result<(Vec<IpAddr>, Duration), String>,
        settings: &Resolver,
        now: Instant,
    ) -> (Resolved, Option<String>, Duration) {
        let min = Duration::from_secs(u64::from(settings.min_ttl_sec.max(1)));
        let max = Duration::from_secs(u64::from(settings.max_ttl_sec)).max(min);
        let keep = Duration::from_secs(u64::from(settings.keep_last_answer_sec));
        match result {
            Ok((addresses, ttl)) => {
                self.last = Some(addresses.clone());
                self.failing_since = None;
                (Resolved { addresses, state: Resolution::Answered }, None, ttl.clamp(min, max))
            }
            Err(why) => {
                let since = *self.failing_since.get_or_insert(now);
                let left = keep.saturating_sub(now.saturating_duration_since(since));
                match &self.last {
                    // Within the bound: the last answer stays; retried in time to end it.
                    Some(last) if !left.is_zero() => (
                        Resolved { addresses: last.clone(), state: Resolution::Kept(why.clone()) },
                        Some(why),
                        min.min(left),
                    ),
                    _ => {
                        self.last = None;
                        (Resolved { addresses: Vec::new(), state: Resolution::Failed(why.clone()) }, Some(why), min)
                    }
                }
            }
        }
    }
}

/// Resolves `name` until aborted, reporting every result.
async fn follow_name(
    name: DnsName,
    resolver: Result<Arc<TokioResolver>, String>,
    settings: Resolver,
    events: mpsc::Sender<NameEvent>,
) {
    let mut state = Follow::default();
    loop {
        let result = match &resolver {
            Ok(r) => lookup(r, &name).await,
            Err(e) => Err(e.clone()),
        };
        let (resolved, error, wait) = state.step(result, &settings, Instant::now());
        if events.send(NameEvent { name: name.clone(), resolved, error }).await.is_err() {
            return; // the daemon is shutting down
        }
        tokio::time::sleep(wait).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{RData, Record, RecordType};
    use std::sync::Mutex;

    fn settings(min: u32, max: u32, keep: u32) -> Resolver {
        Resolver { servers: Vec::new(), min_ttl_sec: min, max_ttl_sec: max, keep_last_answer_sec: keep }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// The TTL is honoured between the floor and the cap; a failure keeps the last answer for
    /// `keep_last_answer_sec` from the first failure (retried in time to end it), then the
    /// name has no address; a success starts over.
    #[test]
    fn ttls_are_bounded_and_a_failure_keeps_the_last_answer_for_a_while() {
        let s = settings(5, 60, 12);
        let mut f = Follow::default();
        let t0 = Instant::now();
        let sec = Duration::from_secs;
        let ok = |ttl| Ok((vec![ip("198.18.21.1")], sec(ttl)));
        let (r, e, wait) = f.step(ok(30), &s, t0);
        assert_eq!((r.state, e, wait), (Resolution::Answered, None, sec(30)));
        assert_eq!(f.step(ok(1), &s, t0).2, sec(5), "floor");
        assert_eq!(f.step(ok(86_400), &s, t0).2, sec(60), "cap");
        let (r, e, wait) = f.step(Err("SERVFAIL".into()), &s, t0);
        assert_eq!(r, Resolved { addresses: vec![ip("198.18.21.1")], state: Resolution::Kept("SERVFAIL".into()) });
        assert_eq!((e.as_deref(), wait), (Some("SERVFAIL"), sec(5)));
        let (r, _, wait) = f.step(Err("SERVFAIL".into()), &s, t0 + sec(10));
        assert_eq!((r.addresses.len(), wait), (1, sec(2)), "retried when the bound ends");
        let (r, _, _) = f.step(Err("NXDOMAIN".into()), &s, t0 + sec(12));
        assert_eq!(r, Resolved { addresses: vec![], state: Resolution::Failed("NXDOMAIN".into()) });
        let (r, _, _) = f.step(ok(30), &s, t0 + sec(20));
        assert_eq!(r.state, Resolution::Answered);
        // A failure from the start, or with no time to keep anything: no address at once.
        let (r, _, _) = Follow::default().step(Err("timeout".into()), &s, t0);
        assert_eq!(r.state, Resolution::Failed("timeout".into()));
        let mut f = Follow::default();
        f.step(ok(30), &settings(5, 60, 0), t0);
        assert_eq!(f.step(Err("x".into()), &settings(5, 60, 0), t0).0.state, Resolution::Failed("x".into()));
    }

    /// A tiny authoritative server on the loopback: A records of `app.test.` from `records`
    /// with TTL `ttl`, SERVFAIL while `records` is None.
    async fn server(records: Arc<Mutex<Option<Vec<std::net::Ipv4Addr>>>>, ttl: u32) -> std::net::SocketAddr {
        let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = sock.local_addr().unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, peer)) = sock.recv_from(&mut buf).await {
                let Ok(q) = Message::from_vec(&buf[..n]) else { continue };
                let mut m = Message::response(q.metadata.id, q.metadata.op_code);
                m.metadata.message_type = MessageType::Response;
                m.metadata.authoritative = true;
                m.add_queries(q.queries.clone());
                match (records.lock().unwrap().clone(), q.queries.first()) {
                    (None, _) => m.metadata.response_code = ResponseCode::ServFail,
                    (Some(list), Some(query)) if query.query_type() == RecordType::A => {
                        for a in list {
                            m.add_answer(Record::from_rdata(query.name().clone(), ttl, RData::A(A(a))));
                        }
                    }
                    _ => {}
                }
                let _ = sock.send_to(&m.to_vec().unwrap(), peer).await;
            }
        });
        addr
    }

    /// `[resolver] servers` with a port: the answers of that server, the records' TTL.
    #[tokio::test]
    async fn resolves_through_the_configured_server_with_its_ttl() {
        let records = Arc::new(Mutex::new(Some(vec!["198.18.21.2".parse().unwrap(), "198.18.21.1".parse().unwrap()])));
        let at = server(records.clone(), 7).await;
        let s = Resolver { servers: vec![at], ..settings(1, 60, 0) };
        let r = build(&s).unwrap();
        let name = DnsName::parse("app.test").unwrap();
        let (addrs, ttl) = lookup(&r, &name).await.unwrap();
        assert_eq!(addrs, [ip("198.18.21.1"), ip("198.18.21.2")]);
        assert!(ttl <= Duration::from_secs(7) && ttl >= Duration::from_secs(5), "{ttl:?}");
        // The follower reports the answer, then the failure (no time to keep it).
        let (tx, mut rx) = mpsc::channel(8);
        let mut names = Names::new(tx);
        *records.lock().unwrap() = Some(vec!["198.18.21.3".parse().unwrap()]);
        names.follow(std::slice::from_ref(&name), &Resolver { servers: vec![at], ..settings(1, 1, 0) });
        let ev = rx.recv().await.unwrap();
        assert_eq!(ev.resolved.state, Resolution::Answered);
        assert_eq!(ev.resolved.addresses, [ip("198.18.21.3")]);
        *records.lock().unwrap() = None;
        let ev = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                let ev = rx.recv().await.unwrap();
                if ev.error.is_some() {
                    return ev;
                }
            }
        })
        .await
        .unwrap();
        assert!(matches!(ev.resolved.state, Resolution::Failed(_)), "{ev:?}");
        assert!(ev.resolved.addresses.is_empty());
        names.stop();
    }
}
