//! Target 3: path-key derivation, byte-exact.
//!
//! The input is a request path, then (after a NUL byte, if any) the rest of the
//! case: where to clone the iterator, a key and how to write it, a strip prefix.
//!
//! * The key of any path is the reference decoding's, byte for byte (query and
//!   fragment cut, `%XX` with two hex digits decoded, every other byte kept), and a
//!   clone of the iterator taken anywhere goes on with the same bytes.
//! * A key is a key only when its bytes are UTF-8, and then it is exactly those
//!   bytes: never a lossy replacement that would merge two paths.
//! * Any key, percent-encoded in any mix of literal bytes and upper- or lower-case
//!   escapes, decodes back to itself: the encodings of one key share one key (that
//!   is the semantics), and distinct keys never share one.
//! * A decoded path resolves its dot segments and repeated slashes as the reference
//!   stack of segments does, in place, and once resolved it stays so.
//! * Every HTTP host derives the same keys through the core's `http::ResourceFrom`
//!   (its `strip_prefix` taken off when present; from a header, the value's bytes
//!   when UTF-8).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fencekeeper_core::http::{decoded_path, resolve_path, resolved_capacity, ResourceFrom};
use fencekeeper_core::resource::{key_from_bytes, normalize_path, path_key_bytes, ResourceError};
use fencekeeper_fuzz::model;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Rest {
    /// Where to clone the iterator.
    fork: u16,
    /// A key, and how to write each of its bytes.
    key: Vec<(u8, Style)>,
    strip_prefix: String,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Style {
    Literal,
    Upper,
    Lower,
}

fn encode(key: &[(u8, Style)]) -> Vec<u8> {
    let mut path = Vec::new();
    for &(byte, style) in key {
        // `%`, `?` and `#` have a meaning in a path: they are always escaped.
        let style =
            if matches!(byte, b'%' | b'?' | b'#') && matches!(style, Style::Literal) { Style::Upper } else { style };
        match style {
            Style::Literal => path.push(byte),
            Style::Upper => path.extend(format!("%{byte:02X}").bytes()),
            Style::Lower => path.extend(format!("%{byte:02x}").bytes()),
        }
    }
    path
}

fn check_key(path: &[u8]) -> Vec<u8> {
    let key: Vec<u8> = path_key_bytes(path).collect();
    assert_eq!(key, model::path_key(path), "{:?}", String::from_utf8_lossy(path));
    match std::str::from_utf8(&key) {
        Ok(text) => assert_eq!(key_from_bytes(&key), Ok(text)),
        Err(_) => assert_eq!(key_from_bytes(&key), Err(ResourceError::NotUtf8)),
    }
    key
}

fuzz_target!(|data: &[u8]| {
    let (path, rest) = data.split_at(data.iter().position(|&b| b == 0).unwrap_or(data.len()));
    let Ok(input) = Rest::arbitrary_take_rest(Unstructured::new(rest.get(1..).unwrap_or_default())) else { return };
    let key = check_key(path);

    let mut iter = path_key_bytes(path);
    let fork = usize::from(input.fork) % (key.len() + 1);
    let head: Vec<u8> = iter.by_ref().take(fork).collect();
    let tail: Vec<u8> = iter.clone().collect();
    assert_eq!([head, tail].concat(), key);
    assert_eq!(iter.collect::<Vec<u8>>(), key[fork..]);

    let bytes: Vec<u8> = input.key.iter().map(|&(b, _)| b).collect();
    let encoded = encode(&input.key);
    assert_eq!(check_key(&encoded), bytes, "{:?}", String::from_utf8_lossy(&encoded));

    let mut resolved = key.clone();
    let len = normalize_path(&mut resolved);
    assert_eq!(resolved[..len], model::normalized_path(&key)[..], "{:?}", String::from_utf8_lossy(&key));
    let mut again = resolved[..len].to_vec();
    assert_eq!(normalize_path(&mut again), len);

    // The hosts' one call: the same resolution; with a bucket from the host name, the
    // same as the path-style path `/bucket` + path (the bucket in lower case).
    let mut buf = vec![0; resolved_capacity(path, None)];
    let n = resolve_path(path, None, &mut buf);
    assert_eq!(buf[..n], resolved[..len]);
    let bucket = b"Bkt-1";
    let mut buf = vec![0; resolved_capacity(path, Some(bucket))];
    let n = resolve_path(path, Some(bucket), &mut buf);
    let path_style = [&b"/bkt-1"[..], path].concat();
    let mut want = vec![0; resolved_capacity(&path_style, None)];
    let m = resolve_path(&path_style, None, &mut want);
    assert_eq!(buf[..n], want[..m]);

    let decoded: Vec<u8> = decoded_path(path).collect();
    let from = ResourceFrom::Path { strip_prefix: input.strip_prefix.as_str() };
    let stripped = key.strip_prefix(input.strip_prefix.as_bytes()).unwrap_or(&key);
    let want = std::str::from_utf8(stripped).map_err(|_| ResourceError::NotUtf8);
    assert_eq!(from.key(&decoded, None), want);
    let from = ResourceFrom::Header("fencing-resource");
    let want = std::str::from_utf8(path).map_err(|_| ResourceError::NotUtf8);
    assert_eq!(from.key(b"/", Some(path)), want);
});
