//! Fencekeeper's etcd wire: the keys, messages and answers of etcd's v3 gRPC API,
//! written once for every host that talks to etcd: the proxy-wasm filter (through
//! `dispatch_grpc_call`, or `dispatch_http_call` to etcd's JSON API), and the library's mark store, provenance check and
//! `fencekeeper lock --etcd` (through its `EtcdClient`). No I/O: each host keeps its
//! own transport, and every answer is parsed as hostile bytes.
//!
//! One concept per module:
//!
//! * [`keys`]: where marks live (prefix + resource) and prefix ranges;
//! * [`mark`]: a mark as etcd holds it, its checked record;
//! * [`txn`]: the shapes of a transaction and of its answer;
//! * [`grpc`]: those shapes, leases and authentication as protobuf messages, and
//!   their answers parsed;
//! * [`json`]: the same messages through etcd's JSON API, for a host without gRPC
//!   calls (transcoded to and from protobuf, so `grpc`'s parsers judge every answer);
//! * [`auth`]: what an authentication may hand back;
//! * [`provenance`]: the reads and the rules that decide whether etcd issued a token
//!   (the lock's holder, the cluster's revision);
//! * [`flights`]: the shared in-flight registry, the ordering gate across instances;
//! * [`retention`]: the floor under forgotten marks, and the checkpoints that tell
//!   idle marks;
//! * [`error`]: the one error, a printable line, and how foreign text is quoted in it.
//!
//! The items of `keys`, `mark`, `txn`, `auth` and `error` are re-exported here, so a
//! host writes `fencekeeper_etcd_wire::{mark_key, Expect, WireError}`.

pub mod auth;
pub mod error;
pub mod flights;
pub mod grpc;
pub mod json;
pub mod keys;
pub mod mark;
pub mod provenance;
pub mod retention;
pub mod txn;

pub use auth::{AuthRefusal, MAX_TOKEN_BYTES};
pub use error::{excerpt, WireError, EXCERPT_BYTES};
pub use keys::{chain_key, mark_key, prefix_end, DEFAULT_PREFIX};
pub use mark::{mark_of, MarkError};
pub use txn::{Expect, KeyValue, Op, Range, TxnAnswer, MAX_CONFIRMS_PER_TXN};
