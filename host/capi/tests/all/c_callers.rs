//! Real C callers: the programs in `host/capi/c` are compiled with the system's `cc`
//! against the committed header (warnings are errors) and linked against the library
//! this build made, shared and static, then run.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// target/release/deps (or debug/deps): where `cargo test` puts libfencekeeper_capi.{so,a}
/// beside this test (only `cargo build` copies them up to target/release).
fn library_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().to_path_buf();
    assert!(dir.join("libfencekeeper_capi.so").exists(), "no libfencekeeper_capi.so in {}", dir.display());
    dir
}

/// Compile `source` (in host/capi/c) into `out`, linked shared or static.
pub(crate) fn compile(source: &str, out: &Path, shared: bool) {
    let lib = library_dir();
    let mut cc = Command::new("cc");
    cc.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-O1"])
        .arg("-I")
        .arg(crate_dir().join("include"))
        .arg(crate_dir().join("c").join(source))
        .arg("-o")
        .arg(out);
    if shared {
        cc.arg("-L").arg(&lib).arg("-lfencekeeper_capi").arg(format!("-Wl,-rpath,{}", lib.display()));
    } else {
        // What a Rust staticlib needs from the C library beside it.
        cc.arg(lib.join("libfencekeeper_capi.a")).args(["-lpthread", "-ldl", "-lm", "-lgcc_s", "-lc"]);
    }
    let output = cc.output().unwrap_or_else(|e| panic!("cannot run cc: {e}"));
    assert!(output.status.success(), "cc {source} failed:\n{}", String::from_utf8_lossy(&output.stderr));
}

fn run(program: &Path, args: &[&Path]) -> Output {
    Command::new(program).args(args).output().unwrap()
}

fn text(output: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
}

#[test]
fn the_documented_c_program_refuses_the_paused_holder_and_the_file_store_remembers() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("admit");
    compile("admit.c", &program, true);
    let store = dir.path().join("marks.redb");
    let first = run(&program, &[&store]);
    assert_eq!(first.status.code(), Some(0), "{}", text(&first));
    let lines: Vec<String> = String::from_utf8_lossy(&first.stdout).lines().map(str::to_owned).collect();
    assert_eq!(
        lines,
        [
            "200 admitted token 33 on \"orders/2026-11.csv\"; the mark advanced",
            "200 admitted token 34 on \"orders/2026-11.csv\"; the mark advanced",
            "409 stale fencing token 33 for \"orders/2026-11.csv\": the resource has seen token 34; a newer lock holder exists, reacquire the lock",
            "mark of orders/2026-11.csv: 34",
        ]
    );
    // Another process, the same file: 33 is stale from the start.
    let second = run(&program, &[&store]);
    assert_eq!(second.status.code(), Some(0), "{}", text(&second));
    assert!(text(&second).starts_with("409 stale fencing token 33"), "{}", text(&second));
    // A store that is not a store is exit 2 and one line, not a crash.
    std::fs::write(dir.path().join("garbage.redb"), b"not a database").unwrap();
    let bad = run(&program, &[&dir.path().join("garbage.redb")]);
    assert_eq!(bad.status.code(), Some(2), "{}", text(&bad));
    assert!(text(&bad).starts_with("cannot open the guard: mark store"), "{}", text(&bad));
    assert_eq!(text(&bad).lines().count(), 1, "{}", text(&bad));
}

#[test]
fn the_documented_c_program_is_the_one_in_docs_embedding() {
    let source = std::fs::read_to_string(crate_dir().join("c/admit.c")).unwrap();
    let docs = std::fs::read_to_string(crate_dir().join("../../docs/embedding.md")).unwrap();
    assert!(docs.contains(&source), "docs/embedding.md must quote host/capi/c/admit.c whole, as it is");
}

#[test]
fn a_c_engine_keeps_marks_in_its_own_transactions_linked_shared_and_static() {
    let dir = tempfile::tempdir().unwrap();
    for shared in [true, false] {
        let program = dir.path().join(if shared { "engine-shared" } else { "engine-static" });
        compile("engine.c", &program, shared);
        let output = run(&program, &[]);
        assert_eq!(output.status.code(), Some(0), "{}", text(&output));
        assert!(!text(&output).contains("FAIL"), "{}", text(&output));
        assert!(text(&output).contains(", 0 failed"), "{}", text(&output));
    }
}
