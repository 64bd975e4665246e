//! The request headers the filter reads, taken in one host call.

use crate::Filter;
use fencekeeper_core::http::ADMITTED_HEADER;
use fencekeeper_core::protocol::DESTINATION_HEADER;
use fencekeeper_core::Protocol;

/// The headers that tell whether a write can be sent with a precondition
/// (`fencekeeper_chain::unconditional`), and whether its body is empty.
pub const CONDITIONAL_HEADERS: [&str; 6] =
    ["if-match", "if-none-match", "x-amz-copy-source", "x-amz-content-sha256", "content-encoding", "content-length"];

/// The request headers the filter reads, taken in one host call: every call into
/// Envoy crosses V8's boundary, and that crossing is most of the filter's cost.
#[derive(Default)]
pub struct Seen {
    /// `:method`.
    pub method: Vec<u8>,
    /// `:path`.
    pub path: Vec<u8>,
    /// `:authority` (the Host the store sees), read with protocol s3 only: it may
    /// name the bucket.
    pub authority: Option<Vec<u8>>,
    /// The token header.
    pub token: Option<Vec<u8>>,
    /// With protocol s3, the object metadata header that may carry the token too.
    pub metadata_token: Option<Vec<u8>>,
    /// The resource header, when the key comes from one.
    pub resource: Option<Vec<u8>>,
    /// `content-type`.
    pub content_type: Option<Vec<u8>>,
    /// WebDAV's `destination` (read only where the protocol names one).
    pub destination: Option<Vec<u8>>,
    /// The client sent a `fencing-admitted-token` of its own.
    pub admitted: bool,
    /// With conditional writes, the headers that tell whether a write can be made
    /// conditional ([`CONDITIONAL_HEADERS`]), as sent.
    pub conditional: Vec<(String, Vec<u8>)>,
    /// The test build's fault header was sent.
    #[cfg(feature = "faults")]
    pub fault: bool,
}

impl Seen {
    /// The first value of one of [`CONDITIONAL_HEADERS`], if sent.
    pub fn conditional(&self, name: &str) -> Option<&[u8]> {
        self.conditional.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_slice())
    }

    /// The first value of each header the filter needs (names arrive lower-case).
    pub fn from(headers: Vec<(String, Vec<u8>)>, filter: &Filter) -> Seen {
        let mut seen = Seen::default();
        let resource_header = filter.config.resource.header();
        for (name, value) in headers {
            let slot = match name.as_str() {
                ":method" => Some(&mut seen.method),
                ":path" => Some(&mut seen.path),
                _ => None,
            };
            if let Some(slot) = slot {
                if slot.is_empty() {
                    *slot = value;
                }
                continue;
            }
            if name == ":authority" {
                if filter.config.protocol == Protocol::S3 {
                    seen.authority.get_or_insert(value);
                }
            } else if name == filter.config.token_header {
                seen.token.get_or_insert(value);
            } else if filter.config.token_metadata_header.as_deref() == Some(name.as_str()) {
                seen.metadata_token.get_or_insert(value);
            } else if Some(name.as_str()) == resource_header {
                seen.resource.get_or_insert(value);
            } else if name == "content-type" {
                seen.content_type.get_or_insert(value);
            } else if name == DESTINATION_HEADER {
                seen.destination.get_or_insert(value);
            } else if name == ADMITTED_HEADER {
                seen.admitted = true;
            } else if filter.config.conditional.is_some() && CONDITIONAL_HEADERS.contains(&name.as_str()) {
                seen.conditional.push((name, value));
                continue;
            }
            #[cfg(feature = "faults")]
            if filter.config.test_fault_header.as_deref() == Some(name.as_str()) {
                seen.fault = true;
            }
        }
        seen
    }
}
