//! GRPC health checks (`protocol = "GRPC"` / `"GRPC_WITH_TLS"`, Google Cloud's): the standard
//! `grpc.health.v1.Health/Check` for `grpc_service_name` (empty: the server as a whole), through
//! tonic's client; SERVING passes, anything else fails with what was answered. The connection is
//! the probe's own (`probe::open_with`, so it follows the probe's path, to the VIP by default),
//! handed to tonic by a connector: plain HTTP/2 (prior knowledge) or over TLS with ALPN h2.
//! The request's `:authority` is the backend's address and the check's port (as the HTTP2
//! check's, and as a gRPC client dialling that address sends it), `:scheme` `https` over TLS.
//! The TLS probe does not verify the backend's certificate, as Google Cloud's does not.

use super::probe::{open_with, LocalError, Observation, Prober, Target};
use hyper_util::rt::TokioIo;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Mutex;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

#[derive(Debug)]
pub struct GrpcProber {
    pub tls: bool,
    /// `grpc_service_name`; empty: the server's overall health.
    pub service: String,
}

impl Prober for GrpcProber {
    fn observe<'a>(
        &'a self,
        to: &'a Target,
    ) -> Pin<Box<dyn Future<Output = Result<Observation, LocalError>> + Send + 'a>> {
        Box::pin(async move {
            use tokio_rustls::rustls::pki_types::ServerName;
            let name = self.tls.then(|| ServerName::IpAddress(to.addr.ip().into()));
            let stream = match open_with(to, false, name, self.tls).await? {
                Ok(stream) => stream,
                Err(failed) => return Ok(failed),
            };
            Ok(self.check(stream, to.addr).await.map_or_else(Observation::Failed, |()| Observation::Connected))
        })
    }
}

impl GrpcProber {
    /// The request's origin: the scheme, and the backend's address and port as the authority
    /// (an IPv6 address without its scope, which an authority cannot carry).
    fn origin(&self, addr: SocketAddr) -> Result<tonic::transport::Uri, String> {
        let scheme = if self.tls { "https" } else { "http" };
        let authority = match addr {
            SocketAddr::V4(a) => a.to_string(),
            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
        };
        format!("{scheme}://{authority}").parse().map_err(|e| format!("gRPC origin {authority}: {e}"))
    }

    async fn check(&self, stream: Box<dyn super::probe::Io>, addr: SocketAddr) -> Result<(), String> {
        // One connection, made already: the connector hands it over once.
        let stream = Mutex::new(Some(stream));
        let connector = tower::service_fn(move |_: tonic::transport::Uri| {
            let taken = stream.lock().ok().and_then(|mut s| s.take());
            async move { taken.map(TokioIo::new).ok_or_else(|| std::io::Error::other("the probe's connection was used")) }
        });
        // The endpoint's URI only reaches the connector, which ignores it (plain `http`: tonic
        // never adds its own TLS); the origin names the backend in each request.
        let channel = tonic::transport::Endpoint::from_static("http://probe")
            .origin(self.origin(addr)?)
            .connect_with_connector(connector)
            .await
            .map_err(|e| format!("gRPC connection: {e}"))?;
        let request = HealthCheckRequest { service: self.service.clone() };
        let answer = HealthClient::new(channel)
            .check(request)
            .await
            .map_err(|status| format!("gRPC health: {:?}: {}", status.code(), status.message()))?;
        match answer.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other => Err(format!("gRPC health: {}", other.as_str_name())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tokio::net::TcpListener;
    use tonic_health::server::{health_reporter, HealthReporter};

    /// A real gRPC health server (tonic-health's) on a loopback port: its reporter, its address.
    async fn health_server() -> (HealthReporter, SocketAddr) {
        let (reporter, addr, _) = recording_health_server().await;
        (reporter, addr)
    }

    /// [`health_server`], recording each request's URI (scheme and authority included).
    async fn recording_health_server() -> (HealthReporter, SocketAddr, Arc<Mutex<Vec<String>>>) {
        let (reporter, service) = health_reporter();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let mut server = tonic::transport::Server::builder().trace_fn(move |req| {
            record.lock().unwrap().push(req.uri().to_string());
            tracing::Span::none()
        });
        tokio::spawn(server.add_service(service).serve_with_incoming(incoming));
        (reporter, addr, seen)
    }

    /// TLS (self-signed, ALPN h2) in front of the plain server at `inner`.
    async fn tls_front(inner: SocketAddr) -> SocketAddr {
        use tokio_rustls::rustls::{self, pki_types::PrivateKeyDer};
        let cert = rcgen::generate_simple_self_signed(vec!["grpc.test".into()]).unwrap();
        let key = PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(vec![cert.cert.der().clone()], key)
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((s, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let (Ok(mut tls), Ok(mut plain)) =
                        (acceptor.accept(s).await, tokio::net::TcpStream::connect(inner).await)
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        addr
    }

    async fn probe(addr: SocketAddr, tls: bool, service: &str) -> Observation {
        let prober = GrpcProber { tls, service: service.into() };
        let to = Target::direct(addr);
        tokio::time::timeout(std::time::Duration::from_secs(10), prober.observe(&to)).await.unwrap().unwrap()
    }

    #[tokio::test]
    async fn serving_passes_and_not_serving_fails_with_and_without_tls() {
        let (reporter, plain) = health_server().await;
        let tls = tls_front(plain).await;
        reporter.set_service_status("shop", tonic_health::ServingStatus::Serving).await;
        for (addr, with_tls) in [(plain, false), (tls, true)] {
            assert_eq!(probe(addr, with_tls, "shop").await, Observation::Connected, "tls {with_tls}");
            assert_eq!(probe(addr, with_tls, "").await, Observation::Connected, "the server as a whole");
        }
        reporter.set_service_status("shop", tonic_health::ServingStatus::NotServing).await;
        for (addr, with_tls) in [(plain, false), (tls, true)] {
            assert_eq!(probe(addr, with_tls, "shop").await, Observation::Failed("gRPC health: NOT_SERVING".into()));
        }
        reporter.set_service_status("shop", tonic_health::ServingStatus::Serving).await;
        for (addr, with_tls) in [(plain, false), (tls, true)] {
            assert_eq!(probe(addr, with_tls, "shop").await, Observation::Connected, "serving again, tls {with_tls}");
        }
        // A service the server does not know: NotFound.
        let Observation::Failed(why) = probe(plain, false, "nope").await else { panic!("an unknown service passed") };
        assert!(why.contains("NotFound"), "{why}");
    }

    /// The request names the backend (its address and the check's port) as its authority, and
    /// its scheme is `https` over TLS.
    #[tokio::test]
    async fn the_request_names_the_backend() {
        let (_reporter, plain, seen) = recording_health_server().await;
        let tls = tls_front(plain).await;
        assert_eq!(probe(plain, false, "").await, Observation::Connected);
        assert_eq!(probe(tls, true, "").await, Observation::Connected);
        let check = "/grpc.health.v1.Health/Check";
        assert_eq!(*seen.lock().unwrap(), [format!("http://{plain}{check}"), format!("https://{tls}{check}")]);
        let v6 = GrpcProber { tls: false, service: String::new() };
        let scoped = SocketAddr::V6(std::net::SocketAddrV6::new("fe80::1".parse().unwrap(), 50051, 0, 2));
        assert_eq!(v6.origin(scoped).unwrap(), "http://[fe80::1]:50051");
    }

    /// A plain relay to `inner`: its address, and a signal each time a relayed connection ends
    /// (both sides closed).
    async fn relay(inner: SocketAddr) -> (SocketAddr, tokio::sync::mpsc::UnboundedReceiver<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (ended, ends) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let ended = ended.clone();
                tokio::spawn(async move {
                    if let Ok(mut plain) = tokio::net::TcpStream::connect(inner).await {
                        let _ = tokio::io::copy_bidirectional(&mut s, &mut plain).await;
                    }
                    let _ = ended.send(());
                });
            }
        });
        (addr, ends)
    }

    /// A probe leaves no connection behind, passed or cut by the runner's timeout: tonic's
    /// connection task must not outlive the probe (a probe every few seconds per backend).
    #[tokio::test]
    async fn a_probe_leaves_no_connection_behind() {
        use std::time::Duration;
        let (reporter, server) = health_server().await;
        reporter.set_service_status("shop", tonic_health::ServingStatus::Serving).await;
        let (addr, mut ends) = relay(server).await;
        assert_eq!(probe(addr, false, "shop").await, Observation::Connected);
        tokio::time::timeout(Duration::from_secs(5), ends.recv())
            .await
            .expect("a passed probe's connection stayed open");

        // A server that accepts and never answers: the runner's timeout cuts the probe.
        let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = silent.local_addr().unwrap();
        let (closed, mut closes) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = silent.accept().await {
                let closed = closed.clone();
                tokio::spawn(async move {
                    use tokio::io::AsyncReadExt;
                    let mut buf = [0u8; 4096];
                    while let Ok(1..) = s.read(&mut buf).await {}
                    let _ = closed.send(());
                });
            }
        });
        let prober = GrpcProber { tls: false, service: "shop".into() };
        let seen = super::super::probe::observe(&prober, &Target::direct(addr), Duration::from_millis(300)).await;
        assert_eq!(seen, Ok(Observation::Failed("timeout after 300ms".into())));
        tokio::time::timeout(Duration::from_secs(5), closes.recv())
            .await
            .expect("a timed-out probe's connection stayed open");
    }

    #[tokio::test]
    async fn a_server_that_is_not_grpc_fails() {
        // Plain TCP that answers text and closes; and TLS expected where there is none.
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                use tokio::io::AsyncWriteExt;
                let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n").await;
            }
        });
        assert!(matches!(probe(addr, false, "").await, Observation::Failed(_)));
        let (_reporter, plain) = health_server().await;
        assert!(matches!(probe(plain, true, "").await, Observation::Failed(_)), "TLS to a plain server");
    }
}
