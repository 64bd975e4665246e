//! The `fencekeeper` command.
//!
//! Exit codes follow ripgrep's convention: 0 success (admitted), 1 refused (or a
//! conformance failure), 2 error. Errors are printed whole, once, here.
//!
//! One module per subcommand.

/// `println!` for a command's answers, through [`output::line`]: a reader that goes
/// away ends the output, not the command.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

mod admit;
mod check;
mod compaction;
mod completions;
mod config_file;
mod conformance;
mod envoy_config;
mod etcd_connection;
mod lock;
mod man;
mod marks;
mod nginx_config;
mod output;
mod protocol;
mod provenance;
mod repair;
mod serve;
mod version;

use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// Fencing for resources that cannot compare tokens.
#[derive(Parser)]
#[command(name = "fencekeeper", version = VERSION, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// One value per process, parsed once: its size costs nothing.
#[allow(clippy::large_enum_variant)]
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
    /// Print an nginx (ngx_wasm_module) or Kong configuration that fences an upstream with the filter.
    NginxConfig(nginx_config::Args),
    /// Run the fencing gateway: a reverse proxy in front of a store.
    Serve(Box<serve::Args>),
    /// Hold a lock in etcd, ZooKeeper or Redis while a command runs, and give it the lock's fencing token.
    Lock(lock::Args),
    /// Check a configuration file for serve, envoy-config and nginx-config, naming the key of each error.
    Check(check::Args),
    /// Print tab completions for bash, zsh, fish, elvish or PowerShell.
    Completions(completions::Args),
    /// Print the manual page, or write one per command into a directory.
    Man(man::Args),
}

/// `-V`: the release and the commit; `--version` adds the bundled guests' hashes.
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("FENCEKEEPER_COMMIT"), ")");

/// The command's definition: the derived one, with `--config` and the
/// `FENCEKEEPER_*` variables of the configurable commands.
fn definition() -> clap::Command {
    config_file::with_environment(config_file::with_config_flag(Cli::command()))
}

fn main() -> ExitCode {
    let mut command = definition();
    if std::env::args_os().any(|a| a == "--version") {
        // Hashing the bundled guests costs a few milliseconds: only when asked.
        command = command.long_version(version::long());
    }
    // A configuration file's settings join the command line as flags (config_file.rs).
    let (args, from_file) = match config_file::File::merge(&command, std::env::args_os().collect()) {
        Ok(merged) => merged,
        Err(e) => {
            eprintln!("fencekeeper: {e:#}");
            return ExitCode::from(2);
        }
    };
    let cli = match command.try_get_matches_from(args).and_then(|m| Cli::from_arg_matches(&m)) {
        Ok(cli) => cli,
        Err(e) => {
            let explain = |line: &str| match &from_file {
                Some(applied) => applied.explain(line),
                None => line.to_owned(),
            };
            return usage_error(&e, explain);
        }
    };
    let result = match cli.command {
        Command::Admit(a) => admit::run(a),
        Command::Marks(a) => marks::run(a),
        Command::Conformance(a) => conformance::run(a),
        Command::EnvoyConfig(a) => envoy_config::run(a),
        Command::NginxConfig(a) => nginx_config::run(a),
        Command::Serve(a) => serve::run(*a),
        Command::Lock(a) => lock::run(a),
        Command::Check(a) => check::run(a, config_file::with_config_flag(Cli::command())),
        Command::Completions(a) => completions::run(a, definition()),
        Command::Man(a) => man::run(a, definition()),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("fencekeeper: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// A bad command line: one `fencekeeper:` line and exit 2, like every other error
/// (clap's multi-line usage text is for `--help`). Help and version print as usual.
/// `explain` adds where a flag came from (a configuration file's key).
fn usage_error(e: &clap::Error, explain: impl Fn(&str) -> String) -> ExitCode {
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
        let _ = e.print();
        return ExitCode::SUCCESS;
    }
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let _ = e.print();
        return ExitCode::from(2);
    }
    let rendered = e.to_string();
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or("bad command line");
    let mut line = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    // "the following required arguments were not provided:" lists them on indented lines.
    if line.ends_with(':') {
        let listed: Vec<&str> = lines.clone().take_while(|l| l.starts_with("  ")).map(str::trim).collect();
        line = format!("{line} {}", listed.join(" "));
    }
    // What clap adds that the user needs: the valid values, and its suggestion ("a
    // similar subcommand exists: 'serve'").
    for extra in lines.map(str::trim) {
        if extra.starts_with("[possible values:") {
            line = format!("{line} {extra}");
        } else if extra.starts_with("tip:") {
            line = format!("{line}; {extra}");
        }
    }
    eprintln!("fencekeeper: {}; see fencekeeper --help", explain(&line));
    ExitCode::from(2)
}
