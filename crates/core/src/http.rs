//! The HTTP vocabulary every HTTP host shares (the gateway, the Envoy filter): where
//! a request's resource key comes from, and how a refusal is rendered (which
//! requests are fenced is the store's [`crate::protocol`]). A host only moves bytes
//! between its HTTP library and these functions, so that two hosts cannot answer the
//! same request differently.

use crate::refusal::{Action, Class};
use crate::resource::{key_from_bytes, path_key_bytes, ResourceError};
use crate::token::Token;
use core::fmt;

/// The request header that carries the fencing token, by default.
pub const TOKEN_HEADER: &str = "fencing-token";
/// The response header that carries the current mark on a stale or replayed refusal.
pub const HIGHEST_HEADER: &str = "fencing-highest";
/// The header added to a forwarded request: the token that was admitted. Only the
/// host sets it; a value a client sent is removed.
pub const ADMITTED_HEADER: &str = "fencing-admitted-token";

/// True for a gRPC request, by its `content-type` (`application/grpc`, `+proto`, ...).
pub fn is_grpc(content_type: &[u8]) -> bool {
    content_type.starts_with(b"application/grpc")
}

/// Where a request's resource key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceFrom<S> {
    /// The request path as the store sees it: without its query, percent-decoded
    /// ([`path_key_bytes`]), minus `strip_prefix` when it starts with it.
    Path {
        /// Cut from the front of the decoded path to form the key.
        strip_prefix: S,
    },
    /// The value of this request header (a lower-case name).
    Header(S),
}

impl<S: AsRef<str>> ResourceFrom<S> {
    /// The key of a request whose decoded path is `decoded_path` (see
    /// [`decoded_path`]) and whose configured header, when the key comes from one,
    /// holds `header` (`None`: absent, which is the empty key, refused as malformed).
    /// Bytes that are not UTF-8 are malformed: never converted lossily, which would
    /// give distinct paths one mark.
    pub fn key<'a>(&self, decoded_path: &'a [u8], header: Option<&'a [u8]>) -> Result<&'a str, ResourceError> {
        let bytes = match self {
            ResourceFrom::Path { strip_prefix } => {
                decoded_path.strip_prefix(strip_prefix.as_ref().as_bytes()).unwrap_or(decoded_path)
            }
            ResourceFrom::Header(_) => header.unwrap_or_default(),
        };
        key_from_bytes(bytes)
    }

    /// The header the key comes from, if it comes from one.
    pub fn header(&self) -> Option<&str> {
        match self {
            ResourceFrom::Header(name) => Some(name.as_ref()),
            ResourceFrom::Path { .. } => None,
        }
    }
}

/// The decoded bytes of a request path, as the store will see it once a host has
/// resolved its dot segments and repeated slashes with
/// [`crate::resource::normalize_path`]: every path-based decision (the fenced prefix
/// and the key) is made on these, so that a re-encoded path can neither dodge its
/// mark nor slip out of scope. An iterator, so a host collects it into its own
/// buffer.
pub fn decoded_path(path: &[u8]) -> impl Iterator<Item = u8> + '_ {
    path_key_bytes(path)
}

/// How many bytes [`resolve_path`] may write for `target` (and an S3 bucket named in
/// the host name): decoding only shortens a path, and resolving it adds at most a `/`.
pub fn resolved_capacity(target: &[u8], bucket: Option<&[u8]>) -> usize {
    bucket.map_or(0, |b| 1 + b.len()) + target.len() + 1
}

/// The path a request writes, as the store sees it, the one way every host derives
/// it: `/BUCKET` first for an S3 request that named its bucket in the host name
/// ([`crate::s3::addressing`]; lower case, as a host name is read), then the target
/// without its query, percent-decoded ([`decoded_path`]), with its dot segments and
/// repeated slashes resolved ([`crate::resource::normalize_path`]). Written into
/// `buf`, which the host sizes with [`resolved_capacity`]; returns the length. A
/// shorter buffer gives 0, an empty path: a host bug, and an empty key is refused.
pub fn resolve_path(target: &[u8], bucket: Option<&[u8]>, buf: &mut [u8]) -> usize {
    let bucket = bucket.map(|b| core::iter::once(b'/').chain(b.iter().map(u8::to_ascii_lowercase)));
    let mut len = 0;
    for byte in bucket.into_iter().flatten().chain(decoded_path(target)) {
        match buf.get_mut(len) {
            Some(slot) => *slot = byte,
            None => return 0,
        }
        len += 1;
    }
    match buf.get_mut(..len) {
        Some(path) => crate::resource::normalize_path(path),
        None => 0,
    }
}

/// A refusal as HTTP and gRPC see it, built from the core's resolved [`Action`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The outcome class.
    pub class: Class,
    /// The HTTP status (409, 428, 400, 403, 503).
    pub http_status: u16,
    /// The gRPC status (9 FAILED_PRECONDITION, 3 INVALID_ARGUMENT, 7 PERMISSION_DENIED,
    /// 14 UNAVAILABLE).
    pub grpc_status: u32,
    /// The value of [`HIGHEST_HEADER`]: the mark, on a stale or replayed refusal.
    pub highest: Option<Token>,
}

impl Refusal {
    /// The refusal of `action`, or `None` when the action forwards the request.
    pub fn of(action: &Action) -> Option<Refusal> {
        if action.forward {
            return None;
        }
        let highest = action.token.filter(|_| matches!(action.class, Class::Stale | Class::Replayed));
        Some(Refusal {
            class: action.class,
            http_status: action.class.http_status(),
            grpc_status: action.class.grpc_status(),
            highest,
        })
    }
}

/// gRPC's `grpc-message`: the reason percent-encoded outside printable ASCII (and
/// `%` itself), so it is always a legal header value. A `Display` adapter, so a host
/// writes it without the core allocating.
pub struct GrpcMessage<'a>(pub &'a str);

impl fmt::Display for GrpcMessage<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in self.0.bytes() {
            if (0x20..0x7f).contains(&byte) && byte != b'%' {
                fmt::Write::write_char(f, char::from(byte))?;
            } else {
                write!(f, "%{byte:02X}")?;
            }
        }
        Ok(())
    }
}

/// A refusal's body for an S3 client: S3's error document. The aws CLI and the SDKs
/// show its `Code` and `Message` ("An error occurred (FencingTokenStale) when calling
/// the PutObject operation: stale fencing token ..."), and of a plain-text body only
/// the status text. A `Display` adapter, so a host writes it without the core
/// allocating.
pub struct S3Error<'a> {
    /// The refusal's class, which names the `Code`.
    pub class: Class,
    /// The one-line reason, the `Message` (XML-escaped here).
    pub reason: &'a str,
}

/// The content type of an [`S3Error`].
pub const S3_ERROR_CONTENT_TYPE: &str = "application/xml";

impl S3Error<'_> {
    /// The error code S3 clients show.
    pub fn code(&self) -> &'static str {
        match self.class {
            Class::Stale => "FencingTokenStale",
            Class::Replayed => "FencingTokenReplayed",
            Class::Malformed => "FencingRequestMalformed",
            Class::Missing => "FencingTokenMissing",
            Class::Unverified => "FencingTokenUnverified",
            Class::Undecided | Class::Admitted => "FencingUnavailable",
        }
    }
}

impl fmt::Display for S3Error<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        S3ErrorDocument { code: self.code(), reason: self.reason }.fmt(f)
    }
}

/// S3's XML error document with any `Code`: [`S3Error`]'s, or a host's own for an
/// answer that is not a fencing refusal (a conditional write's version conflict).
pub struct S3ErrorDocument<'a> {
    /// The `Code`.
    pub code: &'a str,
    /// The one-line reason, the `Message` (XML-escaped here).
    pub reason: &'a str,
}

impl fmt::Display for S3ErrorDocument<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{}</Code><Message>", self.code)?;
        for c in self.reason.chars() {
            match c {
                '<' => f.write_str("&lt;")?,
                '>' => f.write_str("&gt;")?,
                '&' => f.write_str("&amp;")?,
                '"' => f.write_str("&quot;")?,
                '\'' => f.write_str("&apos;")?,
                // XML 1.0 forbids most control characters, even escaped.
                c if c.is_control() => f.write_str(" ")?,
                c => fmt::Write::write_char(f, c)?,
            }
        }
        f.write_str("</Message></Error>\n")
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::decision::{Mode, Verdict};
    use crate::refusal::{resolve, NoVerdict};
    use std::vec::Vec;

    fn decoded(p: &str) -> Vec<u8> {
        decoded_path(p.as_bytes()).collect()
    }

    fn resolved(target: &str, bucket: Option<&str>) -> Vec<u8> {
        let (target, bucket) = (target.as_bytes(), bucket.map(str::as_bytes));
        let mut buf = std::vec![0; resolved_capacity(target, bucket)];
        let len = resolve_path(target, bucket, &mut buf);
        buf.truncate(len);
        buf
    }

    #[test]
    fn paths_resolve_as_the_store_sees_them_with_a_bucket_from_the_host_in_front() {
        assert_eq!(resolved("/d/x/%2e%2e//f?q=1", None), b"/d/f");
        assert_eq!(resolved("/q3%2Ecsv", Some("Reports")), b"/reports/q3.csv");
        assert_eq!(resolved("/../k", Some("b")), b"/k", "never above the root");
        assert_eq!(resolved("/a/..", None), b"/", "a trailing .. keeps its slash");
        assert_eq!(resolved("", None), b"");
        let mut short = [0u8; 3];
        assert_eq!(resolve_path(b"/abcd", None, &mut short), 0, "a buffer too short gives an empty path");
    }

    #[test]
    fn keys_from_paths_are_decoded_stripped_and_utf8() {
        let path = ResourceFrom::Path { strip_prefix: "/data/" };
        assert_eq!(path.key(&decoded("/data/a%62c?x=1"), None), Ok("abc"));
        assert_eq!(path.key(&decoded("/other/abc"), None), Ok("/other/abc"));
        assert_eq!(path.key(&decoded("/data/%FF%FE"), None), Err(ResourceError::NotUtf8));
        assert_ne!(decoded("/%FF%FE"), decoded("/%FE%FF"));
    }

    #[test]
    fn keys_from_headers_must_be_utf8_and_present() {
        let header = ResourceFrom::Header("x-resource");
        assert_eq!(header.header(), Some("x-resource"));
        assert_eq!(header.key(b"/ignored", Some(b"table-7")), Ok("table-7"));
        assert_eq!(header.key(b"/ignored", None), Ok(""), "absent is the empty key: malformed later");
        assert_eq!(header.key(b"/ignored", Some(&[0xff])), Err(ResourceError::NotUtf8));
    }

    #[test]
    fn refusals_carry_the_mark_only_when_stale_or_replayed() {
        let mark = Token::parse("34").unwrap();
        let stale: Verdict = Verdict::Stale { mark, presented: Token::parse("33").unwrap() };
        let r = Refusal::of(&resolve(Mode::Correctness, Ok(&stale))).unwrap();
        assert_eq!((r.http_status, r.grpc_status, r.highest), (409, 9, Some(mark)));
        let admit: Verdict = Verdict::Admit { mark, advanced: true };
        assert_eq!(Refusal::of(&resolve(Mode::Correctness, Ok(&admit))), None);
        let down = Refusal::of(&resolve::<()>(Mode::Correctness, Err(NoVerdict::StoreUnreachable))).unwrap();
        assert_eq!((down.http_status, down.grpc_status, down.highest), (503, 14, None));
        let forged = Refusal::of(&resolve::<()>(Mode::Efficiency, Err(NoVerdict::Unverified))).unwrap();
        assert_eq!(
            (forged.class, forged.http_status, forged.grpc_status, forged.highest),
            (Class::Unverified, 403, 7, None)
        );
    }

    #[test]
    fn s3_errors_are_escaped_xml_with_a_code_per_class() {
        let text = std::format!("{}", S3Error { class: Class::Stale, reason: "stale \"/b/k\" <34> & 'x'\n" });
        assert_eq!(
            text,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>FencingTokenStale</Code>\
             <Message>stale &quot;/b/k&quot; &lt;34&gt; &amp; &apos;x&apos; </Message></Error>\n"
        );
        assert_eq!(S3Error { class: Class::Missing, reason: "" }.code(), "FencingTokenMissing");
    }

    #[test]
    fn grpc_messages_are_printable_ascii() {
        let text = std::format!("{}", GrpcMessage("stale \"x\" 100% ü\n"));
        assert_eq!(text, "stale \"x\" 100%25 %C3%BC%0A");
        assert!(is_grpc(b"application/grpc+proto") && !is_grpc(b"text/plain"));
    }
}
