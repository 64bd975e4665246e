//! What the gateway fences and how. The vocabulary is the Envoy filter's: a token
//! header, where the resource key comes from, which paths and methods are fenced.

use fencekeeper_core::refusal::TOKEN_HEADER;
use fencekeeper_core::Policy;
use hyper::header::HeaderName;
use hyper::{Method, Uri};
use std::net::SocketAddr;
use std::str::FromStr;
use std::time::Duration;

/// A configuration value that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The upstream is not an `http://HOST:PORT` URL.
    #[error("bad upstream URL {url:?}: {why}; expected http://HOST:PORT")]
    Upstream {
        /// What was given.
        url: String,
        /// What is wrong with it.
        why: String,
    },
    /// The resource selector is neither `path` nor `header:NAME`.
    #[error("bad resource selector {0:?}; expected `path` or `header:NAME`")]
    Resource(String),
    /// A header name is not valid.
    #[error("bad header name {0:?}")]
    Header(String),
    /// A method name is not valid.
    #[error("bad HTTP method {0:?}")]
    Method(String),
}

/// Where a request's resource key comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceFrom {
    /// The request path, without the query (`/bucket/file.txt`).
    Path,
    /// A request header's value.
    Header(HeaderName),
}

impl FromStr for ResourceFrom {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<ResourceFrom, ConfigError> {
        match s.split_once(':') {
            None if s == "path" => Ok(ResourceFrom::Path),
            Some(("header", name)) => Ok(ResourceFrom::Header(header_name(name)?)),
            _ => Err(ConfigError::Resource(s.to_owned())),
        }
    }
}

/// Parse a header name (lower-cased, as HTTP/2 requires).
pub fn header_name(s: &str) -> Result<HeaderName, ConfigError> {
    HeaderName::from_bytes(s.trim().to_ascii_lowercase().as_bytes()).map_err(|_| ConfigError::Header(s.to_owned()))
}

/// Parse a comma-separated method list (`PUT,POST,DELETE`).
pub fn methods(s: &str) -> Result<Vec<Method>, ConfigError> {
    s.split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(|m| Method::from_bytes(m.to_ascii_uppercase().as_bytes()).map_err(|_| ConfigError::Method(m.to_owned())))
        .collect()
}

/// Parse the upstream URL: `http://HOST:PORT`, no path, no TLS.
pub fn upstream(url: &str) -> Result<Uri, ConfigError> {
    let bad = |why: &str| ConfigError::Upstream { url: url.to_owned(), why: why.to_owned() };
    let uri: Uri = url.parse().map_err(|e: hyper::http::uri::InvalidUri| bad(&e.to_string()))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err(bad("TLS upstreams are not supported; put the gateway next to the store")),
        _ => return Err(bad("the scheme must be http://")),
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

/// The methods fenced by default: everything that writes.
pub const DEFAULT_FENCED_METHODS: &str = "PUT,POST,PATCH,DELETE,MKCOL,COPY,MOVE";

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
    /// Mode and strictness.
    pub policy: Policy,
    /// The request header carrying the fencing token.
    pub token_header: HeaderName,
    /// Where the resource key comes from.
    pub resource: ResourceFrom,
    /// Only paths starting with this are fenced; others pass through unchecked.
    pub path_prefix: String,
    /// Only these methods are fenced; others (reads) pass through unchecked.
    pub fenced_methods: Vec<Method>,
    /// The largest request body accepted (413 above it).
    pub max_body: usize,
    /// The longest a request may take: reading its body, and the upstream's answer.
    pub request_timeout: Duration,
    /// The longest an admitted write waits at the ordering gate (then 503).
    pub gate_timeout: Duration,
    /// The ordering gate is on (turning it off reopens the check-then-forward window).
    pub gate: bool,
}

impl Config {
    /// A configuration with the defaults, fencing `upstream` from `listen`.
    pub fn new(listen: SocketAddr, upstream: Uri) -> Config {
        Config {
            listen,
            admin: None,
            upstream,
            upstream_http2: false,
            policy: Policy::default(),
            token_header: HeaderName::from_static(TOKEN_HEADER),
            resource: ResourceFrom::Path,
            path_prefix: "/".to_owned(),
            fenced_methods: methods(DEFAULT_FENCED_METHODS).unwrap_or_default(),
            max_body: 16 << 20,
            request_timeout: Duration::from_secs(30),
            gate_timeout: Duration::from_secs(5),
            gate: true,
        }
    }

    /// True when a request with this method and path goes through the fence.
    pub fn fences(&self, method: &Method, path: &str) -> bool {
        path.starts_with(&self.path_prefix) && self.fenced_methods.contains(method)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_must_be_plain_http_with_a_port() {
        assert!(upstream("http://127.0.0.1:8080").is_ok());
        for bad in ["127.0.0.1:8080", "https://a:1", "http://a", "http://a:1/x", "ftp://a:1"] {
            let e = upstream(bad).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(e.starts_with("bad upstream URL"), "{bad}: {e}");
        }
    }

    #[test]
    fn resource_selector_is_path_or_a_header() {
        assert_eq!("path".parse::<ResourceFrom>().ok(), Some(ResourceFrom::Path));
        assert_eq!(
            "header:X-Resource".parse::<ResourceFrom>().ok(),
            Some(ResourceFrom::Header(HeaderName::from_static("x-resource")))
        );
        assert!("query".parse::<ResourceFrom>().is_err());
    }

    #[test]
    fn only_fenced_methods_under_the_prefix_are_fenced() {
        let mut c = Config::new(([127, 0, 0, 1], 0).into(), Uri::from_static("http://127.0.0.1:1"));
        c.path_prefix = "/data/".into();
        assert!(c.fences(&Method::PUT, "/data/a"));
        assert!(!c.fences(&Method::GET, "/data/a"));
        assert!(!c.fences(&Method::PUT, "/other"));
    }
}
