//! A small per-thread cache of verdicts, so that a holder's repeated writes (the
//! same token against the same mark) cost a lookup instead of a trip into the guest.
//!
//! Sound because a verdict is a function of (policy, presented text, mark): the
//! world imports nothing, so a guest has no input but these. The policy is fixed per
//! validator, and the cache belongs to one validator. The guard checks every verdict
//! it gets, cached or not, so a cached answer is held to the same rules as a fresh
//! one. Only verdicts without text are kept (a malformed reason would need an
//! allocation per hit), and nothing here is shared between threads.

use fencekeeper_core::token::MAX_TOKEN_BYTES;
use fencekeeper_core::Token;

const SLOTS: usize = 64;

#[derive(Clone, Copy)]
struct Entry {
    text: [u8; MAX_TOKEN_BYTES],
    /// Text length; `u8::MAX`: no token presented. 0 with `verdict` None: empty slot.
    len: u8,
    mark: Option<Token>,
    verdict: Option<Verdict<()>>,
}

/// The cache of one validator on one thread (direct-mapped).
pub(crate) struct VerdictCache {
    entries: Box<[Entry; SLOTS]>,
}

type Verdict<M> = fencekeeper_core::Verdict<M>;

const NONE: u8 = u8::MAX;
const _: () = assert!(MAX_TOKEN_BYTES < NONE as usize);

impl VerdictCache {
    pub(crate) fn new() -> VerdictCache {
        let empty = Entry { text: [0; MAX_TOKEN_BYTES], len: 0, mark: None, verdict: None };
        VerdictCache { entries: Box::new([empty; SLOTS]) }
    }

    fn slot(presented: Option<&str>, mark: Option<&Token>) -> usize {
        // FNV-1a over the text and the mark's components: cheap, and collisions
        // only cost a miss (the whole key is compared).
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |b: u8| h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        presented.unwrap_or("\u{0}").bytes().for_each(&mut eat);
        for part in mark.map(Token::parts).unwrap_or_default() {
            part.to_le_bytes().into_iter().for_each(&mut eat);
        }
        (h as usize) % SLOTS
    }

    fn matches(e: &Entry, presented: Option<&str>, mark: Option<&Token>) -> bool {
        let text_matches = match presented {
            None => e.len == NONE,
            Some(t) => usize::from(e.len) == t.len() && &e.text[..t.len()] == t.as_bytes(),
        };
        text_matches && e.mark.as_ref() == mark
    }

    pub(crate) fn get(&self, presented: Option<&str>, mark: Option<&Token>) -> Option<crate::Verdict> {
        let e = &self.entries[Self::slot(presented, mark)];
        let verdict = e.verdict?;
        Self::matches(e, presented, mark).then(|| verdict.map_malformed(|()| unreachable_reason()))
    }

    pub(crate) fn put(&mut self, presented: Option<&str>, mark: Option<&Token>, verdict: &crate::Verdict) {
        let kept = match verdict {
            Verdict::Admit { mark, advanced } => Verdict::Admit { mark: *mark, advanced: *advanced },
            Verdict::Stale { mark, presented } => Verdict::Stale { mark: *mark, presented: *presented },
            Verdict::Replayed { mark } => Verdict::Replayed { mark: *mark },
            Verdict::Missing => Verdict::Missing,
            Verdict::Malformed(_) => return,
        };
        let mut text = [0; MAX_TOKEN_BYTES];
        let len = match presented {
            Some(t) if t.len() <= MAX_TOKEN_BYTES => {
                text[..t.len()].copy_from_slice(t.as_bytes());
                t.len() as u8
            }
            // Longer text never reaches a validator (the guard's precheck).
            Some(_) => return,
            None => NONE,
        };
        self.entries[Self::slot(presented, mark)] = Entry { text, len, mark: mark.copied(), verdict: Some(kept) };
    }
}

/// Malformed verdicts are never cached, so no cached verdict carries a reason.
fn unreachable_reason() -> crate::GuestText {
    crate::GuestText::new("")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::GuestText;
    use fencekeeper_core::token;

    #[test]
    fn hits_only_on_the_same_text_and_mark() {
        let mut c = VerdictCache::new();
        let admit = crate::Verdict::Admit { mark: token!("34"), advanced: false };
        c.put(Some("34"), Some(&token!("34")), &admit);
        assert_eq!(c.get(Some("34"), Some(&token!("34"))), Some(admit.clone()));
        assert_eq!(c.get(Some("034"), Some(&token!("34"))), None, "another text is another key");
        assert_eq!(c.get(Some("34"), Some(&token!("33"))), None);
        assert_eq!(c.get(Some("34"), None), None);
        assert_eq!(c.get(None, Some(&token!("34"))), None);
        c.put(None, None, &crate::Verdict::Missing);
        assert_eq!(c.get(None, None), Some(crate::Verdict::Missing));
    }

    #[test]
    fn malformed_verdicts_are_not_kept() {
        let mut c = VerdictCache::new();
        c.put(Some("x"), None, &crate::Verdict::Malformed(GuestText::new("no")));
        assert_eq!(c.get(Some("x"), None), None);
    }
}
