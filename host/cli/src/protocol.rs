//! `--protocol http|webdav`, as `serve` and `envoy-config` take it: which of the
//! store's methods read and pass unfenced, and which resources a write names (the
//! core's `protocol` module holds the rules; docs/clients.md says what each lets
//! through).

use fencekeeper_core::Protocol;

/// The store's protocol, as a command-line value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProtocolArg {
    /// Every method but GET, HEAD and OPTIONS is a write of its path.
    #[default]
    Http,
    /// WebDAV: PROPFIND, REPORT and SEARCH read too; COPY writes its Destination,
    /// MOVE its path and its Destination.
    Webdav,
    /// S3, path-style (/BUCKET/KEY): HTTP's reads; the token may also come as object
    /// metadata (x-amz-meta- + the token header); a POST to a bucket (DeleteObjects)
    /// is refused.
    S3,
}

impl ProtocolArg {
    /// The core's protocol.
    pub fn protocol(self) -> Protocol {
        match self {
            ProtocolArg::Http => Protocol::Http,
            ProtocolArg::Webdav => Protocol::Webdav,
            ProtocolArg::S3 => Protocol::S3,
        }
    }
}
