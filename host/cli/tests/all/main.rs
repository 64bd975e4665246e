//! The `fencekeeper` command's tests, one binary (a module per topic): `cli` (the
//! commands end to end, against golden transcripts), `config_file` (settings from a
//! file, the environment and flags; `fencekeeper check`), `envoy_config` (the generated
//! Envoy configurations, against golden files), `lock` (`fencekeeper lock` without a
//! lock service), `nginx_config` (nginx and Kong configurations, against golden files
//! and loaded into the strict proxy-wasm test host), `reference` (`--version`,
//! `completions`, `man`). Run one with a filter on its module, e.g. `cargo test --release -p
//! fencekeeper-cli --test all envoy_config::`.

mod cli;
mod config_file;
mod deploy;
mod envoy_config;
mod lock;
mod nginx_config;
mod reference;
