//! The Envoy filter's etcd answers, before and after the store's checked records.
//!
//! With the store-integrity work (feature `record`, on when the core has the record
//! codec) a stored mark is the resource's record rather than the bare token text,
//! and `fencekeeper_filter::etcd::parse` takes the resource the record must belong
//! to. The targets call the parser and build stored values through here, so they
//! build and check the right contract on either side of that change.

use fencekeeper_core::Token;
use fencekeeper_filter::etcd::{EtcdError, Outcome};

/// Parse an answer to a transaction on `resource`'s mark.
pub fn parse(status: Option<&str>, body: &[u8], resource: &str) -> Result<Outcome, EtcdError> {
    #[cfg(feature = "record")]
    return fencekeeper_filter::etcd::parse(status, body, resource);
    #[cfg(not(feature = "record"))]
    {
        let _ = resource;
        fencekeeper_filter::etcd::parse(status, body)
    }
}

/// The value a writer stores as `resource`'s mark `token`.
pub fn stored(resource: &str, token: &Token) -> Vec<u8> {
    #[cfg(feature = "record")]
    return fencekeeper_core::record::encode(resource.as_bytes(), token).as_bytes().to_vec();
    #[cfg(not(feature = "record"))]
    {
        let _ = resource;
        token.to_string().into_bytes()
    }
}

/// The mark a stored value holds for `resource`, by the contract; `None` when it
/// holds none that may be trusted.
pub fn mark(resource: &str, value: &[u8]) -> Option<Token> {
    #[cfg(feature = "record")]
    return fencekeeper_core::record::decode(resource.as_bytes(), value).ok();
    #[cfg(not(feature = "record"))]
    {
        let _ = resource;
        let parts = crate::model::token(std::str::from_utf8(value).ok()?).ok()?;
        Some(Token::from_parts(&parts).expect("the model's token has 1 to 4 components"))
    }
}
