//! Hostile frames through the real program (BPF_PROG_TEST_RUN), issue 19 item 1: at least a
//! million generated and mutated frames (`lb_tests::fuzz`) against IPIP, IP6IP6, L2 DSR and
//! L3_DEFAULT services. For every frame: a pass leaves it untouched, a forwarded frame is a
//! well-formed encapsulation of the input, the input with only its MACs changed, or a
//! well-formed ICMP "too big" reply; all pieces of a fragmented datagram reach one backend.
//! Per batch of frames: the global counters moved exactly as the verdicts returned (rx = the
//! frames sent = passes + transmits + redirects + ICMP replies + drops, each drop under a
//! `drop_*` reason). Seeded: `LB_FUZZ_SEED` and `LB_FUZZ_FRAMES` override the defaults,
//! `LB_FUZZ_BATCH=1` compares the counters after every frame; the seed is printed on failure.
//!
//! Checksums are not the balancer's to verify: a frame with a bad IP or transport checksum is
//! forwarded byte for byte and the backend's stack drops it. "Well formed" here means the
//! headers the balancer writes are valid and the datagram it carries is the input's, whose
//! IP header is sound enough to be delivered (version, IHL, length within the frame).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::maps::{affinity, forwarding, stat, tracking, PROTO_ANY, PROTO_TCP, PROTO_UDP};
use lb_tests::fixture::{self, backend, backend_mac, service_info, service_key, TEST_M};
use lb_tests::fixture_net::{in_netns, GW2_MAC, GW_MAC, LB2_MAC, LB_MAC};
use lb_tests::fuzz::{self, check_forwarded, Expect, Forwarded, Gen, Targets};
use lb_user::dataplane::{addr_words, Dataplane, Program, XDP_DROP, XDP_PASS, XDP_REDIRECT, XDP_TX};

const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
/// IPIP: TCP 80 and UDP 53 to two near backends, TCP 8080 to a far one (redirect).
const VIP4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
/// L2 DSR: TCP 80 and every UDP port (fragments of UDP datagrams are balanced); two backends
/// on the ingress segment, one behind another device.
const VIP4_DSR: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 101);
/// L3_DEFAULT (every protocol and port), IPIP.
const VIP4_L3: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 102);
const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x100);
const VIP6_DSR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x101);
const VIP6_L3: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x102);
const ENCAP_SRC4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const ENCAP_SRC6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

/// Frames of the CI run (the soak runs more, `cargo xtask soak`).
const CI_FRAMES: u64 = 1_000_000;
/// Frames between two reads of the counters.
const BATCH: u64 = 256;

/// Counters that end a frame's run: exactly one of them moves per frame.
const PASSES: [u32; 3] = [stat::PASS_NOT_VIP, stat::PASS_NOT_OUR_MAC, stat::PASS_FRAGMENT];
const DROPS: [u32; 12] = [
    stat::DROP_TRUNCATED_ETH,
    stat::DROP_TRUNCATED_IP,
    stat::DROP_BAD_IP_HEADER,
    stat::DROP_TRUNCATED_L4,
    stat::DROP_NO_BACKEND,
    stat::DROP_NO_TABLE,
    stat::DROP_FIB,
    stat::DROP_ENCAP,
    stat::DROP_UNROUTABLE,
    stat::DROP_CLASS_UNROUTABLE,
    stat::DROP_TOO_BIG,
    stat::DROP_MARTIAN,
];

fn near4(i: u8) -> IpAddr {
    Ipv4Addr::new(198, 19, 10, i).into()
}

fn near6(i: u16) -> IpAddr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x10, 0, 0, 0, 0, i).into()
}

/// A table spreading flows over `ids`.
fn spread(ids: &[u32]) -> Vec<u32> {
    (0..TEST_M as usize).map(|i| ids[i % ids.len()]).collect()
}

/// The services above; returns what the checker may accept.
fn configure(dp: &mut Dataplane) -> Expect {
    let ipip = |id| {
        let mut s = service_info(id, affinity::NONE, tracking::PER_CONNECTION, forwarding::IPIP);
        s.encap_src = addr_words(IpAddr::V4(ENCAP_SRC4)).0;
        s
    };
    let ip6ip6 = |id| {
        let mut s = service_info(id, affinity::NONE, tracking::PER_CONNECTION, forwarding::IPIP);
        s.encap_src = addr_words(IpAddr::V6(ENCAP_SRC6)).0;
        s
    };
    dp.set_service(&[service_key(VIP4.into(), 80, PROTO_TCP), service_key(VIP4.into(), 53, PROTO_UDP)], ipip(1))
        .unwrap();
    dp.set_service(&[service_key(VIP4.into(), 8080, PROTO_TCP)], ipip(2)).unwrap();
    let dsr = service_info(3, affinity::CLIENT_IP, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(
        &[
            service_key(VIP4_DSR.into(), 80, PROTO_TCP),
            service_key(VIP4_DSR.into(), 0, PROTO_UDP),
            service_key(VIP6_DSR.into(), 80, PROTO_TCP),
            service_key(VIP6_DSR.into(), 0, PROTO_UDP),
        ],
        dsr,
    )
    .unwrap();
    dp.set_service(&[service_key(VIP6.into(), 80, PROTO_TCP), service_key(VIP6.into(), 53, PROTO_UDP)], ip6ip6(4))
        .unwrap();
    dp.set_service(&[service_key(VIP6.into(), 8080, PROTO_TCP)], ip6ip6(5)).unwrap();
    dp.set_service(&[service_key(VIP4_L3.into(), 0, PROTO_ANY)], ipip(6)).unwrap();
    dp.set_service(&[service_key(VIP6_L3.into(), 0, PROTO_ANY)], ip6ip6(7)).unwrap();
    let far4: IpAddr = Ipv4Addr::new(198, 19, 20, 7).into();
    let far6: IpAddr = Ipv6Addr::new(0x2001, 0xdb8, 0x20, 0, 0, 0, 0, 7).into();
    let backends = [(1, near4(3)), (2, near4(4)), (3, far4), (4, near6(3)), (5, near6(4)), (6, far6)];
    for (id, addr) in backends {
        dp.set_backend(id, backend(addr, [0; 6], 0)).unwrap();
    }
    // L2 DSR backends behind lbv0 (the route leads back out of the ingress: XDP_TX) and one
    // behind lbv2 (XDP_REDIRECT).
    let far_dsr: IpAddr = Ipv4Addr::new(198, 19, 20, 9).into();
    for (id, addr) in [(7, near4(17)), (8, near4(18)), (9, far_dsr)] {
        dp.set_backend(id, backend(addr, backend_mac(id), 0)).unwrap();
    }
    for (svc, ids) in
        [(1, &[1, 2][..]), (2, &[3]), (3, &[7, 8, 9]), (4, &[4, 5]), (5, &[6]), (6, &[1, 2]), (7, &[4, 5])]
    {
        dp.write_table(svc, 0, 0, &spread(ids)).unwrap();
    }
    Expect {
        tx_macs: (GW_MAC, LB_MAC),
        redirect_macs: (GW2_MAC, LB2_MAC),
        encap_src4: ENCAP_SRC4,
        encap_src6: ENCAP_SRC6,
        backends: backends.iter().map(|b| b.1).collect(),
        dsr_macs: vec![backend_mac(7), backend_mac(8), backend_mac(9)],
        local_mac: LB_MAC,
    }
}

fn targets() -> Targets {
    Targets {
        local_mac: LB_MAC,
        client_mac: CLIENT_MAC,
        client4: CLIENT4,
        client6: CLIENT6,
        vips4: vec![VIP4, VIP4, VIP4_DSR, VIP4_L3],
        vips6: vec![VIP6, VIP6, VIP6_DSR, VIP6_L3],
        ports: vec![80, 53, 8080, 22],
    }
}

/// Verdicts of a batch, by the counter group that must have moved for them.
#[derive(Default, Debug, PartialEq, Eq)]
struct Tally {
    rx: u64,
    pass: u64,
    drop: u64,
    tx: u64,
    redirect: u64,
    too_big: u64,
}

impl Tally {
    /// The counters' movement between two reads.
    fn of(before: &[u64], after: &[u64]) -> Tally {
        let d = |i: u32| after[i as usize] - before[i as usize];
        Tally {
            rx: d(stat::RX_PACKETS),
            pass: PASSES.iter().map(|&i| d(i)).sum(),
            drop: DROPS.iter().map(|&i| d(i)).sum(),
            tx: d(stat::TX),
            redirect: d(stat::REDIRECT),
            too_big: d(stat::ICMP_TOO_BIG_SENT),
        }
    }

    fn terminal(&self) -> u64 {
        self.pass + self.drop + self.tx + self.redirect + self.too_big
    }
}

/// Runs `frames` frames of seed `seed`; panics with the seed, the frame number and the frame.
pub fn run(seed: u64, frames: u64, batch: u64) {
    in_netns(move |topo| {
        let mut dp = fixture::load();
        let expect = configure(&mut dp);
        let mut gen = Gen::new(seed, targets());
        let mut groups: HashMap<u64, Forwarded> = HashMap::new();
        let mut before = dp.stats().unwrap().global;
        let mut want = Tally::default();
        let mut seen: HashMap<&'static str, u64> = HashMap::new();
        let mut actions = [0u64; 5];
        for n in 0..frames {
            let f = gen.next_frame();
            let fail = |why: String| -> ! {
                panic!("LB_FUZZ_SEED={seed:#x}, frame {n} ({}): {why}\ninput {:02x?}", f.what, f.bytes)
            };
            let out = dp.run_test(Program::Lb, &f.bytes, topo.lbv0).unwrap_or_else(|e| fail(format!("{e:#}")));
            want.rx += 1;
            *seen.entry(f.what).or_default() += 1;
            match out.action {
                XDP_PASS => {
                    want.pass += 1;
                    if out.data != f.bytes {
                        fail(format!("passed, but changed: {:02x?}", out.data));
                    }
                }
                XDP_DROP => want.drop += 1,
                XDP_TX | XDP_REDIRECT => {
                    let redirect = out.action == XDP_REDIRECT;
                    let got = check_forwarded(&expect, &f.bytes, &out.data, redirect)
                        .unwrap_or_else(|e| fail(format!("{e}\noutput {:02x?}", out.data)));
                    match (&got, redirect) {
                        (Forwarded::TooBig, _) => want.too_big += 1,
                        (_, true) => want.redirect += 1,
                        (_, false) => want.tx += 1,
                    }
                    // Every piece of a datagram goes where the others went.
                    if let (Some(g), Forwarded::Encap(_) | Forwarded::Dsr(_)) = (f.group, &got) {
                        let first = groups.entry(g).or_insert_with(|| got.clone());
                        if *first != got {
                            fail(format!("fragment sent to {got:?}, an earlier piece to {first:?}"));
                        }
                    }
                }
                a => fail(format!("action {a}")),
            }
            actions[(out.action as usize).min(4)] += 1;
            if (n + 1) % batch == 0 || n + 1 == frames {
                let after = dp.stats().unwrap().global;
                let got = Tally::of(&before, &after);
                if got != want || got.terminal() != got.rx {
                    let moved: Vec<_> = (0..stat::NAMES.len())
                        .filter(|&i| after[i] != before[i])
                        .map(|i| format!("{}+{}", stat::NAMES[i], after[i] - before[i]))
                        .collect();
                    fail(format!(
                        "counters of the batch ending here: {got:?}, verdicts returned {want:?}; moved: {moved:?}"
                    ));
                }
                before = after;
                want = Tally::default();
            }
        }
        let totals = dp.stats().unwrap().global;
        eprintln!(
            "fuzz: seed {seed:#x}, {frames} frames; actions aborted/drop/pass/tx/redirect {actions:?}; \
             {} fragment groups; generated {seen:?}",
            groups.len()
        );
        for (i, name) in stat::NAMES.iter().enumerate() {
            if totals[i] != 0 {
                eprintln!("  {name} {}", totals[i]);
            }
        }
        // Every path is reached, or the generator has gone blind somewhere.
        for i in [stat::TX, stat::REDIRECT, stat::ICMP_TOO_BIG_SENT, stat::PASS_NOT_OUR_MAC, stat::CT_HIT]
            .into_iter()
            .chain(DROPS[..4].iter().copied())
            .chain([stat::DROP_TOO_BIG])
        {
            if frames >= 100_000 {
                assert!(totals[i as usize] > 0, "seed {seed:#x}: no frame reached {}", stat::NAMES[i as usize]);
            }
        }
    });
}

#[test]
fn a_million_hostile_frames_are_forwarded_well_formed_or_counted() {
    let seed = fuzz::seed_from_env(fuzz::DEFAULT_SEED);
    let frames = fuzz::frames_from_env(CI_FRAMES);
    let batch: u64 = std::env::var("LB_FUZZ_BATCH").ok().and_then(|b| b.parse().ok()).unwrap_or(BATCH).max(1);
    eprintln!("fuzz: LB_FUZZ_SEED={seed:#x} LB_FUZZ_FRAMES={frames} LB_FUZZ_BATCH={batch}");
    run(seed, frames, batch);
}
