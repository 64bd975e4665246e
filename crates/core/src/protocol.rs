//! The store's protocol, as far as fencing needs to know it: which methods read (and
//! pass unfenced), and which resources a write names. Every HTTP host (the gateway,
//! the Envoy filter, `fencekeeper envoy-config`'s routes) asks this module, so that
//! two hosts in front of one store fence the same requests.
//!
//! * [`Protocol::Http`], the default: every method but GET, HEAD and OPTIONS writes,
//!   and a write writes the resource its path names.
//! * [`Protocol::Webdav`] (RFC 4918): PROPFIND, REPORT and SEARCH read too, so a WebDAV
//!   client's listings need no token. Every other method is fenced: PUT, DELETE,
//!   MKCOL, PROPPATCH, LOCK and UNLOCK write their path; COPY writes its
//!   `Destination`; MOVE writes both its path and its `Destination`. A method this
//!   list does not know is fenced, as a write of its path.
//! * [`Protocol::S3`] (path-style, `/BUCKET/KEY`): GET, HEAD and OPTIONS read (the
//!   object and list calls); every other method writes its path: PutObject,
//!   CopyObject (its source is read), DeleteObject, each multipart step, and the
//!   bucket's own PUT and DELETE. A POST to a bucket names its keys in the body
//!   (DeleteObjects, a browser form's PostObject), so it is refused
//!   ([`Protocol::refusal`]). The token may also come as object metadata
//!   ([`METADATA_PREFIX`] + the token header's name), which the aws CLI and the SDKs
//!   can send, and which the store then keeps with the object.
//!
//! A configured list of fenced methods overrides the protocol's reads, but not which
//! resources a write names.

use crate::resource::ResourceError;

/// The store's protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// Plain HTTP: GET, HEAD and OPTIONS read; every other method writes its path.
    #[default]
    Http,
    /// WebDAV: HTTP's reads plus PROPFIND, REPORT and SEARCH; COPY and MOVE write
    /// their `Destination`.
    Webdav,
    /// S3: HTTP's reads; a POST to a bucket is refused; the token may come as object
    /// metadata.
    S3,
}

/// The prefix of S3's user metadata headers: with [`Protocol::S3`] the token may come
/// in `x-amz-meta-` + the token header's name (`x-amz-meta-fencing-token`, sent by
/// `aws s3 cp --metadata fencing-token=34`).
pub const METADATA_PREFIX: &str = "x-amz-meta-";

/// The resources a fenced request writes, named by where the host finds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writes {
    /// The resource of the request itself (its path, or its resource header).
    Target,
    /// Only the resource the `Destination` header names (WebDAV's COPY: the source
    /// is read).
    Destination,
    /// Both (WebDAV's MOVE: the source is deleted, the destination written).
    TargetAndDestination,
}

impl Writes {
    /// Whether the write names the `Destination` header's resource.
    pub fn destination(self) -> bool {
        !matches!(self, Writes::Target)
    }

    /// Whether the write names the request's own resource.
    pub fn target(self) -> bool {
        !matches!(self, Writes::Destination)
    }
}

/// The WebDAV request header naming the resource COPY and MOVE write.
pub const DESTINATION_HEADER: &str = "destination";

const HTTP_READS: [&str; 3] = ["GET", "HEAD", "OPTIONS"];
const WEBDAV_READS: [&str; 6] = ["GET", "HEAD", "OPTIONS", "PROPFIND", "REPORT", "SEARCH"];

impl Protocol {
    /// Every protocol, in the order the docs list them.
    pub const ALL: [Protocol; 3] = [Protocol::Http, Protocol::Webdav, Protocol::S3];

    /// The protocol of a name (`http`, `webdav`), as configurations spell it.
    pub fn parse(name: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// Its name in configurations, logs and docs.
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Webdav => "webdav",
            Protocol::S3 => "s3",
        }
    }

    /// The methods that read, and so pass unfenced unless a list of fenced methods
    /// is configured.
    pub fn reads(self) -> &'static [&'static str] {
        match self {
            Protocol::Http | Protocol::S3 => &HTTP_READS,
            Protocol::Webdav => &WEBDAV_READS,
        }
    }

    /// Whether a request with `method` is fenced, given the configured list of fenced
    /// methods (`None`: every method but [`Protocol::reads`]). Methods compare
    /// without regard to case.
    pub fn fences<S: AsRef<str>>(self, method: &str, fenced: Option<&[S]>) -> bool {
        match fenced {
            Some(list) => list.iter().any(|m| m.as_ref().eq_ignore_ascii_case(method)),
            None => !self.reads().iter().any(|m| m.eq_ignore_ascii_case(method)),
        }
    }

    /// The resources a fenced request with `method` writes.
    pub fn writes(self, method: &str) -> Writes {
        match self {
            Protocol::Webdav if method.eq_ignore_ascii_case("COPY") => Writes::Destination,
            Protocol::Webdav if method.eq_ignore_ascii_case("MOVE") => Writes::TargetAndDestination,
            Protocol::Http | Protocol::Webdav | Protocol::S3 => Writes::Target,
        }
    }

    /// Why a fenced request with `method` to `decoded_path` cannot be fenced, so is
    /// refused as malformed: S3's POST to a bucket (`/BUCKET`, DeleteObjects'
    /// `?delete`, PostObject's form) names the keys it writes in its body. Judged by
    /// the path, not the query: a store decodes the query's names (`?%64elete`), and
    /// any POST to a bucket names its keys in the body.
    pub fn refusal(self, method: &str, decoded_path: &[u8]) -> Option<ResourceError> {
        let post_to_bucket = method.eq_ignore_ascii_case("POST") && names_a_bucket(decoded_path);
        (self == Protocol::S3 && post_to_bucket).then_some(ResourceError::KeysInBody)
    }

    /// Whether the token may also come as object metadata ([`METADATA_PREFIX`] + the
    /// token header's name).
    pub fn token_in_metadata(self) -> bool {
        self == Protocol::S3
    }
}

/// `/`, `/BUCKET` or `/BUCKET/`: a path that names no key.
fn names_a_bucket(decoded_path: &[u8]) -> bool {
    let inner = decoded_path.strip_prefix(b"/").unwrap_or(decoded_path);
    let inner = inner.strip_suffix(b"/").unwrap_or(inner);
    !inner.contains(&b'/')
}

/// The token of a request that may send it twice (S3: the token header, and the
/// object metadata header): the one sent, or the one both carry. Two different
/// values are refused: which one the lock gave is unknown, and the store would keep
/// the metadata one with the object.
pub fn one_token<'a>(header: Option<&'a [u8]>, metadata: Option<&'a [u8]>) -> Result<Option<&'a [u8]>, ResourceError> {
    match (header, metadata) {
        (Some(h), Some(m)) if h.trim_ascii() != m.trim_ascii() => Err(ResourceError::TwoTokens),
        (h, m) => Ok(h.or(m)),
    }
}

/// The path a `Destination` header value names (RFC 4918 section 10.3: an absolute
/// URI, or an absolute path), still percent-encoded, query included: the host decodes
/// it as it decodes a request path, so both name a resource by one rule. `None`: not
/// a URI or absolute path, which the host refuses as malformed. The authority is not
/// checked: a store refuses a destination on another server itself, and the path is
/// fenced either way.
pub fn destination_path(value: &[u8]) -> Option<&[u8]> {
    if value.first() == Some(&b'/') {
        return Some(value);
    }
    let colon = value.iter().position(|&b| b == b':')?;
    let (scheme, rest) = value.split_at(colon);
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    let after_authority = rest.strip_prefix(b"://").filter(|_| scheme_ok)?;
    // The authority ends at the path, the query or the fragment; an empty path is "/".
    match after_authority.iter().position(|&b| matches!(b, b'/' | b'?' | b'#')) {
        Some(i) if after_authority[i] == b'/' => Some(&after_authority[i..]),
        _ => Some(b"/"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_fences_every_method_that_writes() {
        let none: Option<&[&str]> = None;
        for m in ["PUT", "POST", "DELETE", "PATCH", "MKCOL", "LOCK", "PROPFIND", "put"] {
            assert!(Protocol::Http.fences(m, none), "{m}");
        }
        for m in ["GET", "HEAD", "OPTIONS", "get"] {
            assert!(!Protocol::Http.fences(m, none), "{m}");
        }
        let list = Some(&["PUT"][..]);
        assert!(Protocol::Http.fences("put", list) && !Protocol::Http.fences("DELETE", list));
        assert_eq!(Protocol::Http.writes("MOVE"), Writes::Target, "plain HTTP knows no Destination");
    }

    #[test]
    fn webdav_reads_pass_and_every_other_method_is_fenced() {
        let none: Option<&[&str]> = None;
        for m in ["GET", "HEAD", "OPTIONS", "PROPFIND", "REPORT", "SEARCH", "propfind"] {
            assert!(!Protocol::Webdav.fences(m, none), "{m}");
        }
        for m in ["PUT", "DELETE", "MKCOL", "COPY", "MOVE", "PROPPATCH", "LOCK", "UNLOCK", "POST", "BIND"] {
            assert!(Protocol::Webdav.fences(m, none), "{m}");
        }
        assert!(Protocol::Webdav.fences("PROPFIND", Some(&["PROPFIND"][..])), "a list overrides the reads");
    }

    #[test]
    fn webdav_copy_writes_its_destination_and_move_both() {
        assert_eq!(Protocol::Webdav.writes("copy"), Writes::Destination);
        assert_eq!(Protocol::Webdav.writes("MOVE"), Writes::TargetAndDestination);
        assert_eq!(Protocol::Webdav.writes("PUT"), Writes::Target);
        assert!(!Writes::Destination.target() && Writes::Destination.destination());
        assert!(Writes::TargetAndDestination.target() && Writes::TargetAndDestination.destination());
    }

    #[test]
    fn s3_fences_writes_and_refuses_a_post_to_a_bucket() {
        let none: Option<&[&str]> = None;
        for m in ["PUT", "POST", "DELETE"] {
            assert!(Protocol::S3.fences(m, none), "{m}");
        }
        for m in ["GET", "HEAD", "OPTIONS"] {
            assert!(!Protocol::S3.fences(m, none), "{m}");
        }
        assert_eq!(Protocol::S3.writes("PUT"), Writes::Target, "CopyObject writes its own path");
        for bucket in [&b"/bkt"[..], b"/bkt/", b"/", b""] {
            assert_eq!(Protocol::S3.refusal("post", bucket), Some(ResourceError::KeysInBody), "{bucket:?}");
        }
        assert_eq!(Protocol::S3.refusal("POST", b"/bkt/k"), None, "a multipart step names its key");
        assert_eq!(Protocol::S3.refusal("DELETE", b"/bkt"), None);
        assert_eq!(Protocol::Http.refusal("POST", b"/bkt"), None);
        assert!(Protocol::S3.token_in_metadata() && !Protocol::Http.token_in_metadata());
    }

    #[test]
    fn a_token_sent_twice_must_agree() {
        assert_eq!(one_token(Some(b"34"), None), Ok(Some(&b"34"[..])));
        assert_eq!(one_token(None, Some(b"34")), Ok(Some(&b"34"[..])));
        assert_eq!(one_token(Some(b"34"), Some(b" 34")), Ok(Some(&b"34"[..])));
        assert_eq!(one_token(None, None), Ok(None));
        assert_eq!(one_token(Some(b"35"), Some(b"34")), Err(ResourceError::TwoTokens));
    }

    #[test]
    fn names_parse_back() {
        for p in Protocol::ALL {
            assert_eq!(Protocol::parse(p.name()), Some(p));
        }
        assert_eq!(Protocol::parse("WebDAV"), Some(Protocol::Webdav));
        assert_eq!(Protocol::parse("S3"), Some(Protocol::S3));
        assert_eq!(Protocol::parse("s4"), None);
    }

    #[test]
    fn destinations_are_absolute_uris_or_paths() {
        fn d(v: &str) -> Option<&str> {
            destination_path(v.as_bytes()).map(|p| core::str::from_utf8(p).unwrap_or("?"))
        }
        assert_eq!(d("http://store:8080/data/b%20c"), Some("/data/b%20c"));
        assert_eq!(d("https://store/x?y=1"), Some("/x?y=1"));
        assert_eq!(d("http://store"), Some("/"));
        assert_eq!(d("http://store?q"), Some("/"));
        assert_eq!(d("/data/b"), Some("/data/b"));
        for bad in ["", "data/b", "store:8080/data", "1http://x/y", "http:/x/y", "ht tp://x/y"] {
            assert_eq!(d(bad), None, "{bad:?}");
        }
    }
}
