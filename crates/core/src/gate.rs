//! The ordering gate's rule: when a host may send an admitted write to the store.
//!
//! A host checks a token before the store applies the write. If write A (token 33)
//! is admitted and sent, then B (34) is admitted and applied, A can still land after
//! B when the store is slow on it. A host that sees the writes it sent closes this:
//! a write may go only when no write with a lower token on the same resource may
//! still reach the store. This module is that rule, once, for every host's gate (the
//! gateway's memory, the Envoy filter's shared data, the shared registry in etcd).
//!
//! A *flight* is a write a host sent on a resource and that the store may still
//! apply:
//! * [`Until::Answered`]: sent, not yet answered. It holds the resource until the
//!   store answers it or the host gives up on it;
//! * [`Until::Deadline`]: the host gave up on it (a timeout, a reset, a client that
//!   went away, a host that died), at a time when the store could still apply it.
//!   The host's *store apply bound* says how long after that the store may still
//!   apply it; the flight holds the resource until then (milliseconds on the host's
//!   clock), and is forgotten after.
//!
//! Writes with equal tokens do not hold each other back (one holder's own concurrent
//! writes), and a write with a higher token already sent makes a lower one stale.

use crate::token::Token;
use core::cmp::Ordering;

/// How long a flight holds its resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Until {
    /// Sent and not answered: until the store answers or the host gives up.
    Answered,
    /// Given up on: until this instant (milliseconds on the host's clock), after
    /// which the store can no longer apply it.
    Deadline(u64),
}

/// A write sent to the store on one resource, that the store may still apply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flight {
    /// The token it was admitted with.
    pub token: Token,
    /// How long it holds the resource.
    pub until: Until,
}

impl Flight {
    /// Whether the store may still apply it at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        match self.until {
            Until::Answered => true,
            Until::Deadline(at) => now_ms < at,
        }
    }
}

/// What the gate says of a write admitted with some token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passage {
    /// No lower-token write can reach the store after it: send it.
    Go,
    /// A lower-token write may still reach the store: hold the write. `until` is the
    /// latest deadline of the lower writes that were given up on, when every one of
    /// them was (a hint for `Retry-After`); `None` while one is still unanswered.
    Wait {
        /// When the last lower write given up on stops holding the resource.
        until: Option<u64>,
    },
    /// The mark or a write already sent carries a higher token: the write is stale,
    /// and this is that token (for `fencing-highest`).
    Stale(Token),
}

/// May a write admitted with `token` go to the store now? `highest` is the highest
/// token the host knows admitted on the resource (its mark, or a lower bound of it);
/// `flights` are the writes it knows sent on the resource, its own excluded. Flights
/// no longer live at `now_ms` are ignored. A flight whose token cannot be compared
/// (another arity: the resource's mark was cleared and restarted by an operator)
/// holds the write like a lower one: waiting is always safe.
pub fn pass(token: &Token, highest: Option<&Token>, flights: impl IntoIterator<Item = Flight>, now_ms: u64) -> Passage {
    let mut stale = highest.filter(|h| h.partial_cmp(&token) == Some(Ordering::Greater)).copied();
    let mut held = false;
    let mut unanswered = false;
    let mut until = 0;
    for flight in flights.into_iter().filter(|f| f.live(now_ms)) {
        match flight.token.partial_cmp(token) {
            Some(Ordering::Equal) => {}
            Some(Ordering::Greater) => {
                if stale.is_none_or(|s| flight.token > s) {
                    stale = Some(flight.token);
                }
            }
            Some(Ordering::Less) | None => {
                held = true;
                match flight.until {
                    Until::Answered => unanswered = true,
                    Until::Deadline(at) => until = until.max(at),
                }
            }
        }
    }
    if let Some(s) = stale {
        return Passage::Stale(s);
    }
    if held {
        return Passage::Wait { until: (!unanswered).then_some(until) };
    }
    Passage::Go
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::token;
    use proptest::prelude::*;
    use std::vec::Vec;

    fn sent(token: &str) -> Flight {
        Flight { token: token!(token), until: Until::Answered }
    }

    fn given_up(token: &str, at: u64) -> Flight {
        Flight { token: token!(token), until: Until::Deadline(at) }
    }

    #[test]
    fn a_lower_write_in_flight_holds_a_higher_one() {
        assert_eq!(pass(&token!("34"), Some(&token!("34")), [sent("33")], 0), Passage::Wait { until: None });
        assert_eq!(pass(&token!("34"), Some(&token!("34")), [], 0), Passage::Go);
    }

    #[test]
    fn equal_tokens_and_other_resources_do_not_wait() {
        assert_eq!(pass(&token!("34"), Some(&token!("34")), [sent("34"), sent("34")], 0), Passage::Go);
    }

    #[test]
    fn a_higher_mark_or_a_higher_write_sent_makes_the_write_stale() {
        assert_eq!(pass(&token!("33"), Some(&token!("34")), [], 0), Passage::Stale(token!("34")));
        assert_eq!(pass(&token!("33"), Some(&token!("33")), [sent("35"), sent("34")], 0), Passage::Stale(token!("35")));
        assert_eq!(pass(&token!("33"), Some(&token!("34")), [sent("36")], 0), Passage::Stale(token!("36")));
        // A higher one sent wins over a lower one in flight: waiting would not help.
        assert_eq!(pass(&token!("34"), None, [sent("33"), sent("35")], 0), Passage::Stale(token!("35")));
    }

    #[test]
    fn a_write_given_up_on_holds_until_its_deadline_then_not_at_all() {
        let f = [given_up("33", 1_000)];
        assert_eq!(pass(&token!("34"), None, f, 999), Passage::Wait { until: Some(1_000) });
        assert_eq!(pass(&token!("34"), None, f, 1_000), Passage::Go);
        // A higher write given up on and past its deadline no longer makes one stale.
        assert_eq!(pass(&token!("34"), None, [given_up("35", 10)], 10), Passage::Go);
    }

    #[test]
    fn the_retry_hint_is_the_last_deadline_and_absent_while_one_is_unanswered() {
        let f = [given_up("31", 500), given_up("32", 900)];
        assert_eq!(pass(&token!("34"), None, f, 0), Passage::Wait { until: Some(900) });
        let f = [given_up("31", 500), sent("32")];
        assert_eq!(pass(&token!("34"), None, f, 0), Passage::Wait { until: None });
    }

    #[test]
    fn a_flight_of_another_arity_holds_the_write() {
        assert_eq!(pass(&token!("7.1"), None, [sent("9")], 0), Passage::Wait { until: None });
    }

    proptest! {
        /// Against a model: the write goes exactly when nothing live is lower and
        /// nothing known is higher.
        #[test]
        fn passage_matches_the_model(
            token in 0u64..8,
            highest in proptest::option::of(0u64..8),
            flights in proptest::collection::vec((0u64..8, proptest::option::of(0u64..20)), 0..6),
            now in 0u64..20,
        ) {
            let tok = Token::from_parts(&[token]).unwrap();
            let high = highest.map(|h| Token::from_parts(&[h]).unwrap());
            let fl: Vec<Flight> = flights.iter().map(|&(t, d)| Flight {
                token: Token::from_parts(&[t]).unwrap(),
                until: d.map_or(Until::Answered, Until::Deadline),
            }).collect();
            let live: Vec<&(u64, Option<u64>)> = flights.iter().filter(|(_, d)| d.is_none_or(|d| now < d)).collect();
            let got = pass(&tok, high.as_ref(), fl, now);
            let higher = highest.into_iter().chain(live.iter().map(|(t, _)| *t)).filter(|&h| h > token).max();
            let lower: Vec<_> = live.iter().filter(|(t, _)| *t < token).collect();
            let want = match (higher, lower.is_empty()) {
                (Some(h), _) => Passage::Stale(Token::from_parts(&[h]).unwrap()),
                (None, true) => Passage::Go,
                (None, false) => Passage::Wait {
                    until: lower.iter().map(|(_, d)| *d).collect::<Option<Vec<u64>>>().map(|d| d.into_iter().max().unwrap_or(0)),
                },
            };
            prop_assert_eq!(got, want);
        }
    }
}
