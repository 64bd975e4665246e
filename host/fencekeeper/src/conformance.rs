//! The conformance vectors: one decision each, run against any [`Decider`].
//!
//! The vectors live in one data file, `conformance/vectors.json` in this crate,
//! embedded here as [`BUNDLED_VECTORS`] so that `fencekeeper conformance` works from
//! any directory, and so that [`Validator::load`](crate::Validator::load) can run them
//! against every guest it loads.
//! Every build of the guest (native core, wasm component, proxy-wasm filter) must
//! pass all of them. A malformed expectation names only the verdict: the reason text
//! is for humans and is not part of the contract.
//!
//! ```
//! use fencekeeper::conformance::{self, Vectors};
//! use fencekeeper::NativeDecider;
//!
//! let vectors = Vectors::bundled().unwrap();
//! let report = conformance::run(&vectors, |policy| Ok::<_, std::convert::Infallible>(NativeDecider(policy)));
//! assert_eq!(report.failed(), 0);
//! ```

use crate::decider::Decider;
use crate::{verify, Verdict};
use fencekeeper_core::{Mode, Policy, Token};
use serde::Deserialize;
use std::fmt;

/// The project's conformance vectors, as shipped with this crate.
pub const BUNDLED_VECTORS: &str = include_str!("../conformance/vectors.json");

/// The vector file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum VectorError {
    /// The file is not the vector format.
    #[error("conformance vectors are not valid: {0}")]
    Format(#[from] serde_json::Error),
    /// A vector's own mark or expected mark is not a token.
    #[error("conformance vector {name:?}: {field} {text:?} is not a valid token ({detail})")]
    BadToken {
        /// The vector.
        name: String,
        /// Which field.
        field: &'static str,
        /// Its text.
        text: String,
        /// Why it does not parse.
        detail: String,
    },
}

/// The verdict a vector expects (or a decider gave), without the reason text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// Admitted.
    Admit,
    /// Lower than the mark.
    Stale,
    /// Strict mode: equal to the mark.
    Replayed,
    /// Malformed token or resource key.
    Malformed,
    /// No token presented.
    Missing,
}

impl Kind {
    /// The verdict's kind.
    pub fn of(verdict: &Verdict) -> Kind {
        match verdict {
            Verdict::Admit { .. } => Kind::Admit,
            Verdict::Stale { .. } => Kind::Stale,
            Verdict::Replayed { .. } => Kind::Replayed,
            Verdict::Malformed(_) => Kind::Malformed,
            Verdict::Missing => Kind::Missing,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Admit => "admit",
            Kind::Stale => "stale",
            Kind::Replayed => "replayed",
            Kind::Malformed => "malformed",
            Kind::Missing => "missing",
        }
    }
}

/// What a vector expects.
#[derive(Clone, Debug, Deserialize)]
pub struct Expect {
    /// The verdict.
    pub verdict: Kind,
    /// The mark carried by the verdict (admit, stale, replayed), as token text.
    #[serde(default)]
    pub mark: Option<String>,
    /// Whether an admit advanced the mark.
    #[serde(default)]
    pub advanced: Option<bool>,
}

/// One decision to check.
#[derive(Clone, Debug, Deserialize)]
pub struct Vector {
    /// What the vector pins, in words.
    pub name: String,
    /// The resource key.
    pub resource: String,
    /// The presented token text; `None`: the request carried no token.
    pub presented: Option<String>,
    /// The resource's mark; `None`: it has none yet.
    pub mark: Option<String>,
    /// Strict policy (equal tokens are replays).
    pub strict: bool,
    /// The expected verdict.
    pub expect: Expect,
}

impl Vector {
    /// The policy the vector is decided under (always correctness mode: the mode
    /// changes what a host does with a verdict, not the verdict).
    pub fn policy(&self) -> Policy {
        Policy { mode: Mode::Correctness, strict: self.strict }
    }

    fn token(&self, field: &'static str, text: &Option<String>) -> Result<Option<Token>, VectorError> {
        text.as_deref()
            .map(|t| {
                Token::parse(t).map_err(|e| VectorError::BadToken {
                    name: self.name.clone(),
                    field,
                    text: t.to_owned(),
                    detail: e.to_string(),
                })
            })
            .transpose()
    }

    fn expected_text(&self) -> String {
        let e = &self.expect;
        let mut text = e.verdict.name().to_owned();
        if let Some(m) = &e.mark {
            text.push(' ');
            text.push_str(m);
        }
        match e.advanced {
            Some(true) => text.push_str(" (advanced)"),
            Some(false) => text.push_str(" (unchanged)"),
            None => {}
        }
        text
    }
}

/// A parsed, checked vector file.
#[derive(Clone, Debug)]
pub struct Vectors {
    vectors: Vec<Vector>,
}

#[derive(Deserialize)]
struct File {
    vectors: Vec<Vector>,
}

impl Vectors {
    /// Parse a vector file's text; every token in it must be valid.
    pub fn parse(text: &str) -> Result<Vectors, VectorError> {
        let file: File = serde_json::from_str(text)?;
        for v in &file.vectors {
            v.token("mark", &v.mark)?;
            v.token("expect.mark", &v.expect.mark)?;
        }
        Ok(Vectors { vectors: file.vectors })
    }

    /// The vectors shipped with this crate ([`BUNDLED_VECTORS`]).
    pub fn bundled() -> Result<Vectors, VectorError> {
        Vectors::parse(BUNDLED_VECTORS)
    }

    /// The vectors, in file order.
    pub fn iter(&self) -> impl Iterator<Item = &Vector> {
        self.vectors.iter()
    }

    /// How many vectors there are.
    pub fn len(&self) -> usize {
        self.vectors.len()
    }

    /// True when the file holds no vector.
    pub fn is_empty(&self) -> bool {
        self.vectors.is_empty()
    }
}

/// The result of one vector.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The vector's name.
    pub name: String,
    /// What it expects, in short text (`admit 34 (advanced)`, `malformed`).
    pub expected: String,
    /// What the decider answered, in the same form (or `error: ...`).
    pub got: String,
    /// The verdict itself, when the decider reached one.
    pub verdict: Option<Verdict>,
    /// The answer matched the expectation.
    pub passed: bool,
}

/// The results of a run, in vector order.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// One outcome per vector.
    pub outcomes: Vec<Outcome>,
}

impl Report {
    /// How many vectors passed.
    pub fn passed(&self) -> usize {
        self.outcomes.iter().filter(|o| o.passed).count()
    }

    /// How many vectors failed.
    pub fn failed(&self) -> usize {
        self.outcomes.len() - self.passed()
    }
}

impl fmt::Display for Report {
    /// A pass/fail table and the summary line `N passed, M failed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let width = |col: fn(&Outcome) -> &str, title: &str| {
            self.outcomes.iter().map(|o| col(o).chars().count()).chain([title.len()]).max().unwrap_or(0)
        };
        let (wn, we) = (width(|o| &o.name, "vector"), width(|o| &o.expected, "expected"));
        writeln!(f, "{:<4}  {:<wn$}  {:<we$}  got", "", "vector", "expected")?;
        for o in &self.outcomes {
            let status = if o.passed { "pass" } else { "FAIL" };
            // Width counts characters, as `{:<w$}` pads: names may hold multi-byte UTF-8.
            writeln!(f, "{status}  {:<wn$}  {:<we$}  {}", o.name, o.expected, o.got)?;
        }
        writeln!(f, "{} passed, {} failed", self.passed(), self.failed())
    }
}

/// Short text for a verdict, in the form of a vector's expectation.
pub fn verdict_text(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Admit { mark, advanced: true } => format!("admit {mark} (advanced)"),
        Verdict::Admit { mark, advanced: false } => format!("admit {mark} (unchanged)"),
        Verdict::Stale { mark, .. } => format!("stale {mark}"),
        Verdict::Replayed { mark } => format!("replayed {mark}"),
        Verdict::Malformed(_) => "malformed".to_owned(),
        Verdict::Missing => "missing".to_owned(),
    }
}

/// Does `verdict` meet the vector's expectation? Marks compare as tokens, so
/// `0034` in a vector matches a verdict carrying `34`.
pub fn matches(vector: &Vector, verdict: &Verdict) -> bool {
    let e = &vector.expect;
    if Kind::of(verdict) != e.verdict {
        return false;
    }
    let (mark, advanced) = match verdict {
        Verdict::Admit { mark, advanced } => (Some(mark), Some(*advanced)),
        Verdict::Stale { mark, .. } | Verdict::Replayed { mark } => (Some(mark), None),
        Verdict::Malformed(_) | Verdict::Missing => (None, None),
    };
    let mark_ok = match (&e.mark, mark) {
        (None, _) => true,
        (Some(want), Some(got)) => Token::parse(want).ok().as_ref() == Some(got),
        (Some(_), None) => false,
    };
    mark_ok && (e.advanced.is_none() || e.advanced == advanced)
}

/// Decide every vector with a decider built by `make` for the vector's policy, and
/// compare. `make` is called once per distinct policy (building a wasm validator
/// compiles nothing new, but instantiates). A decider that cannot be built, or that
/// fails to decide, fails the vectors it was meant for with the error as `got`.
pub fn run<D, E>(vectors: &Vectors, mut make: impl FnMut(Policy) -> Result<D, E>) -> Report
where
    D: Decider,
    E: fmt::Display,
{
    let mut deciders: Vec<(Policy, Result<D, String>)> = Vec::new();
    run_with(vectors, |policy, presented, mark| {
        let index = match deciders.iter().position(|(p, _)| p == policy) {
            Some(i) => i,
            None => {
                deciders.push((*policy, make(*policy).map_err(|e| format!("{e:#}"))));
                deciders.len() - 1
            }
        };
        match &deciders[index].1 {
            Ok(d) => d.decide(presented, mark).map_err(|e| e.to_string()),
            Err(e) => Err(format!("cannot build the validator: {e}")),
        }
    })
}

/// Decide every vector as the guard would (the host's bounds on the key and the
/// token first, then `decide`, then the host's check of the verdict) and compare.
pub(crate) fn run_with(
    vectors: &Vectors,
    mut decide: impl FnMut(&Policy, Option<&str>, Option<&Token>) -> Result<Verdict, String>,
) -> Report {
    let mut report = Report::default();
    for v in vectors.iter() {
        let policy = v.policy();
        // Parse errors were rejected by Vectors::parse, so this is always Ok.
        let mark = v.token("mark", &v.mark).ok().flatten();
        let presented = v.presented.as_deref();
        let answer = match fencekeeper_core::precheck(&v.resource, presented) {
            Err(m) => Ok(Verdict::Malformed(crate::GuestText::new(&m.to_string()))),
            Ok(()) => decide(&policy, presented, mark.as_ref()).and_then(|verdict| {
                let canonical = verify::reading(presented);
                verify::check_read(&policy, presented, canonical, mark.as_ref(), &verdict)
                    .map_err(|b| b.to_string())?;
                Ok(verdict)
            }),
        };
        let (got, passed, verdict) = match answer {
            Ok(verdict) => (verdict_text(&verdict), matches(v, &verdict), Some(verdict)),
            Err(e) => (format!("error: {}", crate::GuestText::new(&e)), false, None),
        };
        report.outcomes.push(Outcome { name: v.name.clone(), expected: v.expected_text(), got, verdict, passed });
    }
    report
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{DecideError, NativeDecider};

    #[test]
    fn bundled_vectors_all_pass_natively() {
        let vectors = Vectors::bundled().unwrap();
        assert!(vectors.len() > 20);
        let report = run(&vectors, |p| Ok::<_, String>(NativeDecider(p)));
        assert_eq!(report.failed(), 0, "{report}");
    }

    /// A decider that always answers "stale 1": it must fail most vectors.
    struct AlwaysStale;
    impl Decider for AlwaysStale {
        fn policy(&self) -> Policy {
            Policy::default()
        }
        fn decide(&self, _: Option<&str>, _: Option<&Token>) -> Result<Verdict, DecideError> {
            let one = Token::from_parts(&[1]).map_err(|e| DecideError::Contract(e.to_string()))?;
            Ok(Verdict::Stale { mark: one, presented: one })
        }
    }

    #[test]
    fn a_wrong_decider_fails_vectors_and_the_table_says_so() {
        let vectors = Vectors::bundled().unwrap();
        let report = run(&vectors, |_| Ok::<_, String>(AlwaysStale));
        assert!(report.failed() > report.passed());
        let table = report.to_string();
        assert!(table.contains("FAIL"), "{table}");
        assert!(table.trim_end().ends_with(&format!("{} passed, {} failed", report.passed(), report.failed())));
    }

    #[test]
    fn a_decider_that_cannot_be_built_fails_every_vector_it_is_asked() {
        let vectors = Vectors::bundled().unwrap();
        let report = run(&vectors, |_| Err::<NativeDecider, _>("no guest"));
        // Only the vectors the host refuses on its own (a bad key) pass without it.
        let passed: Vec<_> = report.outcomes.iter().filter(|o| o.passed).collect();
        assert!(passed.iter().all(|o| o.expected == "malformed") && passed.len() < 5, "{report}");
        assert!(report.outcomes[0].got.contains("no guest"));
    }

    #[test]
    fn a_vector_with_an_invalid_mark_is_rejected() {
        let text = r#"{"vectors":[{"name":"x","resource":"r","presented":"1","mark":"-1","strict":false,
            "expect":{"verdict":"admit"}}]}"#;
        assert!(matches!(Vectors::parse(text), Err(VectorError::BadToken { .. })));
    }

    #[test]
    fn expected_marks_compare_as_tokens() {
        let text = r#"{"vectors":[{"name":"x","resource":"r","presented":"34","mark":null,"strict":false,
            "expect":{"verdict":"admit","mark":"0034","advanced":true}}]}"#;
        let vectors = Vectors::parse(text).unwrap();
        assert_eq!(run(&vectors, |p| Ok::<_, String>(NativeDecider(p))).failed(), 0);
    }
}
