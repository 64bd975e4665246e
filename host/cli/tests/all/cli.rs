//! The `fencekeeper` command end to end: real processes, real store files, the
//! bundled wasm guest. Transcripts are compared with golden files in
//! `tests/golden/`; re-bless them after an intended change with
//! `BLESS=1 cargo test --release -p fencekeeper-cli` and review the diff.

// A test states its expectations by panicking.
#![allow(clippy::panic)]

use fencekeeper::validator::{guest_path, VALIDATOR_FILE};
use std::path::{Path, PathBuf};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_fencekeeper");

/// A temporary directory and the transcript of the commands run in it. Paths under
/// the directory are written `$TMP` so the transcript does not depend on where it ran.
struct Session {
    dir: tempfile::TempDir,
    transcript: String,
}

/// What one command did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Session {
    fn new() -> Session {
        Session { dir: tempfile::tempdir().expect("temp dir"), transcript: String::new() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn store(&self) -> String {
        self.path("marks.redb").display().to_string()
    }

    /// Run `fencekeeper args...` in the session's directory and record it.
    fn run(&mut self, args: &[&str]) -> Run {
        let out = Command::new(BIN).args(args).current_dir(self.dir.path()).output().expect("run fencekeeper");
        let run = Run {
            code: out.status.code().expect("exited, not killed"),
            stdout: self.redact(&String::from_utf8_lossy(&out.stdout)),
            stderr: self.redact(&String::from_utf8_lossy(&out.stderr)),
        };
        let shown: Vec<String> = args.iter().map(|a| self.redact(a)).collect();
        self.transcript.push_str(&format!("$ fencekeeper {}\n", shown.join(" ")));
        self.transcript.push_str(&run.stdout);
        for line in run.stderr.lines() {
            self.transcript.push_str(&format!("stderr: {line}\n"));
        }
        self.transcript.push_str(&format!("[exit {}]\n\n", run.code));
        run
    }

    fn redact(&self, text: &str) -> String {
        text.replace(&self.dir.path().display().to_string(), "$TMP")
            .replace(&repo_root().display().to_string(), "$REPO")
    }

    /// Compare the transcript with `tests/golden/<name>.txt` (or write it, with BLESS=1).
    fn check_golden(&self, name: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(format!("{name}.txt"));
        if std::env::var_os("BLESS").is_some() {
            std::fs::create_dir_all(path.parent().expect("golden dir")).expect("create golden dir");
            std::fs::write(&path, &self.transcript).expect("write golden file");
            return;
        }
        let golden = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}; create it with BLESS=1", path.display()));
        assert!(
            golden == self.transcript,
            "transcript differs from {}; if the change is intended, re-bless with BLESS=1\n--- golden\n{golden}\n--- now\n{}",
            path.display(),
            self.transcript
        );
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repo root")
}

/// The validator guest file (the fresh build in `FENCEKEEPER_GUEST_DIR` when set).
fn bundled_artifact() -> PathBuf {
    // Canonical, so the transcript shows it under $REPO.
    let path = guest_path(VALIDATOR_FILE);
    path.canonicalize().unwrap_or(path)
}

fn json(run: &Run) -> serde_json::Value {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", run.stdout))
}

#[test]
fn seed_scenario_admits_33_and_34_then_refuses_33_with_mark_34() {
    let mut s = Session::new();
    let store = s.store();
    assert_eq!(s.run(&["admit", "--store", &store, "orders/2026.csv", "33"]).code, 0);
    assert_eq!(s.run(&["admit", "--store", &store, "orders/2026.csv", "34"]).code, 0);
    let stale = s.run(&["admit", "--store", &store, "orders/2026.csv", "33"]);
    assert_eq!(stale.code, 1);
    assert!(stale.stdout.contains("stale") && stale.stdout.contains("34"), "{}", stale.stdout);
    assert_eq!(s.run(&["admit", "--store", &store, "orders/2026.csv", "34"]).code, 0, "the holder writes again");
    assert_eq!(s.run(&["admit", "--store", &store, "--strict", "orders/2026.csv", "34"]).code, 1, "strict: replayed");
    assert_eq!(s.run(&["admit", "--store", &store, "invoices/7", "7.1042"]).code, 0);
    let one = s.run(&["marks", "--store", &store, "orders/2026.csv"]);
    assert_eq!((one.code, one.stdout.as_str()), (0, "34\n"));
    assert_eq!(s.run(&["marks", "--store", &store]).code, 0);
    assert_eq!(s.run(&["marks", "--store", &store, "never/admitted"]).code, 1);
    s.check_golden("seed_scenario");
}

#[test]
fn json_output_reports_class_mark_and_http_status() {
    let mut s = Session::new();
    let store = s.store();
    let first = json(&s.run(&["admit", "--json", "--store", &store, "orders/2026.csv", "34"]));
    assert_eq!(first["admitted"], true);
    assert_eq!(first["advanced"], true);
    assert_eq!(first["mark"], "34");
    let stale = s.run(&["admit", "--json", "--store", &store, "orders/2026.csv", "0033"]);
    assert_eq!(stale.code, 1);
    let v = json(&stale);
    assert_eq!(
        (v["class"].as_str(), v["http_status"].as_u64(), v["mark"].as_str()),
        (Some("stale"), Some(409), Some("34"))
    );
    assert_eq!(v["token"], "0033");
    let bad = json(&s.run(&["admit", "--json", "--store", &store, "orders/2026.csv", "-1"]));
    assert_eq!((bad["class"].as_str(), bad["http_status"].as_u64()), (Some("malformed"), Some(400)));
    let marks = json(&s.run(&["marks", "--json", "--store", &store]));
    assert_eq!(marks, serde_json::json!([{"resource": "orders/2026.csv", "mark": "34"}]));
    s.check_golden("json");
}

#[test]
fn missing_token_is_refused_as_428_in_both_modes() {
    let mut s = Session::new();
    let store = s.store();
    let refused = s.run(&["admit", "--json", "--store", &store, "orders/2026.csv"]);
    assert_eq!(refused.code, 1);
    let v = json(&refused);
    assert_eq!(
        (v["class"].as_str(), v["http_status"].as_u64(), v["admitted"].as_bool()),
        (Some("missing"), Some(428), Some(false))
    );
    assert!(v["token"].is_null());
    // Efficiency mode fails open only when the mark store cannot be reached, never
    // on what a request carries: a writer cannot dodge its mark by dropping its token.
    let refused = s.run(&["admit", "--mode", "efficiency", "--store", &store, "orders/2026.csv"]);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    s.check_golden("missing_token");
}

#[test]
fn corrupt_store_is_an_error_with_exit_2_and_is_left_untouched() {
    let mut s = Session::new();
    let store = s.store();
    let garbage = b"this is not a mark store\n".repeat(100);
    std::fs::write(&store, &garbage).expect("write garbage");
    for args in [&["admit", "--store", &store, "orders/2026.csv", "35"][..], &["marks", "--store", &store][..]] {
        let run = s.run(args);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty(), "{args:?} must not print a verdict: {}", run.stdout);
        assert!(
            run.stderr.starts_with("fencekeeper: ") && run.stderr.contains("marks.redb"),
            "{args:?}: {}",
            run.stderr
        );
        assert!(run.stderr.contains("corrupt"), "{args:?} must say the store is corrupt: {}", run.stderr);
        assert_eq!(run.stderr.lines().count(), 1, "one line: {}", run.stderr);
        assert_eq!(std::fs::read(&store).expect("store file still there"), garbage, "{args:?} replaced the store");
    }
    let absent = s.path("absent.redb").display().to_string();
    assert_eq!(s.run(&["marks", "--store", &absent]).code, 2);
    assert!(!Path::new(&absent).exists(), "inspecting must not create a store");
    s.check_golden("corrupt_store");
}

/// Rewrite `resource`'s record inside the store file with `damage` applied, through
/// redb, so the file's pages stay valid and only the record is wrong.
fn damage_record(store: &str, resource: &str, damage: impl FnOnce(&mut Vec<u8>)) {
    use redb::ReadableTable;
    let def: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("fencekeeper_marks_v2");
    let db = redb::Database::open(store).expect("open the store with redb");
    let txn = db.begin_write().expect("write");
    {
        let mut table = txn.open_table(def).expect("marks table");
        let mut value = table.get(resource.as_bytes()).expect("read").expect("a record").value().to_vec();
        damage(&mut value);
        table.insert(resource.as_bytes(), value.as_slice()).expect("insert");
    }
    txn.commit().expect("commit");
}

fn assert_one_line_error(run: &Run, needles: &[&str]) {
    assert_eq!(run.code, 2, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.is_empty(), "no verdict on stdout: {}", run.stdout);
    assert_eq!(run.stderr.lines().count(), 1, "one line: {}", run.stderr);
    assert!(run.stderr.starts_with("fencekeeper: "), "{}", run.stderr);
    for needle in needles {
        assert!(run.stderr.contains(needle), "{needle:?} missing: {}", run.stderr);
    }
}

#[test]
fn a_flipped_digit_in_a_stored_mark_is_exit_2_naming_resource_and_file_until_raised_by_hand() {
    let mut s = Session::new();
    let store = s.store();
    assert_eq!(s.run(&["admit", "--store", &store, "orders/2026.csv", "50"]).code, 0);
    assert_eq!(s.run(&["admit", "--store", &store, "invoices/7", "7.1042"]).code, 0);
    // "fk2 50 ..." -> "fk2 40 ...": before records were checked, 49 was admitted.
    damage_record(&store, "orders/2026.csv", |v| v[4] ^= 0x01);
    for args in [
        &["admit", "--store", &store, "orders/2026.csv", "49"][..],
        &["admit", "--store", &store, "--mode", "efficiency", "orders/2026.csv", "49"][..],
        &["marks", "--store", &store, "orders/2026.csv"][..],
        &["marks", "--store", &store][..],
    ] {
        assert_one_line_error(&s.run(args), &["\"orders/2026.csv\"", "$TMP/marks.redb", "damaged"]);
    }
    let verify = s.run(&["marks", "--store", &store, "--verify"]);
    assert_eq!(verify.code, 2);
    assert!(verify.stdout.contains("damaged \"orders/2026.csv\"") && verify.stdout.contains("2 records checked"));
    assert!(!verify.stdout.contains("damaged \"invoices/7\""), "{}", verify.stdout);
    // The damaged record shows 40: raising to it is refused, raising above is logged.
    assert_eq!(s.run(&["marks", "--store", &store, "--raise", "orders/2026.csv", "40"]).code, 1);
    let audit = s.path("audit.jsonl");
    let raised = s.run(&[
        "marks",
        "--store",
        &store,
        "--raise",
        "orders/2026.csv",
        "60",
        "--audit",
        &audit.display().to_string(),
    ]);
    assert_eq!(raised.code, 0, "{}", raised.stderr);
    assert!(raised.stderr.contains("audit: raised the mark"), "{}", raised.stderr);
    let entry: serde_json::Value =
        serde_json::from_str(std::fs::read_to_string(&audit).expect("audit file").trim()).expect("one JSON line");
    assert_eq!((entry["reason"].as_str(), entry["new"].as_str()), (Some("raise"), Some("60")));
    assert_eq!((entry["old"].as_str(), entry["token"].as_str()), (None, Some("60")));
    assert!(entry["old_damaged"].as_str().is_some_and(|d| d.contains("checksum")), "{entry}");
    assert_eq!(s.run(&["marks", "--store", &store, "--raise", "orders/2026.csv", "59"]).code, 1, "never lower");
    assert_eq!(s.run(&["admit", "--store", &store, "orders/2026.csv", "55"]).code, 1, "stale below the raised mark");
    assert_eq!(s.run(&["marks", "--store", &store, "--verify"]).code, 0);
    s.check_golden("damaged_record");
}

#[test]
fn a_mark_a_forged_token_raised_is_lowered_by_force_and_every_change_is_audited() {
    let mut s = Session::new();
    let store = s.store();
    let audit = s.path("audit.jsonl").display().to_string();
    let admit = |s: &mut Session, token: &str| s.run(&["admit", "--store", &store, "--audit", &audit, "r", token]).code;
    assert_eq!(admit(&mut s, "34"), 0, "the honest holder");
    assert_eq!(admit(&mut s, "18446744073709551615"), 0, "a forged token, without provenance");
    assert_eq!(admit(&mut s, "35"), 1, "the next honest holder is locked out");
    let unforced = s.run(&["marks", "--store", &store, "--set", "r", "34"]);
    assert_one_line_error(&unforced, &["--force", "re-admits"]);
    assert_eq!(s.run(&["marks", "--store", &store, "r"]).stdout.trim(), "18446744073709551615", "nothing written");
    let set = s.run(&["marks", "--store", &store, "--set", "r", "34", "--force", "--audit", &audit]);
    assert_eq!(set.code, 0, "{}", set.stderr);
    assert!(set.stdout.contains("from 18446744073709551615 to 34"), "old and new: {}", set.stdout);
    assert_eq!(admit(&mut s, "35"), 0, "the honest holder again");
    assert_eq!(s.run(&["marks", "--store", &store, "--clear", "r", "--force", "--audit", &audit]).code, 0);
    assert_eq!(s.run(&["marks", "--store", &store, "r"]).code, 1, "no mark");
    s.check_golden("forced_set");

    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&audit)
        .expect("audit file")
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
        .collect();
    // reason old new token, per line.
    let changes: Vec<String> = lines
        .iter()
        .map(|e| ["reason", "old", "new", "token"].map(|f| e[f].as_str().unwrap_or("-")).join(" "))
        .collect();
    let max = "18446744073709551615";
    assert_eq!(
        changes,
        [
            "advance - 34 34".to_owned(),
            format!("advance 34 {max} {max}"),
            format!("set {max} 34 34"),
            "advance 34 35 35".to_owned(),
            "clear 35 - -".to_owned(),
        ]
    );
    for entry in &lines {
        let fields = entry.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()).unwrap_or_default();
        assert_eq!(fields.len(), fencekeeper_core::audit::FIELDS.len(), "{entry}");
        assert_eq!((entry["host"].as_str(), entry["resource"].as_str()), (Some("cli"), Some("r")));
        assert_eq!(entry["store"].as_str(), Some(format!("file {store}").as_str()));
        assert!(entry["time"].as_str().is_some_and(|t| t.ends_with('Z')) && entry["unix_ms"].as_u64().is_some());
        assert!(entry["client"].is_null() && entry["old_damaged"].is_null());
    }
}

/// A store written by the previous version (bare tokens), made by its `admit`.
const FORMAT1: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../fencekeeper/tests/fixtures/format1.redb");

#[test]
fn an_old_format_store_is_refused_with_the_upgrade_command_then_upgraded_in_place() {
    let mut s = Session::new();
    let store = s.path("old.redb").display().to_string();
    std::fs::copy(FORMAT1, &store).expect("copy the fixture");
    for args in [&["marks", "--store", &store][..], &["admit", "--store", &store, "journal/segment-7", "49"][..]] {
        assert_one_line_error(&s.run(args), &["old format", "fencekeeper marks --store $TMP/old.redb --upgrade"]);
    }
    assert_eq!(s.run(&["marks", "--store", &store, "--upgrade"]).code, 0);
    assert_eq!(s.run(&["marks", "--store", &store, "--upgrade"]).code, 0, "a second upgrade changes nothing");
    assert_eq!(s.run(&["marks", "--store", &store]).code, 0);
    assert_eq!(s.run(&["admit", "--store", &store, "journal/segment-7", "49"]).code, 1, "still stale");
    s.check_golden("old_format");
}

/// Overwrite every page after the header page with garbage.
fn garbage_pages(store: &str) {
    let mut bytes = std::fs::read(store).expect("read the store");
    for (i, b) in bytes.iter_mut().enumerate().skip(4096) {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3];
    }
    std::fs::write(store, bytes).expect("write garbage");
}

#[test]
fn garbage_data_pages_are_exit_2_with_one_line_for_every_command_and_serve_does_not_start() {
    let mut s = Session::new();
    let store = s.store();
    assert_eq!(s.run(&["admit", "--store", &store, "orders/2026.csv", "34"]).code, 0);
    garbage_pages(&store);
    let serve =
        ["serve", "--upstream", "127.0.0.1:9", "--store", &store, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    for args in [
        &["admit", "--store", &store, "orders/2026.csv", "35"][..],
        &["marks", "--store", &store][..],
        &["marks", "--store", &store, "--verify"][..],
        &serve[..],
    ] {
        assert_one_line_error(&s.run(args), &["$TMP/marks.redb", "corrupt"]);
    }
    // A store of the old format does not start the gateway either.
    let old = s.path("old.redb").display().to_string();
    std::fs::copy(FORMAT1, &old).expect("copy the fixture");
    let serve_old =
        ["serve", "--upstream", "127.0.0.1:9", "--store", &old, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    assert_one_line_error(&s.run(&serve_old), &["--upgrade"]);
}

#[test]
fn default_store_is_created_under_dot_fencekeeper() {
    let mut s = Session::new();
    assert_eq!(s.run(&["admit", "orders/2026.csv", "1"]).code, 0);
    assert!(s.path(".fencekeeper/marks.redb").is_file());
    assert_eq!(s.run(&["marks", "orders/2026.csv"]).stdout, "1\n");
}

#[test]
fn conformance_passes_on_the_bundled_artifact() {
    let mut s = Session::new();
    let guest = bundled_artifact();
    let run = s.run(&["conformance", &guest.display().to_string()]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains(" passed, 0 failed"), "{}", run.stdout);
    assert!(!run.stdout.contains("FAIL"));
    // A fresh fallback-toolchain build may describe itself differently: only the
    // committed artifact is held to the transcript.
    if std::env::var_os(fencekeeper::validator::GUEST_DIR_ENV).is_none() {
        s.check_golden("conformance_bundled");
    }
}

#[test]
fn conformance_fails_with_exit_1_when_the_guest_disagrees_with_a_vector() {
    let mut s = Session::new();
    // The right guest against a wrong expectation: the table must show the failure.
    let wrong = r#"{"vectors":[
        {"name":"stale is refused","resource":"r","presented":"33","mark":"34","strict":false,"expect":{"verdict":"stale","mark":"34"}},
        {"name":"deliberately wrong: expects stale to be admitted","resource":"r","presented":"33","mark":"34","strict":false,
         "expect":{"verdict":"admit","mark":"33","advanced":true}}]}"#;
    let vectors = s.path("wrong.json");
    std::fs::write(&vectors, wrong).expect("write vectors");
    let run =
        s.run(&["conformance", "--vectors", &vectors.display().to_string(), &bundled_artifact().display().to_string()]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.contains("FAIL") && run.stdout.contains("1 passed, 1 failed"), "{}", run.stdout);
}

#[test]
fn conformance_cannot_load_a_file_that_is_not_a_guest_component_or_vectors() {
    let mut s = Session::new();
    let not_wasm = s.path("not-a-guest.wasm");
    std::fs::write(&not_wasm, b"\0asm but not really").expect("write file");
    let run = s.run(&["conformance", &not_wasm.display().to_string()]);
    assert_eq!(run.code, 2);
    assert!(run.stdout.is_empty() && run.stderr.starts_with("fencekeeper: "), "{}{}", run.stdout, run.stderr);
    // A core module (the proxy-wasm filter) is wasm, but not a component of our world.
    let filter = repo_root().join("guest/artifacts/fencekeeper_filter.wasm");
    if filter.exists() {
        assert_eq!(s.run(&["conformance", &filter.display().to_string()]).code, 2);
    }
    let missing = s.run(&["conformance", "/nonexistent/guest.wasm"]);
    assert_eq!(missing.code, 2, "{}", missing.stderr);
    let not_vectors = s.path("vectors.json");
    std::fs::write(&not_vectors, "{\"vectors\": 3}").expect("write file");
    let bad = s.run(&[
        "conformance",
        "--vectors",
        &not_vectors.display().to_string(),
        &bundled_artifact().display().to_string(),
    ]);
    assert_eq!(bad.code, 2, "{}{}", bad.stdout, bad.stderr);
    assert!(bad.stderr.contains("conformance vectors are not valid"), "{}", bad.stderr);
}

/// The fault-injection guest: reserved token texts (`fault-trap`, ...) trap, loop or
/// grow memory; tokens 64023.K.*.* make it lie (guest/validator/src/faults.rs).
fn fault_guest() -> PathBuf {
    guest_path("test-guests/guest_faults.wasm")
}

#[test]
fn a_faulting_guest_is_refused_as_503_in_both_modes() {
    let mut s = Session::new();
    let store = s.store();
    let guest = fault_guest().display().to_string();
    for fault in ["fault-trap", "fault-loop", "fault-grow"] {
        for mode in ["correctness", "efficiency"] {
            let run = s.run(&["admit", "--json", "--mode", mode, "--guest", &guest, "--store", &store, "f", fault]);
            assert_eq!(run.code, 1, "{fault} {mode}: {}{}", run.stdout, run.stderr);
            let v = json(&run);
            assert_eq!((v["class"].as_str(), v["http_status"].as_u64()), (Some("undecided"), Some(503)), "{fault}");
        }
    }
    // The same guest decides normally on other tokens, and nothing above set a mark.
    assert_eq!(s.run(&["admit", "--guest", &guest, "--store", &store, "orders/2026.csv", "5"]).code, 0);
    assert_eq!(s.run(&["marks", "--store", &store, "f"]).code, 1);
}

#[test]
fn a_lying_guest_cannot_get_a_stale_write_admitted_or_the_cli_to_say_so() {
    let mut s = Session::new();
    let store = s.store();
    let guest = fault_guest().display().to_string();
    assert_eq!(s.run(&["admit", "--store", &store, "r", "64023.3.0.34"]).code, 0);
    for mode in ["correctness", "efficiency"] {
        // This guest answers "admit, the mark unchanged" for any token.
        let run = s.run(&["admit", "--mode", mode, "--guest", &guest, "--store", &store, "r", "64023.3.0.5"]);
        assert_eq!(run.code, 1, "{mode}: {}{}", run.stdout, run.stderr);
        assert!(run.stdout.starts_with("stale fencing token 64023.3.0.5"), "{}", run.stdout);
        assert!(!run.stdout.contains("admitted"), "{}", run.stdout);
    }
    assert_eq!(s.run(&["marks", "--store", &store, "r"]).stdout.trim(), "64023.3.0.34");
}

#[test]
fn an_over_long_token_is_malformed_in_both_modes() {
    let mut s = Session::new();
    let store = s.store();
    assert_eq!(s.run(&["admit", "--store", &store, "r", "50"]).code, 0);
    let padded = format!("{}49", "0".repeat(4096));
    for mode in ["correctness", "efficiency"] {
        let run = s.run(&["admit", "--json", "--mode", mode, "--store", &store, "r", &padded]);
        assert_eq!(run.code, 1, "{mode}");
        let v = json(&run);
        assert_eq!((v["class"].as_str(), v["http_status"].as_u64()), (Some("malformed"), Some(400)), "{mode}");
    }
}

#[test]
fn a_bad_argument_is_one_line_and_exit_2() {
    use std::os::unix::ffi::OsStrExt;
    let s = Session::new();
    let bad = std::ffi::OsStr::from_bytes(b"r\xff");
    for args in
        [vec![std::ffi::OsStr::new("admit"), bad], vec![std::ffi::OsStr::new("admit"), std::ffi::OsStr::new("--nope")]]
    {
        let out = Command::new(BIN).args(&args).current_dir(s.dir.path()).output().expect("run fencekeeper");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
        assert!(stderr.starts_with("fencekeeper: "), "{stderr}");
    }
    // The one line keeps what clap would say to help: its suggestion, the valid values.
    for (args, says) in [
        (&["sevre"][..], "a similar subcommand exists: 'serve'"),
        (&["serve", "--upstream", "http://a:1", "--mode", "fast"], "[possible values: correctness, efficiency]"),
        // A cluster's members, none of them up: each named with why, on one line.
        (&["marks", "--etcd", "127.0.0.1:1,127.0.0.1:2"], "no member answered (127.0.0.1:1: cannot connect"),
    ] {
        let out = Command::new(BIN).args(args).current_dir(s.dir.path()).output().expect("run fencekeeper");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!((out.status.code(), stderr.lines().count()), (Some(2), 1), "{stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let help = Command::new(BIN).arg("--help").output().expect("run fencekeeper");
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).lines().count() > 3);
}

#[test]
fn conformance_prints_a_hostile_guest_name_escaped() {
    let mut s = Session::new();
    let run = s.run(&["conformance", &fault_guest().display().to_string()]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let first = run.stdout.lines().next().unwrap_or_default();
    assert!(first.contains("\\u{1b}[2J") && first.contains("\\u{a}44 passed"), "{first}");
    assert!(!run.stdout.contains('\x1b'));
    let summaries = run.stdout.lines().filter(|l| l.split(' ').next().is_some_and(|w| w.parse::<u32>().is_ok()));
    assert_eq!(summaries.count(), 1, "one summary line, the real one: {}", run.stdout);
}

#[test]
fn conformance_reports_a_faulting_guest_as_failures_not_a_crash() {
    let mut s = Session::new();
    let vectors = r#"{"vectors":[
        {"name":"normal key","resource":"r","presented":"35","mark":"34","strict":false,"expect":{"verdict":"admit","mark":"35","advanced":true}},
        {"name":"guest traps","resource":"r","presented":"fault-trap","mark":"34","strict":false,"expect":{"verdict":"malformed"}},
        {"name":"guest loops","resource":"r","presented":"fault-loop","mark":"34","strict":false,"expect":{"verdict":"malformed"}}]}"#;
    let path = s.path("faults.json");
    std::fs::write(&path, vectors).expect("write vectors");
    let run = s.run(&["conformance", "--vectors", &path.display().to_string(), &fault_guest().display().to_string()]);
    assert_eq!(run.code, 1, "{}{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("1 passed, 2 failed"), "{}", run.stdout);
    assert_eq!(run.stdout.matches("error: ").count(), 2, "{}", run.stdout);
}

#[test]
fn serve_keeps_marks_where_admit_and_marks_look_and_will_not_start_empty_beside_its_old_store() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fencekeeper = |args: &[&str]| Command::new(BIN).args(args).current_dir(dir.path()).output().expect("run");
    // A store at serve's old default path, holding a mark.
    let admitted = fencekeeper(&["admit", "--store", "fencekeeper-marks.redb", "/r", "34"]);
    assert!(admitted.status.success(), "{admitted:?}");
    let serve = ["serve", "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"];
    let refused = fencekeeper(&serve);
    assert_eq!(refused.status.code(), Some(2));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("mv fencekeeper-marks.redb .fencekeeper/marks.redb") && said.contains("--store"), "{said}");
    assert!(!dir.path().join(".fencekeeper").exists(), "no empty store was made: {said}");
    // Moved as it says, `serve` opens it at the default path, where `marks` reads it.
    std::fs::create_dir(dir.path().join(".fencekeeper")).expect("mkdir");
    std::fs::rename(dir.path().join("fencekeeper-marks.redb"), dir.path().join(".fencekeeper/marks.redb")).expect("mv");
    let journal = dir.path().join("fencekeeper-marks.redb.journal");
    if journal.exists() {
        std::fs::rename(journal, dir.path().join(".fencekeeper/marks.redb.journal")).expect("mv");
    }
    let log = serving(dir.path(), &serve, &[]);
    assert!(log.contains("marks=file .fencekeeper/marks.redb"), "{log}");
    let shown = fencekeeper(&["marks", "/r"]);
    assert!(shown.status.success() && String::from_utf8_lossy(&shown.stdout).contains("34"), "{shown:?}");
}

/// Start `fencekeeper serve ARGS` in `dir` with `env` added, read its log up to the
/// line it logs once it serves (which names its settings), stop it, and return the
/// log so far. A serve that exits first returns what it said.
fn serving(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut child = Command::new(BIN)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(dir)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    let mut log = String::new();
    let stderr = child.stderr.take().expect("stderr");
    for line in std::io::BufRead::lines(std::io::BufReader::new(stderr)) {
        let line = line.expect("log");
        log.push_str(&line);
        log.push('\n');
        if line.contains("serving") {
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    log
}

#[test]
fn serve_takes_every_setting_from_the_environment_and_a_flag_wins_over_it() {
    let dir = tempfile::tempdir().expect("temp dir");
    let env = [
        ("FENCEKEEPER_UPSTREAM", "127.0.0.1:9"),
        ("FENCEKEEPER_LISTEN", "127.0.0.1:0"),
        ("FENCEKEEPER_ADMIN", "127.0.0.1:0"),
        ("FENCEKEEPER_STORE", "from-env.redb"),
        ("FENCEKEEPER_STORE_APPLY_BOUND", "7s"),
    ];
    let log = serving(dir.path(), &["serve"], &env);
    assert!(log.contains("marks=file from-env.redb") && log.contains("store_apply_bound=7s"), "{log}");
    let log = serving(dir.path(), &["serve", "--store", "from-flag.redb"], &env);
    assert!(log.contains("marks=file from-flag.redb"), "{log}");
    // A bad value from the environment is refused as the flag's would be.
    let bad = Command::new(BIN)
        .args(["serve"])
        .envs(env)
        .env("FENCEKEEPER_MODE", "fast")
        .current_dir(dir.path())
        .output()
        .expect("serve");
    assert_eq!(bad.status.code(), Some(2));
    let said = String::from_utf8_lossy(&bad.stderr);
    assert!(said.contains("invalid value 'fast' for '--mode"), "{said}");
}

/// `serve --check`: a dry run that says whether the gateway would start, and why not,
/// without binding an address or creating a store.
#[test]
fn serve_check_says_whether_the_gateway_would_start_and_creates_nothing() {
    let mut s = Session::new();
    // The address is taken: --check does not bind it, so it passes.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let listen = taken.local_addr().expect("its address").to_string();
    let ok = s.run(&["serve", "--check", "--upstream", "127.0.0.1:8000", "--listen", &listen]);
    assert_eq!(ok.code, 0, "{}{}", ok.stdout, ok.stderr);
    assert!(ok.stdout.starts_with("fencekeeper serve: usable: clients on 127.0.0.1:"), "{}", ok.stdout);
    assert!(ok.stdout.contains("marks in .fencekeeper/marks.redb, correctness mode"), "{}", ok.stdout);
    assert!(!s.path(".fencekeeper").exists(), "a store was created");
    let missing = s.path("missing.pem").display().to_string();
    for (args, says) in [
        (vec!["--upstream", "https://127.0.0.1:8000"], "--upstream-cacert"),
        (vec!["--upstream", "127.0.0.1:8000", "--tls-cert", &missing, "--tls-key", &missing], "missing.pem"),
        (vec!["--upstream", "127.0.0.1:8000", "--guest", &missing], "missing.pem"),
    ] {
        let run = s.run(&[&["serve", "--check"][..], &args].concat());
        assert_eq!(run.code, 2, "{args:?}: {}{}", run.stdout, run.stderr);
        assert_one_line_error(&run, &[says]);
    }
}

/// A reader that has gone away (`fencekeeper admit ... | head -0`): no panic, and the
/// exit code still says what was decided.
#[test]
fn a_closed_standard_output_changes_no_exit_code() {
    let dir = tempfile::tempdir().expect("temp dir");
    let run = |args: &[&str]| {
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let out = Command::new(BIN)
            .args(args)
            .current_dir(dir.path())
            .stdout(writer)
            .stderr(std::process::Stdio::piped())
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
        out.status.code()
    };
    assert_eq!(run(&["admit", "/r", "34"]), Some(0), "admitted");
    assert_eq!(run(&["admit", "/r", "33"]), Some(1), "refused, unread");
    assert_eq!(run(&["marks"]), Some(0));
    assert_eq!(run(&["envoy-config", "--upstream", "127.0.0.1:8000", "--filter", "/f.wasm"]), Some(0));
}
