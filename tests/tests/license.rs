//! Why the XDP objects are GPL-compatible: the kernel refuses `lb` when its licence is not,
//! because a helper it calls (`bpf_fib_lookup`) is GPL-only. The production object's licence
//! string is overwritten in place with one of the same length that the kernel does not count
//! as GPL-compatible, and loaded with the data plane's settings.

use aya::programs::Xdp;
use aya::EbpfLoader;
use lb_tests::fixture;
use lb_user::dataplane::{LoadSettings, EBPF_OBJECT};

const LICENSE: &[u8] = b"Dual MIT/GPL\0";

fn with_license(object: &[u8], license: &[u8]) -> Vec<u8> {
    assert_eq!(license.len(), LICENSE.len());
    let at = object.windows(LICENSE.len()).position(|w| w == LICENSE).expect("the object holds its license string");
    let mut patched = object.to_vec();
    patched[at..at + license.len()].copy_from_slice(license);
    patched
}

fn load_lb(object: &[u8]) -> Result<(), String> {
    let settings = LoadSettings::new(&fixture::sizes(), None).unwrap();
    let mut loader = EbpfLoader::new();
    let mut ebpf = settings.apply(&mut loader).load(object).map_err(|e| format!("{e:#}"))?;
    let program: &mut Xdp = ebpf.program_mut("lb").unwrap().try_into().unwrap();
    program.load().map_err(|e| format!("{e:?}"))
}

#[test]
fn the_kernel_refuses_lb_without_a_gpl_compatible_license() {
    // The object as built loads (root, CAP_BPF): the comparison below is about the licence only.
    load_lb(&with_license(EBPF_OBJECT, LICENSE)).expect("loading lb as built");
    let err = load_lb(&with_license(EBPF_OBJECT, b"Dual MIT/XYZ\0")).expect_err("lb loaded under a non-GPL licence");
    assert!(err.contains("GPL"), "the verifier refused lb for another reason: {err}");
}
