//! What the gateway fences and how. The vocabulary is the Envoy filter's: a token
//! header, where the resource key comes from, which paths and methods are fenced.

use fencekeeper_core::http::{self, TOKEN_HEADER};
use fencekeeper_core::protocol::{DESTINATION_HEADER, METADATA_PREFIX};
use fencekeeper_core::{Policy, Protocol};
use fencekeeper_engine::gate;
use fencekeeper_engine::head::{Head, Scope};
use hyper::header::{HeaderMap, HeaderName, HeaderValue};
use hyper::{Method, Uri};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The upstream is not an `http://HOST:PORT` (or `https://`) URL.
    #[error("bad upstream URL {url:?}: {why}; expected HOST:PORT, http://HOST:PORT or https://HOST:PORT")]
    Upstream {
        /// What was given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// A header name is not valid.
    #[error("bad header name {0:?}")]
    Header(String),
    /// A method name is not valid.
    #[error("bad HTTP method {0:?}")]
    Method(String),
    /// A list of fenced methods names none.
    #[error("the list of fenced methods is empty: nothing would be fenced; name at least one (PUT,POST,...)")]
    NoMethods,
}

/// Where a request's resource key comes from: the core's rule, shared with the Envoy
/// filter (a header name is lower case).
pub type ResourceFrom = http::ResourceFrom<String>;

/// Parse a header name (lower-cased, as HTTP/2 requires).
pub fn header_name(s: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(s.trim().to_ascii_lowercase().as_bytes()).map_err(|_| ConfigError::Header(s.to_owned()))
}

/// Parse a comma-separated method list (`PUT,POST,DELETE`), upper-cased. A list
/// that names no method is refused: it would fence nothing.
pub fn methods(s: &str) -> Result<Vec<Method>, ConfigError> {
    let list = s
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| ConfigError::Method(m.to_owned())))
        .collect::<Result<Vec<_>, _>>()?;
    if list.is_empty() {
        return Err(ConfigError::NoMethods);
    }
    Ok(list)
}

/// Parse the upstream address: `http://HOST:PORT` or `HOST:PORT` (as
/// `fencekeeper envoy-config` takes it), or `https://HOST:PORT` for a store that
/// speaks TLS (its CA given apart: [`Config::upstream_tls`]); no path.
pub fn upstream(url: &str) -> Result<Uri, ConfigError> {
    let bad = |why: &str| ConfigError::Upstream { url: url.to_owned(), why: why.to_owned() };
    let uri: Uri = with_scheme(url).parse().map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(bad("the scheme must be http:// or https://")),
    }
    let authority = uri.authority().ok_or_else(|| bad("no host"))?;
    if authority.port_u16().is_none() {
        return Err(bad("no port"));
    }
    if !matches!(uri.path(), "" | "/") {
        return Err(bad("a path is not supported; requests keep their own path"));
    }
    Ok(uri)
}

/// `HOST:PORT` -> `http://HOST:PORT`; anything with a scheme is left as it is.
pub fn with_scheme(address: &str) -> String {
    if address.contains("://") {
        address.to_owned()
    } else {
        format!("http://{address}")
    }
}

/// The gateway's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where clients connect.
    pub listen: SocketAddr,
    /// The admin listener (`/metrics`, mark lookup), or none.
    pub admin: Option<SocketAddr>,
    /// The store's address, `http://HOST:PORT`.
    pub upstream: Uri,
    /// Speak HTTP/2 (prior knowledge) to the upstream, for gRPC stores.
    pub upstream_http2: bool,
    /// TLS to an `https://` upstream: what checks its certificate. Required for one,
    /// refused for an `http://` one ([`Config::check_tls`]).
    pub upstream_tls: Option<std::sync::Arc<rustls::ClientConfig>>,
    /// TLS on the listener: its certificate and key.
    pub tls: Option<crate::tls::TlsFiles>,
    /// Mode and strictness.
    pub policy: Policy,
    /// The request header carrying the fencing token.
    pub token_header: HeaderName,
    /// Where the resource key comes from.
    pub resource: ResourceFrom,
    /// The store's protocol: which methods read, which resources a write names.
    pub protocol: Protocol,
    /// With protocol s3, the store's S3 domain: a request to `BUCKET.` + it names its
    /// bucket in the host name (virtual-hosted-style), one to it or to an IP address
    /// in the path. `None`: every domain name is refused as a Host (the bucket could
    /// not be told), IP addresses and single-label names are path-style.
    pub s3_domain: Option<String>,
    /// Only paths whose decoded form starts with this are fenced; others pass
    /// through unchecked.
    pub path_prefix: String,
    /// Only these methods are fenced; others pass through unchecked. `None`: every
    /// method but the protocol's reads (GET, HEAD and OPTIONS for plain HTTP).
    pub fenced_methods: Option<Vec<Method>>,
    /// The largest request body accepted (413 above it).
    pub max_body: usize,
    /// The longest a request may take: reading its body, and the upstream's answer.
    pub request_timeout: Duration,
    /// The longest an admitted write waits at the ordering gate (then 503). Default:
    /// the engine's [`gate::GATE_TIMEOUT`] (5 s).
    pub gate_timeout: Duration,
    /// How long the store may still apply a write after the gateway gave up on it
    /// (the upstream timed out, reset or failed once the request was sent): for that
    /// long the write keeps holding its resource at the ordering gate, so no higher
    /// write is forwarded while the store may still apply it. Set it at or above the
    /// store's own request timeout. Default: the engine's
    /// [`gate::STORE_APPLY_BOUND`] (60 s), whatever `request_timeout` is.
    pub apply_bound: Duration,
    /// For this long after start, fenced writes are refused (503, `Retry-After`):
    /// writes that a previous run of this gateway had in flight when it died may still
    /// be applied by the store, and the ordering gate, which lives in memory, no longer
    /// knows them. Set it to the longest the store may take to apply a write it was
    /// sent (its own request timeout). Zero: off.
    pub start_grace: Duration,
    /// The ordering gate is on (turning it off reopens the check-then-forward window).
    pub gate: bool,
    /// Run every admit on the blocking pool, even when the store can be awaited (an
    /// etcd store's admits are otherwise awaited on the request's own task): the
    /// earlier way, kept for comparisons.
    pub blocking_admits: bool,
    /// Append every mark the gateway raises to this file, one JSON line each.
    pub audit: Option<PathBuf>,
    /// Where the marks live, as the audit log names it (`file PATH`, `etcd URL prefix P`).
    pub store: String,
    /// With conditional writes: the store honours `If-Match` on DELETE (the start-up
    /// probe saw it, or the operator vouched for the store); else deletes are refused.
    pub conditional_deletes: bool,
}

impl Config {
    /// A configuration with the defaults, fencing `upstream` from `listen`.
    pub fn new(listen: SocketAddr, upstream: Uri) -> Config {
        Config {
            listen,
            admin: None,
            upstream,
            upstream_http2: false,
            upstream_tls: None,
            tls: None,
            policy: Policy::default(),
            token_header: HeaderName::from_static(TOKEN_HEADER),
            resource: ResourceFrom::Path { strip_prefix: String::new() },
            protocol: Protocol::Http,
            s3_domain: None,
            path_prefix: "/".to_owned(),
            fenced_methods: None,
            max_body: 16 << 20,
            request_timeout: Duration::from_secs(30),
            gate_timeout: gate::GATE_TIMEOUT,
            apply_bound: gate::STORE_APPLY_BOUND,
            start_grace: Duration::ZERO,
            gate: true,
            blocking_admits: false,
            audit: None,
            store: String::new(),
            conditional_deletes: true,
        }
    }

    /// An `https://` upstream has its TLS, and an `http://` one has none.
    pub fn check_tls(&self) -> Result<(), ConfigError> {
        let bad = |why: &str| ConfigError::Upstream { url: self.upstream.to_string(), why: why.to_owned() };
        match (self.upstream.scheme_str(), &self.upstream_tls) {
            (Some("https"), None) => {
                Err(bad("an https:// upstream needs the CA of its certificate (--upstream-cacert)"))
            }
            (Some("http"), Some(_)) => {
                Err(bad("a CA is given for the upstream but its address is http://; write https:// (never plaintext)"))
            }
            _ => Ok(()),
        }
    }

    /// What the gateway guards, for the engine's rules ([`Scope`]): the gateway fences
    /// both ends of a WebDAV MOVE.
    pub fn scope(&self) -> Scope<'_, Method, String> {
        Scope {
            protocol: self.protocol,
            fenced_methods: self.fenced_methods.as_deref(),
            path_prefix: &self.path_prefix,
            s3_domain: self.s3_domain.as_deref(),
            resource: &self.resource,
            two_resources: true,
        }
    }

    /// The parts of a request's head the engine's rules read ([`Head`]): `target` is
    /// its path and query as sent, `host` the Host the store will see.
    pub fn head<'a>(
        &'a self,
        method: &'a Method,
        target: &'a [u8],
        headers: &'a HeaderMap,
        host: Option<&'a [u8]>,
    ) -> Head<'a> {
        let get = |name: &str| headers.get(name).map(HeaderValue::as_bytes);
        let metadata = match self.protocol.token_in_metadata() {
            true => get(&format!("{METADATA_PREFIX}{}", self.token_header)),
            false => None,
        };
        Head {
            method: method.as_str(),
            target,
            host,
            token: headers.get(&self.token_header).map(HeaderValue::as_bytes),
            metadata_token: metadata,
            resource: self.resource.header().and_then(get),
            destination: get(DESTINATION_HEADER),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fencekeeper_core::resource::ResourceError;

    /// Whether `c` fences `method` on `target` with `headers`, by the engine's rules.
    fn fences(c: &Config, method: &Method, target: &str, headers: &HeaderMap) -> bool {
        let head = c.head(method, target.as_bytes(), headers, None);
        c.scope().fences(&head, &c.scope().store_path(&head))
    }

    /// The path a request to `target` with Host `host` writes, as the store sees it.
    fn store_path(c: &Config, target: &str, host: Option<&[u8]>) -> Result<Vec<u8>, ResourceError> {
        let none = HeaderMap::new();
        c.scope().store_path(&c.head(&Method::PUT, target.as_bytes(), &none, host))
    }

    /// The token a PUT with `headers` presents.
    fn token(c: &Config, headers: &HeaderMap) -> Result<Option<String>, ResourceError> {
        let head = c.head(&Method::PUT, b"/k", headers, None);
        c.scope().presented(&head, &c.scope().store_path(&head), |_| None).map(|p| p.token)
    }

    #[test]
    fn upstream_must_be_http_or_https_with_a_port_and_https_needs_its_ca() {
        assert!(upstream("http://127.0.0.1:8080").is_ok());
        assert_eq!(upstream("127.0.0.1:8080").ok(), upstream("http://127.0.0.1:8080").ok());
        for bad in ["http://a", "http://a:1/x", "ftp://a:1", "https://a"] {
            let e = upstream(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.starts_with("bad upstream URL"), "{bad}: {e}");
        }
        let https = Config::new(([127, 0, 0, 1], 0).into(), upstream("https://a:1").expect("an https upstream"));
        let e = https.check_tls().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("--upstream-cacert"), "{e}");
        assert!(Config::new(([127, 0, 0, 1], 0).into(), upstream("http://a:1").expect("an http upstream"))
            .check_tls()
            .is_ok());
    }

    #[test]
    fn a_re_encoded_path_is_still_in_the_fenced_prefix() {
        let mut c = Config::new(([127, 0, 0, 1], 0).into(), Uri::from_static("http://127.0.0.1:1"));
        c.path_prefix = "/data/".into();
        let none = HeaderMap::new();
        assert!(fences(&c, &Method::PUT, "/dat%61/a?x=1", &none));
        assert!(fences(&c, &Method::PUT, "/data/%FF", &none), "an undecodable path stays in scope");
        assert!(fences(&c, &Method::PUT, "/public/../data/a", &none), "dots cannot leave the prefix");
        assert!(!fences(&c, &Method::PUT, "/data/../public/a", &none));
        assert_eq!(store_path(&c, "/data//x/%2e%2e/./a", None), Ok(b"/data/a".to_vec()));
    }

    #[test]
    fn only_fenced_methods_under_the_prefix_are_fenced() {
        let mut c = Config::new(([127, 0, 0, 1], 0).into(), Uri::from_static("http://127.0.0.1:1"));
        c.path_prefix = "/data/".into();
        let none = HeaderMap::new();
        assert!(fences(&c, &Method::PUT, "/data/a", &none));
        assert!(!fences(&c, &Method::GET, "/data/a", &none));
        assert!(!fences(&c, &Method::PUT, "/other", &none));
        let lock = Method::from_bytes(b"LOCK").unwrap_or_default();
        assert!(fences(&c, &lock, "/data/a", &none), "every method but GET, HEAD, OPTIONS by default");
        c.fenced_methods = methods("PUT").ok();
        assert!(!fences(&c, &lock, "/data/a", &none));
    }

    #[test]
    fn webdav_listings_pass_and_a_copy_into_the_prefix_is_fenced() {
        let mut c = Config::new(([127, 0, 0, 1], 0).into(), Uri::from_static("http://127.0.0.1:1"));
        c.path_prefix = "/data/".into();
        let method = |m: &str| Method::from_bytes(m.as_bytes()).unwrap_or_default();
        let none = HeaderMap::new();
        assert!(fences(&c, &method("PROPFIND"), "/data/", &none), "plain HTTP fences PROPFIND");
        c.protocol = Protocol::Webdav;
        assert!(!fences(&c, &method("PROPFIND"), "/data/", &none));
        assert!(fences(&c, &method("MKCOL"), "/data/d", &none));
        let mut into = HeaderMap::new();
        into.insert(DESTINATION_HEADER, hyper::header::HeaderValue::from_static("http://store:1/d%61ta/b"));
        assert!(fences(&c, &method("COPY"), "/public/a", &into), "the Destination is in scope");
        assert!(!fences(&c, &method("PUT"), "/public/a", &into), "a PUT names no Destination");
        assert!(!fences(&c, &method("COPY"), "/public/a", &none));
    }

    #[test]
    fn s3_takes_the_token_from_metadata_and_fences_a_post_to_a_bucket_above_the_prefix() {
        let mut c = Config::new(([127, 0, 0, 1], 0).into(), Uri::from_static("http://127.0.0.1:1"));
        let mut h = HeaderMap::new();
        h.insert("x-amz-meta-fencing-token", HeaderValue::from_static("34"));
        assert_eq!(token(&c, &h).ok(), Some(None), "plain HTTP does not read metadata");
        c.protocol = Protocol::S3;
        assert_eq!(token(&c, &h).ok(), Some(Some("34".to_owned())));
        h.insert(TOKEN_HEADER, HeaderValue::from_static("35"));
        assert!(matches!(token(&c, &h), Err(ResourceError::TwoTokens)));
        c.path_prefix = "/bkt/data/".into();
        assert!(fences(&c, &Method::POST, "/bkt", &h), "DeleteObjects on the bucket reaches the prefix");
        assert!(!fences(&c, &Method::POST, "/other", &h));
        assert!(!fences(&c, &Method::POST, "/bkt/k", &h), "a multipart step above the prefix is out of it");
    }

    #[test]
    fn s3_keys_a_virtual_hosted_request_on_its_path_style_path() {
        let mut c = Config::new(([127, 0, 0, 1], 0).into(), Uri::from_static("http://127.0.0.1:1"));
        assert_eq!(store_path(&c, "/q3.csv", Some(b"reports.s3.test")), Ok(b"/q3.csv".to_vec()), "plain HTTP");
        c.protocol = Protocol::S3;
        assert_eq!(store_path(&c, "/reports/q3.csv", Some(b"127.0.0.1:9000")), Ok(b"/reports/q3.csv".to_vec()));
        assert_eq!(store_path(&c, "/q3.csv", Some(b"reports.s3.test")), Err(ResourceError::S3Host), "no domain");
        c.s3_domain = Some("s3.test".to_owned());
        for (path, host) in [("/reports/q3.csv", "s3.test:8080"), ("/q%33.csv", "Reports.s3.test:8080")] {
            assert_eq!(store_path(&c, path, Some(host.as_bytes())), Ok(b"/reports/q3.csv".to_vec()), "{host}{path}");
        }
        assert_eq!(store_path(&c, "/../other/k", Some(b"reports.s3.test")), Ok(b"/other/k".to_vec()));
        assert_eq!(store_path(&c, "/k", Some(b"store.lan")), Err(ResourceError::S3Host));
    }

    #[test]
    fn a_method_list_that_names_none_is_refused() {
        for empty in ["", " ", ",", " , "] {
            assert!(matches!(methods(empty), Err(ConfigError::NoMethods)), "{empty:?}");
        }
        assert!(matches!(methods("PUT,(x)"), Err(ConfigError::Method(m)) if m == "(x)"));
        assert_eq!(
            methods(" put , MkCol ").ok(),
            Some(vec![Method::PUT, Method::from_bytes(b"MKCOL").unwrap_or_default()])
        );
    }
}
