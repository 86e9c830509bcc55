//! Test backend: answers TCP and UDP on the given addresses with its own name.
//!
//! TCP: greets each connection with `NAME\n`, then answers every line `L` with `NAME L\n`, so a
//! test can keep a connection open and see which backend serves each request.
//! UDP: answers every datagram with `NAME`.
//! Usage: lb-testsrv NAME ADDR:PORT [ADDR:PORT...]
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().expect("usage: lb-testsrv NAME ADDR:PORT...");
    let addrs: Vec<SocketAddr> = args.map(|a| a.parse().expect("ADDR:PORT")).collect();
    let mut threads = Vec::new();
    for addr in addrs {
        let tcp = bind_retry(|| TcpListener::bind(addr), addr);
        let n = name.clone();
        threads.push(std::thread::spawn(move || {
            for stream in tcp.incoming().flatten() {
                let n = n.clone();
                std::thread::spawn(move || {
                    let mut w = match stream.try_clone() {
                        Ok(w) => w,
                        Err(_) => return,
                    };
                    if writeln!(w, "{n}").is_err() {
                        return;
                    }
                    for line in BufReader::new(stream).lines() {
                        let Ok(line) = line else { return };
                        if writeln!(w, "{n} {line}").is_err() {
                            return;
                        }
                    }
                });
            }
        }));
        let udp = bind_retry(|| UdpSocket::bind(addr), addr);
        let n = name.clone();
        threads.push(std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while let Ok((_, peer)) = udp.recv_from(&mut buf) {
                let _ = udp.send_to(n.as_bytes(), peer);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
}

/// The VIP may still be in IPv6 duplicate-address detection right after setup: retry briefly.
fn bind_retry<T>(f: impl Fn() -> std::io::Result<T>, addr: SocketAddr) -> T {
    for _ in 0..100 {
        if let Ok(s) = f() {
            return s;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    f().unwrap_or_else(|e| panic!("binding {addr}: {e}"))
}
