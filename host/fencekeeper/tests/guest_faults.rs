//! The fault-injection guest (guest/artifacts/test-guests/guest_faults.wasm) against
//! the host's limits. The full suite lands with the validator.

#[test]
fn fault_guest_artifact_is_a_component() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../guest/artifacts/test-guests/guest_faults.wasm");
    let bytes = std::fs::read(path).expect("the fault guest is committed");
    // A component's preamble: magic, then version 0x0d and layer 1.
    assert_eq!(&bytes[..8], b"\0asm\x0d\x00\x01\x00");
}
