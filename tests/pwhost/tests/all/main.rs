//! The filter's `.wasm` in the in-process proxy-wasm host, under each profile. Tests fail
//! by panicking, with what the proxy answered.
#![allow(clippy::panic)]

mod common;
mod etcd_json;
mod http_contract;
pub mod modes;
mod strict;
mod tokens_contract;
