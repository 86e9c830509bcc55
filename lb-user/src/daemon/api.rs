//! The control API between the `lb` CLI and the daemon: one JSON request line, one JSON response
//! line, over a Unix socket (default [`DEFAULT_SOCKET`]).

use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::Path;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

pub const DEFAULT_SOCKET: &str = "/run/lb/lb.sock";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum HealthOverride {
    Healthy,
    Unhealthy,
    /// Back to the health checker's verdict.
    Auto,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "request", rename_all = "snake_case")]
pub enum Request {
    Status,
    Stats,
    Explain { service: String, client: IpAddr, sport: Option<u16>, dport: Option<u16>, proto: Option<String> },
    BackendSet { service: String, address: IpAddr, health: HealthOverride },
    BackendDrain { service: String, address: IpAddr },
    BackendUndrain { service: String, address: IpAddr },
    Reload,
    /// Drain the whole host: withdraw the VIPs, keep forwarding `grace_sec` (default
    /// `[announce] drain_grace_sec`), then stop.
    HostDrain { grace_sec: Option<u32> },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Response {
    pub fn ok(result: serde_json::Value) -> Self {
        Self { ok: true, result: Some(result), error: None }
    }
    pub fn err(e: impl std::fmt::Display) -> Self {
        Self { ok: false, result: None, error: Some(e.to_string()) }
    }
}

/// Send one request to the daemon and return its result, or its error as an `Err`.
pub async fn call(socket: &Path, req: &Request) -> anyhow::Result<serde_json::Value> {
    let stream = UnixStream::connect(socket).await.map_err(|e| {
        anyhow::anyhow!("cannot reach the lb daemon at {}: {e} (is `lb run` running?)", socket.display())
    })?;
    let (read, mut write) = stream.into_split();
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    write.write_all(line.as_bytes()).await?;
    write.shutdown().await?;
    let mut reply = String::new();
    BufReader::new(read).read_line(&mut reply).await?;
    if reply.is_empty() {
        anyhow::bail!("the daemon closed the connection without answering");
    }
    let resp: Response = serde_json::from_str(&reply)?;
    if resp.ok {
        Ok(resp.result.unwrap_or(serde_json::Value::Null))
    } else {
        anyhow::bail!("{}", resp.error.unwrap_or_else(|| "unknown daemon error".into()))
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

/// Read one request from an accepted connection. Malformed input is answered right here.
pub async fn read_request(stream: UnixStream) -> Option<(Request, tokio::net::unix::OwnedWriteHalf)> {
    let (read, mut write) = stream.into_split();
    let mut line = String::new();
    if BufReader::new(read).read_line(&mut line).await.is_err() {
        return None;
    }
    match serde_json::from_str::<Request>(&line) {
        Ok(req) => Some((req, write)),
        Err(e) => {
            let _ = reply(&mut write, &Response::err(format!("bad request: {e}"))).await;
            None
        }
    }
}

pub async fn reply(write: &mut tokio::net::unix::OwnedWriteHalf, resp: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_string(resp).map_err(std::io::Error::other)?;
    line.push('\n');
    write.write_all(line.as_bytes()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_wire_format() {
        let r = Request::BackendSet { service: "web".into(), address: "198.18.1.10".parse().unwrap(), health: HealthOverride::Unhealthy };
        let s = serde_json::to_string(&r).unwrap();
        assert_eq!(s, r#"{"request":"backend_set","service":"web","address":"198.18.1.10","health":"unhealthy"}"#);
        assert_eq!(serde_json::from_str::<Request>(&s).unwrap(), r);
    }

    #[tokio::test]
    async fn round_trip_over_a_socket() {
        let dir = std::env::temp_dir().join(format!("lb-api-test-{}", std::process::id()));
        let sock = dir.join("lb.sock");
        let listener = bind(&sock).unwrap();
        let server = tokio::spawn(async move {
            for _ in 0..2 {
                let (s, _) = listener.accept().await.unwrap();
                let (req, mut w) = read_request(s).await.unwrap();
                let resp = match req {
                    Request::Status => Response::ok(serde_json::json!({"services": 1})),
                    other => Response::err(format!("unsupported: {other:?}")),
                };
                reply(&mut w, &resp).await.unwrap();
            }
        });
        assert_eq!(call(&sock, &Request::Status).await.unwrap(), serde_json::json!({"services": 1}));
        let err = call(&sock, &Request::Reload).await.unwrap_err();
        assert_eq!(err.to_string(), "unsupported: Reload");
        server.await.unwrap();
        assert!(bind(&sock).is_ok(), "a stale socket file is replaced");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
