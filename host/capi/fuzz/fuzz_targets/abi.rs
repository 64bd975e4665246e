//! The C ABI driven with arbitrary bytes, as a careless or hostile C caller would.
//!
//! Each input is a script of calls into the exported functions on guards opened
//! once per process (the four policies, the bundled validator, marks in memory),
//! with resource keys and token bytes of any content and length, NULL pointers with
//! lengths, and engine callback tables that answer anything: any status, any value
//! bytes, any claimed length, a reason without a NUL. What must hold:
//!
//! * no call panics, crashes or returns a status it should not; bad arguments are
//!   `FENCEKEEPER_ERR_ARGUMENT`, everything else `FENCEKEEPER_OK`;
//! * on the guard's own store, every outcome is the core's decision against a
//!   max-register model of the marks (the class, the mark text), and the mark read
//!   back is the model's;
//! * through a callback table, a write is admitted only on the table's own word:
//!   an advance only after it answered SWAPPED to the new record, a holder's write
//!   again only when the value it returned is that resource's checked record of the
//!   same token, and never below a mark the table holds; anything else is refused;
//! * every outcome's texts are NUL-terminated, as long as their lengths say, one
//!   line, and the class and its statuses agree.
#![no_main]
#![allow(unsafe_code)]

use arbitrary::Arbitrary;
use fencekeeper_capi::*;
use fencekeeper_core::{decide, record, refusal, Mode, Policy, Token};
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

#[derive(Arbitrary, Debug)]
struct Script {
    strict: bool,
    efficiency: bool,
    calls: Vec<Call>,
}

#[derive(Arbitrary, Debug)]
enum Key {
    /// One of a few names, so that calls meet on a resource.
    Named(u8),
    /// Any bytes (UTF-8 or not, empty, long).
    Raw(Vec<u8>),
    /// A key of this many bytes past the bound, passed with a short buffer.
    Past(u16),
}

#[derive(Arbitrary, Debug)]
enum Text {
    /// A token with small components, so that tokens and marks meet.
    Small(Vec<u8>),
    Raw(Vec<u8>),
    /// A length past the bound with a short buffer.
    Past(u16),
}

#[derive(Arbitrary, Debug)]
enum Stored {
    Absent,
    /// The resource's own checked record of a small token.
    Record(Vec<u8>),
    /// Another resource's record of it.
    Foreign(Vec<u8>),
    Bytes(Vec<u8>),
}

#[derive(Arbitrary, Debug)]
struct Table {
    get_status: Option<i32>,
    stored: Stored,
    claimed_len: Option<usize>,
    swap_status: Option<i32>,
    why_without_nul: bool,
}

#[derive(Arbitrary, Debug)]
enum Call {
    Admit(Key, Option<Text>),
    AdmitIn(Key, Option<Text>, Table),
    Mark(Key),
    NullOutcome,
    NullWithLength(u16, bool),
}

struct Guards([*mut fencekeeper_guard; 4]);
// SAFETY: a guard may be used from any thread (header); these are never closed.
unsafe impl Send for Guards {}
// SAFETY: as above.
unsafe impl Sync for Guards {}

fn guard(strict: bool, efficiency: bool) -> *mut fencekeeper_guard {
    static GUARDS: OnceLock<Guards> = OnceLock::new();
    let guards = GUARDS.get_or_init(|| {
        Guards([0, 1, 2, 3].map(|i| {
            // SAFETY: zero is every option's default.
            let mut options: fencekeeper_options = unsafe { std::mem::zeroed() };
            options.strict = u8::from(i & 1 == 1);
            options.mode = if i & 2 == 2 { FENCEKEEPER_MODE_EFFICIENCY } else { FENCEKEEPER_MODE_CORRECTNESS };
            let mut g = std::ptr::null_mut();
            // SAFETY: valid options, room for the handle.
            assert_eq!(unsafe { fencekeeper_guard_open(&options, &mut g) }, FENCEKEEPER_OK);
            g
        }))
    });
    guards.0[usize::from(strict) | (usize::from(efficiency) << 1)]
}

fn small_token(parts: &[u8]) -> String {
    let n = parts.len().clamp(1, 2);
    parts.iter().chain([0u8, 0].iter()).take(n).map(|p| (p % 8).to_string()).collect::<Vec<_>>().join(".")
}

/// Key bytes, made unique to this input so that the memory store's marks from
/// earlier inputs never meet this one's model.
fn key_bytes(key: &Key, run: u64) -> (Vec<u8>, usize) {
    let prefix = format!("{run}/").into_bytes();
    match key {
        Key::Named(n) => {
            let k = [prefix, format!("r{}", n % 4).into_bytes()].concat();
            let len = k.len();
            (k, len)
        }
        Key::Raw(raw) => {
            let k = [prefix, raw.clone()].concat();
            let len = k.len();
            (k, len)
        }
        Key::Past(extra) => (prefix, 1025 + usize::from(*extra)),
    }
}

fn text_bytes(text: &Text) -> (Vec<u8>, usize) {
    match text {
        Text::Small(parts) => {
            let t = small_token(parts).into_bytes();
            let len = t.len();
            (t, len)
        }
        Text::Raw(raw) => (raw.clone(), raw.len()),
        Text::Past(extra) => (b"1".to_vec(), 129 + usize::from(*extra)),
    }
}

fn texts(o: &fencekeeper_outcome) -> (String, String) {
    let read = |buf: &[c_char], len: usize| {
        let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
        let until_nul = bytes.iter().position(|&b| b == 0).expect("a text without its NUL");
        assert_eq!(until_nul, len, "a text's length is not its length");
        String::from_utf8(bytes[..len].to_vec()).expect("a text that is not UTF-8")
    };
    let (mark, reason) = (read(&o.mark, o.mark_len), read(&o.reason, o.reason_len));
    assert!(!reason.contains(['\n', '\r']), "a reason on two lines: {reason:?}");
    (mark, reason)
}

fn class_of(c: refusal::Class) -> fencekeeper_class {
    [
        FENCEKEEPER_CLASS_ADMITTED,
        FENCEKEEPER_CLASS_STALE,
        FENCEKEEPER_CLASS_REPLAYED,
        FENCEKEEPER_CLASS_MALFORMED,
        FENCEKEEPER_CLASS_MISSING,
        FENCEKEEPER_CLASS_UNDECIDED,
        FENCEKEEPER_CLASS_UNVERIFIED,
    ][c.index()]
}

/// What the table saw and answered, for the checks after the call.
#[derive(Default)]
struct Log {
    swapped: Vec<Vec<u8>>,
    returned: Vec<Vec<u8>>,
}

struct Ctx<'a> {
    table: &'a Table,
    value: Vec<u8>,
    log: Mutex<Log>,
}

unsafe extern "C" fn get(
    ctx: *mut c_void,
    _r: *const u8,
    _rl: usize,
    value: *mut u8,
    value_len: *mut usize,
    why: *mut c_char,
    why_cap: usize,
) -> fencekeeper_store_status {
    // SAFETY: ctx is this input's Ctx; the buffers are the library's, of the sizes it gave.
    unsafe {
        let ctx = &*ctx.cast::<Ctx>();
        if ctx.table.why_without_nul {
            std::ptr::write_bytes(why, b'!', why_cap);
        }
        if let Some(status) = ctx.table.get_status {
            return status;
        }
        if matches!(ctx.table.stored, Stored::Absent) {
            return FENCEKEEPER_STORE_ABSENT;
        }
        let n = ctx.value.len().min(*value_len);
        std::ptr::copy_nonoverlapping(ctx.value.as_ptr(), value, n);
        *value_len = ctx.table.claimed_len.unwrap_or(n);
        ctx.log.lock().unwrap_or_else(|p| p.into_inner()).returned.push(ctx.value[..n].to_vec());
        FENCEKEEPER_STORE_FOUND
    }
}

unsafe extern "C" fn swap(
    ctx: *mut c_void,
    _r: *const u8,
    _rl: usize,
    _e: *const u8,
    _el: usize,
    value: *const u8,
    vl: usize,
    _why: *mut c_char,
    _why_cap: usize,
) -> fencekeeper_store_status {
    // SAFETY: as in `get`.
    unsafe {
        let ctx = &*ctx.cast::<Ctx>();
        let status = ctx.table.swap_status.unwrap_or(FENCEKEEPER_STORE_SWAPPED);
        if status == FENCEKEEPER_STORE_SWAPPED {
            let written = std::slice::from_raw_parts(value, vl).to_vec();
            ctx.log.lock().unwrap_or_else(|p| p.into_inner()).swapped.push(written);
        }
        status
    }
}

fn admit_in(g: *mut fencekeeper_guard, key: &[u8], len: usize, token: Option<(Vec<u8>, usize)>, table: &Table) {
    let resource_for_records = key.to_vec();
    let value = match &table.stored {
        Stored::Absent => Vec::new(),
        Stored::Record(parts) => {
            let t = Token::parse(&small_token(parts)).expect("a small token");
            record::encode(&resource_for_records, &t).as_bytes().to_vec()
        }
        Stored::Foreign(parts) => {
            let t = Token::parse(&small_token(parts)).expect("a small token");
            record::encode(b"another resource", &t).as_bytes().to_vec()
        }
        Stored::Bytes(b) => b.clone(),
    };
    let ctx = Ctx { table, value, log: Mutex::default() };
    let store = fencekeeper_mark_store {
        ctx: (&ctx as *const Ctx).cast_mut().cast(),
        get: Some(get),
        compare_and_swap: Some(swap),
        audit: None,
        name: c"fuzzed table".as_ptr(),
    };
    let (t, tl) = token.as_ref().map_or((std::ptr::null(), 0), |(t, l)| (t.as_ptr(), *l));
    let mut o = std::mem::MaybeUninit::<fencekeeper_outcome>::uninit();
    // SAFETY: lengths past what the buffers hold are past the bounds, never read.
    let status = unsafe { fencekeeper_admit_in(g, &store, key.as_ptr(), len, t, tl, o.as_mut_ptr()) };
    assert_eq!(status, FENCEKEEPER_OK);
    // SAFETY: written whole on FENCEKEEPER_OK.
    let o = unsafe { o.assume_init_ref() };
    let (mark, reason) = texts(o);
    if !o.admitted || o.failed_open {
        return;
    }
    assert_eq!(o.class_, FENCEKEEPER_CLASS_ADMITTED, "{reason}");
    let admitted = Token::parse(&mark).expect("an admitted mark that is not a token");
    let log = ctx.log.lock().unwrap_or_else(|p| p.into_inner());
    let record_of = |bytes: &Vec<u8>| record::decode(key, bytes).ok();
    if o.advanced {
        let expected = record::encode(key, &admitted).as_bytes().to_vec();
        assert!(log.swapped.contains(&expected), "an advance the table never swapped in: {reason}");
    } else {
        assert!(
            log.returned.iter().filter_map(record_of).any(|m| m == admitted),
            "a repeated write admitted without the table's record of it: {reason}"
        );
    }
    for held in log.returned.iter().filter_map(record_of) {
        assert!(held.partial_cmp(&admitted).is_some_and(|o| o.is_le()), "admitted {admitted} below {held}");
    }
}

fuzz_target!(|script: Script| {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let run = RUN.fetch_add(1, Ordering::Relaxed);
    let g = guard(script.strict, script.efficiency);
    let policy =
        Policy { mode: if script.efficiency { Mode::Efficiency } else { Mode::Correctness }, strict: script.strict };
    let mut model: HashMap<Vec<u8>, Token> = HashMap::new();
    for call in script.calls.iter().take(64) {
        match call {
            Call::Admit(key, text) => {
                let (k, kl) = key_bytes(key, run);
                let token = text.as_ref().map(text_bytes);
                let (t, tl) = token.as_ref().map_or((std::ptr::null(), 0), |(t, l)| (t.as_ptr(), *l));
                let mut o = std::mem::MaybeUninit::<fencekeeper_outcome>::uninit();
                // SAFETY: lengths past the buffers are past the bounds, never read.
                let status = unsafe { fencekeeper_admit(g, k.as_ptr(), kl, t, tl, o.as_mut_ptr()) };
                assert_eq!(status, FENCEKEEPER_OK);
                // SAFETY: written whole on FENCEKEEPER_OK.
                let o = unsafe { o.assume_init_ref() };
                let (mark, reason) = texts(o);
                let key = std::str::from_utf8(&k).ok().filter(|_| kl == k.len());
                let text = token.as_ref().map(|(t, l)| (String::from_utf8_lossy(t).into_owned(), *l));
                let expected = match (key, &text) {
                    (Some(key), _) if fencekeeper_core::resource::check(key).is_err() => None,
                    (None, _) => None,
                    (_, Some((t, l))) if *l != t.len() || fencekeeper_core::token::check_length(t).is_err() => None,
                    (Some(key), _) => {
                        Some(decide(&policy, text.as_ref().map(|(t, _)| t.as_str()), model.get(key.as_bytes())))
                    }
                };
                let class = match &expected {
                    None => FENCEKEEPER_CLASS_MALFORMED,
                    Some(v) => class_of(refusal::resolve(policy.mode, Ok(v)).class),
                };
                assert_eq!(o.class_, class, "{reason}");
                assert!(!o.failed_open, "a memory store never fails: {reason}");
                assert_eq!(o.admitted, class == FENCEKEEPER_CLASS_ADMITTED, "{reason}");
                if let Some(v) = &expected {
                    let action = refusal::resolve(policy.mode, Ok(v));
                    assert_eq!(mark, action.token.map(|t| t.to_string()).unwrap_or_default(), "{reason}");
                    if let Some(new) = v.advance() {
                        assert!(o.advanced);
                        model.insert(k.clone(), *new);
                    }
                }
            }
            Call::AdmitIn(key, text, table) => {
                let (k, kl) = key_bytes(key, run);
                admit_in(g, &k, kl, text.as_ref().map(text_bytes), table);
            }
            Call::Mark(key) => {
                let (k, kl) = key_bytes(key, run);
                let mut buffer = [0 as c_char; FENCEKEEPER_TOKEN_CAP];
                let mut found = false;
                // SAFETY: as above; a buffer of FENCEKEEPER_TOKEN_CAP bytes.
                let status = unsafe { fencekeeper_mark(g, k.as_ptr(), kl, buffer.as_mut_ptr(), &mut found) };
                let valid = kl == k.len()
                    && std::str::from_utf8(&k).is_ok_and(|s| fencekeeper_core::resource::check(s).is_ok());
                if !valid {
                    assert_eq!(status, FENCEKEEPER_ERR_ARGUMENT);
                    continue;
                }
                assert_eq!(status, FENCEKEEPER_OK);
                // SAFETY: NUL-terminated by the library.
                let text = unsafe { CStr::from_ptr(buffer.as_ptr()) }.to_str().expect("UTF-8").to_owned();
                assert_eq!(found.then_some(text), model.get(&k).map(|t| t.to_string()));
            }
            Call::NullOutcome => {
                // SAFETY: NULL outcome is refused before anything is written.
                let status =
                    unsafe { fencekeeper_admit(g, b"k".as_ptr(), 1, std::ptr::null(), 0, std::ptr::null_mut()) };
                assert_eq!(status, FENCEKEEPER_ERR_ARGUMENT);
            }
            Call::NullWithLength(len, on_token) => {
                let len = usize::from(*len).max(1);
                let mut o = std::mem::MaybeUninit::<fencekeeper_outcome>::uninit();
                // SAFETY: a NULL pointer with a length is refused before it is read.
                let status = unsafe {
                    if *on_token {
                        fencekeeper_admit(g, b"k".as_ptr(), 1, std::ptr::null(), len, o.as_mut_ptr())
                    } else {
                        fencekeeper_admit(g, std::ptr::null(), len, b"1".as_ptr(), 1, o.as_mut_ptr())
                    }
                };
                assert_eq!(status, FENCEKEEPER_ERR_ARGUMENT);
            }
        }
    }
});
