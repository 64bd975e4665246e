//! `--protocol http|webdav|s3` (and `--s3-domain`), as `serve` and `envoy-config` take it: which of the
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
    /// S3: HTTP's reads; a write's resource is its path-style path (/BUCKET/KEY,
    /// with --s3-domain also for virtual-hosted-style requests); the token may also
    /// come as object metadata (x-amz-meta- + the token header); a POST to a bucket
    /// (DeleteObjects) is refused.
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

    /// `--s3-domain`, checked: a lower-case DNS name, and only with `s3`.
    pub fn s3_domain(self, domain: Option<&str>) -> anyhow::Result<Option<String>> {
        let Some(domain) = domain else { return Ok(None) };
        anyhow::ensure!(self == ProtocolArg::S3, "--s3-domain goes with --protocol s3");
        fencekeeper_core::s3::check_domain(domain)
            .map_err(|why| anyhow::anyhow!("bad --s3-domain {domain:?}: {why}"))?;
        Ok(Some(domain.to_owned()))
    }
}
