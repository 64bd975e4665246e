//! The C ABI's tests, one binary (a module per topic): `abi` (the exported functions
//! called as a C caller calls them), `c_callers` (real C programs compiled against the
//! header and linked against the library), `header` (the committed header is what
//! cbindgen makes of the source), `tokens_contract` (the token table every host
//! runs). Run one with a filter on its module, e.g. `cargo test --release -p
//! fencekeeper-capi --test all header::`.

mod abi;
mod c_callers;
mod header;
mod tokens_contract;
