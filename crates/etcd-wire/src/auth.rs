//! etcd users: what an authentication's answer may hand back. The token goes into a
//! header (gRPC metadata) of every later call, so it is checked as hostile text.

use crate::WireError;

/// The most bytes of a token: it goes into a header of every later request.
pub const MAX_TOKEN_BYTES: usize = 4096;

/// How an authentication was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthRefusal {
    /// etcd does not know this user with this password (etcd 3.4 answers gRPC code 3,
    /// "etcdserver: authentication failed, invalid user ID or password").
    WrongCredentials(WireError),
    /// Anything else (authentication not enabled, no leader, a proxy's error page).
    Other(WireError),
}

/// A token fit for a header: bounded, visible ASCII (a CR or LF would split the
/// request).
pub(crate) fn checked_token(t: &str) -> Result<String, WireError> {
    match t {
        t if t.len() > MAX_TOKEN_BYTES => {
            Err(WireError("etcd answered the authentication with an over-long token".into()))
        }
        t if !t.is_empty() && t.bytes().all(|b| b.is_ascii_graphic()) => Ok(t.to_owned()),
        t if !t.is_empty() => {
            Err(WireError("etcd answered the authentication with a token that is not visible ASCII".into()))
        }
        _ => Err(WireError("etcd answered the authentication without a token".into())),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_fit_for_a_header_or_an_error() {
        assert_eq!(checked_token("wdBxRxjwXFskssWu.12").unwrap(), "wdBxRxjwXFskssWu.12");
        let long = "t".repeat(MAX_TOKEN_BYTES + 1);
        for hostile in ["abc\r\nx-admin: 1", "a b", "", "\u{202e}x", long.as_str()] {
            let e = checked_token(hostile).unwrap_err();
            assert!(e.0.len() < 100 && !e.0.contains('\n'), "{hostile:?}: {e}");
        }
        assert_eq!(checked_token(&"t".repeat(MAX_TOKEN_BYTES)).map(|t| t.len()), Ok(MAX_TOKEN_BYTES));
    }
}
