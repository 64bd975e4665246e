//! Hand-written guests: core modules in WAT, made components against
//! wit/fencekeeper.wit, so a test or a bench can hold the host to a guest that does
//! exactly one thing (escape a limit, answer at once). Shared by
//! tests/all/hostile_guests.rs and benches/admit.rs.

#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

/// The WIT directory of the current world (the repository's `wit/`, found from
/// whichever crate includes this file).
fn wit() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors().map(|dir| dir.join("wit")).find(|wit| wit.join("fencekeeper.wit").exists()).unwrap()
}

/// A guest whose `decide` runs `decide_body` and then calls the token malformed
/// (reason `hostile`), and whose `decide-short` runs it and answers `malformed` too
/// (so the host goes on to `decide` for the reason: two runs of the body a
/// request); `extra` adds module fields (memories, tables).
pub fn component(extra: &str, decide_body: &str) -> Vec<u8> {
    let short = short_decide(&format!("{decide_body}\n    (i32.store8 (i32.const 192) (i32.const 3))"));
    encode(&wit(), "0.3.0", &format!("{extra}\n{short}"), decide_body)
}

/// A guest whose `decide-short` answers at once, whatever it is asked: admit the
/// one-component token `token`, not advanced. It parses nothing, so a call to it
/// costs what the host and the sandbox cost alone.
pub fn answering_admit(token: u64) -> Vec<u8> {
    // short-verdict at 192: case 0 (admit), then `admitted` 8 bytes in: the token
    // (arity, then four u64 from offset 8), `advanced` at 40.
    let short = short_decide(&format!(
        "(i32.store8 (i32.const 192) (i32.const 0))
    (i32.store8 (i32.const 200) (i32.const 1))
    (i64.store (i32.const 208) (i64.const {token}))
    (i32.store8 (i32.const 240) (i32.const 0))"
    ));
    encode(&wit(), "0.3.0", &short, "")
}

/// `decide-short` of 0.3.0, running `body` (which writes the verdict at 192).
fn short_decide(body: &str) -> String {
    format!(
        r#"(func (export "fencekeeper:validator/validator@0.3.0#decide-short")
    (param i32 i32 i32 i64 i64 i64 i64 i64 i64 i64 i32 i32 i64 i64 i64 i64) (result i32)
    {body}
    (i32.const 192))"#
    )
}

/// The core module with `parse`, `describe` and `decide` of `version` and the fields
/// in `extra`, made a component against the WIT in `wit`.
pub fn encode(wit: &Path, version: &str, extra: &str, decide_body: &str) -> Vec<u8> {
    let module = format!(
        r#"(module
  (memory (export "memory") 1)
  {extra}
  (global $heap (mut i32) (i32.const 4096))
  (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
    (local $p i32)
    (local.set $p (i32.and (i32.add (global.get $heap) (i32.const 7)) (i32.const -8)))
    (global.set $heap (i32.add (local.get $p) (local.get 3)))
    (local.get $p))
  (func (export "fencekeeper:validator/validator@{version}#parse") (param i32 i32) (result i32)
    (i32.store8 (i32.const 256) (i32.const 1))
    (i32.store (i32.const 264) (i32.const 512))
    (i32.store (i32.const 268) (i32.const 7))
    (i32.const 256))
  (func (export "fencekeeper:validator/validator@{version}#describe") (result i32)
    (i32.store (i32.const 320) (i32.const 512))
    (i32.store (i32.const 324) (i32.const 7))
    (i32.store (i32.const 328) (i32.const 512))
    (i32.store (i32.const 332) (i32.const 7))
    (i32.store (i32.const 336) (i32.const 512))
    (i32.store (i32.const 340) (i32.const 7))
    (i32.const 320))
  (func (export "fencekeeper:validator/validator@{version}#decide")
    (param i32 i32 i32 i32 i32 i32 i32 i64 i64 i64 i64) (result i32)
    {decide_body}
    (i32.store8 (i32.const 128) (i32.const 3))
    (i32.store (i32.const 136) (i32.const 512))
    (i32.store (i32.const 140) (i32.const 7))
    (i32.const 128))
  (data (i32.const 512) "hostile"))"#
    );
    let mut bytes = wat::parse_str(&module).unwrap();
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve.push_dir(wit).unwrap();
    let world = resolve.select_world(&[package], Some("fencekeeper")).unwrap();
    wit_component::embed_component_metadata(&mut bytes, &resolve, world, wit_component::StringEncoding::UTF8, false)
        .unwrap();
    wit_component::ComponentEncoder::default().module(&bytes).unwrap().validate(true).encode().unwrap()
}
