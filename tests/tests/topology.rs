//! The namespace topology itself: addressing, direct reachability, and cleanup on drop.
use lb_tests::topology::{Topology, TopologySpec};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

#[test]
fn hosts_reach_each_other_and_namespaces_are_removed_on_drop() {
    let spec = TopologySpec { prefix: "ttop".into(), zones: vec![(1, 1)], outside_clients: 1 };
    let names;
    {
        let topo = Topology::build(&spec).expect("building the topology (needs root)");
        names = [topo.switch.name().to_owned(), topo.lb.ns.name().to_owned()];
        let b = &topo.backends[0];
        let _srv = b
            .ns
            .spawn(&[env!("CARGO_BIN_EXE_lb-testsrv"), "b1-1", &format!("{}:8080", b.v4), &format!("[{}]:8080", b.v6)])
            .unwrap();
        for v6 in [false, true] {
            let target = SocketAddr::new(b.addr(v6), 8080);
            for c in &topo.clients {
                let greeting =
                    c.ns.run(move || -> std::io::Result<String> {
                        let mut last = None;
                        for _ in 0..100 {
                            match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
                                Ok(s) => {
                                    let mut line = String::new();
                                    BufReader::new(s).read_line(&mut line)?;
                                    return Ok(line);
                                }
                                Err(e) => last = Some(e),
                            }
                            std::thread::sleep(Duration::from_millis(100));
                        }
                        Err(last.unwrap())
                    })
                    .unwrap()
                    .unwrap_or_else(|e| panic!("{} cannot reach {target}: {e}", c.name));
                assert_eq!(greeting, "b1-1\n");
            }
        }
    }
    let left = std::process::Command::new("ip").args(["netns", "list"]).output().unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    for n in names {
        assert!(!left.lines().any(|l| l.split_whitespace().next() == Some(n.as_str())), "{n} left behind");
    }
}
