//! `fencekeeper check FILE`: a configuration file checked for every command that
//! reads it, without serving, probing or writing anything.
//!
//! Each key is checked (known, of the right type, a value its flag takes); then each
//! command's settings from the file alone are checked together (conflicts,
//! requirements) and as the command itself would (`serve --check`; the
//! configuration `envoy-config` and `nginx-config` would print). The environment is
//! not read: the verdict is the file's. A command the file leaves without a required
//! setting (`upstream`) is named, not failed: a flag can give it.

use crate::config_file::{File, Setting, COMMANDS};
use clap::error::ErrorKind;
use clap::{Command, FromArgMatches};
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `fencekeeper check`.
#[derive(clap::Args)]
#[command(after_help = "Examples:
  fencekeeper check /etc/fencekeeper/fencekeeper.toml
  fencekeeper serve --config /etc/fencekeeper/fencekeeper.toml")]
pub struct Args {
    /// The configuration file (TOML; docs/configuration.md).
    #[arg(value_name = "FILE")]
    file: PathBuf,
}

/// Check the file against `cli` (the commands' definitions, without the environment).
/// 0 when every command can use it, 2 with one line per error.
pub fn run(args: Args, cli: Command) -> anyhow::Result<ExitCode> {
    let file = File::read(&args.file)?;
    let shown = file.path.display().to_string();
    // Each error, with the commands that found it: a top-level key is judged by
    // every command that has the setting, mostly alike.
    let mut errors: Vec<(String, Vec<&str>)> = Vec::new();
    let mut found = |error: String, name| match errors.iter_mut().find(|(e, _)| *e == error) {
        Some((_, names)) => names.push(name),
        None => errors.push((error, vec![name])),
    };
    let mut usable = String::new();
    for name in COMMANDS {
        match file.settings(&cli, name) {
            Ok(settings) => match verdict(&cli, &file, &settings, name) {
                Ok(line) => usable.push_str(&format!("{shown}: {name}: {line}\n")),
                Err(e) => found(e, name),
            },
            Err(errors) => errors.into_iter().for_each(|e| found(e, name)),
        }
    }
    crate::output::text(usable.as_bytes())?;
    for (e, names) in &errors {
        // A key in a command's table names its command already.
        let own_table = names.len() == 1 && e.starts_with(&format!("`{}.", names[0]));
        let whose = if names.len() == COMMANDS.len() || own_table {
            String::new()
        } else {
            format!(" (for {})", names.join(", "))
        };
        eprintln!("fencekeeper: {shown}: {e}{whose}");
    }
    Ok(if errors.is_empty() { ExitCode::SUCCESS } else { ExitCode::from(2) })
}

/// What command `name` makes of the file's settings alone.
fn verdict(cli: &Command, file: &File, settings: &[Setting], name: &str) -> Result<String, String> {
    let matches = match cli.clone().try_get_matches_from(File::command_line(settings, name)) {
        Ok(m) => m,
        // A setting every run needs (`upstream`), not one another setting requires.
        Err(e) if e.kind() == ErrorKind::MissingRequiredArgument && needs_only_required(cli, name, &e) => {
            let missing = missing_flags(&e);
            return Ok(format!(
                "not runnable from the file alone: give {} (a flag or a variable will do)",
                missing.join(", ")
            ));
        }
        Err(e) => {
            let first = e.to_string();
            let first = first.lines().next().unwrap_or_default();
            return Err(file.explain(settings, first.strip_prefix("error: ").unwrap_or(first)));
        }
    };
    let sub = matches.subcommand_matches(name).expect("the command parsed");
    let checked = match name {
        "serve" => crate::serve::Args::from_arg_matches(sub).map(|a| crate::serve::verify(&a)),
        "envoy-config" => crate::envoy_config::Args::from_arg_matches(sub).map(|a| crate::envoy_config::verify(&a)),
        _ => crate::nginx_config::Args::from_arg_matches(sub).map(|a| crate::nginx_config::verify(&a)),
    };
    checked.map_err(|e| e.to_string())?.map_err(|e| file.explain(settings, &format!("{e:#}")))
}

/// The flags (without dashes) a "required arguments were not provided" error lists.
fn missing_flags(e: &clap::Error) -> Vec<String> {
    e.to_string()
        .lines()
        .filter(|l| l.starts_with("  --"))
        .filter_map(|l| l.trim().split([' ', '=']).next())
        .map(|flag| flag.trim_start_matches('-').to_owned())
        .collect()
}

/// Whether every flag the error misses is required by the command itself.
fn needs_only_required(cli: &Command, name: &str, e: &clap::Error) -> bool {
    let Some(command) = cli.find_subcommand(name) else { return false };
    missing_flags(e)
        .iter()
        .all(|flag| command.get_arguments().any(|a| a.get_long() == Some(flag.as_str()) && a.is_required_set()))
}
