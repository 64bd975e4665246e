//! The token contract, `tests/contract/tokens.json`: one table of token inputs that
//! every host runs, and the driver the Rust-side runners share. A runner is a
//! [`Host`]: how it writes one token on one resource, and how it reads a mark back.
//! [`run`] plays every row (its `before` tokens first, each of which must be
//! admitted), compares the answer with the host's rendering of the row's class (or
//! with the row's written exception for that host) and the mark afterwards, and
//! returns every row the host does not keep, so that one run names them all.
//!
//! The Python and JavaScript runners read the same file with their own few lines;
//! the rules of the file itself ([`Table::check`]) are checked here once.

use anyhow::{bail, ensure, Context, Result};
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fmt::Write as _;

const TABLE: &str = include_str!("../../tests/contract/tokens.json");

/// Every class a row or a rendering can name, in the order of the file.
pub const CLASSES: [&str; 7] = ["admitted", "stale", "replayed", "missing", "malformed", "unverified", "undecided"];

/// The hosts the table renders classes for.
pub const HOSTS: [&str; 7] = ["library", "http", "postgres", "redis", "c", "python", "component"];

/// The table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Table {
    #[allow(dead_code)]
    about: Vec<String>,
    /// Per host, the answer for each class (and an `about`).
    renderings: BTreeMap<String, BTreeMap<String, Value>>,
    /// The rows, in order.
    pub rows: Vec<Row>,
    exceptions: Vec<Exception>,
}

/// One write, after its story.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row {
    /// What the row is about; exceptions name rows by it.
    pub name: String,
    /// The host runs in strict mode.
    #[serde(default)]
    pub strict: bool,
    /// Tokens admitted on the resource first, in order.
    #[serde(default)]
    pub before: Vec<String>,
    resource: Option<Text>,
    token: Option<Text>,
    /// The outcome's class.
    pub class: String,
    /// The resource's mark afterwards.
    pub mark: Option<String>,
}

/// A host's own answer to a row, written down with the reason.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Exception {
    host: String,
    row: String,
    /// The class the host answers instead, rendered as the host renders it.
    class: Option<String>,
    /// Or a rendering outside the classes (Redis's `ERR`).
    rendering: Option<Value>,
    mark: Option<String>,
    why: String,
}

/// A resource or a token: text, a repeated text, or bytes.
#[derive(Deserialize)]
#[serde(untagged, deny_unknown_fields)]
enum Text {
    Plain(String),
    Repeat { repeat: String, times: usize, then: Option<String> },
    Hex { hex: String },
}

impl Text {
    fn bytes(&self) -> Result<Vec<u8>> {
        Ok(match self {
            Text::Plain(s) => s.as_bytes().to_vec(),
            Text::Repeat { repeat, times, then } => {
                let mut s = repeat.repeat(*times);
                s.push_str(then.as_deref().unwrap_or(""));
                s.into_bytes()
            }
            Text::Hex { hex } => {
                ensure!(hex.len() % 2 == 0, "hex {hex:?} has an odd length");
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).with_context(|| format!("hex {hex:?}")))
                    .collect::<Result<_>>()?
            }
        })
    }
}

/// One row as a host receives it.
pub struct Case<'a> {
    /// The row's place, 1-based.
    pub number: usize,
    /// The row.
    pub row: &'a Row,
    /// The resource key's bytes (not necessarily UTF-8).
    pub resource: Vec<u8>,
    /// The token's bytes; `None`: no token at all.
    pub token: Option<Vec<u8>>,
}

impl Case<'_> {
    /// The resource as a key a host can hold a mark for, or `None` when it is not one
    /// (not UTF-8, empty, too long): no host can keep a mark for it, so none is read.
    pub fn key(&self) -> Option<&str> {
        let key = fencekeeper_core::resource::key_from_bytes(&self.resource).ok()?;
        fencekeeper_core::resource::check(key).ok().map(|()| key)
    }

    /// The token as text (a host that takes text only: every token of the table is UTF-8).
    pub fn token_text(&self) -> Option<&str> {
        self.token.as_deref().map(|t| std::str::from_utf8(t).expect("the table's tokens are UTF-8"))
    }
}

/// What a runner must be able to do with a host.
pub trait Host {
    /// The host's name in `renderings` and `exceptions`.
    fn name(&self) -> &'static str;
    /// Write `token` (`None`: no token) on `resource`, with the host in strict mode
    /// or not, and answer as the table renders it (a status, a SQLSTATE, a prefix).
    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value>;
    /// The mark of `key` (a valid key) afterwards.
    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>>;
}

/// The path an HTTP write of `resource` goes to: `/` and the resource's bytes, each
/// byte but the unreserved ones and `/` as `%XX` (a resource that is not UTF-8 is
/// sent as `%FF`, which the hosts decode).
pub fn http_path(resource: &[u8]) -> String {
    let mut path = String::from("/");
    for &b in resource {
        if b.is_ascii_alphanumeric() || b"-._~/".contains(&b) {
            path.push(char::from(b));
        } else {
            let _ = write!(path, "%{b:02X}");
        }
    }
    path
}

/// One of a host per policy: most runners start two, as a host's policy is set when
/// it starts.
pub struct ByPolicy<T> {
    /// The host outside strict mode.
    pub lax: T,
    /// The host in strict mode.
    pub strict: T,
}

impl<T> ByPolicy<T> {
    /// Start one host per policy with `start(strict)`.
    pub fn start(mut start: impl FnMut(bool) -> T) -> ByPolicy<T> {
        ByPolicy { lax: start(false), strict: start(true) }
    }

    /// The host of a policy.
    pub fn of(&mut self, strict: bool) -> &mut T {
        if strict {
            &mut self.strict
        } else {
            &mut self.lax
        }
    }
}

/// One row a host did not keep.
#[derive(Debug)]
pub struct Miss {
    /// The row's name.
    pub row: String,
    /// What was expected and what came.
    pub what: String,
}

/// What a host must answer for a row.
#[derive(Debug, PartialEq)]
pub struct Expected {
    /// The rendering.
    pub answer: Value,
    /// The mark afterwards.
    pub mark: Option<String>,
}

impl Table {
    /// The committed table, its rules checked.
    // A table that breaks its rules fails every test that loads it, with the reason.
    #[allow(clippy::panic)]
    pub fn load() -> Table {
        Table::parse(TABLE).unwrap_or_else(|e| panic!("tests/contract/tokens.json: {e:#}"))
    }

    /// A table from text, its rules checked.
    pub fn parse(text: &str) -> Result<Table> {
        let table: Table = serde_json::from_str(text)?;
        table.check()?;
        Ok(table)
    }

    /// The rules of the file: every host renders every class, every row names a
    /// class and has a name of its own, every exception names a host and a row and
    /// says why, and differs from what the rendering would be.
    fn check(&self) -> Result<()> {
        for host in HOSTS {
            let rendering = self.renderings.get(host).with_context(|| format!("no rendering for {host}"))?;
            for class in CLASSES {
                ensure!(rendering.contains_key(class), "{host} renders no {class}");
            }
            for name in rendering.keys() {
                ensure!(name == "about" || CLASSES.contains(&name.as_str()), "{host} renders an unknown class {name}");
            }
        }
        for (i, row) in self.rows.iter().enumerate() {
            ensure!(CLASSES.contains(&row.class.as_str()), "row {:?}: unknown class {}", row.name, row.class);
            ensure!(
                !self.rows[..i].iter().any(|r| r.name == row.name),
                "two rows are called {:?}: exceptions name rows by name",
                row.name
            );
        }
        for e in &self.exceptions {
            ensure!(HOSTS.contains(&e.host.as_str()), "an exception for an unknown host {}", e.host);
            let row = self.rows.iter().find(|r| r.name == e.row).with_context(|| format!("no row {:?}", e.row))?;
            ensure!(!e.why.trim().is_empty(), "the exception for {} on {:?} says no why", e.host, e.row);
            ensure!(e.class.is_some() != e.rendering.is_some(), "an exception gives a class or a rendering");
            let own = self.rendering(&e.host, &row.class);
            ensure!(
                self.exception_answer(e) != own || e.mark != row.mark,
                "the exception for {} on {:?} expects what the row does: drop it",
                e.host,
                e.row
            );
        }
        Ok(())
    }

    fn rendering(&self, host: &str, class: &str) -> Value {
        self.renderings[host][class].clone()
    }

    fn exception_answer(&self, e: &Exception) -> Value {
        match (&e.class, &e.rendering) {
            (Some(class), _) => self.rendering(&e.host, class),
            (None, Some(rendering)) => rendering.clone(),
            (None, None) => Value::Null,
        }
    }

    /// The rows as cases: their resource (`tokens/row-NN` unless given) and token bytes.
    pub fn cases(&self) -> Vec<Case<'_>> {
        self.rows
            .iter()
            .enumerate()
            .map(|(i, row)| Case {
                number: i + 1,
                row,
                resource: match &row.resource {
                    Some(text) => text.bytes().expect("a resource's text"),
                    None => format!("tokens/row-{:02}", i + 1).into_bytes(),
                },
                token: row.token.as_ref().map(|t| t.bytes().expect("a token's text")),
            })
            .collect()
    }

    /// What `host` must answer for `row`: the rendering of its class, or its
    /// exception for that host.
    pub fn expected(&self, host: &str, row: &Row) -> Expected {
        match self.exceptions.iter().find(|e| e.host == host && e.row == row.name) {
            Some(e) => Expected { answer: self.exception_answer(e), mark: e.mark.clone() },
            None => Expected { answer: self.rendering(host, &row.class), mark: row.mark.clone() },
        }
    }

    /// The rows `host` has a written exception for.
    pub fn exceptions_of(&self, host: &str) -> Vec<&str> {
        self.exceptions.iter().filter(|e| e.host == host).map(|e| e.row.as_str()).collect()
    }
}

/// Play every row of `table` against `host`: the rows it does not keep.
pub fn run(table: &Table, host: &mut dyn Host) -> Vec<Miss> {
    let admitted = table.rendering(host.name(), "admitted");
    let mut misses = Vec::new();
    for case in table.cases() {
        if let Err(e) = play(table, host, &case, &admitted) {
            misses.push(Miss { row: case.row.name.clone(), what: format!("{e:#}") });
        }
    }
    misses
}

fn play(table: &Table, host: &mut dyn Host, case: &Case<'_>, admitted: &Value) -> Result<()> {
    let row = case.row;
    for token in &row.before {
        let answer = host.write(row.strict, &case.resource, Some(token.as_bytes()))?;
        ensure!(&answer == admitted, "its story's token {token} was answered {answer}, not {admitted}");
    }
    let want = table.expected(host.name(), row);
    let answer = host.write(row.strict, &case.resource, case.token.as_deref())?;
    let mark = match case.key() {
        Some(key) => host.mark(row.strict, key)?,
        None => None,
    };
    if answer != want.answer || mark != want.mark {
        bail!("expected {} with mark {:?}, got {answer} with mark {mark:?}", want.answer, want.mark);
    }
    Ok(())
}

/// The misses as one report, for a test's failure.
pub fn report(host: &str, misses: &[Miss]) -> String {
    let mut text = format!("{} row(s) of tests/contract/tokens.json failed on {host}:\n", misses.len());
    for m in misses {
        let _ = writeln!(text, "  {:?}: {}", m.row, m.what);
    }
    text
}

/// Fail with the report unless every row held.
pub fn assert_kept(host: &str, misses: &[Miss]) {
    assert!(misses.is_empty(), "{}", report(host, misses));
}
