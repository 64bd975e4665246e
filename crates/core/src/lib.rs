//! Fencekeeper's core: the fencing decision and the token codec.
//!
//! This crate is the one place where Fencekeeper's policy lives. Every build of the
//! guest (the WebAssembly component, the proxy-wasm filter) and every host adapter
//! that maps a verdict to a response calls into it; none keeps a copy of its rules.
//! It is `no_std`, allocates nothing, performs no I/O and never panics on input, so
//! it compiles unchanged to `wasm32-unknown-unknown` and natively.
//!
//! # Layout
//! * [`token`]: parsing and comparing fencing tokens (`34`, `7.1042`).
//! * [`resource`]: the rules for resource keys.
//! * [`decision`]: the verdict for a presented token against a mark.
//! * [`gate`]: when an admitted write may go to the store (the ordering gate's rule:
//!   no lower-token write may still land after it).
//! * [`http`]: the HTTP vocabulary of every HTTP host: the resource key of a
//!   request, the rendering of a refusal.
//! * [`protocol`]: the store's protocol (plain HTTP, WebDAV, S3): which methods are
//!   fenced, and which resources a write names.
//! * [`s3`]: S3 addressing: the bucket a request names in its path or host name.
//! * [`refusal`]: what a host does with a verdict: forward, or refuse with which
//!   HTTP / gRPC status, under which mode.
//! * [`verify`]: a host's check of a validator's verdict against what it knows.
//! * [`short_text`]: a short token text packed into words, as the validator
//!   component's `decide-short` carries it.
//! * [`record`]: a stored mark: key, token and CRC32C in one checked text record,
//!   the one format of every store (file, etcd, the Envoy filter).
//! * [`audit`]: the audit record of a change of a mark, one JSON line, the one
//!   format of every host.
#![no_std]
#![forbid(unsafe_code)]

#[cfg(test)]
extern crate std;

pub mod audit;
pub mod decision;
pub mod gate;
pub mod http;
pub mod protocol;
pub mod record;
pub mod refusal;
pub mod resource;
pub mod s3;
pub mod short_text;
pub mod token;
pub mod verify;

pub use decision::{decide, precheck, Mode, Policy, Verdict};
pub use protocol::{Protocol, Writes};
pub use refusal::{Action, Class, NoVerdict};
pub use resource::ResourceError;
pub use token::{Malformed, Token};
