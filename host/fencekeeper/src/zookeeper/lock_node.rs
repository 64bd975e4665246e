//! The lock recipe's names and numbers, one definition for the lock client
//! (`fencekeeper lock --zookeeper`) and for provenance, so that both agree on who
//! holds a lock and on what its token is.
//!
//! * A lock is a znode path; its contenders are ephemeral sequential children named
//!   as kazoo names its own, `<id>__lock__NNNNNNNNNN` (kazoo's read locks,
//!   `__rlock__`, count too); the lowest sequence number holds.
//! * The token is the holder node's czxid (the zxid of the transaction that created
//!   it) as `epoch.counter`: the high and low 32 bits. zxids only grow, across leader
//!   changes (the epoch goes up) and across the lock node being deleted and made
//!   again, where sequence numbers start over.

use fencekeeper_core::Token;

/// The lock node's path for lock `name`: a leading `/` added, a trailing one cut;
/// None when it has an empty, `.` or `..` part or characters ZooKeeper refuses in a
/// path, so that a name ZooKeeper would answer BADARGUMENTS for is caught before
/// anything is sent.
pub fn lock_path(name: &str) -> Option<String> {
    let trimmed = name.trim_matches('/');
    let parts_ok = trimmed.split('/').all(|part| !part.is_empty() && part != "." && part != "..");
    // ZooKeeper's PathUtils refuses these code points in a path (surrogates cannot
    // occur in a str).
    let refused = |c: char| matches!(c, '\u{0}'..='\u{1f}' | '\u{7f}'..='\u{9f}' | '\u{e000}'..='\u{f8ff}' | '\u{fff0}'..='\u{ffff}');
    (!trimmed.is_empty() && parts_ok && !trimmed.chars().any(refused)).then(|| format!("/{trimmed}"))
}

/// The sequence number of a contender's node (`...__lock__0000000042`; kazoo's read
/// locks, `__rlock__`, count too); None for other children. ZooKeeper writes the
/// sequence with `%010d`, so past 2^31 it is negative (`-2147483648`).
pub fn sequence(child: &str) -> Option<i64> {
    let split = child.len().checked_sub(10)?;
    let (head, digits) = (child.get(..split)?, child.get(split..)?);
    let unsigned = head.strip_suffix('-');
    let head = unsigned.unwrap_or(head);
    if !digits.bytes().all(|b| b.is_ascii_digit()) || !(head.ends_with("__lock__") || head.ends_with("__rlock__")) {
        return None;
    }
    let value: i64 = digits.parse().ok()?;
    Some(if unsigned.is_some() { -value } else { value })
}

/// The token of a znode created at `czxid`: its epoch and counter, `3.57`.
pub fn token_text(czxid: i64) -> String {
    let zxid = czxid as u64;
    format!("{}.{}", zxid >> 32, zxid & 0xffff_ffff)
}

/// Why a token cannot be a czxid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NotAZxid {
    /// It is not `epoch.counter`.
    #[error("a ZooKeeper token is a czxid as epoch.counter (two components), not {0}")]
    Arity(usize),
    /// A component does not fit in 32 bits.
    #[error("its epoch and counter are each at most 4294967295")]
    TooWide,
    /// The zxid would be negative as ZooKeeper's signed 64-bit zxid: no ensemble
    /// reaches epoch 2^31.
    #[error("its epoch is above 2147483647, which no ZooKeeper ensemble reaches")]
    Negative,
}

/// The czxid a token stands for: the inverse of [`token_text`], for the zxids
/// ZooKeeper issues (positive 64-bit numbers).
pub fn czxid(token: &Token) -> Result<i64, NotAZxid> {
    let &[epoch, counter] = token.parts() else { return Err(NotAZxid::Arity(token.arity())) };
    let (Ok(epoch), Ok(counter)) = (u32::try_from(epoch), u32::try_from(counter)) else {
        return Err(NotAZxid::TooWide);
    };
    i64::try_from((u64::from(epoch) << 32) | u64::from(counter)).map_err(|_| NotAZxid::Negative)
}

#[cfg(test)]
// A test states its expectations by panicking.
#[allow(clippy::panic)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    #[test]
    fn contenders_are_kazoo_lock_and_read_lock_nodes() {
        assert_eq!(sequence("5f1c__lock__0000000042"), Some(42));
        assert_eq!(sequence("fencekeeper-1-2-3__lock__0000000007"), Some(7));
        assert_eq!(sequence("ab__rlock__0000000003"), Some(3));
        assert_eq!(sequence("ab__lock__-2147483648"), Some(-2147483648));
        assert_eq!(sequence("_c_ab-lock-0000000001"), None);
        assert_eq!(sequence("lease"), None);
        assert_eq!(sequence("ab__lock__00000000x1"), None);
        assert_eq!(sequence("ab__lock__00000\u{e9}001"), None, "not digits, and not a char boundary");
    }

    #[test]
    fn the_token_is_the_czxid_as_epoch_and_counter_and_back() {
        assert_eq!(token_text(0x0000_0001_0000_0005), "1.5");
        assert_eq!(token_text(0x0000_0003_0000_0000), "3.0");
        assert_eq!(token_text(42), "0.42");
        for czxid in [1, 42, 0x0000_0002_0000_0002, 0x7fff_ffff_ffff_ffff] {
            assert_eq!(super::czxid(&token!(&token_text(czxid))), Ok(czxid));
        }
    }

    #[test]
    fn tokens_that_are_no_czxid_say_why() {
        assert_eq!(czxid(&token!("57")), Err(NotAZxid::Arity(1)));
        assert_eq!(czxid(&token!("1.2.3")), Err(NotAZxid::Arity(3)));
        assert_eq!(czxid(&token!("4294967296.0")), Err(NotAZxid::TooWide));
        assert_eq!(czxid(&token!("1.4294967296")), Err(NotAZxid::TooWide));
        assert_eq!(czxid(&token!("4294967295.4294967295")), Err(NotAZxid::Negative));
        assert_eq!(czxid(&token!("2147483648.0")), Err(NotAZxid::Negative));
        assert_eq!(czxid(&token!("2147483647.4294967295")), Ok(i64::MAX));
    }

    #[test]
    fn lock_paths_are_absolute_without_empty_or_dot_parts() {
        assert_eq!(lock_path("locks/orders").as_deref(), Some("/locks/orders"));
        assert_eq!(lock_path("/locks/orders/").as_deref(), Some("/locks/orders"));
        assert_eq!(lock_path("/locks/orders/2026-11.csv").as_deref(), Some("/locks/orders/2026-11.csv"));
        assert!(lock_path("/").is_none());
        assert!(lock_path("a//b").is_none());
        assert!(lock_path("/locks/../b").is_none());
        assert!(lock_path("/locks/./b").is_none());
        assert!(lock_path("/locks/a\u{0}b").is_none());
    }
}
