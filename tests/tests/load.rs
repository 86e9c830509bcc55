//! The XDP object loads and verifies with configured sizes; the writer's slot accounting.

use lb_tests::fixture::{self, TEST_M};

#[test]
fn loads_and_verifies_both_programs() {
    let dp = fixture::load();
    assert_eq!(dp.sizes().table_size_m, TEST_M);
    assert_eq!(dp.free_table_slots(), 40);
}

#[test]
fn write_table_uses_standby_slot_and_frees_old_one() {
    let mut dp = fixture::load();
    assert!(dp.tables_mapped(), "TABLES is mmapable: tables are written through the mapping");
    let s1 = dp.write_table(1, 0, 0, &fixture::uniform(3)).unwrap();
    assert_eq!(dp.free_table_slots(), 39);
    let s2 = dp.write_table(1, 0, 0, &fixture::uniform(4)).unwrap();
    assert_ne!(s1, s2, "a new table must go to a standby slot");
    assert_eq!(dp.free_table_slots(), 39, "the previous slot is freed");
    let (r, entries) = dp.read_table(1, 0).unwrap().expect("active table");
    assert_eq!(r.slot, s2);
    assert_eq!(entries, fixture::uniform(4));
    assert!(dp.write_table(1, 0, 0, &[1, 2, 3]).is_err(), "wrong length is rejected");
    assert!(dp.write_table(8, 0, 0, &fixture::uniform(1)).is_err(), "service out of range");
    assert!(dp.write_table(1, 0, 0, &fixture::uniform(64)).is_err(), "backend out of range");
}

#[test]
fn attaches_natively_to_a_veth_device() {
    lb_tests::fixture_net::in_netns(|_| {
        let mut dp = fixture::load();
        let mode = dp.attach("lbv1", lb_user::dataplane::Program::Lb).expect("attach");
        assert_eq!(mode, aya::programs::XdpMode::Driver, "veth supports native XDP");
        let mut decapsulator = lb_user::cli::decap::Decapsulator::load().expect("load decap");
        let decap = decapsulator.attach("lbv3").expect("attach decap");
        assert_eq!(decap, aya::programs::XdpMode::Driver);
        assert!(dp.attach("nonexistent0", lb_user::dataplane::Program::Lb).is_err());
    });
}

#[test]
fn maps_the_kernel_cannot_allocate_are_reported_as_such() {
    // Connection tables of 2^30 flows: more memory than the kernel hands out for a map.
    let sizes = lb_user::dataplane::DataplaneSizes { conntrack_entries: 1 << 30, ..fixture::sizes() };
    let err = format!("{:#}", lb_user::dataplane::Dataplane::load(sizes).err().expect("refused"));
    assert!(
        err.contains("could not allocate its maps") && err.contains("conntrack_entries") && !err.contains("root"),
        "{err}"
    );
}
