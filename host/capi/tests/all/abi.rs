//! The C ABI called as a C caller calls it (through the exported functions, with raw
//! pointers), on what a C test program cannot reach easily: a real etcd with TLS and
//! users, the test guest's faults and lies, threads, and callback tables that break
//! their contract.

#![allow(clippy::unwrap_used, clippy::panic, unsafe_code)]

use fencekeeper_capi::*;
use fencekeeper_harness::secure_etcd::SecureEtcd;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::sync::Mutex;

/// An open guard, closed on drop; the strings its options point at live beside it.
struct Guard(*mut fencekeeper_guard);

// SAFETY: the header says a guard may be used from any number of threads at once.
unsafe impl Send for Guard {}
// SAFETY: as above.
unsafe impl Sync for Guard {}

impl Drop for Guard {
    fn drop(&mut self) {
        // SAFETY: opened by `open`, used by nobody else any more.
        unsafe { fencekeeper_guard_close(self.0) }
    }
}

fn last_error() -> String {
    // SAFETY: the library's pointer, valid until the next call on this thread.
    unsafe { CStr::from_ptr(fencekeeper_last_error()) }.to_string_lossy().into_owned()
}

fn zeroed() -> fencekeeper_options {
    // SAFETY: every field of the options is valid when zero (NULL pointers, 0 values).
    unsafe { std::mem::zeroed() }
}

fn open(options: &fencekeeper_options) -> Result<Guard, (fencekeeper_status, String)> {
    let mut guard = std::ptr::null_mut();
    // SAFETY: the options' strings are NUL-terminated CStrings the caller keeps alive.
    match unsafe { fencekeeper_guard_open(options, &mut guard) } {
        FENCEKEEPER_OK => Ok(Guard(guard)),
        status => Err((status, last_error())),
    }
}

struct Outcome {
    class: fencekeeper_class,
    admitted: bool,
    advanced: bool,
    failed_open: bool,
    breach: bool,
    mark: String,
    reason: String,
}

fn read(o: &fencekeeper_outcome) -> Outcome {
    let text = |b: &[c_char]| {
        let bytes: Vec<u8> = b.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        String::from_utf8(bytes).unwrap()
    };
    Outcome {
        class: o.class_,
        admitted: o.admitted,
        advanced: o.advanced,
        failed_open: o.failed_open,
        breach: o.breach,
        mark: text(&o.mark),
        reason: text(&o.reason),
    }
}

fn admit(guard: &Guard, resource: &str, token: Option<&str>) -> Outcome {
    let mut o = std::mem::MaybeUninit::<fencekeeper_outcome>::uninit();
    let (t, tl) = token.map_or((std::ptr::null(), 0), |t| (t.as_ptr(), t.len()));
    // SAFETY: the slices' pointers and lengths; room for one outcome.
    let status = unsafe { fencekeeper_admit(guard.0, resource.as_ptr(), resource.len(), t, tl, o.as_mut_ptr()) };
    assert!(status == FENCEKEEPER_OK || status == FENCEKEEPER_ERR_AUDIT, "{status}: {}", last_error());
    // SAFETY: written whole on these two statuses (the header's promise, tested here).
    read(unsafe { o.assume_init_ref() })
}

fn mark(guard: &Guard, resource: &str) -> Result<Option<String>, String> {
    let mut buffer = [0 as c_char; FENCEKEEPER_TOKEN_CAP];
    let mut found = false;
    // SAFETY: a buffer of FENCEKEEPER_TOKEN_CAP bytes and a bool.
    let status =
        unsafe { fencekeeper_mark(guard.0, resource.as_ptr(), resource.len(), buffer.as_mut_ptr(), &mut found) };
    if status != FENCEKEEPER_OK {
        return Err(last_error());
    }
    // SAFETY: NUL-terminated by the library.
    let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_string_lossy().into_owned();
    Ok(found.then_some(text))
}

fn guest(name: &str) -> CString {
    let path = fencekeeper::validator::guest_path(name);
    CString::new(path.to_str().unwrap()).unwrap()
}

fn c(path: &Path) -> CString {
    CString::new(path.to_str().unwrap()).unwrap()
}

#[test]
fn a_file_store_guard_fences_audits_lists_and_remembers_across_opens() {
    let dir = tempfile::tempdir().unwrap();
    let (store, audit) = (c(&dir.path().join("marks.redb")), c(&dir.path().join("audit.jsonl")));
    let host = CString::new("my-engine").unwrap();
    let mut options = zeroed();
    options.store = FENCEKEEPER_STORE_KIND_FILE;
    options.store_path = store.as_ptr();
    options.audit_path = audit.as_ptr();
    options.host_name = host.as_ptr();
    {
        let g = open(&options).unwrap();
        assert!(admit(&g, "b", Some("33")).advanced);
        assert!(admit(&g, "a", Some("7.1")).advanced);
        let again = admit(&g, "a", Some("7.1"));
        assert!(again.admitted && !again.advanced, "the holder writing again");
        assert!(admit(&g, "a", Some("8.0")).advanced);
        let mut listed: Vec<(String, String)> = Vec::new();
        unsafe extern "C" fn visit(ctx: *mut c_void, r: *const u8, rl: usize, m: *const c_char, ml: usize) -> i32 {
            // SAFETY: ctx is the Vec passed below; the key and the mark are valid for the call.
            unsafe {
                let listed = &mut *ctx.cast::<Vec<(String, String)>>();
                let key = String::from_utf8(std::slice::from_raw_parts(r, rl).to_vec()).unwrap();
                let mark = CStr::from_ptr(m).to_string_lossy().into_owned();
                assert_eq!(mark.len(), ml);
                listed.push((key, mark));
            }
            0
        }
        // SAFETY: `visit` has the documented signature; ctx outlives the call.
        let status = unsafe { fencekeeper_marks(g.0, Some(visit), (&mut listed as *mut Vec<_>).cast()) };
        assert_eq!(status, FENCEKEEPER_OK, "{}", last_error());
        assert_eq!(listed, [("a".to_owned(), "8.0".to_owned()), ("b".to_owned(), "33".to_owned())]);
    }
    let g = open(&options).unwrap();
    let stale = admit(&g, "a", Some("7.9"));
    assert_eq!((stale.class, stale.mark.as_str()), (FENCEKEEPER_CLASS_STALE, "8.0"), "{}", stale.reason);
    assert_eq!(mark(&g, "b").unwrap().as_deref(), Some("33"));
    assert_eq!(mark(&g, "nothing").unwrap(), None);
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(dir.path().join("audit.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "one line per advance: {lines:?}");
    assert_eq!((lines[2]["old"].as_str(), lines[2]["new"].as_str()), (Some("7.1"), Some("8.0")));
    assert_eq!(lines[2]["host"], "my-engine");
    assert!(lines[2]["store"].as_str().unwrap().starts_with("file "), "{}", lines[2]["store"]);

    let nowhere = c(&dir.path().join("no/such/dir/audit.jsonl"));
    options.audit_path = nowhere.as_ptr();
    let (status, why) = open(&options).err().unwrap();
    assert_eq!(status, FENCEKEEPER_ERR_AUDIT, "{why}");
    assert!(why.contains("cannot open the audit log"), "{why}");
}

#[test]
fn a_file_store_in_directories_that_do_not_exist_yet_creates_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("not/yet/marks.redb");
    let store = c(&path);
    let mut options = zeroed();
    options.store = FENCEKEEPER_STORE_KIND_FILE;
    options.store_path = store.as_ptr();
    let g = open(&options).unwrap_or_else(|(s, e)| panic!("{s}: {e}"));
    assert!(admit(&g, "r", Some("33")).advanced);
    drop(g);
    assert!(path.is_file(), "the header says the store's directories are created");
}

#[test]
fn an_etcd_with_tls_and_users_is_a_store_and_every_wrong_setting_is_one_line() {
    let etcd = SecureEtcd::start().unwrap();
    let endpoint = CString::new(etcd.url()).unwrap();
    let (ca, cert, key) = (c(&etcd.certs.ca), c(&etcd.certs.client.0), c(&etcd.certs.client.1));
    let (user, password) = (CString::new(etcd.user.clone()).unwrap(), CString::new(etcd.password.clone()).unwrap());
    let mut options = zeroed();
    options.store = FENCEKEEPER_STORE_KIND_ETCD;
    options.etcd_endpoint = endpoint.as_ptr();
    options.etcd_ca = ca.as_ptr();
    options.etcd_cert = cert.as_ptr();
    options.etcd_key = key.as_ptr();
    options.etcd_user = user.as_ptr();
    options.etcd_password = password.as_ptr();
    let g = open(&options).unwrap_or_else(|(s, e)| panic!("{s}: {e}"));
    assert!(admit(&g, "orders", Some("33")).admitted);
    assert!(admit(&g, "orders", Some("34")).admitted);
    let stale = admit(&g, "orders", Some("33"));
    assert_eq!((stale.class, stale.mark.as_str()), (FENCEKEEPER_CLASS_STALE, "34"));
    let stored = etcd.ctl(&["get", "/fencekeeper/marks/orders", "--print-value-only"]).unwrap();
    assert!(stored.starts_with("fk2 34 "), "the shared key scheme and record: {stored}");
    assert_eq!(mark(&g, "orders").unwrap().as_deref(), Some("34"));

    let wrong = CString::new("not the password").unwrap();
    options.etcd_password = wrong.as_ptr();
    let (status, why) = open(&options).err().unwrap();
    assert_eq!(status, FENCEKEEPER_ERR_STORE, "{why}");
    assert!(!why.contains('\n') && why.contains("mark store"), "{why}");
    options.etcd_password = std::ptr::null();
    let (status, why) = open(&options).err().unwrap();
    assert_eq!(status, FENCEKEEPER_ERR_ARGUMENT, "{why}");
    options.etcd_password = password.as_ptr();
    options.etcd_ca = std::ptr::null();
    let (status, why) = open(&options).err().unwrap();
    assert_eq!(status, FENCEKEEPER_ERR_ARGUMENT, "a certificate without a CA: {why}");
    let plain = CString::new(etcd.url().replace("https", "http")).unwrap();
    options.etcd_ca = ca.as_ptr();
    options.etcd_endpoint = plain.as_ptr();
    let (status, why) = open(&options).err().unwrap();
    assert_eq!(status, FENCEKEEPER_ERR_STORE, "TLS settings with a plaintext endpoint: {why}");
}

#[test]
fn the_test_guests_faults_and_lies_are_refused_in_both_modes_and_a_reason_stays_one_capped_line() {
    let path = guest("test-guests/guest_faults.wasm");
    for mode in [FENCEKEEPER_MODE_CORRECTNESS, FENCEKEEPER_MODE_EFFICIENCY] {
        let mut options = zeroed();
        options.guest_path = path.as_ptr();
        options.mode = mode;
        let g = open(&options).unwrap_or_else(|(s, e)| panic!("{s}: {e}"));
        assert!(admit(&g, "r", Some("64023.0.0.5")).admitted);
        for fault in ["fault-trap", "fault-loop", "fault-grow"] {
            let o = admit(&g, "r", Some(fault));
            assert!(!o.admitted && !o.failed_open, "{mode} {fault}: {}", o.reason);
            assert_eq!(o.class, FENCEKEEPER_CLASS_UNDECIDED, "{fault}: {}", o.reason);
        }
        let lie = admit(&g, "r", Some("64023.2.0.0"));
        assert!(!lie.admitted && lie.breach, "a lock-out to the maximum is a breach: {}", lie.reason);
        assert_eq!(mark(&g, "r").unwrap().as_deref(), Some("64023.0.0.5"), "the mark never moved");
        // A 2 MiB reason full of escapes: under the default fuel the guest runs out
        // while it builds it (undecided); either way the reason is one short line.
        let flood = admit(&g, "r", Some("fault-reason"));
        assert!(!flood.admitted && !flood.failed_open, "{}", flood.reason);
        assert!(flood.reason.len() < 600 && !flood.reason.contains(['\n', '\x1b']), "{}", flood.reason);
    }
}

#[test]
fn a_guest_that_fails_conformance_or_is_not_a_component_does_not_load() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm not really").unwrap();
    let junk = c(&junk);
    let mut options = zeroed();
    options.guest_path = junk.as_ptr();
    let (status, why) = open(&options).err().unwrap();
    assert_eq!(status, FENCEKEEPER_ERR_LOAD, "{why}");
    assert!(why.starts_with("cannot load the validator"), "{why}");
}

#[test]
fn threads_share_one_guard_and_the_mark_ends_at_the_highest_admitted_token() {
    let dir = tempfile::tempdir().unwrap();
    let store = c(&dir.path().join("marks.redb"));
    let mut options = zeroed();
    options.store = FENCEKEEPER_STORE_KIND_FILE;
    options.store_path = store.as_ptr();
    let g = open(&options).unwrap();
    let threads = 4u64;
    let per_thread = 150u64;
    std::thread::scope(|s| {
        for t in 0..threads {
            let g = &g;
            s.spawn(move || {
                for k in 0..per_thread {
                    let token = (k * threads + t + 1).to_string();
                    let o = admit(g, "shared", Some(&token));
                    match o.class {
                        FENCEKEEPER_CLASS_ADMITTED => assert_eq!(o.mark, token),
                        FENCEKEEPER_CLASS_STALE => {
                            assert!(o.mark.parse::<u64>().unwrap() > token.parse::<u64>().unwrap(), "{}", o.reason)
                        }
                        other => panic!("class {other}: {}", o.reason),
                    }
                }
            });
        }
    });
    assert_eq!(mark(&g, "shared").unwrap(), Some((threads * per_thread).to_string()));
}

/// A store of callbacks written in Rust, as a C engine writes them, whose behaviour
/// a test can break.
#[derive(Default)]
struct Table {
    values: Mutex<BTreeMap<Vec<u8>, Vec<u8>>>,
    /// get answers this status instead of looking.
    get_answers: Option<i32>,
    /// get claims a value this long.
    get_len: Option<usize>,
    /// compare_and_swap answers CONFLICT without looking.
    always_conflict: bool,
    /// the failure reason written, without a NUL.
    why_without_nul: bool,
}

unsafe extern "C" fn table_get(
    ctx: *mut c_void,
    r: *const u8,
    rl: usize,
    value: *mut u8,
    value_len: *mut usize,
    why: *mut c_char,
    why_cap: usize,
) -> fencekeeper_store_status {
    // SAFETY: ctx is the Table of the call; the buffers are the library's, of the sizes given.
    unsafe {
        let table = &*ctx.cast::<Table>();
        if table.why_without_nul {
            std::ptr::write_bytes(why, b'x', why_cap);
            return FENCEKEEPER_STORE_FAILED;
        }
        if let Some(status) = table.get_answers {
            return status;
        }
        let key = std::slice::from_raw_parts(r, rl).to_vec();
        match table.values.lock().unwrap().get(&key) {
            None => FENCEKEEPER_STORE_ABSENT,
            Some(v) => {
                std::ptr::copy_nonoverlapping(v.as_ptr(), value, v.len().min(*value_len));
                *value_len = table.get_len.unwrap_or(v.len());
                FENCEKEEPER_STORE_FOUND
            }
        }
    }
}

unsafe extern "C" fn table_swap(
    ctx: *mut c_void,
    r: *const u8,
    rl: usize,
    expected: *const u8,
    el: usize,
    value: *const u8,
    vl: usize,
    _why: *mut c_char,
    _why_cap: usize,
) -> fencekeeper_store_status {
    // SAFETY: as in `table_get`; the slices are the library's for the call.
    unsafe {
        let table = &*ctx.cast::<Table>();
        if table.always_conflict {
            return FENCEKEEPER_STORE_CONFLICT;
        }
        let key = std::slice::from_raw_parts(r, rl).to_vec();
        let expected = (!expected.is_null()).then(|| std::slice::from_raw_parts(expected, el).to_vec());
        let mut values = table.values.lock().unwrap();
        if values.get(&key) != expected.as_ref() {
            return FENCEKEEPER_STORE_CONFLICT;
        }
        values.insert(key, std::slice::from_raw_parts(value, vl).to_vec());
        FENCEKEEPER_STORE_SWAPPED
    }
}

fn admit_in(guard: &Guard, table: &Table, resource: &str, token: &str) -> Outcome {
    let store = fencekeeper_mark_store {
        ctx: (table as *const Table).cast_mut().cast(),
        get: Some(table_get),
        compare_and_swap: Some(table_swap),
        audit: None,
        name: c"the test table".as_ptr(),
    };
    let mut o = std::mem::MaybeUninit::<fencekeeper_outcome>::uninit();
    // SAFETY: the table's callbacks have the documented signatures; ctx outlives the call.
    let status = unsafe {
        fencekeeper_admit_in(
            guard.0,
            &store,
            resource.as_ptr(),
            resource.len(),
            token.as_ptr(),
            token.len(),
            o.as_mut_ptr(),
        )
    };
    assert_eq!(status, FENCEKEEPER_OK, "{}", last_error());
    // SAFETY: written whole on FENCEKEEPER_OK.
    read(unsafe { o.assume_init_ref() })
}

#[test]
fn a_callback_table_that_breaks_its_contract_is_undecided_never_admitted() {
    let g = open(&zeroed()).unwrap();
    let honest = Table::default();
    assert!(admit_in(&g, &honest, "r", "5").advanced);
    assert_eq!(admit_in(&g, &honest, "r", "4").class, FENCEKEEPER_CLASS_STALE);
    let stored = honest.values.lock().unwrap().get(b"r".as_slice()).cloned().unwrap();
    assert!(stored.starts_with(b"fk2 5 "), "the table keeps a checked record: {}", String::from_utf8_lossy(&stored));

    let cases: [(&str, Table); 6] = [
        ("no status (0)", Table { get_answers: Some(0), ..Table::default() }),
        ("an unknown status", Table { get_answers: Some(0x7fff), ..Table::default() }),
        ("a found value of no bytes", Table { get_len: Some(0), ..Table::default() }),
        ("a value longer than any record", Table { get_len: Some(FENCEKEEPER_RECORD_CAP + 1), ..Table::default() }),
        ("conflict forever", Table { always_conflict: true, ..Table::default() }),
        ("why without a NUL", Table { why_without_nul: true, ..Table::default() }),
    ];
    for (what, table) in cases {
        table.values.lock().unwrap().insert(b"r".to_vec(), stored.clone());
        let o = admit_in(&g, &table, "r", "9");
        assert_eq!(o.class, FENCEKEEPER_CLASS_UNDECIDED, "{what}: {}", o.reason);
        assert!(!o.admitted && !o.reason.contains('\n'), "{what}: {}", o.reason);
        assert!(o.reason.len() < 1024, "{what}: {}", o.reason);
        assert_eq!(table.values.lock().unwrap().get(b"r".as_slice()), Some(&stored), "{what}: the mark stays");
    }
}
