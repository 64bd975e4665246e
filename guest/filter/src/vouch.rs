//! The provenance step of a request: before a token advances a mark, etcd vouches for
//! it (docs/envoy.md, "Provenance"). The rules are the etcd wire's, shared with the
//! gateway; this module only says, from what the filter knows, whether a read is
//! needed, and what to do with the read's answer. Pure, so it is tested natively.
//!
//! * weak: a token at or below a revision this worker has already seen in an etcd
//!   answer needs no read (revisions only grow); otherwise the read's revision decides;
//! * strong: always a read, of the holder of the lock `lock_prefix + resource`.
//!
//! The read also returns the exact mark (the shared-data copy can lag it): a token
//! equal to the mark is then admitted without a check, and a lower one refused.

use crate::config::Provenance;
use crate::etcd::Found;
use fencekeeper_core::decision::decide_token;
use fencekeeper_core::{Policy, Token, Verdict};
use fencekeeper_etcd_wire::provenance as rules;

/// Whether `token` needs no read to be vouched for: no check, or the weak check of a
/// token at or below `revision_seen`.
pub fn vouched_without_read(provenance: &Provenance, token: &Token, revision_seen: u64) -> bool {
    match provenance {
        Provenance::Off => true,
        Provenance::Weak => rules::weak(token, revision_seen).is_ok(),
        Provenance::Strong { .. } => false,
    }
}

/// The lock whose holder the read asks for (the strong check only).
pub fn lock(provenance: &Provenance, resource: &str) -> Option<String> {
    match provenance {
        Provenance::Strong { lock_prefix } => Some(rules::lock_name(lock_prefix, resource)),
        _ => None,
    }
}

/// What to do after the read.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// Decided on the exact mark without a check: an equal token admitted (not
    /// advancing), or a refusal.
    Decided(Verdict),
    /// etcd did not issue the token (to the lock's holder); why, naming it.
    Unverified(String),
    /// Vouched for: advance from this exact mark with the mark transaction.
    Advance(Option<Token>),
}

/// Judge the read's answer for `token` on `resource`.
pub fn judge(provenance: &Provenance, policy: &Policy, resource: &str, token: Token, found: &Found) -> Next {
    match decide_token(policy, token, found.mark.as_ref()) {
        Verdict::Admit { advanced: true, .. } => {}
        decided => return Next::Decided(decided),
    }
    let rule = match (provenance, lock(provenance, resource)) {
        (Provenance::Strong { .. }, Some(lock)) => rules::strong(&token, found.holder.as_ref(), &lock, found.revision),
        (Provenance::Off, _) => Ok(()),
        _ => rules::weak(&token, found.revision),
    };
    match rule {
        Ok(()) => Next::Advance(found.mark),
        Err(why) => Next::Unverified(why.to_string()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;
    use fencekeeper_etcd_wire::KeyValue;

    fn found(mark: Option<&str>, holder: Option<u64>, revision: u64) -> Found {
        let holder = holder.map(|c| KeyValue {
            key: b"/locks/r/1".to_vec(),
            value: vec![],
            create_revision: c,
            mod_revision: c,
        });
        Found { mark: mark.map(|m| token!(m)), holder, revision }
    }

    #[test]
    fn a_weak_token_below_a_revision_seen_needs_no_read_a_strong_one_always_does() {
        assert!(vouched_without_read(&Provenance::Weak, &token!("40"), 40));
        assert!(!vouched_without_read(&Provenance::Weak, &token!("41"), 40));
        assert!(!vouched_without_read(&Provenance::Weak, &token!("1.1"), 40));
        assert!(!vouched_without_read(&Provenance::Strong { lock_prefix: "/l/".into() }, &token!("1"), 40));
        assert!(vouched_without_read(&Provenance::Off, &token!("18446744073709551615"), 0));
    }

    #[test]
    fn the_read_decides_on_the_exact_mark_then_checks_only_an_advance() {
        let policy = Policy::default();
        let weak = Provenance::Weak;
        let forged = judge(&weak, &policy, "r", token!("18446744073709551615"), &found(Some("33"), None, 57));
        assert!(matches!(forged, Next::Unverified(why) if why.contains("above the cluster's revision 57")));
        assert_eq!(
            judge(&weak, &policy, "r", token!("40"), &found(Some("33"), None, 57)),
            Next::Advance(Some(token!("33")))
        );
        // The copy lagged: the token equals the mark, or is below it; no check either way.
        let equal = judge(&weak, &policy, "r", token!("99"), &found(Some("99"), None, 57));
        assert_eq!(equal, Next::Decided(Verdict::Admit { mark: token!("99"), advanced: false }));
        assert!(matches!(
            judge(&weak, &policy, "r", token!("40"), &found(Some("41"), None, 57)),
            Next::Decided(Verdict::Stale { .. })
        ));
        let strong = Provenance::Strong { lock_prefix: "/locks/".into() };
        assert_eq!(judge(&strong, &policy, "r", token!("45"), &found(None, Some(40), 57)), Next::Advance(None));
        assert!(matches!(judge(&strong, &policy, "r", token!("39"), &found(None, Some(40), 57)), Next::Unverified(_)));
        let free = judge(&strong, &policy, "r", token!("45"), &found(None, None, 57));
        assert!(matches!(free, Next::Unverified(why) if why.contains("nobody holds the lock \"/locks/r\"")));
        assert_eq!(lock(&strong, "/a"), Some("/locks//a".into()));
    }
}
