//! DNS messages and exchanges for the tests of the daemon's DNS front: a query builder, and
//! one query over UDP (retried) or over a TCP connection (length-prefixed, RFC 1035 4.2.2).
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

/// A query with id `id` for the A record of the name made of `labels`, and an OPT record
/// holding `options` (code, data) when given (payload 65535, version and flags 0).
pub fn query(id: u16, labels: &[&str], options: Option<&[(u16, Vec<u8>)]>) -> Vec<u8> {
    let mut q = id.to_be_bytes().to_vec();
    q.extend_from_slice(&[1, 0, 0, 1, 0, 0, 0, 0, 0, u8::from(options.is_some())]);
    for label in labels {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    if let Some(opts) = options {
        let rdata: Vec<u8> = opts
            .iter()
            .flat_map(|(code, data)| {
                let mut o = code.to_be_bytes().to_vec();
                o.extend_from_slice(&(data.len() as u16).to_be_bytes());
                o.extend_from_slice(data);
                o
            })
            .collect();
        // Root name, type OPT, payload 65535, extended rcode/version/flags 0.
        q.extend_from_slice(&[0, 0, 41, 0xff, 0xff, 0, 0, 0, 0]);
        q.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        q.extend_from_slice(&rdata);
    }
    q
}

/// Sends `q` to `to` over UDP, up to `tries` times, each waiting 2 s for the answer.
pub fn ask_udp(to: SocketAddr, q: &[u8], tries: usize) -> std::io::Result<Vec<u8>> {
    let s = UdpSocket::bind("127.0.0.1:0")?;
    s.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 1500];
    for _ in 0..tries {
        s.send_to(q, to)?;
        if let Ok((n, _)) = s.recv_from(&mut buf) {
            return Ok(buf[..n].to_vec());
        }
    }
    Err(std::io::Error::other(format!("no UDP answer in {tries} tries")))
}

/// Sends `q` on `s` with its length prefix and reads one answer (5 s at most).
pub fn ask_on(mut s: TcpStream, q: &[u8]) -> std::io::Result<Vec<u8>> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.write_all(&(q.len() as u16).to_be_bytes())?;
    s.write_all(q)?;
    let mut len = [0u8; 2];
    s.read_exact(&mut len)?;
    let mut msg = vec![0u8; u16::from_be_bytes(len) as usize];
    s.read_exact(&mut msg)?;
    Ok(msg)
}
