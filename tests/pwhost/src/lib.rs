//! An in-process proxy-wasm host for the filter's tests.
//!
//! It loads the filter's `.wasm` (guest/artifacts/fencekeeper_filter.wasm) on the
//! wasmtime the project already builds, implements the host calls the filter
//! imports, and drives requests through it on a virtual clock: no Envoy, no nginx,
//! no sockets, no sleeps. Two profiles ([`Profile`]) say which host it behaves as:
//! Envoy, or ngx_wasm_module's documented limits (`strict`), so that the tests hold
//! the filter to a host that is not Envoy without building or shipping one.
//!
//! # Layout
//! * [`profile`]: the capabilities of each host.
//! * [`abi`]: status codes, map and property encodings, guest memory.
//! * [`imports`]: the host calls.
//! * [`vm`]: one worker's VM and its streams.
//! * [`world`]: what the workers share (clock, shared data, queues, metrics, log).
//! * [`proxy`]: the driver: workers, requests, the upstream, time.

pub mod abi;
pub mod imports;
pub mod profile;
pub mod proxy;
pub mod vm;
pub mod world;

pub use profile::{ConfigureFailure, Profile};
pub use proxy::{Answer, Answerer, Binary, CallId, Error, Proxy, Request, State, StreamId};
pub use vm::{CallAnswer, Callout};
