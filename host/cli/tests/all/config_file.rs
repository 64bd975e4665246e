//! The settings file (`--config FILE`, `fencekeeper check FILE`): where a setting
//! comes from, what a bad file is told, and that a file and the flags it stands for
//! make the same configuration.

#![allow(clippy::unwrap_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_fencekeeper");

/// `fencekeeper ARGS` in `dir`, with only `env` of the FENCEKEEPER_* variables.
fn run(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    for (name, _) in std::env::vars().filter(|(n, _)| n.starts_with("FENCEKEEPER_")) {
        command.env_remove(name);
    }
    command.args(args).envs(env.iter().copied()).current_dir(dir).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn write(dir: &Path, name: &str, contents: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path.display().to_string()
}

const FILTER: &str = "/opt/fencekeeper/fencekeeper_filter.wasm";

#[test]
fn a_setting_comes_from_the_flag_then_the_environment_then_the_file_then_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let file =
        write(dir.path(), "f.toml", "upstream = \"127.0.0.1:9\"\nlisten = \"127.0.0.1:7001\"\nstore = \"file.redb\"\n");
    let listening = |args: &[&str], env: &[(&str, &str)]| {
        let out = run(dir.path(), &[&["serve", "--check"][..], args].concat(), env);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        let said = text(&out.stdout);
        let clients = said.split("clients on ").nth(1).and_then(|s| s.split(',').next()).unwrap().to_owned();
        let marks = said.split("marks in ").nth(1).and_then(|s| s.split(',').next()).unwrap().to_owned();
        (clients, marks)
    };
    let env = [("FENCEKEEPER_LISTEN", "127.0.0.1:7002")];
    assert_eq!(listening(&["--upstream", "127.0.0.1:9"], &[]).0, "127.0.0.1:8080", "the default");
    assert_eq!(listening(&["--config", &file], &[]), ("127.0.0.1:7001".into(), "file.redb".into()));
    assert_eq!(listening(&["--config", &file], &env).0, "127.0.0.1:7002", "the environment over the file");
    assert_eq!(listening(&["--config", &file, "--listen", "127.0.0.1:7003"], &env).0, "127.0.0.1:7003");
    // The file named by the environment, and `--config=FILE`.
    assert_eq!(listening(&[], &[("FENCEKEEPER_CONFIG", &file)]).0, "127.0.0.1:7001");
    assert_eq!(listening(&[&format!("--config={file}")], &[]).0, "127.0.0.1:7001");
    // A command's table wins over the top level; a switch set false stays off.
    let tables = write(
        dir.path(),
        "t.toml",
        "upstream = \"127.0.0.1:9\"\nlisten = \"127.0.0.1:7001\"\n[serve]\nlisten = \"127.0.0.1:7004\"\n",
    );
    assert_eq!(listening(&["--config", &tables], &[]).0, "127.0.0.1:7004");
}

#[test]
fn check_accepts_a_file_for_every_command_and_says_what_each_would_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "good.toml",
        "upstream = \"127.0.0.1:8000\"\netcd = [\"127.0.0.1:2379\", \"127.0.0.1:22379\"]\n\
         gate-timeout = \"3s\"\nstrict = true\nshared-marks-max = 4096\n\
         [serve]\nlisten = \"127.0.0.1:8088\"\n[nginx-config]\netcd = \"127.0.0.1:2379\"\nlocal-gate = true\n",
    );
    let out = run(dir.path(), &["check", &file], &[]);
    let said = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{said}{}", text(&out.stderr));
    assert!(said.contains("serve: usable: clients on 127.0.0.1:8088"), "{said}");
    assert!(said.contains("marks in etcd at 127.0.0.1:2379,127.0.0.1:22379"), "{said}");
    assert!(said.contains("correctness mode, provenance weak"), "weak with etcd by default: {said}");
    assert!(said.contains("envoy-config: usable: Envoy on 127.0.0.1:10000"), "{said}");
    assert!(said.contains("nginx-config: usable: nginx on 127.0.0.1:10000"), "{said}");
    // The environment is not the file's: it changes nothing in the verdict.
    let out = run(dir.path(), &["check", &file], &[("FENCEKEEPER_MODE", "fast")]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // Without an upstream: named, not failed (a flag can give it).
    let partial = write(dir.path(), "partial.toml", "strict = true\n");
    let out = run(dir.path(), &["check", &partial], &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("serve: not runnable from the file alone: give upstream"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn check_names_the_key_of_every_error_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "bad.toml",
        "upstraem = \"127.0.0.1:8000\"\ngate-budget = \"5s\"\nmode = \"fast\"\nstrict = \"yes\"\n\
         request-timeout = \"soon\"\ncheck = true\netcd = true\nprotocol = \"s3\"\n\
         [serve]\netcd-api = \"json\"\n[envoy-config]\nstore = \"x.redb\"\n",
    );
    let out = run(dir.path(), &["check", &file], &[]);
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    for expected in [
        "`upstraem`: unknown setting; did you mean `upstream`?",
        "`gate-budget`: renamed: write `gate-timeout`",
        "`mode`: invalid value 'fast' [possible values: correctness, efficiency] (for serve, envoy-config)",
        "`strict`: expected true or false, found string",
        "`request-timeout`: invalid value 'soon'",
        "`check`: not a setting",
        "`etcd`: expected a string or a list of strings, found boolean (for serve, envoy-config)",
        "`etcd`: expected a string, found boolean (for nginx-config)",
        "`serve.etcd-api`: not a setting of serve (only of envoy-config)",
        "`envoy-config.store`: not a setting of envoy-config (only of serve)",
    ] {
        assert!(said.contains(expected), "missing {expected:?} in:\n{said}");
    }
    assert!(said.lines().all(|l| l.starts_with(&format!("fencekeeper: {file}: "))), "{said}");
    assert_eq!(said.lines().count(), 10, "each error once:\n{said}");
}

#[test]
fn a_file_that_is_not_a_settings_file_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("syntax.toml", b"upstream = \"127.0.0.1:8000\"\nx = [\n".to_vec(), "syntax.toml:2: "),
        ("accents.toml", "upstream = \"caf\u{e9}.internal:80\"\n\u{e9} = [\n".as_bytes().to_vec(), "accents.toml:2: "),
        ("latin1.toml", b"upstream = \"caf\xe9\"\n".to_vec(), "cannot read it as UTF-8 text"),
        ("big.toml", vec![b'#'; (1 << 20) + 1], "a configuration file is at most 1048576"),
        ("table.toml", b"serve = 1\n".to_vec(), "`serve` must be a table of serve's own settings"),
    ];
    for (name, bytes, expected) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        for args in [vec!["check", path.to_str().unwrap()], vec!["serve", "--config", path.to_str().unwrap()]] {
            let out = run(dir.path(), &args, &[]);
            let said = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {said}");
            assert!(said.contains(expected) && said.lines().count() == 1, "{args:?}: {said}");
        }
    }
    let out = run(dir.path(), &["serve", "--config", "absent.toml"], &[]);
    assert!(text(&out.stderr).starts_with("fencekeeper: --config absent.toml: cannot read it"), "{out:?}");
}

#[test]
fn a_bad_file_stops_serve_before_it_creates_anything_and_a_conflict_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(dir.path(), "f.toml", "upstream = \"127.0.0.1:9\"\nstore = \"made.redb\"\nmode = \"fast\"\n");
    let out = run(dir.path(), &["serve", "--config", &file, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    assert!(said.starts_with(&format!("fencekeeper: {file}: `mode`: invalid value 'fast'")), "{said}");
    assert!(!dir.path().join("made.redb").exists(), "no store was made");
    // The file's store and the command line's etcd: refused as the two flags are, the
    // key named.
    let file = write(dir.path(), "c.toml", "upstream = \"127.0.0.1:9\"\nstore = \"made.redb\"\n");
    let out = run(dir.path(), &["serve", "--config", &file, "--etcd", "127.0.0.1:2379", "--check"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let said = text(&out.stderr);
    assert!(
        said.contains("cannot be used with") && said.contains(&format!("(from {file}: --store is `store`)")),
        "{said}"
    );
}

#[test]
fn a_file_makes_the_same_configuration_as_the_flags_it_stands_for() {
    let dir = tempfile::tempdir().unwrap();
    let flags = [
        "--upstream",
        "127.0.0.1:8000",
        "--etcd",
        "127.0.0.1:2379,127.0.0.2:2379",
        "--strict",
        "--gate-timeout",
        "2s",
        "--request-timeout",
        "20s",
        "--store-apply-bound",
        "45s",
        "--fenced-methods",
        "PUT,DELETE",
        "--filter",
        FILTER,
    ];
    let file = write(
        dir.path(),
        "f.toml",
        &format!(
            "upstream = \"127.0.0.1:8000\"\netcd = [\"127.0.0.1:2379\", \"127.0.0.2:2379\"]\nstrict = true\n\
             gate-timeout = \"2s\"\nrequest-timeout = \"20s\"\nstore-apply-bound = \"45s\"\n\
             fenced-methods = [\"PUT\", \"DELETE\"]\nfilter = \"{FILTER}\"\n"
        ),
    );
    let by_flags = run(dir.path(), &[&["envoy-config"][..], &flags].concat(), &[]);
    assert_eq!(by_flags.status.code(), Some(0), "{}", text(&by_flags.stderr));
    let by_file = run(dir.path(), &["envoy-config", "--config", &file], &[]);
    assert_eq!(text(&by_file.stdout), text(&by_flags.stdout), "{}", text(&by_file.stderr));
    // The flags' former names still work, and mean the same.
    let renamed: Vec<&str> = flags
        .iter()
        .map(|f| match *f {
            "--gate-timeout" => "--gate-budget",
            "--request-timeout" => "--route-timeout",
            other => other,
        })
        .collect();
    let by_old_names = run(dir.path(), &[&["envoy-config"][..], &renamed].concat(), &[]);
    assert_eq!(text(&by_old_names.stdout), text(&by_flags.stdout), "{}", text(&by_old_names.stderr));
    let nginx = |timeout: &str| {
        let out =
            run(dir.path(), &["nginx-config", "--upstream", "127.0.0.1:8000", "--filter", FILTER, timeout, "20s"], &[]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    assert_eq!(nginx("--proxy-timeout"), nginx("--request-timeout"));
    // Every setting of these commands can come from FENCEKEEPER_<NAME>, not just serve's.
    let by_env = run(
        dir.path(),
        &["envoy-config", "--config", &file],
        &[("FENCEKEEPER_GATE_TIMEOUT", "4s"), ("FENCEKEEPER_STRICT", "false")],
    );
    let yaml = text(&by_env.stdout);
    assert!(yaml.contains("\"budget_ms\":4000") && yaml.contains("\"strict\":false"), "{}", text(&by_env.stderr));
}
