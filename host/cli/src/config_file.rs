//! The configuration file: the settings of `serve`, `envoy-config` and `nginx-config`
//! in one TOML schema (docs/configuration.md).
//!
//! A key is a flag's long name, its value what the flag takes: a string, a number,
//! `true`/`false` for a switch, a list for a comma-separated flag. Top-level keys are
//! for every command that has the setting; a `[serve]`, `[envoy-config]` or
//! `[nginx-config]` table holds keys for that command alone and wins over the top
//! level. Each setting is taken from the first of: the command line, the environment
//! (`FENCEKEEPER_<NAME>`), the file, the default.
//!
//! The file's settings enter the command line as flags, before the user's, and only
//! for settings that neither the command line nor the environment gives. So clap
//! checks them exactly as it checks flags (values, conflicts, requirements), and a
//! flag or a variable always wins. Each value is checked first on its own, so that an
//! error names the key it came from.

use anyhow::{anyhow, Context, Result};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The commands a file configures; a table of the same name holds keys for one alone.
pub const COMMANDS: [&str; 3] = ["serve", "envoy-config", "nginx-config"];

/// The flag that names the file, and the variable that does when no flag does.
const FLAG: &str = "config";
const ENV: &str = "FENCEKEEPER_CONFIG";

/// A configuration is a page: a larger file is refused rather than read.
const MAX_BYTES: u64 = 1 << 20;

/// Flags that say what to do rather than how: not settings, so not in a file.
const NOT_SETTINGS: [&str; 3] = ["help", "config", "check"];

/// The variable a flag can also come from: `--gate-timeout` from `FENCEKEEPER_GATE_TIMEOUT`.
fn env_name(long: &str) -> String {
    format!("FENCEKEEPER_{}", long.to_ascii_uppercase().replace('-', "_"))
}

/// `--config FILE` on each configurable command.
pub fn with_config_flag(cli: Command) -> Command {
    COMMANDS.iter().fold(cli, |cli, name| {
        cli.mut_subcommand(name, |sub| {
            sub.arg(
                Arg::new(FLAG)
                    .long(FLAG)
                    .value_name("FILE")
                    .value_parser(clap::value_parser!(PathBuf))
                    .help_heading("Settings")
                    .help(
                        "Read settings from this TOML file (docs/configuration.md): a key per flag, \
                         `gate-timeout = \"5s\"`. A flag or a FENCEKEEPER_* variable wins over the file; \
                         `fencekeeper check FILE` checks it.",
                    ),
            )
        })
    })
}

/// Every setting of a configurable command can come from `FENCEKEEPER_<NAME>`.
pub fn with_environment(cli: Command) -> Command {
    COMMANDS.iter().fold(cli, |cli, name| {
        cli.mut_subcommand(name, |sub| {
            let named: Vec<(clap::Id, String)> = sub
                .get_arguments()
                .filter(|a| is_setting(a) || a.get_long() == Some(FLAG))
                .filter_map(|a| Some((a.get_id().clone(), a.get_long()?.to_owned())))
                .collect();
            named.into_iter().fold(sub, |sub, (id, long)| sub.mut_arg(id, |a| a.env(env_name(&long))))
        })
    })
}

fn is_setting(arg: &Arg) -> bool {
    let Some(long) = arg.get_long() else { return false };
    !arg.is_hide_set()
        && !NOT_SETTINGS.contains(&long)
        && !matches!(arg.get_action(), ArgAction::Help | ArgAction::Version | ArgAction::HelpLong)
}

/// One setting the file gives a command, as the flag it becomes.
pub struct Setting {
    /// The key as written (`gate-timeout`, or `serve.gate-timeout` in a table).
    key: String,
    id: clap::Id,
    long: String,
    /// The flag and its value (none for a switch set to false).
    args: Vec<String>,
}

/// A file's settings, as put into a command line.
pub struct Applied {
    file: File,
    settings: Vec<Setting>,
}

impl Applied {
    /// An error clap gave about the command line, with the keys of the file's flags named.
    pub fn explain(&self, error: &str) -> String {
        self.file.explain(&self.settings, error)
    }
}

/// A configuration file, read and parsed.
pub struct File {
    pub path: PathBuf,
    table: toml::Table,
}

impl File {
    /// Read `path`: at most [`MAX_BYTES`], UTF-8, TOML. An error names the file, and
    /// the line for a syntax error.
    pub fn read(path: &Path) -> Result<File> {
        let shown = path.display();
        let size = std::fs::metadata(path).with_context(|| format!("--config {shown}: cannot read it"))?.len();
        anyhow::ensure!(size <= MAX_BYTES, "{shown}: {size} bytes; a configuration file is at most {MAX_BYTES}");
        let text = std::fs::read_to_string(path).with_context(|| format!("{shown}: cannot read it as UTF-8 text"))?;
        let table = text.parse::<toml::Table>().map_err(|e| {
            // Lines before the error's first byte, counted in bytes (no char boundary needed).
            let line = e
                .span()
                .map_or(0, |s| text.as_bytes()[..s.start.min(text.len())].iter().filter(|b| **b == b'\n').count() + 1);
            anyhow!("{shown}:{line}: {} (not valid TOML)", e.message().trim_end())
        })?;
        Ok(File { path: path.to_owned(), table })
    }

    /// The settings the file gives command `name` of `cli`, or every error found, each
    /// naming its key.
    pub fn settings(&self, cli: &Command, name: &str) -> Result<Vec<Setting>, Vec<String>> {
        let command = subcommand(cli, name);
        let mut settings: Vec<Setting> = Vec::new();
        let mut errors = Vec::new();
        let mut put = |found: Result<Option<Setting>, String>| match found {
            Ok(Some(s)) => {
                settings.retain(|earlier| earlier.id != s.id);
                settings.push(s);
            }
            Ok(None) => {}
            Err(e) => errors.push(e),
        };
        // The top level first: a command's own table then replaces what it sets.
        let own = match self.table.get(name) {
            Some(toml::Value::Table(own)) => Some(own),
            _ => None,
        };
        for (key, value) in &self.table {
            // What the command's table sets, the top level does not (not even wrongly).
            if own.is_some_and(|own| own.contains_key(key)) {
                continue;
            }
            if !COMMANDS.contains(&key.as_str()) {
                put(self.top_level(cli, command, key, value));
            } else if !value.is_table() {
                put(Err(format!("`{key}` must be a table of {key}'s own settings ([{key}])")));
            }
        }
        if let Some(own) = own {
            for (key, value) in own {
                let shown = format!("{name}.{key}");
                put(match setting_arg(command, key) {
                    Some(arg) => to_setting(arg, &shown, value).map(Some),
                    None => Err(format!("`{shown}`: {}", unknown(cli, key, Some(name)))),
                });
            }
        }
        if errors.is_empty() {
            Ok(settings)
        } else {
            Err(errors)
        }
    }

    fn top_level(
        &self,
        cli: &Command,
        command: &Command,
        key: &str,
        value: &toml::Value,
    ) -> Result<Option<Setting>, String> {
        if let Some(arg) = setting_arg(command, key) {
            return to_setting(arg, key, value).map(Some);
        }
        // Another command's setting: that command takes it.
        let elsewhere = COMMANDS.iter().any(|other| setting_arg(subcommand(cli, other), key).is_some());
        if elsewhere {
            Ok(None)
        } else {
            Err(format!("`{key}`: {}", unknown(cli, key, None)))
        }
    }

    /// The command line `args` names a file for: the file's settings put in before
    /// the user's flags, for the settings that neither those flags nor the
    /// environment give. Also returned: what was put in, to name in a later error.
    pub fn merge(cli: &Command, args: Vec<OsString>) -> Result<(Vec<OsString>, Option<Applied>)> {
        let Some(name) = args.get(1).and_then(|a| a.to_str()).filter(|a| COMMANDS.contains(a)).map(str::to_owned)
        else {
            return Ok((args, None));
        };
        let Some(path) = named_file(&args) else { return Ok((args, None)) };
        let file = File::read(&path)?;
        let settings = file.settings(cli, &name).map_err(|errors| {
            let more = match errors.len() {
                1 => String::new(),
                n => format!(" (and {} more: `fencekeeper check {}` lists them)", n - 1, path.display()),
            };
            anyhow!("{}: {}{more}", path.display(), errors[0])
        })?;
        // What the command line and the environment give, read without requiring
        // anything (the file may be what gives a required setting). A command line
        // that does not parse is left for the real parse to explain.
        let given = match relaxed(cli, &name).try_get_matches_from(&args) {
            Ok(matches) => {
                let sub = matches.subcommand_matches(&name).cloned();
                move |s: &Setting| {
                    sub.as_ref()
                        .and_then(|m| m.value_source(s.id.as_str()))
                        .is_some_and(|source| matches!(source, ValueSource::CommandLine | ValueSource::EnvVariable))
                }
            }
            Err(_) => return Ok((args, None)),
        };
        let settings: Vec<Setting> = settings.into_iter().filter(|s| !given(s)).collect();
        let mut merged: Vec<OsString> = args[..2].to_vec();
        merged.extend(settings.iter().flat_map(|s| s.args.iter().map(OsString::from)));
        merged.extend(args.into_iter().skip(2));
        Ok((merged, Some(Applied { file, settings })))
    }

    /// The command line of `name` made of the file's settings alone.
    pub fn command_line(settings: &[Setting], name: &str) -> Vec<String> {
        ["fencekeeper", name]
            .into_iter()
            .map(str::to_owned)
            .chain(settings.iter().flat_map(|s| s.args.clone()))
            .collect()
    }

    /// An error clap gave about flags that came from this file, with the keys named.
    pub fn explain(&self, settings: &[Setting], error: &str) -> String {
        let keys: Vec<String> = settings
            .iter()
            .filter(|s| names_flag(error, &s.long))
            .map(|s| format!("--{} is `{}`", s.long, s.key))
            .collect();
        if keys.is_empty() {
            error.to_owned()
        } else {
            format!("{error} (from {}: {})", self.path.display(), keys.join(", "))
        }
    }
}

/// Whether `text` names the flag `--long` (not one it is the start of).
fn names_flag(text: &str, long: &str) -> bool {
    let flag = format!("--{long}");
    text.match_indices(&flag)
        .any(|(at, _)| !text[at + flag.len()..].chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '-'))
}

/// `--config FILE` (or `--config=FILE`) before a `--`, else `FENCEKEEPER_CONFIG`.
fn named_file(args: &[OsString]) -> Option<PathBuf> {
    let mut rest = args.iter().skip(2);
    while let Some(arg) = rest.next() {
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            return rest.next().map(PathBuf::from);
        }
        if let Some(path) = arg.to_str().and_then(|a| a.strip_prefix("--config=")) {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os(ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
}

fn subcommand<'c>(cli: &'c Command, name: &str) -> &'c Command {
    cli.find_subcommand(name).expect("a configurable command is a subcommand")
}

fn setting_arg<'c>(command: &'c Command, key: &str) -> Option<&'c Arg> {
    command.get_arguments().find(|a| a.get_long() == Some(key) && is_setting(a))
}

/// `cli` with nothing of command `name` required.
fn relaxed(cli: &Command, name: &str) -> Command {
    cli.clone().mut_subcommand(name, |sub| {
        let ids: Vec<clap::Id> = sub.get_arguments().map(|a| a.get_id().clone()).collect();
        ids.into_iter().fold(sub, |sub, id| sub.mut_arg(id, |a| a.required(false)))
    })
}

/// Why `key` is no setting (of the command `only`, or of any): renamed, misspelt, or
/// unknown.
fn unknown(cli: &Command, key: &str, only: Option<&str>) -> String {
    let commands: Vec<&Command> = COMMANDS.iter().map(|name| subcommand(cli, name)).collect();
    let args = || commands.iter().flat_map(|c| c.get_arguments()).filter(|a| is_setting(a));
    if let Some(renamed) = args().find(|a| a.get_all_aliases().is_some_and(|aliases| aliases.contains(&key))) {
        return format!("renamed: write `{}`", renamed.get_long().unwrap_or_default());
    }
    if NOT_SETTINGS.contains(&key) {
        return format!("not a setting: `--{key}` says what to do, give it on the command line");
    }
    if let Some(name) = only {
        let owners: Vec<&str> =
            COMMANDS.iter().copied().filter(|c| setting_arg(subcommand(cli, c), key).is_some()).collect();
        if !owners.is_empty() {
            return format!("not a setting of {name} (only of {}): move it out of [{name}]", owners.join(", "));
        }
    }
    let mut names: Vec<&str> = args().filter_map(Arg::get_long).collect();
    names.sort_unstable();
    names.dedup();
    match names.iter().filter(|n| edit_distance(key, n) <= 2).min_by_key(|n| edit_distance(key, n)) {
        Some(near) => format!("unknown setting; did you mean `{near}`?"),
        None => "unknown setting (docs/configuration.md lists them)".to_owned(),
    }
}

/// The flag a key's TOML value becomes, its value checked by the flag's own parser.
fn to_setting(arg: &Arg, key: &str, value: &toml::Value) -> Result<Setting, String> {
    let long = arg.get_long().unwrap_or_default().to_owned();
    let wrong = |expected: &str| format!("`{key}`: expected {expected}, found {}", value.type_str());
    let args = if matches!(arg.get_action(), ArgAction::SetTrue) {
        match value {
            toml::Value::Boolean(true) => vec![format!("--{long}")],
            toml::Value::Boolean(false) => Vec::new(),
            _ => return Err(wrong("true or false")),
        }
    } else {
        let text = match value {
            toml::Value::String(s) => s.clone(),
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Array(items) if is_list(arg) => items
                .iter()
                .map(|item| item.as_str().map(str::to_owned).ok_or_else(|| wrong("a list of strings")))
                .collect::<Result<Vec<_>, _>>()?
                .join(","),
            _ if is_list(arg) => return Err(wrong("a string or a list of strings")),
            _ => return Err(wrong("a string")),
        };
        check_value(arg, &text).map_err(|reason| format!("`{key}`: {reason}"))?;
        vec![format!("--{long}={text}")]
    };
    Ok(Setting { key: key.to_owned(), id: arg.get_id().clone(), long, args })
}

/// A flag that takes a comma-separated list (its value name says `...`).
fn is_list(arg: &Arg) -> bool {
    arg.get_value_names().is_some_and(|names| names.iter().any(|n| n.as_str().contains("...")))
}

/// `text` through `arg`'s own value parser, alone: its reason if refused.
fn check_value(arg: &Arg, text: &str) -> Result<(), String> {
    let probe = Arg::new("value").long("value").action(ArgAction::Set).value_parser(arg.get_value_parser().clone());
    let parsed =
        Command::new("probe").no_binary_name(true).arg(probe).try_get_matches_from([format!("--value={text}")]);
    let Err(e) = parsed else { return Ok(()) };
    let rendered = e.to_string();
    let mut lines = rendered.lines();
    let first = lines.next().unwrap_or("invalid value");
    let mut reason = first.strip_prefix("error: ").unwrap_or(first).replace(" for '--value <value>'", "");
    if let Some(values) = lines.map(str::trim).find(|l| l.starts_with("[possible values:")) {
        reason = format!("{reason} {values}");
    }
    Err(reason)
}

/// Levenshtein distance, for "did you mean".
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let next = (row[j + 1] + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = row[j + 1];
            row[j + 1] = next;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::edit_distance;

    #[test]
    fn edit_distance_counts_insertions_deletions_and_substitutions() {
        assert_eq!(edit_distance("gate-timeout", "gate-timeout"), 0);
        assert_eq!(edit_distance("gate-timout", "gate-timeout"), 1);
        assert_eq!(edit_distance("upstraem", "upstream"), 2);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
