//! Target 8: the host's verification of arbitrary guest verdicts
//! (`verify::check` and `verify::provable`).
//!
//! The input is the text the client presented (the first line; `-`: no token) and
//! the mark the host read (the second; empty: none), then the rest of the case: the
//! policy and the guest's verdict.
//!
//! Any verdict a guest could return, for any presented text and mark read:
//! * no panic, and a breach is one printable line (it is logged and counted);
//! * a verdict that passes is consistent with what the host knows: an admit's
//!   token is at or above the mark, of its arity, above it in strict mode,
//!   `advanced` exactly when above (or no mark), and equal to the reference reading
//!   of the text when the text is a token; a stale verdict reports the mark read
//!   and a token below it; a replay is strict and reports the mark; `missing`
//!   exactly when no token came;
//! * the reference decision (`decide`) always passes;
//! * `provable` never admits, its refusal is what `decide` says and passes the
//!   check, and no admit passes the check where a refusal is provable.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use fencekeeper_core::decision::{decide, Mode, Policy, Verdict};
use fencekeeper_core::verify::{check, provable};
use fencekeeper_core::Token;
use fencekeeper_fuzz::header::is_printable_line;
use fencekeeper_fuzz::input::SmallToken;
use fencekeeper_fuzz::model;
use libfuzzer_sys::fuzz_target;
use std::cmp::Ordering;

#[derive(Arbitrary, Debug)]
struct Rest {
    strict: bool,
    efficiency: bool,
    verdict: Guest,
}

/// What a guest may answer: any verdict, tokens included.
#[derive(Arbitrary, Debug)]
enum Guest {
    Admit(SmallToken, bool),
    Stale(SmallToken, SmallToken),
    Replayed(SmallToken),
    Malformed,
    Missing,
    /// Admit exactly the presented text's token (when it is one).
    AdmitPresented(bool),
    /// Refuse as stale with the mark read and the presented token.
    StalePresented,
    /// Refuse as stale with the mark read and any token.
    StaleRead(SmallToken),
    /// Refuse as replayed with the mark read.
    ReplayedRead,
    /// Admit the mark read.
    AdmitRead(bool),
}

fn line(bytes: Option<&[u8]>) -> Result<&str, std::str::Utf8Error> {
    std::str::from_utf8(bytes.unwrap_or_default())
}

fuzz_target!(|data: &[u8]| {
    let mut lines = data.splitn(3, |&b| b == b'\n');
    let (Ok(presented), Ok(read)) = (line(lines.next()), line(lines.next())) else { return };
    let presented = (presented != "-").then_some(presented);
    let read = match read {
        "" => None,
        text => match Token::parse(text) {
            Ok(t) => Some(t),
            Err(_) => return,
        },
    };
    let Ok(input) = Rest::arbitrary_take_rest(Unstructured::new(lines.next().unwrap_or_default())) else { return };
    let mode = if input.efficiency { Mode::Efficiency } else { Mode::Correctness };
    let policy = Policy { mode, strict: input.strict };
    let canonical = presented.and_then(|p| model::token(p).ok()).map(|p| Token::from_parts(&p).expect("1 to 4"));
    let fallback = || Token::from_parts(&[0]).expect("one component");
    let verdict: Verdict<()> = match input.verdict {
        Guest::Admit(t, advanced) => Verdict::Admit { mark: t.token(), advanced },
        Guest::Stale(m, p) => Verdict::Stale { mark: m.token(), presented: p.token() },
        Guest::Replayed(m) => Verdict::Replayed { mark: m.token() },
        Guest::Malformed => Verdict::Malformed(()),
        Guest::Missing => Verdict::Missing,
        Guest::AdmitPresented(advanced) => Verdict::Admit { mark: canonical.unwrap_or_else(fallback), advanced },
        Guest::StalePresented => {
            Verdict::Stale { mark: read.unwrap_or_else(fallback), presented: canonical.unwrap_or_else(fallback) }
        }
        Guest::StaleRead(p) => Verdict::Stale { mark: read.unwrap_or_else(fallback), presented: p.token() },
        Guest::ReplayedRead => Verdict::Replayed { mark: read.unwrap_or_else(fallback) },
        Guest::AdmitRead(advanced) => Verdict::Admit { mark: read.unwrap_or_else(fallback), advanced },
    };

    let checked = check(&policy, presented, read.as_ref(), &verdict);
    if let Err(breach) = &checked {
        assert!(is_printable_line(&breach.to_string()), "{breach:?}");
    }
    if checked.is_ok() {
        assert_eq!(matches!(verdict, Verdict::Missing), presented.is_none(), "{verdict:?}");
        match verdict {
            Verdict::Admit { mark: token, advanced } => {
                if let Some(m) = read {
                    let order = token.partial_cmp(&m);
                    assert!(matches!(order, Some(Ordering::Greater | Ordering::Equal)), "{token} admitted over {m}");
                    assert!(!policy.strict || order == Some(Ordering::Greater), "{token} replayed over {m}");
                }
                assert_eq!(advanced, read.is_none_or(|m| token > m));
                if let Some(c) = canonical {
                    assert_eq!(token, c);
                }
            }
            Verdict::Stale { mark, presented: token } => {
                assert_eq!(Some(mark), read);
                assert!(token < mark);
                assert!(canonical.is_none_or(|c| c == token));
            }
            Verdict::Replayed { mark } => {
                assert!(policy.strict && Some(mark) == read);
                assert!(canonical.is_none_or(|c| c == mark));
            }
            Verdict::Malformed(()) | Verdict::Missing => {}
        }
    }

    let reference = decide(&policy, presented, read.as_ref());
    assert_eq!(check(&policy, presented, read.as_ref(), &reference), Ok(()), "{reference:?}");

    if let Some(refusal) = provable(&policy, presented, read.as_ref()) {
        assert!(!matches!(refusal, Verdict::Admit { .. } | Verdict::Missing), "{refusal:?}");
        assert_eq!(refusal, reference);
        assert_eq!(check(&policy, presented, read.as_ref(), &refusal), Ok(()));
        if matches!(verdict, Verdict::Admit { .. }) {
            assert!(checked.is_err(), "{verdict:?} passed where {refusal:?} is provable");
        }
    }
});
