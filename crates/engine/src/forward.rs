//! What a forwarded request carries of the fence's decision.
//!
//! Only the fence tells the store what it admitted: a store (or an application behind
//! it) may trust [`ADMITTED_HEADER`] as the token of the write. So the header a client
//! sent is removed from every request a host forwards, fenced or not, admitted or
//! passed failing open, and the fence sets it only on a write it admitted, to the
//! token it admitted.

use fencekeeper_core::http::ADMITTED_HEADER;
use fencekeeper_core::refusal::Action;
use fencekeeper_core::{Class, Token};

/// Request headers a client may not send through the fence: a host removes each from
/// every request before it forwards it.
pub const NEVER_FROM_CLIENTS: [&str; 1] = [ADMITTED_HEADER];

/// The [`ADMITTED_HEADER`] a forwarded request carries after `action` (resolved for
/// it), once a host removed [`NEVER_FROM_CLIENTS`]: the admitted token, or nothing
/// (a write passed failing open was admitted by no one).
pub fn admitted(action: &Action) -> Option<Token> {
    action.token.filter(|_| action.forward && action.class == Class::Admitted)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::refusal::{resolve, NoVerdict};
    use fencekeeper_core::{Mode, Verdict};

    #[test]
    fn only_an_admitted_write_carries_the_admitted_token() {
        let token = Token::parse("0042").unwrap();
        let admit: Verdict = Verdict::Admit { mark: token, advanced: true };
        assert_eq!(admitted(&resolve(Mode::Correctness, Ok(&admit))).map(|t| t.to_string()), Some("42".into()));
        let open = resolve::<()>(Mode::Efficiency, Err(NoVerdict::StoreUnreachable));
        assert!(open.forward, "efficiency mode passes it");
        assert_eq!(admitted(&open), None, "nobody admitted a write passed failing open");
        let stale: Verdict = Verdict::Stale { mark: token, presented: Token::parse("1").unwrap() };
        assert_eq!(admitted(&resolve(Mode::Correctness, Ok(&stale))), None);
    }
}
