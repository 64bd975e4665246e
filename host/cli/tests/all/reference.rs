//! What the command says about itself: `--version` (the commit and the bundled
//! guests' hashes), `completions` (used by a real bash), `man` (roff pages).

// A test states its expectations by panicking.
#![allow(clippy::panic, clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fencekeeper");

fn fencekeeper(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    text(&out.stdout).split_whitespace().next().unwrap().to_owned()
}

#[test]
fn the_version_names_the_commit_and_the_bundled_guests_by_their_hashes() {
    let out = fencekeeper(&["--version"]);
    assert!(out.status.success());
    let version = text(&out.stdout);
    let artifacts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/artifacts");
    let filter = sha256(&artifacts.join("fencekeeper_filter.wasm"));
    let validator = sha256(&artifacts.join("fencekeeper_validator.wasm"));
    assert!(version.contains(&format!("filter sha256:{filter}")), "{version}");
    assert!(version.contains(&format!("validator sha256:{validator}")), "{version}");
    let head = Command::new("git").args(["rev-parse", "--short=12", "HEAD"]).output().unwrap();
    if head.status.success() {
        // Built from this checkout (the build records HEAD as it was then).
        let commit = version.lines().nth(1).unwrap_or_default();
        assert!(commit.starts_with("commit ") && commit.len() == "commit ".len() + 12, "{version}");
    }
    let short = text(&fencekeeper(&["-V"]).stdout);
    assert!(short.starts_with("fencekeeper 0.") && short.contains("(commit "), "{short}");
}

#[test]
fn bash_completes_commands_and_flags_from_the_generated_script() {
    let out = fencekeeper(&["completions", "bash"]);
    assert!(out.status.success());
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fencekeeper.bash");
    std::fs::write(&script, &out.stdout).unwrap();
    // What bash offers after `fencekeeper se<TAB>` and `fencekeeper serve --etcd-pr<TAB>`.
    let complete = |words: &str, word: usize| {
        let probe = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD={word}; COMP_LINE='{words}'; COMP_POINT=${{#COMP_LINE}}; \
             _fencekeeper fencekeeper \"${{COMP_WORDS[COMP_CWORD]}}\" \"${{COMP_WORDS[COMP_CWORD-1]}}\"; echo \"${{COMPREPLY[@]}}\"",
            script.display()
        );
        let out = Command::new("bash").args(["--noprofile", "--norc", "-c", &probe]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout).trim().to_owned()
    };
    assert_eq!(complete("fencekeeper se", 1), "serve");
    assert_eq!(complete("fencekeeper serve --etcd-pr", 2), "--etcd-prefix");
    for shell in ["zsh", "fish"] {
        let out = fencekeeper(&["completions", shell]);
        assert!(out.status.success() && text(&out.stdout).contains("envoy-config"), "{shell}");
    }
    let out = fencekeeper(&["completions", "tcsh"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("[possible values: bash, elvish, fish, powershell, zsh]"), "{out:?}");
}

#[test]
fn man_prints_a_page_or_writes_one_per_command() {
    let out = fencekeeper(&["man"]);
    assert!(out.status.success());
    let page = text(&out.stdout);
    assert!(page.contains(".TH fencekeeper 1") && page.contains("envoy\\-config"), "{page}");
    let dir = tempfile::tempdir().unwrap();
    let out = fencekeeper(&["man", "--dir", &dir.path().display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let serve = std::fs::read_to_string(dir.path().join("fencekeeper-serve.1")).unwrap();
    assert!(serve.contains(".TH fencekeeper-serve 1") && serve.contains("\\-\\-etcd"), "{serve}");
    let out = fencekeeper(&["man", "--dir", "/nonexistent/man1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).starts_with("fencekeeper: --dir /nonexistent/man1: not a directory"), "{out:?}");
}

#[test]
fn every_flag_a_command_takes_is_documented_on_its_page() {
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs");
    let pages = [
        ("admit", "cli.md"),
        ("marks", "cli.md"),
        ("conformance", "cli.md"),
        ("lock", "cli.md"),
        ("completions", "cli.md"),
        ("man", "cli.md"),
        ("check", "cli.md"),
        ("serve", "gateway.md"),
        ("envoy-config", "envoy.md"),
        ("nginx-config", "proxy-wasm-hosts.md"),
    ];
    let mut undocumented = Vec::new();
    for (command, page) in pages {
        let help = text(&fencekeeper(&[command, "--help"]).stdout);
        let page_text = std::fs::read_to_string(docs.join(page)).unwrap();
        // The flags as clap renders them: an option line starts with `-x, --name` or `--name`.
        for line in option_lines(&help) {
            let Some(flag) = line.split([' ', ',', '=']).find(|w| w.starts_with("--")) else { continue };
            let documented = page_text.match_indices(flag).any(|(at, _)| {
                let next = page_text[at + flag.len()..].chars().next();
                !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
            });
            if flag != "--help" && !documented {
                undocumented.push(format!("{command} {flag} (docs/{page})"));
            }
        }
    }
    assert!(undocumented.is_empty(), "flags no page documents: {undocumented:?}");
}

/// The lines of clap's help that name an option (`  -x, --name` or `      --name`),
/// trimmed: not a description's line that starts with a dash (indented further).
fn option_lines(help: &str) -> impl Iterator<Item = &str> {
    help.lines().filter(|l| l.len() - l.trim_start().len() < 8).map(str::trim_start).filter(|l| l.starts_with('-'))
}

/// Flags that share a name across commands but not their format or default, each for
/// a reason. A new difference fails the test below; so does an entry here that no
/// longer differs.
const DIFFER: &[(&str, &str)] = &[
    ("--listen", "the gateway listens on 127.0.0.1:8080 and a proxy on 127.0.0.1:10000, so both run on one host"),
    ("--admin", "the gateway's admin is on 127.0.0.1:9090, Envoy's on 127.0.0.1:9901, Envoy's own convention"),
    (
        "--etcd",
        "envoy-config keeps marks in etcd unless --no-etcd (127.0.0.1:2379 by default); the gateway, marks and \
         lock use etcd only when given one; nginx-config names one member (ngx_wasm_module calls one address)",
    ),
    ("--store", "serve's default is the same file, chosen after it looks for a file of the old default name"),
];

/// Every long flag of every command, with its value's name and its default, as the
/// manual pages (made from the parser's own definitions) give them.
fn flags() -> std::collections::BTreeMap<String, std::collections::BTreeMap<String, (String, String)>> {
    let dir = tempfile::tempdir().unwrap();
    let out = fencekeeper(&["man", "--dir", &dir.path().display().to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut flags: std::collections::BTreeMap<String, std::collections::BTreeMap<String, (String, String)>> =
        Default::default();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(command) = name.strip_prefix("fencekeeper-").and_then(|n| n.strip_suffix(".1")) else { continue };
        let page = std::fs::read_to_string(&path).unwrap().replace("\\-", "-");
        let lines: Vec<&str> = page.lines().collect();
        for pair in lines.windows(2).filter(|w| w[0] == ".TP") {
            // `\fB--name\fR \fI<VALUE>\fR [default: D]`, after `-x, ` for a short one.
            let line = pair[1];
            let Some(at) = line.find("\\fB--") else { continue };
            let rest = &line[at + 3..];
            let flag = rest[..rest.find("\\fR").unwrap_or(rest.len())].to_owned();
            let value = rest.split("\\fI<").nth(1).and_then(|v| v.split(">\\fR").next()).unwrap_or_default();
            let default = rest.split("[default: ").nth(1).and_then(|d| d.split(']').next()).unwrap_or_default();
            flags.entry(flag).or_default().insert(command.to_owned(), (value.to_owned(), default.to_owned()));
        }
    }
    flags
}

#[test]
fn a_flag_that_several_commands_take_has_one_format_and_one_default() {
    let flags = flags();
    assert!(flags["--upstream"].len() >= 3, "{:?}", flags["--upstream"]);
    let mut differing = Vec::new();
    for (flag, commands) in &flags {
        let forms: std::collections::BTreeSet<_> = commands.values().collect();
        if commands.len() > 1 && forms.len() > 1 {
            differing.push(flag.as_str());
            if !DIFFER.iter().any(|(f, _)| f == flag) {
                panic!("{flag} differs between commands, with no reason given in DIFFER: {commands:?}");
            }
        }
    }
    for (flag, _) in DIFFER {
        assert!(differing.contains(flag), "{flag} no longer differs: take it out of DIFFER");
    }
}

/// The settings of `serve`, `envoy-config` and `nginx-config` as their help lists
/// them (what a settings file can hold), against docs/configuration.md's table: every
/// key in it once, with the commands that take it.
#[test]
fn the_configuration_page_lists_every_setting_with_the_commands_that_take_it() {
    let commands = ["serve", "envoy-config", "nginx-config"];
    let mut settings: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for command in commands {
        let help = text(&fencekeeper(&[command, "--help"]).stdout);
        for line in option_lines(&help).filter(|l| l.starts_with("--")) {
            let flag = line.split([' ', ',', '=']).next().unwrap_or_default().trim_start_matches('-');
            if ["help", "config", "check"].contains(&flag) {
                continue;
            }
            // (An example's line may name a flag again.)
            let takes = settings.entry(flag.to_owned()).or_default();
            if !takes.contains(&command) {
                takes.push(command);
            }
        }
    }
    let page =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/configuration.md")).unwrap();
    let mut listed: std::collections::BTreeMap<String, Vec<&str>> = Default::default();
    for row in page.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let key = cells[1].trim_matches('`').to_owned();
        let takes = commands.iter().zip(&cells[2..5]).filter(|(_, c)| **c == "yes").map(|(c, _)| *c).collect();
        assert!(listed.insert(key.clone(), takes).is_none(), "{key} listed twice");
    }
    assert_eq!(listed, settings, "docs/configuration.md's table against the commands' help");
}
