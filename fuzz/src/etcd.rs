//! The Envoy filter's etcd answers: a stored mark is the resource's checked record
//! (`fencekeeper_core::record`), and the parser takes the resource the record must
//! belong to. The targets call the parser and build stored values through here.

use fencekeeper_core::Token;
use fencekeeper_filter::etcd::{EtcdError, Outcome, Response};

/// Parse an answer to a transaction on `resource`'s mark.
pub fn parse(response: &Response, resource: &str) -> Result<Outcome, EtcdError> {
    fencekeeper_filter::etcd::parse(response, resource)
}

/// The value a writer stores as `resource`'s mark `token`.
pub fn stored(resource: &str, token: &Token) -> Vec<u8> {
    fencekeeper_core::record::encode(resource.as_bytes(), token).as_bytes().to_vec()
}

/// The mark a stored value holds for `resource`, by the contract; `None` when it
/// holds none that may be trusted.
pub fn mark(resource: &str, value: &[u8]) -> Option<Token> {
    fencekeeper_core::record::decode(resource.as_bytes(), value).ok()
}
