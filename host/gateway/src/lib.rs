//! The fencing gateway: a reverse proxy in front of an HTTP store that cannot compare
//! fencing tokens itself (a file server, an object store, a blind-write key/value
//! service). Each write carries the lock's fencing token; the gateway admits it
//! through a [`fencekeeper::Guard`] (the validator plus a mark store), refuses stale,
//! missing and malformed tokens with the refusal contract (docs/semantics.md), and orders
//! admitted writes on one resource so that a slow lower-token write cannot land after
//! a higher one (the [`gate`]).
//!
//! # Layout
//! * [`config`]: what the gateway fences and how (the same vocabulary as the Envoy filter).
//! * [`gate`]: the in-flight ordering gate, per resource.
//! * [`conditional`]: conditional writes: each admitted write sent with a precondition
//!   on the store's version, so the store refuses one that arrives late.
//! * [`ordered`]: what becomes of a fenced write once the guard and the gate decided.
//! * [`registry`]: the ordering gate across instances, in etcd.
//! * [`proxy`]: one request: read, admit, wait at the gate, forward, answer.
//! * [`refusal`]: refusal responses (HTTP status or gRPC status, one-line body).
//! * [`admin`]: the admin listener: `/metrics`, mark lookup, health.
//! * [`metrics`]: the counters and the latency histogram, in Prometheus text.
//! * [`server`]: listeners, connections, graceful shutdown.
//! * [`uploads`]: S3 multipart uploads and the token each started with (protocol s3).
//! * [`tls`]: TLS on the listener (its certificate reloaded when the files change)
//!   and to an `https://` upstream.

pub mod admin;
pub mod conditional;
pub mod config;
pub mod gate;
pub mod metrics;
pub mod ordered;
pub mod proxy;
pub mod refusal;
pub mod registry;
pub mod server;
pub mod tls;
pub mod uploads;

pub use config::{Config, ConfigError, ResourceFrom};
pub use server::{Listeners, ServeError, Server};

/// The body type the gateway sends and receives.
pub type Body = http_body_util::combinators::BoxBody<hyper::body::Bytes, hyper::Error>;
