//! A request's head, classified: the path it writes as the store will see it, whether
//! the fence is in its way, and the resources and the token it presents. Every HTTP
//! host asks these questions of every request, in this order, with the same answers.
//!
//! A host reads the few headers the rules need into a [`Head`] (the filter in one host
//! call, the gateway from hyper's map) and its configuration into a [`Scope`]; it
//! keeps nothing of its own here. What a host must still do itself is bound the key and
//! the token ([`fencekeeper_core::precheck`], which its admit loop runs) and supply the
//! token a multipart step inherits (its upload memory, [`crate::uploads`]).

use fencekeeper_core::http::{resolve_path, resolved_capacity, ResourceFrom};
use fencekeeper_core::protocol::{self, destination_path};
use fencekeeper_core::s3::{self, Addressing};
use fencekeeper_core::{Protocol, ResourceError};

/// What the fence is configured to guard.
#[derive(Clone, Copy, Debug)]
pub struct Scope<'a, M, R> {
    /// The store's protocol.
    pub protocol: Protocol,
    /// The methods fenced, when not the protocol's writes.
    pub fenced_methods: Option<&'a [M]>,
    /// Only writes under this decoded path prefix are fenced (`/`, or `""` where the
    /// proxy's routes already scope the filter).
    pub path_prefix: &'a str,
    /// With protocol s3, the domain under which a Host names a bucket.
    pub s3_domain: Option<&'a str>,
    /// Where a request's resource key comes from.
    pub resource: &'a ResourceFrom<R>,
    /// Whether one write may name two resources (WebDAV's MOVE, fenced at both ends).
    /// A host that decides one resource per request refuses such a write as
    /// malformed: fencing one end only would let a stale MOVE overwrite the other.
    pub two_resources: bool,
}

/// The parts of a request's head the rules read, as sent.
#[derive(Clone, Copy, Debug, Default)]
pub struct Head<'a> {
    /// The method.
    pub method: &'a str,
    /// The request target: path and query, as sent.
    pub target: &'a [u8],
    /// The Host (or `:authority`) the store will see: with protocol s3 it may name
    /// the bucket.
    pub host: Option<&'a [u8]>,
    /// The token header.
    pub token: Option<&'a [u8]>,
    /// With protocol s3, the object metadata header that may carry the token too.
    pub metadata_token: Option<&'a [u8]>,
    /// The resource header, when the key comes from one.
    pub resource: Option<&'a [u8]>,
    /// WebDAV's `Destination`.
    pub destination: Option<&'a [u8]>,
}

/// A fenced write's resources and token, by the rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Presented {
    /// The keys of the resources it writes: sorted, without repeats, at least one.
    pub keys: Vec<String>,
    /// The token it presents (lossy text: the core refuses what is not a token), or
    /// the one its multipart upload inherited.
    pub token: Option<String>,
}

impl<M: AsRef<str>, R: AsRef<str>> Scope<'_, M, R> {
    /// The decoded path `head` writes as the store sees it: with protocol s3 the
    /// path-style path, a bucket named in the Host in front. Refused when the Host
    /// names a bucket the fence cannot tell.
    pub fn store_path(&self, head: &Head) -> Result<Vec<u8>, ResourceError> {
        let bucket = match self.protocol {
            Protocol::S3 => match s3::addressing(head.host, self.s3_domain)? {
                Addressing::VirtualHosted(bucket) => Some(bucket),
                Addressing::PathStyle => None,
            },
            _ => None,
        };
        Ok(resolved(head.target, bucket))
    }

    /// Whether the fence is in `head`'s way: a method the protocol (or the list)
    /// fences, writing under the prefix. `path` is [`Scope::store_path`]'s answer; a
    /// path the fence cannot place is in scope of every fenced method, and refused
    /// later. WebDAV's COPY and MOVE are in scope when their `Destination` is; a write
    /// whose keys are in its body (S3's POST to a bucket) is in scope when the prefix
    /// lies below its path.
    pub fn fences(&self, head: &Head, path: &Result<Vec<u8>, ResourceError>) -> bool {
        if !self.protocol.fences(head.method, self.fenced_methods) {
            return false;
        }
        let Ok(path) = path else { return true };
        let path = path.as_slice();
        let prefix = self.path_prefix.as_bytes();
        let in_scope = |p: &[u8]| p.starts_with(prefix);
        let keys_in_body = self.protocol.refusal(head.method, path).is_some() && prefix.starts_with(path);
        in_scope(path)
            || keys_in_body
            || (self.protocol.writes(head.method).destination() && destination(head).is_some_and(|d| in_scope(&d)))
    }

    /// The resources and the token a fenced write presents. `path` is
    /// [`Scope::store_path`]'s; `inherited` gives, for a request that sent no token,
    /// the token of the multipart upload its target names (protocol s3 only). A
    /// resource that cannot be named, a token sent twice with two values, or a write
    /// the protocol cannot fence, is malformed.
    pub fn presented(
        &self,
        head: &Head,
        path: &Result<Vec<u8>, ResourceError>,
        inherited: impl FnOnce(&[u8]) -> Option<String>,
    ) -> Result<Presented, ResourceError> {
        let path = path.as_deref().map_err(|e| *e)?;
        let metadata = head.metadata_token.filter(|_| self.protocol.token_in_metadata());
        let sent = protocol::one_token(head.token, metadata)?.map(|t| String::from_utf8_lossy(t).into_owned());
        if let Some(why) = self.protocol.refusal(head.method, path) {
            return Err(why);
        }
        let writes = self.protocol.writes(head.method);
        if writes.target() && writes.destination() && !self.two_resources {
            return Err(ResourceError::TwoResources);
        }
        let mut keys = Vec::with_capacity(2);
        if writes.target() {
            keys.push(self.resource.key(path, head.resource)?.to_owned());
        }
        if writes.destination() {
            let destination = destination(head).ok_or(ResourceError::Destination)?;
            keys.push(self.resource.key(&destination, head.resource)?.to_owned());
        }
        keys.sort();
        keys.dedup();
        let token = match sent {
            None if self.protocol == Protocol::S3 => inherited(path),
            sent => sent,
        };
        Ok(Presented { keys, token })
    }

    /// The resource an unfenced read (GET or HEAD) of `head` names, when it is one the
    /// fence guards: its answer may tell the store's version of it (conditional
    /// writes).
    pub fn read_of(&self, head: &Head, path: &Result<Vec<u8>, ResourceError>) -> Option<String> {
        if !matches!(head.method, "GET" | "HEAD") {
            return None;
        }
        let path = path.as_deref().ok().filter(|p| p.starts_with(self.path_prefix.as_bytes()))?;
        let key = self.resource.key(path, head.resource).ok()?;
        fencekeeper_core::resource::check(key).ok().map(|()| key.to_owned())
    }
}

/// The decoded path of `head`'s `Destination` (WebDAV's COPY and MOVE), `None` when
/// it is absent or names no path.
pub fn destination(head: &Head) -> Option<Vec<u8>> {
    head.destination.and_then(destination_path).map(|path| resolved(path, None))
}

/// [`resolve_path`] into a buffer of its own.
fn resolved(target: &[u8], bucket: Option<&[u8]>) -> Vec<u8> {
    let mut path = vec![0; resolved_capacity(target, bucket)];
    let len = resolve_path(target, bucket, &mut path);
    path.truncate(len);
    path
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PATH: ResourceFrom<&str> = ResourceFrom::Path { strip_prefix: "" };

    fn scope(protocol: Protocol, prefix: &str) -> Scope<'_, &'static str, &'static str> {
        Scope {
            protocol,
            fenced_methods: None,
            path_prefix: prefix,
            s3_domain: None,
            resource: &PATH,
            two_resources: true,
        }
    }

    fn head<'a>(method: &'a str, target: &'a str) -> Head<'a> {
        Head { method, target: target.as_bytes(), ..Head::default() }
    }

    fn keys_of(scope: &Scope<&str, &str>, head: &Head) -> Result<Vec<String>, ResourceError> {
        let path = scope.store_path(head);
        scope.presented(head, &path, |_| None).map(|p| p.keys)
    }

    #[test]
    fn only_fenced_methods_under_the_prefix_are_fenced_and_a_re_encoding_does_not_dodge_it() {
        let s = scope(Protocol::Http, "/data/");
        let fenced = |h: &Head| s.fences(h, &s.store_path(h));
        assert!(fenced(&head("PUT", "/data/f")));
        assert!(fenced(&head("PUT", "/x/../data/%66")), "resolved and decoded before the prefix is judged");
        assert!(!fenced(&head("PUT", "/other/f")));
        assert!(!fenced(&head("GET", "/data/f")));
    }

    #[test]
    fn a_move_names_both_ends_or_is_refused_where_one_resource_is_decided() {
        let mut s = scope(Protocol::Webdav, "/");
        let mv = Head { destination: Some(b"http://h/b%20c"), ..head("MOVE", "/a") };
        assert_eq!(keys_of(&s, &mv), Ok(vec!["/a".to_owned(), "/b c".to_owned()]));
        let copy = Head { destination: Some(b"/b"), ..head("COPY", "/a") };
        assert_eq!(keys_of(&s, &copy), Ok(vec!["/b".to_owned()]), "a copy writes its destination only");
        s.two_resources = false;
        assert_eq!(keys_of(&s, &mv), Err(ResourceError::TwoResources));
        assert_eq!(keys_of(&s, &head("COPY", "/a")), Err(ResourceError::Destination));
        let s = scope(Protocol::Webdav, "/data/");
        let into = Head { destination: Some(b"/data/x"), ..head("COPY", "/other/a") };
        assert!(s.fences(&into, &s.store_path(&into)), "a copy into the prefix is fenced");
        let elsewhere = Head { destination: Some(b"/elsewhere/x"), ..head("COPY", "/other/a") };
        assert!(!s.fences(&elsewhere, &s.store_path(&elsewhere)), "a copy between paths outside it is not");
    }

    #[test]
    fn s3_takes_the_token_from_metadata_or_the_upload_and_refuses_two_values() {
        let s = scope(Protocol::S3, "/");
        let meta = Head { metadata_token: Some(b"34"), ..head("PUT", "/b/k") };
        let presented = |h: &Head| s.presented(h, &s.store_path(h), |_| Some("7".to_owned()));
        assert_eq!(presented(&meta).unwrap().token.as_deref(), Some("34"));
        let both = Head { token: Some(b"35"), ..meta };
        assert_eq!(presented(&both), Err(ResourceError::TwoTokens));
        assert_eq!(presented(&head("PUT", "/b/k?uploadId=u")).unwrap().token.as_deref(), Some("7"), "inherited");
        let http = scope(Protocol::Http, "/");
        let h = head("PUT", "/b/k");
        assert_eq!(http.presented(&h, &http.store_path(&h), |_| Some("7".into())).unwrap().token, None);
    }

    #[test]
    fn s3_keys_a_virtual_hosted_request_on_its_path_style_path() {
        let s = Scope { s3_domain: Some("s3.local"), ..scope(Protocol::S3, "/") };
        let h = Head { host: Some(b"Reports.s3.local:9000"), ..head("PUT", "/q3.csv") };
        assert_eq!(keys_of(&s, &h), Ok(vec!["/reports/q3.csv".to_owned()]));
        let post = head("POST", "/bucket?delete");
        assert!(s.fences(&post, &s.store_path(&post)), "a write whose keys are in its body is in scope");
        assert!(keys_of(&s, &post).is_err(), "and refused");
    }

    #[test]
    fn a_read_names_its_resource_only_under_the_prefix() {
        let s = scope(Protocol::S3, "/data/");
        let read = |h: &Head| s.read_of(h, &s.store_path(h));
        assert_eq!(read(&head("GET", "/data/k")).as_deref(), Some("/data/k"));
        assert_eq!(read(&head("HEAD", "/other/k")), None);
        assert_eq!(read(&head("PUT", "/data/k")), None);
    }
}
