//! The way to etcd: one client of its v3 gRPC API for everything the library sends
//! etcd, the mark store ([`crate::store::EtcdStore`]), the provenance check
//! ([`crate::provenance::EtcdProvenance`]) and the lock of `fencekeeper lock`.
//!
//! What is sent is `fencekeeper-etcd-wire`'s (the messages, the key scheme, the
//! transactions, shared with the Envoy filter); this module carries it: one HTTP/2
//! connection (`channel.rs`), plaintext or TLS, with a user's token when the cluster
//! has authentication on (`client.rs`). It knows nothing of marks: the store's key
//! prefix is the store's.

mod channel;
mod client;

pub use client::{EtcdAuth, EtcdClient, EtcdOptions, EtcdTls};

use std::path::PathBuf;

/// Why a call to etcd, or setting up its client, failed: one line.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    /// The endpoint, TLS files or certificates cannot work as given; the line says
    /// what to change.
    #[error("{0}")]
    Settings(String),
    /// A file the settings name could not be read.
    #[error("{}: {error}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        error: std::io::Error,
    },
    /// etcd did not answer, or answered with a refusal or something unreadable.
    #[error("{0}")]
    Unavailable(String),
    /// etcd's authentication refused the user a key the call touched
    /// (PERMISSION_DENIED): the line says which call; a caller names the grant.
    #[error("{0}")]
    Denied(String),
}

/// A mark store's error: the line a gateway has always printed for an etcd that
/// cannot be used (`mark store unavailable: etcd at …`), or the file it could not read.
impl From<EtcdError> for crate::StoreError {
    fn from(e: EtcdError) -> crate::StoreError {
        match e {
            EtcdError::Io { path, error } => crate::StoreError::Io { path, error },
            EtcdError::Settings(line) | EtcdError::Unavailable(line) | EtcdError::Denied(line) => {
                crate::StoreError::Unavailable(line)
            }
        }
    }
}

/// The lock service's error, without the mark store's words.
impl From<EtcdError> for crate::ProvenanceError {
    fn from(e: EtcdError) -> crate::ProvenanceError {
        crate::ProvenanceError::Unavailable(e.to_string())
    }
}
