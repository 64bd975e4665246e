//! Where the etcd endpoint is, without a thread per call.
//!
//! ureq resolves the endpoint's host before every call, and with a timeout set it
//! resolves on a thread of its own: a thread created and ended for each etcd call. In
//! the gateway that was most of its CPU per admit (measured: one `clone3` per
//! request). An IP address needs no resolving; a name is resolved by ureq's own
//! resolver, within the call's timeout, and kept for [`KEEP`], so a moved endpoint is
//! followed within seconds.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};
use ureq::config::Config;
use ureq::http::Uri;
use ureq::unversioned::resolver::{DefaultResolver, ResolvedSocketAddrs, Resolver};
use ureq::unversioned::transport::NextTimeout;

/// How long the addresses of a name are used before it is resolved again.
pub const KEEP: Duration = Duration::from_secs(5);

/// The resolver of one etcd client.
#[derive(Debug, Default)]
pub struct Resolve {
    names: DefaultResolver,
    /// The last name resolved (`host:port`), when, and to what.
    kept: Mutex<Option<(String, Instant, ResolvedSocketAddrs)>>,
}

impl Resolver for Resolve {
    fn resolve(&self, uri: &Uri, config: &Config, timeout: NextTimeout) -> Result<ResolvedSocketAddrs, ureq::Error> {
        let port = uri.port_u16().unwrap_or(if uri.scheme_str() == Some("https") { 443 } else { 80 });
        let host = uri.host().unwrap_or_default();
        if let Ok(ip) = host.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            let mut addrs = self.empty();
            addrs.push(SocketAddr::new(ip, port));
            return Ok(addrs);
        }
        let name = format!("{host}:{port}");
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((n, at, addrs)) = kept.as_ref() {
            if *n == name && at.elapsed() < KEEP {
                return Ok(addrs.clone());
            }
        }
        // Not under the lock: a slow lookup must not hold up calls to another name.
        drop(kept);
        let addrs = self.names.resolve(uri, config, timeout)?;
        kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        *kept = Some((name, Instant::now(), addrs.clone()));
        Ok(addrs)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn resolve(r: &Resolve, uri: &str) -> Vec<SocketAddr> {
        let config = Config::default();
        let timeout = NextTimeout {
            after: ureq::unversioned::transport::time::Duration::NotHappening,
            reason: ureq::Timeout::Resolve,
            per_read: None,
            per_write: None,
        };
        r.resolve(&uri.parse().unwrap(), &config, timeout).unwrap().to_vec()
    }

    #[test]
    fn an_address_is_taken_as_it_is_and_a_name_is_kept() {
        let r = Resolve::default();
        assert_eq!(resolve(&r, "http://127.0.0.1:2379/v3/kv/txn"), ["127.0.0.1:2379".parse().unwrap()]);
        assert_eq!(resolve(&r, "https://[::1]/v3/kv/txn"), ["[::1]:443".parse().unwrap()]);
        assert!(r.kept.lock().unwrap().is_none(), "nothing resolved");
        let named = resolve(&r, "http://localhost:2379/v3/kv/range");
        assert!(named.iter().all(|a| a.port() == 2379 && a.ip().is_loopback()), "{named:?}");
        assert_eq!(r.kept.lock().unwrap().as_ref().map(|k| k.0.clone()).as_deref(), Some("localhost:2379"));
    }
}
