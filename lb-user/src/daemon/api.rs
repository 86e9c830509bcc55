//! The control API between the `lb` CLI and the daemon: one JSON request line, one JSON response
//! line, over a Unix socket (default [`DEFAULT_SOCKET`]).

use super::control_slots::{Limits, Slot, Slots};
use super::reply::Reply;
use crate::error::ErrorKind;
use ipnet::IpNet;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub const DEFAULT_SOCKET: &str = "/run/lb/lb.sock";

pub use super::reply::HealthOverride;

/// The protocol of a flow `lb explain` explains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    Tcp,
    Udp,
    /// ICMP (ICMPv6 for an IPv6 client): L3_DEFAULT services only.
    Icmp,
}

/// What to trace (`lb trace` flags; checked and written by `trace`). Absent fields match every packet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TraceSpec {
    /// Client (source) prefix.
    pub client: Option<IpNet>,
    /// VIP (destination) address.
    pub vip: Option<IpAddr>,
    /// Destination port.
    pub port: Option<u16>,
    pub proto: Option<Proto>,
    /// Events per second and CPU, 1..=MAX_RATE.
    pub rate: u32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    Status,
    Stats,
    Explain {
        service: String,
        client: IpAddr,
        /// The flow's destination (next-hop services).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dst: Option<IpAddr>,
        sport: Option<u16>,
        dport: Option<u16>,
        proto: Option<Proto>,
    },
    BackendSet {
        service: String,
        address: IpAddr,
        health: HealthOverride,
    },
    BackendDrain {
        service: String,
        address: IpAddr,
    },
    BackendUndrain {
        service: String,
        address: IpAddr,
    },
    Reload,
    /// What a reload would change, without applying it.
    ReloadDryRun,
    /// Drain the whole host: withdraw the VIPs, keep forwarding `grace_sec` (default
    /// `[announce] drain_grace_sec`), then stop.
    HostDrain {
        grace_sec: Option<u32>,
    },
    /// Attach the traced program with this filter for `seconds` (`lb trace`).
    TraceStart {
        spec: TraceSpec,
        seconds: u32,
    },
    /// Attach the balancer's own program again.
    TraceStop,
}

/// One reply line: `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`. The daemon
/// sends a [`Reply`]; a client reads the result type it asked for (see [`call`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(bound(deserialize = "T: Deserialize<'de>"))]
pub struct Response<T = Reply> {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<T>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What kind of failure `error` is, when a caller may act on it (absent from older daemons).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ErrorKind>,
}

impl<T> Response<T> {
    pub fn ok(result: T) -> Self {
        Self { ok: true, result: Some(result), error: None, kind: None }
    }
    pub fn err(e: impl std::fmt::Display) -> Self {
        Self { ok: false, result: None, error: Some(e.to_string()), kind: None }
    }
    /// The answer to a failed request: its message and, when typed, its kind.
    pub fn failed(e: &anyhow::Error) -> Self {
        Self { ok: false, result: None, error: Some(format!("{e:#}")), kind: ErrorKind::of(e) }
    }
}

pub use crate::error::CallError;

/// Send one request to the daemon and return its result as `T` (the reply type of the
/// request, in [`super::reply`]), or its error as an `Err`.
pub async fn call<T: DeserializeOwned>(socket: &Path, req: &Request) -> anyhow::Result<T> {
    let stream = UnixStream::connect(socket)
        .await
        .map_err(|source| CallError::Unreachable { socket: socket.to_path_buf(), source })?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    // A refused connection is answered and closed before the request is taken: the write
    // then fails, and the answer says why.
    let sent = async {
        write.write_all(line.as_bytes()).await?;
        write.shutdown().await
    }
    .await;
    let mut reply = String::new();
    BufReader::new(read).read_line(&mut reply).await?;
    if reply.is_empty() {
        sent?;
        anyhow::bail!("the daemon closed the connection without answering");
    }
    let resp: Response<T> = serde_json::from_str(&reply)
        .map_err(|e| anyhow::anyhow!("unexpected reply from the daemon ({e}): {}", reply.trim()))?;
    match (resp.ok, resp.result) {
        (true, Some(result)) => Ok(result),
        (true, None) => Ok(serde_json::from_value(serde_json::Value::Null)?),
        (false, _) => Err(CallError::Refused {
            message: resp.error.unwrap_or_else(|| "unknown daemon error".into()),
            kind: resp.kind,
        }
        .into()),
    }
}

/// Bind the control socket (replacing a stale one), readable by root only.
pub fn bind(socket: &Path) -> anyhow::Result<UnixListener> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if socket.exists() {
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            anyhow::bail!("another lb daemon is already listening on {}", socket.display());
        }
        std::fs::remove_file(socket)?;
    }
    let listener = UnixListener::bind(socket)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// The longest request line taken (a request is a few hundred bytes); a longer one is refused
/// without being read further, so a client cannot grow the daemon's memory.
pub const MAX_REQUEST: usize = 64 * 1024;
/// How long a client may take to send its request, and to take its reply.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// Control connections open at once; when all are taken, the oldest one still sending its
/// request is closed to make room (see [`super::control_slots`]).
pub const MAX_CONNECTIONS: usize = 64;
/// Control connections one client process may hold at once.
pub const PER_CLIENT: usize = 8;

/// A well-formed request read by a connection's task, for the daemon's loop to handle; the
/// loop sends its answer on `reply`.
pub struct Pending {
    pub request: Request,
    pub reply: oneshot::Sender<Response>,
}

/// Accepts control connections until the receiver of `requests` is gone. Each connection is
/// served in its own task (read and write timeouts, [`MAX_REQUEST`]), so a client that connects
/// and stalls holds up neither the daemon's loop nor other clients.
pub fn spawn_server(listener: UnixListener, requests: mpsc::Sender<Pending>) -> JoinHandle<()> {
    spawn_server_with(listener, requests, Limits { total: MAX_CONNECTIONS, per_client: PER_CLIENT })
}

/// [`spawn_server`] with other connection limits.
pub fn spawn_server_with(listener: UnixListener, requests: mpsc::Sender<Pending>, limits: Limits) -> JoinHandle<()> {
    tokio::spawn(async move {
        let slots = Slots::new(limits);
        loop {
            let stream = match listener.accept().await {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of descriptors (or memory): wait instead of spinning on accept.
                    tracing::warn!("control socket: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if requests.is_closed() {
                return;
            }
            let requests = requests.clone();
            // The connecting process: the per-client limit's key.
            let client = stream.peer_cred().ok().and_then(|c| c.pid()).unwrap_or(-1);
            match slots.admit(client) {
                Ok(slot) => {
                    tokio::spawn(serve_connection(stream, slot, requests));
                }
                Err(busy) => {
                    tracing::warn!("control socket: connection refused: {busy}");
                    tokio::spawn(async move {
                        let (_, mut write) = stream.into_split();
                        let _ = tokio::time::timeout(IO_TIMEOUT, reply(&mut write, &Response::err(busy))).await;
                    });
                }
            }
        }
    })
}

/// Serves one connection: reads one request, hands it to the daemon's loop and writes its
/// answer. Every malformed request (too long, not UTF-8, not a request, or not sent within
/// [`IO_TIMEOUT`]) gets an error reply, and so does one cut to make room for another.
async fn serve_connection(stream: UnixStream, mut slot: Slot, requests: mpsc::Sender<Pending>) {
    let (read, mut write) = stream.into_split();
    let read = tokio::select! {
        r = tokio::time::timeout(IO_TIMEOUT, read_request(read)) => Some(r),
        _ = &mut slot.evicted => None,
    };
    let resp = match read {
        None => Response::err(format!(
            "bad request: closed to make room ({MAX_CONNECTIONS} control connections open and this one had sent no complete request)"
        )),
        Some(Err(_)) => Response::err(format!("bad request: none received within {} s", IO_TIMEOUT.as_secs())),
        Some(Ok(Err(e))) => Response::err(format!("bad request: {e}")),
        Some(Ok(Ok(_))) if !slot.request_read() => {
            Response::err("bad request: closed to make room (too many control connections open)")
        }
        Some(Ok(Ok(request))) => {
            let (tx, rx) = oneshot::channel();
            if requests.send(Pending { request, reply: tx }).await.is_err() {
                Response::err("the daemon is shutting down")
            } else {
                rx.await.unwrap_or_else(|_| Response::err("the daemon is shutting down"))
            }
        }
    };
    let _ = tokio::time::timeout(IO_TIMEOUT, reply(&mut write, &resp)).await;
    drop(slot);
}

/// Reads one request line of at most [`MAX_REQUEST`] bytes. The error says what is wrong with
/// it, for the reply.
pub async fn read_request<R: AsyncRead + Unpin>(read: R) -> Result<Request, String> {
    let mut line = Vec::new();
    let mut limited = BufReader::new(read).take(MAX_REQUEST as u64 + 1);
    limited.read_until(b'\n', &mut line).await.map_err(|e| format!("reading it: {e}"))?;
    if line.len() > MAX_REQUEST {
        return Err(format!("longer than {MAX_REQUEST} bytes"));
    }
    let text = std::str::from_utf8(&line).map_err(|e| format!("not UTF-8 ({e})"))?;
    if text.trim().is_empty() {
        return Err("empty (one JSON request line expected)".into());
    }
    serde_json::from_str::<Request>(text).map_err(|e| e.to_string())
}

pub async fn reply(write: &mut tokio::net::unix::OwnedWriteHalf, resp: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_string(resp).map_err(std::io::Error::other)?;
    line.push('\n');
    write.write_all(line.as_bytes()).await?;
    write.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::super::reply::{Reloaded, Status};
    use super::*;

    #[test]
    fn request_wire_format() {
        let r = Request::BackendSet {
            service: "web".into(),
            address: "198.18.1.10".parse().unwrap(),
            health: HealthOverride::Unhealthy,
        };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"request":"backend_set","service":"web","address":"198.18.1.10","health":"unhealthy"}"#);
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
        let explain =
            r#"{"request":"explain","service":"web","client":"198.18.1.1","sport":null,"dport":80,"proto":"icmp"}"#;
        let r = Request::Explain {
            service: "web".into(),
            client: "198.18.1.1".parse().unwrap(),
            dst: None,
            sport: None,
            dport: Some(80),
            proto: Some(Proto::Icmp),
        };
        assert_eq!(serde_json::to_string(&r).unwrap(), explain);
        assert_eq!(serde_json::from_str::<Request>(explain).unwrap(), r);
    }

    /// What the test server answers to Status.
    fn answer() -> Status {
        Status {
            config: "test.toml".into(),
            interfaces: vec!["eth9".into()],
            links: vec![],
            pins: "ok".into(),
            services: vec![],
            announce: None,
            reloads: Default::default(),
            faults: Default::default(),
            probes: Vec::new(),
            clean_slots: None,
        }
    }

    /// A test socket in a directory of its own; the server task answers Status and refuses
    /// the rest, as the daemon's loop would.
    fn test_server(name: &str) -> (std::path::PathBuf, JoinHandle<()>, JoinHandle<()>) {
        test_server_with(name, Limits { total: MAX_CONNECTIONS, per_client: PER_CLIENT })
    }

    fn test_server_with(name: &str, limits: Limits) -> (std::path::PathBuf, JoinHandle<()>, JoinHandle<()>) {
        let dir = std::env::temp_dir().join(format!("lb-api-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let sock = dir.join("lb.sock");
        let listener = bind(&sock).unwrap();
        let (tx, mut rx) = mpsc::channel::<Pending>(8);
        let server = spawn_server_with(listener, tx, limits);
        let answering = tokio::spawn(async move {
            while let Some(p) = rx.recv().await {
                let resp = match p.request {
                    Request::Status => Response::ok(Reply::Status(answer())),
                    other => Response::err(format!("unsupported: {other:?}")),
                };
                let _ = p.reply.send(resp);
            }
        });
        (sock, server, answering)
    }

    /// Sends `bytes` raw and returns the reply line.
    async fn raw(sock: &Path, bytes: &[u8]) -> Response<serde_json::Value> {
        let stream = UnixStream::connect(sock).await.unwrap();
        let (read, mut write) = stream.into_split();
        // The daemon may answer (and close) before taking everything: ignore write errors.
        let _ = write.write_all(bytes).await;
        let _ = write.shutdown().await;
        let mut line = String::new();
        BufReader::new(read).read_line(&mut line).await.unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
    }

    #[tokio::test]
    async fn a_stalled_client_holds_up_no_other_client() {
        let (sock, server, answering) = test_server("stall");
        let stalled = UnixStream::connect(&sock).await.unwrap();
        let started = std::time::Instant::now();
        for _ in 0..3 {
            let got = tokio::time::timeout(Duration::from_secs(2), call::<Status>(&sock, &Request::Status)).await;
            assert_eq!(got.expect("answered while a client stalls").unwrap(), answer());
        }
        assert!(started.elapsed() < IO_TIMEOUT);
        // The stalled client is answered with an error after the timeout, and closed.
        let (read, _write) = stalled.into_split();
        let mut line = String::new();
        tokio::time::timeout(IO_TIMEOUT * 2, BufReader::new(read).read_line(&mut line)).await.unwrap().unwrap();
        let resp: Response<serde_json::Value> = serde_json::from_str(&line).unwrap();
        assert!(!resp.ok && resp.error.as_deref().unwrap().contains("none received within"), "{line}");
        server.abort();
        answering.abort();
        let _ = std::fs::remove_dir_all(sock.parent().unwrap());
    }

    /// Every slot held by idle or half-sent clients (one process, no per-client cap here):
    /// each status request still gets in, by cutting the oldest idle connection.
    #[tokio::test]
    async fn idle_clients_filling_every_slot_do_not_lock_out_a_request() {
        let (sock, server, answering) = test_server_with("lockout", Limits { total: 8, per_client: usize::MAX });
        let mut idle = Vec::new();
        for i in 0..80 {
            let mut s = UnixStream::connect(&sock).await.unwrap();
            if i % 2 == 0 {
                s.write_all(b"{\"request\":").await.unwrap();
            }
            idle.push(s);
        }
        for i in 0..20 {
            let got = tokio::time::timeout(Duration::from_secs(3), call::<Status>(&sock, &Request::Status)).await;
            assert_eq!(got.expect("answered").unwrap_or_else(|e| panic!("try {i}: {e:#}")), answer());
        }
        server.abort();
        answering.abort();
        let _ = std::fs::remove_dir_all(sock.parent().unwrap());
    }

    #[tokio::test]
    async fn malformed_requests_each_get_an_error() {
        let (sock, server, answering) = test_server("malformed");
        let huge = vec![b'x'; 4 * MAX_REQUEST];
        let cases: [(&[u8], &str); 5] = [
            (&huge, "longer than 65536 bytes"),
            (b"\xff\xfe{\"request\":\"status\"}\n", "not UTF-8"),
            (b"{\"request\":\"launch\"}\n", "unknown variant `launch`"),
            (b"\n", "empty"),
            (b"{\"request\":\"status\"", "EOF while parsing"),
        ];
        for (bytes, want) in cases {
            let resp = tokio::time::timeout(Duration::from_secs(3), raw(&sock, bytes)).await.expect("answered at once");
            assert!(!resp.ok, "{want}: {resp:?}");
            let err = resp.error.unwrap();
            assert!(err.starts_with("bad request: ") && err.contains(want), "{want}: {err}");
        }
        assert!(raw(&sock, b"{\"request\":\"status\"}\n").await.ok);
        server.abort();
        answering.abort();
        let _ = std::fs::remove_dir_all(sock.parent().unwrap());
    }

    #[tokio::test]
    async fn round_trip_over_a_socket() {
        let (sock, server, answering) = test_server("round-trip");
        assert_eq!(call::<Status>(&sock, &Request::Status).await.unwrap(), answer());
        let err = call::<Reloaded>(&sock, &Request::Reload).await.unwrap_err();
        assert_eq!(err.to_string(), "unsupported: Reload");
        server.abort();
        answering.abort();
        drop(server.await);
        assert!(bind(&sock).is_ok(), "a stale socket file is replaced");
        std::fs::remove_dir_all(sock.parent().unwrap()).unwrap();
    }
}
