//! The `fencekeeper` command.
//!
//! Exit codes follow ripgrep's convention: 0 success (admitted), 1 refused (or a
//! conformance failure), 2 error. Errors are printed whole, once, here.
//!
//! One module per subcommand.

mod admit;
mod conformance;
mod demo;
mod envoy_config;
mod marks;
mod repair;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Fencing for resources that cannot compare tokens.
#[derive(Parser)]
#[command(name = "fencekeeper", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Decide on one write: admit or refuse a token for a resource, advancing its mark.
    Admit(admit::Args),
    /// List or inspect the marks in a store; verify, repair (raise only) or upgrade it.
    Marks(marks::Args),
    /// Run the conformance vectors against a guest component and print a table.
    Conformance(conformance::Args),
    /// Print an Envoy configuration that fences an upstream with the proxy-wasm filter.
    EnvoyConfig(envoy_config::Args),
    /// Run the fencing gateway: a reverse proxy in front of a store.
    Serve(serve::Args),
    /// Run the lock-and-pause scenario with and without fencing.
    Demo(demo::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Admit(a) => admit::run(a),
        Command::Marks(a) => marks::run(a),
        Command::Conformance(a) => conformance::run(a),
        Command::EnvoyConfig(a) => envoy_config::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Demo(a) => demo::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencekeeper: {e:#}");
            ExitCode::from(2)
        }
    }
}
