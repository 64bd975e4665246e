//! The committed header is what cbindgen makes of the source today: a change to the
//! ABI that was not regenerated fails here (`BLESS=1` rewrites the header; review the
//! diff).

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::Path;

#[test]
fn the_committed_header_is_generated_from_the_source() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")).unwrap();
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(crate_dir)
        .with_config(config)
        .generate()
        .unwrap_or_else(|e| panic!("cbindgen failed on the source: {e}"))
        .write(&mut generated);
    let generated = String::from_utf8(generated).unwrap();
    let committed_path = crate_dir.join("include/fencekeeper_capi.h");
    if std::env::var_os("BLESS").is_some() {
        std::fs::write(&committed_path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    if committed != generated {
        let line = committed.lines().zip(generated.lines()).position(|(a, b)| a != b);
        panic!(
            "{} differs from the header the source generates (first difference at line {}); \
             re-bless with BLESS=1 cargo test --release -p fencekeeper-capi --test all header::",
            committed_path.display(),
            line.map_or_else(|| "the end".to_owned(), |l| (l + 1).to_string())
        );
    }
}
