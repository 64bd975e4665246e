//! Target 2: the decision against a max-register model.
//!
//! The input is a script, one line each: the policy (`strict`, `efficiency`, both
//! or neither), the resource's mark before the first request (empty: none), then
//! the token text each request presents (`-`: no token). The model is a register
//! that only grows: no mark admits and sets it, above admits and raises it, equal
//! admits (or is replayed when strict), below is stale and reports it, another
//! arity is malformed, text that is not a token is malformed as the grammar model
//! says. Each verdict must be the model's, `decide_token` must agree with `decide`,
//! and the mark a host keeps by applying the verdicts (store when `advanced`) must
//! equal the model's register after every request, and never decrease.
#![no_main]

use fencekeeper_core::decision::{decide, decide_token, Mode, Policy, Verdict};
use fencekeeper_core::refusal::{resolve, Class};
use fencekeeper_core::{Malformed, Token};
use fencekeeper_fuzz::model;
use libfuzzer_sys::fuzz_target;
use std::cmp::Ordering;

/// A verdict in the model's terms.
#[derive(Debug, PartialEq)]
enum Expected {
    Admit { mark: Vec<u64>, advanced: bool },
    Stale { mark: Vec<u64>, presented: Vec<u64> },
    Replayed { mark: Vec<u64> },
    Malformed(Malformed),
    Missing,
}

fn expected(strict: bool, presented: Option<&str>, register: Option<&Vec<u64>>) -> Expected {
    let Some(text) = presented else {
        return Expected::Missing;
    };
    let presented = match model::token(text) {
        Ok(p) => p,
        Err(e) => return Expected::Malformed(e),
    };
    let Some(mark) = register else {
        return Expected::Admit { mark: presented, advanced: true };
    };
    if mark.len() != presented.len() {
        return Expected::Malformed(Malformed::ArityMismatch { mark: mark.len(), presented: presented.len() });
    }
    match presented.cmp(mark) {
        Ordering::Greater => Expected::Admit { mark: presented, advanced: true },
        Ordering::Equal if strict => Expected::Replayed { mark: presented },
        Ordering::Equal => Expected::Admit { mark: presented, advanced: false },
        Ordering::Less => Expected::Stale { mark: mark.clone(), presented },
    }
}

fn observed(verdict: &Verdict) -> Expected {
    match *verdict {
        Verdict::Admit { mark, advanced } => Expected::Admit { mark: mark.parts().to_vec(), advanced },
        Verdict::Stale { mark, presented } => {
            Expected::Stale { mark: mark.parts().to_vec(), presented: presented.parts().to_vec() }
        }
        Verdict::Replayed { mark } => Expected::Replayed { mark: mark.parts().to_vec() },
        Verdict::Malformed(e) => Expected::Malformed(e),
        Verdict::Missing => Expected::Missing,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(script) = std::str::from_utf8(data) else { return };
    let mut lines = script.split('\n');
    let flags = lines.next().unwrap_or_default();
    let strict = flags.contains("strict");
    let mode = if flags.contains("efficiency") { Mode::Efficiency } else { Mode::Correctness };
    let policy = Policy { mode, strict };
    let (mut held, mut register) = match lines.next().unwrap_or_default() {
        "" => (None, None),
        text => match (Token::parse(text), model::token(text)) {
            (Ok(t), Ok(parts)) => (Some(t), Some(parts)),
            _ => return,
        },
    };

    for line in lines {
        let presented = (line != "-").then_some(line);
        let verdict = decide(&policy, presented, held.as_ref());
        let want = expected(strict, presented, register.as_ref());
        assert_eq!(observed(&verdict), want, "{line:?} against {held:?}");
        if let Some(Ok(token)) = presented.map(Token::parse) {
            assert_eq!(decide_token(&policy, token, held.as_ref()), verdict);
        }
        let action = resolve(mode, Ok(&verdict));
        assert_eq!(action.forward, matches!(verdict, Verdict::Admit { .. }));
        assert_eq!(action.class == Class::Admitted, action.forward);

        if let Expected::Admit { mark, .. } = want {
            register = Some(mark);
        }
        // What a host does with the verdict: store the mark when it advanced.
        if let Verdict::Admit { mark, advanced: true } = verdict {
            if let Some(old) = held {
                assert!(mark > old, "an advance from {old} to {mark}");
            }
            held = Some(mark);
        }
        assert_eq!(held.map(|t| t.parts().to_vec()), register);
    }
});
