//! Fencekeeper's HTTP fencing engine: what an HTTP host does with a request, decided
//! once for every host that carries HTTP writes (the proxy-wasm filter in Envoy and
//! other proxy-wasm hosts, the gateway behind `fencekeeper serve`).
//!
//! The engine does no I/O. A host hands it what it read (a request's head, a verdict,
//! the store's answer) and gets back a value saying what to do: the exact answer to
//! send, the edits to make to a request it forwards, what to remember of the store's
//! answer. The host keeps only its plumbing: Envoy's callbacks and shared data, or
//! hyper and tokio. So two hosts cannot answer the same request differently, and a
//! behaviour is written, and tested, once. docs/architecture.md ("The HTTP engine")
//! says what the engine owns, what each host owns, and what is still to move here.
//!
//! # Layout
//! * [`answer`]: every answer the fence gives itself, refusal or error, as status,
//!   headers and body, in the form the client reads (text, S3's XML, gRPC).
//! * [`gate`]: the ordering gate's and the start grace's defaults, what a flight's
//!   end means, and the gate's own refusals (503 with `Retry-After`).
//! * [`flights`]: the ordering gate as a machine: the writes an instance sent that
//!   the store may still apply, the writes held for them, and when each goes.
//! * [`early`]: what a fenced write is refused for on its head alone (malformed, not
//!   conditional, too large, the start grace), in one order for every host.
//! * [`head`]: a request's head classified: the path it writes as the store sees it,
//!   whether the fence is in its way, the resources and the token it presents.
//! * [`forward`]: what a forwarded request carries of the fence's decision, and what
//!   of the client's it never carries.
//! * [`uploads`]: S3 multipart uploads: which step a write is, what a host remembers
//!   of the store's answer, and how much.
//! * [`conditional`]: conditional writes around a version chain: the precondition a
//!   write carries, what the chain's refusals and the store's answers mean for the
//!   client, what a read teaches, and what each outcome counts.
#![forbid(unsafe_code)]

pub mod answer;
pub mod conditional;
pub mod early;
pub mod flights;
pub mod forward;
pub mod gate;
pub mod head;
pub mod uploads;

pub use answer::{Answer, Failure, Form};
