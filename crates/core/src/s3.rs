//! S3 addressing: which bucket a request names, so that the two ways S3 clients name
//! one object share one mark.
//!
//! S3 names an object in two ways. *Path-style*: `PUT /reports/q3.csv` to the
//! endpoint. *Virtual-hosted-style*: `PUT /q3.csv` with `Host: reports.DOMAIN`, where
//! DOMAIN is the store's S3 domain (AWS's `s3.amazonaws.com`, MinIO's `MINIO_DOMAIN`).
//! A store that serves both would see one object where a fence keyed on the path alone
//! sees two resources, `/reports/q3.csv` and `/q3.csv`: a stale holder could then
//! dodge the new holder's mark by switching style. So with the s3 protocol every host
//! keys a write on the path-style path, `/BUCKET` + the request path, and finds the
//! bucket with [`addressing`].
//!
//! The fence cannot tell a bucket in a host name from a plain host name (`store.lan`)
//! unless it knows the domain. So a domain name that is neither the configured domain
//! nor `BUCKET.` + it is refused as malformed ([`ResourceError::S3Host`]), never
//! guessed at: a guess one way merges buckets, the other way opens the dodge above.
//! IP addresses and single-label names (`localhost`) never carry a bucket.

use crate::resource::ResourceError;

/// S3's longest bucket name.
pub const MAX_BUCKET_BYTES: usize = 63;

/// Where an S3 request names its bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Addressing<'a> {
    /// In the path: `/BUCKET/KEY`. The path is the path-style path already.
    PathStyle,
    /// In the host name, `BUCKET.DOMAIN`: the bucket as sent (host names are not case
    /// sensitive, so [`crate::http::resolve_path`] lower-cases it into the key).
    VirtualHosted(&'a [u8]),
}

/// How a request with this `Host` (or `:authority`; `None`: absent) names its bucket,
/// given the store's S3 domain (`None`: no virtual-hosted-style requests are expected;
/// lower case, no port, checked by [`check_domain`]).
pub fn addressing<'a>(host: Option<&'a [u8]>, domain: Option<&str>) -> Result<Addressing<'a>, ResourceError> {
    let Some(host) = host else { return Ok(Addressing::PathStyle) };
    let name = without_port(host.trim_ascii());
    let is_ip =
        name.first() == Some(&b'[') || (!name.is_empty() && name.iter().all(|b| b.is_ascii_digit() || *b == b'.'));
    if is_ip || !name.contains(&b'.') {
        return Ok(Addressing::PathStyle);
    }
    let Some(domain) = domain.map(str::as_bytes) else { return Err(ResourceError::S3Host) };
    if name.eq_ignore_ascii_case(domain) {
        return Ok(Addressing::PathStyle);
    }
    let bucket = name
        .len()
        .checked_sub(domain.len() + 1)
        .filter(|&cut| name[cut] == b'.' && name[cut + 1..].eq_ignore_ascii_case(domain))
        .map(|cut| &name[..cut])
        .ok_or(ResourceError::S3Host)?;
    // S3's rule for a bucket name: letters, digits, '.' and '-', starting and ending
    // with a letter or digit (so never `.` or `..`, which would resolve away).
    let valid = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-');
    let ends = |b: Option<&u8>| b.is_some_and(u8::is_ascii_alphanumeric);
    match bucket.len() {
        1..=MAX_BUCKET_BYTES if bucket.iter().all(valid) && ends(bucket.first()) && ends(bucket.last()) => {
            Ok(Addressing::VirtualHosted(bucket))
        }
        _ => Err(ResourceError::S3Host),
    }
}

/// The `uploadId` query parameter of a request target, still percent-encoded: the
/// multipart upload an UploadPart, CompleteMultipartUpload or AbortMultipartUpload
/// belongs to. `None` without one (or with an empty one).
pub fn upload_id(target: &[u8]) -> Option<&[u8]> {
    query_params(target).find(|(name, _)| *name == b"uploadId").map(|(_, value)| value).filter(|v| !v.is_empty())
}

/// What a request is to a multipart upload, by its method and target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Multipart<'a> {
    /// Not a multipart step.
    None,
    /// CreateMultipartUpload (`POST ?uploads`): its answer names the upload.
    Create,
    /// A step within the upload named by this `uploadId` (still percent-encoded):
    /// UploadPart, UploadPartCopy (PUT), ListParts (GET).
    Within(&'a [u8]),
    /// CompleteMultipartUpload (POST) or AbortMultipartUpload (DELETE) of the upload:
    /// once it succeeds, the upload is over.
    Ends(&'a [u8]),
}

/// The multipart step of a request with `method` to `target` (path and query).
pub fn multipart<'a>(method: &str, target: &'a [u8]) -> Multipart<'a> {
    let post = method.eq_ignore_ascii_case("POST");
    match upload_id(target) {
        Some(id) if post || method.eq_ignore_ascii_case("DELETE") => Multipart::Ends(id),
        Some(id) => Multipart::Within(id),
        None if post && query_params(target).any(|(name, _)| name == b"uploads") => Multipart::Create,
        None => Multipart::None,
    }
}

/// The `UploadId` a CreateMultipartUpload answer (S3's XML) names: the element's text,
/// when it holds only characters an upload id has in practice (letters, digits and
/// `-_.~+/=`, which need no XML escape). `None` otherwise: a host then remembers
/// nothing, and the upload's later steps need their own token.
pub fn upload_id_in_answer(xml: &[u8]) -> Option<&[u8]> {
    const OPEN: &[u8] = b"<UploadId>";
    let start = xml.windows(OPEN.len()).position(|w| w == OPEN)? + OPEN.len();
    let len = xml.get(start..)?.iter().position(|&b| b == b'<')?;
    let id = xml.get(start..start + len)?;
    let plain = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'+' | b'/' | b'=');
    (!id.is_empty() && id.iter().all(plain)).then_some(id)
}

/// A query's `name=value` pairs (a name without `=` has an empty value), undecoded.
fn query_params(target: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
    let query = target.iter().position(|&b| b == b'?').map_or(&b""[..], |i| &target[i + 1..]);
    let query = query.split(|&b| b == b'#').next().unwrap_or_default();
    query.split(|&b| b == b'&').filter(|p| !p.is_empty()).map(|pair| {
        let eq = pair.iter().position(|&b| b == b'=').unwrap_or(pair.len());
        (&pair[..eq], pair.get(eq + 1..).unwrap_or_default())
    })
}

/// Whether `domain` can be a store's S3 domain: a lower-case DNS name with at least
/// one dot (a single label is taken for a plain host), no port, no leading or
/// trailing dot.
pub fn check_domain(domain: &str) -> Result<(), &'static str> {
    let bytes = domain.as_bytes();
    let label_chars = bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'-'));
    if !label_chars {
        return Err("an S3 domain is a lower-case DNS name (letters, digits, '-' and '.'), with no port");
    }
    if !domain.contains('.') || domain.split('.').any(str::is_empty) {
        return Err("an S3 domain has at least two labels and no empty one (s3.example.com)");
    }
    Ok(())
}

/// `host:port` -> `host`; an IPv6 literal keeps its brackets.
fn without_port(host: &[u8]) -> &[u8] {
    let end = match host.first() {
        Some(b'[') => host.iter().position(|&b| b == b']').map_or(host.len(), |i| i + 1),
        _ => host.iter().position(|&b| b == b':').unwrap_or(host.len()),
    };
    &host[..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::format;

    const D: Option<&str> = Some("s3.test");

    fn of<'a>(host: &'a str, domain: Option<&str>) -> Result<Addressing<'a>, ResourceError> {
        addressing(Some(host.as_bytes()), domain)
    }

    #[test]
    fn addresses_and_single_labels_are_path_style() {
        for host in ["127.0.0.1:9000", "127.0.0.1", "[::1]:9000", "[::1]", "localhost:9000", "minio", ""] {
            assert_eq!(of(host, None), Ok(Addressing::PathStyle), "{host}");
            assert_eq!(of(host, D), Ok(Addressing::PathStyle), "{host}");
        }
        assert_eq!(addressing(None, D), Ok(Addressing::PathStyle), "no Host: nothing to name a bucket");
    }

    #[test]
    fn the_domain_itself_is_path_style_and_a_name_under_it_is_a_bucket() {
        assert_eq!(of("s3.test:8080", D), Ok(Addressing::PathStyle));
        assert_eq!(of("S3.Test", D), Ok(Addressing::PathStyle));
        assert_eq!(of("reports.s3.test:8080", D), Ok(Addressing::VirtualHosted(b"reports")));
        assert_eq!(of("Reports.S3.TEST", D), Ok(Addressing::VirtualHosted(b"Reports")));
        assert_eq!(of("my.reports.s3.test", D), Ok(Addressing::VirtualHosted(b"my.reports")), "dots in a bucket");
    }

    #[test]
    fn a_domain_name_the_fence_cannot_place_is_refused() {
        for host in ["store.lan", "reports.s3.test", "xs3.test", "reports.s3.test.evil", "a_b.s3.test", "...s3.test"] {
            let domain = if host == "store.lan" || host == "reports.s3.test" { None } else { D };
            assert_eq!(of(host, domain), Err(ResourceError::S3Host), "{host} with {domain:?}");
        }
        let long = format!("{}.s3.test", "b".repeat(MAX_BUCKET_BYTES + 1));
        assert_eq!(of(&long, D), Err(ResourceError::S3Host));
    }

    #[test]
    fn multipart_uploads_are_named_in_the_query_and_the_create_answer() {
        assert_eq!(upload_id(b"/b/k?partNumber=2&uploadId=Zm9v%2Bb"), Some(&b"Zm9v%2Bb"[..]));
        assert_eq!(upload_id(b"/b/k?uploadId=abc"), Some(&b"abc"[..]));
        for none in [&b"/b/k"[..], b"/b/k?uploadId=", b"/b/k?uploadIds=x", b"/b/k?x=1#uploadId=y", b"/b/k?uploads"] {
            assert_eq!(upload_id(none), None, "{:?}", core::str::from_utf8(none));
        }
        assert_eq!(multipart("POST", b"/b/k?uploads"), Multipart::Create);
        assert_eq!(multipart("post", b"/b/k?uploads=&x=1"), Multipart::Create);
        assert_eq!(multipart("PUT", b"/b/k?uploads"), Multipart::None, "only a POST creates");
        assert_eq!(multipart("POST", b"/b/uploads"), Multipart::None);
        assert_eq!(multipart("PUT", b"/b/k?partNumber=1&uploadId=u"), Multipart::Within(b"u"));
        assert_eq!(multipart("POST", b"/b/k?uploadId=u"), Multipart::Ends(b"u"));
        assert_eq!(multipart("DELETE", b"/b/k?uploadId=u"), Multipart::Ends(b"u"));
        assert_eq!(multipart("PUT", b"/b/k"), Multipart::None);
        let answer = b"<?xml version=\"1.0\"?><InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>\
                       <UploadId>VXBsb2FkSUQ-x_y.z~1+2/3=</UploadId></InitiateMultipartUploadResult>";
        assert_eq!(upload_id_in_answer(answer), Some(&b"VXBsb2FkSUQ-x_y.z~1+2/3="[..]));
        for bad in [&b"<UploadId></UploadId>"[..], b"<UploadId>a&amp;b</UploadId>", b"<UploadId>open", b"no id", b""] {
            assert_eq!(upload_id_in_answer(bad), None, "{:?}", core::str::from_utf8(bad));
        }
    }

    #[test]
    fn domains_are_checked() {
        assert_eq!(check_domain("s3.test"), Ok(()));
        assert_eq!(check_domain("s3.eu-west-1.example.com"), Ok(()));
        for bad in ["", "s3", "S3.test", "s3.test:80", ".s3.test", "s3.test.", "s3..test", "s3 .test"] {
            assert!(check_domain(bad).is_err(), "{bad:?}");
        }
    }
}
