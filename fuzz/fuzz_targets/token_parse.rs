//! Target 1: token parsing against the grammar's reference model.
//!
//! The input is one or two token texts (split at the first newline). For each:
//! `Token::parse` gives exactly the model's components or the model's error (same
//! variant, same position), `FromStr` agrees, `Display` is the canonical text
//! derived from the text alone, and that text parses back to the same token. For
//! two tokens, the order is the model's: lexicographic on equal arity, none else.
#![no_main]

use fencekeeper_core::token::{check_length, MAX_TOKEN_BYTES};
use fencekeeper_core::Token;
use fencekeeper_fuzz::header::is_token_value;
use fencekeeper_fuzz::model;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut texts = data.splitn(2, |&b| b == b'\n').filter_map(|t| std::str::from_utf8(t).ok());
    let a = texts.next().map(one);
    let b = texts.next().map(one);
    if let (Some(Some(a)), Some(Some(b))) = (a, b) {
        let expected = (a.arity() == b.arity()).then(|| a.parts().cmp(b.parts()));
        assert_eq!(a.partial_cmp(&b), expected, "{a} against {b}");
        assert_eq!(a == b, a.parts() == b.parts());
    }
});

fn one(raw: &str) -> Option<Token> {
    let parsed = Token::parse(raw);
    assert_eq!(parsed.map(|t| t.parts().to_vec()), model::token(raw), "{raw:?}");
    assert_eq!(raw.parse::<Token>(), parsed);
    assert_eq!(check_length(raw).is_ok(), !raw.is_empty() && raw.len() <= MAX_TOKEN_BYTES);
    let token = parsed.ok()?;
    let text = token.to_string();
    assert_eq!(Some(&text), model::canonical(raw).as_ref(), "{raw:?}");
    assert!(is_token_value(&text) && text.len() <= 83, "{text:?}");
    assert_eq!(Token::parse(&text), Ok(token));
    assert_eq!(Token::from_parts(token.parts()), Ok(token));
    assert_eq!(token.arity(), token.parts().len());
    Some(token)
}
