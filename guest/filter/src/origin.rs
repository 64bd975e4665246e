//! Whether a response came from the store, or from the proxy.
//!
//! It decides how a write's flight ends at the ordering gate: at once when the store
//! answered it (the store will not apply it later), after the store apply bound when
//! the proxy gave up on it (a timeout, a reset: the store may still apply it). Envoy
//! says which exactly: `response.code_details` is `via_upstream` for the upstream's
//! answer. A host without that property (ngx_wasm_module) is judged by the answer's
//! status instead, on the side of safety: the statuses a proxy gives when it gave up
//! on an upstream or lost it (any 5xx, 408 and 499: a timeout, a reset, a client
//! gone) count as given up, and hold the resource for the bound; any other status is
//! one a proxy gives only after the store answered (or before it sent anything, when
//! nothing can land either), and ends the flight at once. A store's own 5xx then
//! holds its resource for the bound: slower, never unsafe.
//!
//! Envoy also says when nothing was sent at all: its response flags name a connection
//! that was never made (UF), no healthy host (UH) or a circuit breaker's overflow
//! (UO), and `upstream.request_attempt_count` says whether that was the only attempt.
//! Such a write ends at once too, as the gateway ends one it could not connect for:
//! held for the bound, it would make every write after a store outage wait out the
//! gate timeout. A route that retries may have sent an earlier attempt, so a count
//! above one, or none to read, is taken as given up.

/// Where an answer came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The store answered: it will not apply the write later.
    Store,
    /// Nothing was sent (no connection was made): nothing can land.
    NeverSent,
    /// The proxy answered, or may have: the store may still apply the write.
    Proxy,
}

/// The origin of an answer with `code_details` (Envoy's property; `None` where the
/// host has none) and response status `status` (`None`: unreadable).
pub fn of(code_details: Option<&[u8]>, status: Option<u16>) -> Origin {
    if let Some(details) = code_details {
        return if details == b"via_upstream" { Origin::Store } else { Origin::Proxy };
    }
    match status {
        Some(408 | 499 | 500..=599) | None => Origin::Proxy,
        Some(_) => Origin::Store,
    }
}

/// Envoy's response flags that mean the request never left the proxy: upstream
/// connection failure (UF), no healthy upstream (UH), upstream overflow (UO).
const NEVER_CONNECTED: u64 = 0x20 | 0x2 | 0x80;

/// Whether an answer that is not the store's came about with nothing sent, from
/// Envoy's `response.flags` and `upstream.request_attempt_count` (each a
/// little-endian u64; `None` where unreadable).
pub fn never_sent(flags: Option<&[u8]>, attempts: Option<&[u8]>) -> bool {
    let number = |bytes: Option<&[u8]>| Some(u64::from_le_bytes(bytes?.try_into().ok()?));
    let (Some(flags), Some(attempts)) = (number(flags), number(attempts)) else { return false };
    flags & NEVER_CONNECTED != 0 && attempts <= 1
}

/// A status header's value, if it is one.
pub fn status(value: &[u8]) -> Option<u16> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envoys_details_decide_when_the_host_has_them() {
        assert_eq!(of(Some(b"via_upstream"), Some(503)), Origin::Store, "the store's own 503");
        assert_eq!(of(Some(b"upstream_response_timeout"), Some(504)), Origin::Proxy);
        assert_eq!(of(Some(b"wasm_local_reply"), Some(201)), Origin::Proxy);
    }

    #[test]
    fn without_details_only_a_status_no_proxy_gives_for_a_lost_upstream_is_the_stores() {
        for store in [200, 201, 204, 301, 404, 409, 412, 413] {
            assert_eq!(of(None, Some(store)), Origin::Store, "{store}");
        }
        for given_up in [408, 499, 500, 502, 503, 504] {
            assert_eq!(of(None, Some(given_up)), Origin::Proxy, "{given_up}");
        }
        assert_eq!(of(None, None), Origin::Proxy, "no status to read");
        assert_eq!(status(b"201"), Some(201));
        assert_eq!(status(b"2x1"), None);
    }

    #[test]
    fn only_a_single_attempt_that_never_connected_is_never_sent() {
        let n = |v: u64| v.to_le_bytes();
        assert!(never_sent(Some(&n(0x20)), Some(&n(1))), "UF, one attempt (Envoy 1.40's own answer)");
        assert!(never_sent(Some(&n(0x2)), Some(&n(1))), "UH");
        assert!(never_sent(Some(&n(0x80)), Some(&n(0))), "UO");
        assert!(!never_sent(Some(&n(0x20)), Some(&n(2))), "a retry: the first attempt may have been sent");
        assert!(!never_sent(Some(&n(0x4)), Some(&n(1))), "UT: given up on after it was sent");
        assert!(!never_sent(Some(&n(0x10)), Some(&n(1))), "UR: reset after it may have been sent");
        assert!(!never_sent(Some(&n(0x20)), None), "no attempt count to read");
        assert!(!never_sent(None, Some(&n(1))), "no flags to read");
        assert!(!never_sent(Some(&[0x20, 0]), Some(&n(1))), "not a u64");
    }
}
