//! The inline-probed service table through the real XDP program: 200 service keys across IPv4
//! and IPv6 (exact ports, all-ports, L3_DEFAULT), each its own service with its own backend, so
//! the backend a packet is sent to names the key it matched. A reference model of the lookup
//! order (exact port, all-ports of the protocol, L3_DEFAULT) predicts every verdict; then half
//! of the keys are removed and the prediction is checked again. Also: a restarted writer that
//! adopts pinned maps sees the keys its predecessor installed.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use lb_common::maps::{affinity, forwarding, stat, tracking, ServiceKey, PROTO_ANY, PROTO_TCP, PROTO_UDP};
use lb_tests::fixture::{backend, backend_mac, l3_default_key, service_info, service_key, TEST_M};
use lb_tests::packet::*;
use lb_user::dataplane::{Dataplane, DataplaneSizes, Program, XDP_PASS, XDP_TX};

const LB_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 0x05];
const CLIENT4: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 5);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 5);
const VIPS: u32 = 40;
/// Keys per VIP: TCP 80, TCP 443, UDP 53, all TCP ports, L3_DEFAULT.
const KEYS_PER_VIP: u32 = 5;

/// Room for 200 services, each with one table; the service table holds 256 * 16 keys.
fn sizes() -> DataplaneSizes {
    DataplaneSizes {
        table_size_m: TEST_M,
        conntrack_entries: 65536,
        max_services: 256,
        classes_per_service: 1,
        max_backends: 256,
        table_slots: 256,
    }
}

/// VIP `v`: even ones IPv4, odd ones IPv6.
fn vip(v: u32) -> IpAddr {
    if v.is_multiple_of(2) {
        IpAddr::V4(Ipv4Addr::new(198, 18, 100 + (v / 256) as u8, v as u8))
    } else {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0x100, 0, 0, 0, v as u16))
    }
}

/// Key `k` of VIP `v`; its service id is `v * KEYS_PER_VIP + k`.
fn key(v: u32, k: u32) -> ServiceKey {
    match k {
        0 => service_key(vip(v), 80, PROTO_TCP),
        1 => service_key(vip(v), 443, PROTO_TCP),
        2 => service_key(vip(v), 53, PROTO_UDP),
        3 => service_key(vip(v), 0, PROTO_TCP),
        _ => l3_default_key(vip(v)),
    }
}

/// Probe packets per VIP: (proto, port), hitting each key when all are installed.
const PROBES: [(u8, u16); 6] =
    [(PROTO_TCP, 80), (PROTO_TCP, 443), (PROTO_UDP, 53), (PROTO_TCP, 8080), (PROTO_UDP, 9999), (PROTO_UDP, 80)];

/// The lookup order of the data plane over the installed keys (the model, not the kernel).
fn expected(installed: &BTreeMap<(u32, u32), ServiceKey>, v: u32, proto: u8, port: u16) -> Option<u32> {
    let has = |want: ServiceKey| installed.iter().find(|(_, k)| **k == want).map(|((v, k), _)| v * KEYS_PER_VIP + k);
    has(service_key(vip(v), port, proto))
        .or_else(|| has(service_key(vip(v), 0, proto)))
        .or_else(|| has(service_key(vip(v), 0, PROTO_ANY)))
}

fn frame(v: u32, proto: u8, port: u16) -> Vec<u8> {
    let sport = 40000 + v as u16;
    match vip(v) {
        IpAddr::V4(dst) => {
            let l4 = if proto == PROTO_TCP {
                tcp4(CLIENT4, dst, sport, port, TCP_SYN, b"x")
            } else {
                udp4(CLIENT4, dst, sport, port, b"x")
            };
            ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &V4::new(CLIENT4, dst, proto).build(&l4))
        }
        IpAddr::V6(dst) => {
            let l4 = if proto == PROTO_TCP {
                tcp6(CLIENT6, dst, sport, port, TCP_SYN, b"x")
            } else {
                udp6(CLIENT6, dst, sport, port, b"x")
            };
            ethernet(LB_MAC, CLIENT_MAC, ETH_P_IPV6, &ipv6(CLIENT6, dst, proto, 64, 0, &l4))
        }
    }
}

/// Installs every key as its own L2 DSR service whose table sends all flows to backend id =
/// service id (MAC `backend_mac(id)`).
fn install_all(dp: &mut Dataplane) -> BTreeMap<(u32, u32), ServiceKey> {
    let mut installed = BTreeMap::new();
    for v in 0..VIPS {
        for k in 0..KEYS_PER_VIP {
            let id = v * KEYS_PER_VIP + k;
            let baddr = match vip(v) {
                IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::new(198, 19, 3, id as u8)),
                IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 3, 0, 0, 0, 0, id as u16)),
            };
            dp.set_backend(id, backend(baddr, backend_mac(id), 0)).unwrap();
            dp.write_table(id, 0, 0, &vec![id; TEST_M as usize]).unwrap();
            dp.set_service(
                &[key(v, k)],
                service_info(id, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR),
            )
            .unwrap();
            installed.insert((v, k), key(v, k));
        }
    }
    installed
}

/// Sends every probe packet through the program and checks the service it reached against the
/// model; returns (hits, passes).
fn check_all(dp: &Dataplane, installed: &BTreeMap<(u32, u32), ServiceKey>) -> (u64, u64) {
    let before = dp.stats().unwrap();
    let (mut hits, mut passes) = (0u64, 0u64);
    for v in 0..VIPS {
        for (proto, port) in PROBES {
            let f = frame(v, proto, port);
            let out = dp.run_test(Program::Lb, &f, 0).unwrap();
            match expected(installed, v, proto, port) {
                Some(id) => {
                    assert_eq!(out.action, XDP_TX, "VIP {} {proto}/{port}: expected service {id}", vip(v));
                    assert_eq!(out.data[..6], backend_mac(id), "VIP {} {proto}/{port}: expected service {id}", vip(v));
                    hits += 1;
                }
                None => {
                    assert_eq!(out.action, XDP_PASS, "VIP {} {proto}/{port}: expected no service", vip(v));
                    assert_eq!(out.data, f, "passed packets are untouched");
                    passes += 1;
                }
            }
        }
    }
    let after = dp.stats().unwrap();
    assert_eq!(after.get(stat::TX) - before.get(stat::TX), hits);
    assert_eq!(after.get(stat::PASS_NOT_VIP) - before.get(stat::PASS_NOT_VIP), passes);
    (hits, passes)
}

fn installed_keys(dp: &Dataplane) -> Vec<ServiceKey> {
    let mut keys: Vec<ServiceKey> = dp.installed_services().into_iter().map(|(k, _)| k).collect();
    keys.sort_by_key(|k| k.words());
    keys
}

fn model_keys(installed: &BTreeMap<(u32, u32), ServiceKey>) -> Vec<ServiceKey> {
    let mut keys: Vec<ServiceKey> = installed.values().copied().collect();
    keys.sort_by_key(|k| k.words());
    keys
}

#[test]
fn two_hundred_keys_hit_their_services_and_removed_ones_do_not() {
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = lb_tests::fixture::register_interfaces(
        Dataplane::load(sizes()).expect("loading the data plane (tests must run as root)"),
    );
    let mut installed = install_all(&mut dp);
    assert_eq!(installed.len(), 200);
    assert_eq!(installed_keys(&dp), model_keys(&installed));
    let (hits, passes) = check_all(&dp, &installed);
    // Every probe hits (UDP/80 and UDP/9999 fall to L3_DEFAULT).
    assert_eq!((hits, passes), (VIPS as u64 * PROBES.len() as u64, 0));

    // Remove 100 keys: every key of a quarter of the VIPs (they stop being VIPs), the TCP:80 and
    // all-ports TCP keys of another quarter (those fall to L3_DEFAULT), UDP:53 and L3_DEFAULT of
    // the third (UDP passes), TCP:443 of the last (falls to all-ports TCP).
    let remove: Vec<(u32, u32)> = (0..VIPS)
        .flat_map(|v| {
            let ks: &[u32] = match v % 4 {
                0 => &[0, 1, 2, 3, 4],
                1 => &[0, 3],
                2 => &[2, 4],
                _ => &[1],
            };
            ks.iter().map(move |&k| (v, k))
        })
        .collect();
    assert_eq!(remove.len(), 100);
    // In a few batches, as the controller removes a service's keys at once.
    for chunk in remove.chunks(17) {
        let keys: Vec<ServiceKey> = chunk.iter().map(|vk| installed[vk]).collect();
        dp.remove_service_keys(&keys).unwrap();
        for vk in chunk {
            installed.remove(vk);
        }
    }
    assert_eq!(installed_keys(&dp), model_keys(&installed));
    let (hits, passes) = check_all(&dp, &installed);
    assert!(hits > 0 && passes > 0);
    // Removed VIPs are no longer ours at all: packets to them are passed as non-VIP traffic
    // even when malformed (a truncated TCP header would be dropped on a VIP).
    let truncated = |v: u32| {
        let IpAddr::V4(dst) = vip(v) else { unreachable!() };
        let ip = V4::new(CLIENT4, dst, PROTO_TCP).build(&tcp4(CLIENT4, dst, 40000, 80, TCP_SYN, b"")[..10]);
        ethernet(LB_MAC, CLIENT_MAC, ETH_P_IP, &ip)
    };
    assert_eq!(dp.run_test(Program::Lb, &truncated(0), 0).unwrap().action, XDP_PASS);
    // VIP 2 keeps keys: the same packet to it is ours, and dropped.
    assert_eq!(dp.run_test(Program::Lb, &truncated(2), 0).unwrap().action, lb_user::dataplane::XDP_DROP);

    // Re-adding a removed key makes it hit again; updating a key's service moves it.
    dp.set_service(&[key(0, 0)], service_info(0, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR))
        .unwrap();
    installed.insert((0, 0), key(0, 0));
    check_all(&dp, &installed);
    dp.set_service(&[key(3, 0)], service_info(19, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR))
        .unwrap();
    let out = dp.run_test(Program::Lb, &frame(3, PROTO_TCP, 80), 0).unwrap();
    assert_eq!((out.action, &out.data[..6]), (XDP_TX, &backend_mac(19)[..]));
}

#[test]
fn more_keys_than_the_capacity_are_refused_and_change_nothing() {
    let mut small = sizes();
    small.max_services = 2; // 32 keys, halves of 64 slots.
    lb_tests::fixture_net::enter_lo_routed_netns();
    let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load(small).unwrap());
    let keys: Vec<ServiceKey> = (0..32).map(|p| service_key(vip(0), 1000 + p, PROTO_TCP)).collect();
    let info = service_info(1, affinity::NONE, tracking::PER_CONNECTION, forwarding::L2_DSR);
    dp.set_service(&keys, info).unwrap();
    assert!(dp.set_service(&[service_key(vip(1), 80, PROTO_TCP)], info).is_err());
    assert_eq!(dp.installed_services().len(), 32);
    // The refused key's VIP was not left behind in VIPS: its traffic is not ours.
    let out = dp.run_test(Program::Lb, &frame(1, PROTO_TCP, 80), 0).unwrap();
    assert_eq!(out.action, XDP_PASS);
    assert_eq!(dp.stats().unwrap().get(stat::PASS_NOT_VIP), 1);
}

#[test]
fn a_restarted_writer_adopts_the_pinned_service_table() {
    let pins = lb_tests::fixture::PinDir::new("svc");
    let dir = pins.path();
    let installed = {
        lb_tests::fixture_net::enter_lo_routed_netns();
        let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load_with(sizes(), Some(dir)).unwrap());
        install_all(&mut dp)
    };
    let mut dp = lb_tests::fixture::register_interfaces(Dataplane::load_with(sizes(), Some(dir)).unwrap());
    assert_eq!(installed_keys(&dp), model_keys(&installed));
    check_all(&dp, &installed);
    // The adopted bookkeeping is complete: removing a VIP's keys removes the VIP.
    let keys: Vec<ServiceKey> = (0..KEYS_PER_VIP).map(|k| key(2, k)).collect();
    dp.remove_service_keys(&keys).unwrap();
    let mut rest = installed.clone();
    rest.retain(|(v, _), _| *v != 2);
    check_all(&dp, &rest);
    drop(dp);
    lb_user::dataplane::pinning::remove_map_pins(dir).unwrap();
}
