//! What Fencekeeper's fuzz targets share: reference models written apart from the
//! code under test, the rules for header values, and inputs shaped like the
//! contract's values.
//!
//! Each target in `fuzz_targets/` checks one piece of the core or of the Envoy
//! filter against these, and panics (a libFuzzer crash) when they disagree.
//! tests/README.md ("Fuzzing") lists the targets and how to run them.
//!
//! # Layout
//! * [`etcd`]: the filter's etcd parser and stored values, before and after the
//!   store's checked records.
//! * [`model`]: the token grammar and the path-key decoding, as independent models.
//! * [`header`]: what a host may put in an HTTP or gRPC header, and what a reason
//!   line may hold.
//! * [`input`]: tokens with small components (so that marks and presented tokens
//!   meet), and token text with leading zeros.

pub mod etcd;
pub mod header;
pub mod input;
pub mod model;
