//! Provenance: did etcd issue this token? A host asks before a token advances a mark,
//! so that a token nobody was given (`fencing-token: 18446744073709551615`) cannot
//! raise the mark past every honest holder and lock them out. Tokens equal to the mark
//! are never asked about: they were vouched for when they became the mark.
//!
//! Both checks take tokens that are etcd revisions (one component), which is what
//! `etcdctl lock` hands its command (`ETCD_LOCK_REV`, the revision at which it saw that
//! it holds the lock) and what `fencekeeper lock --etcd` hands out (docs/tokens.md):
//!
//! * **weak**: the token is not above the cluster's revision. etcd has issued every
//!   revision up to its current one and none above, so a token above it was never
//!   issued. Revisions only grow, so a host that has seen revision R in any answer
//!   needs no round trip for a token at or below R.
//! * **strong**: the token belongs to the current holder of the resource's lock: the
//!   lock named `LOCK_PREFIX + resource` (etcd's `concurrency.Mutex`, which `etcdctl
//!   lock` and `fencekeeper lock --etcd` both run, keeps its keys under `NAME/`; the
//!   holder is the key with the lowest create revision), and the token lies between
//!   the holder key's create revision and the revision of the read. A holder's token
//!   is the revision at which it saw that it held the lock, so it is at or above its
//!   key's create revision and at or below any later revision. What this is not: an
//!   exact match. Neither client stores its token in etcd, so a token anywhere in that
//!   interval passes (see docs/operations.md for what that leaves open).
//!
//! Here is the read those checks need ([`holder_op`]; [`crate::grpc::vouch_txn`]
//! sends it with the mark's read in one transaction) and the rules, [`weak`] and
//! [`strong`]: pure functions, shared by the library and the Envoy filter.

use crate::{KeyValue, Op, Range};
use fencekeeper_core::Token;
use std::fmt;

/// Which provenance check a host runs for etcd tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// The token is not above the cluster's revision.
    Weak,
    /// The token belongs to the current holder of the resource's lock.
    Strong,
}

/// The lock of `resource` under `lock_prefix`: the name a client locks
/// (`etcdctl lock NAME`), whose keys live under `NAME/`.
pub fn lock_name(lock_prefix: &str, resource: &str) -> String {
    format!("{lock_prefix}{resource}")
}

/// What [`crate::grpc::vouch_txn`] answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VouchAnswer {
    /// The mark key (its raw value is the caller's to verify), if it exists.
    pub mark: Option<KeyValue>,
    /// The holder's key, when the lock was read and is held.
    pub holder: Option<KeyValue>,
    /// The cluster's revision at the read.
    pub revision: u64,
}

/// Why etcd did not issue a token (to this holder).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unissued {
    /// etcd's tokens are revisions: one component.
    Arity(usize),
    /// The token is above the cluster's revision.
    AboveRevision {
        /// The token.
        token: Token,
        /// The cluster's revision.
        revision: u64,
    },
    /// Nobody holds the resource's lock.
    NoHolder {
        /// The token.
        token: Token,
        /// The lock's name.
        lock: String,
    },
    /// The token is below the create revision of the holder's key: an earlier holder's.
    BelowHolder {
        /// The token.
        token: Token,
        /// The holder key's create revision.
        create: u64,
        /// The holder's key.
        key: String,
    },
}

impl fmt::Display for Unissued {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unissued::Arity(n) => {
                write!(f, "etcd issues tokens of one component (a revision), and this one has {n}")
            }
            Unissued::AboveRevision { token, revision } => {
                write!(f, "etcd has not issued token {token}: it is above the cluster's revision {revision}")
            }
            Unissued::NoHolder { token, lock } => {
                write!(f, "token {token} is not the lock holder's: nobody holds the lock {lock:?} (no key under {lock:?}/)")
            }
            Unissued::BelowHolder { token, create, key } => write!(
                f,
                "token {token} is not the lock holder's: it is below the create revision {create} of the holder's key {key:?}, \
                 so it belongs to an earlier holder"
            ),
        }
    }
}

/// The token as a revision, if it is one component.
fn revision_of(token: &Token) -> Result<u64, Unissued> {
    match token.parts() {
        [revision] => Ok(*revision),
        parts => Err(Unissued::Arity(parts.len())),
    }
}

/// The weak check: `token` is not above `revision`, a revision of the cluster.
pub fn weak(token: &Token, revision: u64) -> Result<(), Unissued> {
    if revision_of(token)? > revision {
        return Err(Unissued::AboveRevision { token: *token, revision });
    }
    Ok(())
}

/// The strong check: `token` lies between the create revision of `holder` (the first
/// key under lock `lock`, by create revision; `None` when nobody holds it) and
/// `revision`, the revision at which the holder was read.
pub fn strong(token: &Token, holder: Option<&KeyValue>, lock: &str, revision: u64) -> Result<(), Unissued> {
    weak(token, revision)?;
    let Some(holder) = holder else {
        return Err(Unissued::NoHolder { token: *token, lock: lock.to_owned() });
    };
    if revision_of(token)? < holder.create_revision {
        let key = String::from_utf8_lossy(&holder.key).into_owned();
        return Err(Unissued::BelowHolder { token: *token, create: holder.create_revision, key });
    }
    Ok(())
}

/// The keys under which lock `name`'s contenders live (`name/`), for [`holder_op`].
pub fn holder_keys(name: &str) -> String {
    format!("{name}/")
}

/// The strong check's read of a lock's holder as a Txn's operation: the key under
/// `keys` ([`holder_keys`]) with the lowest create revision, key only (etcd's `Mutex`
/// calls it the owner).
pub fn holder_op(keys: &str) -> Op<'_> {
    Op::Range(Range {
        key: keys.as_bytes(),
        prefix: true,
        limit: 1,
        by_create_revision: Some(true),
        keys_only: true,
        ..Range::default()
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use fencekeeper_core::token;

    fn holder(create: u64) -> KeyValue {
        KeyValue { key: b"/locks/r/694d8a".to_vec(), value: Vec::new(), create_revision: create, mod_revision: create }
    }

    #[test]
    fn weak_admits_any_revision_up_to_the_clusters_and_nothing_above() {
        assert_eq!(weak(&token!("57"), 57), Ok(()));
        assert_eq!(weak(&token!("1"), 57), Ok(()));
        let forged = weak(&token!("18446744073709551615"), 57).unwrap_err();
        assert!(forged.to_string().contains("above the cluster's revision 57"), "{forged}");
        assert_eq!(weak(&token!("3.1"), 57), Err(Unissued::Arity(2)));
    }

    #[test]
    fn strong_admits_only_tokens_of_the_current_holder() {
        let lock = lock_name("/locks/", "r");
        assert_eq!(lock, "/locks/r");
        // The holder's key was created at 40; it saw it held the lock at 40 (nobody
        // queued) or later (it waited); the read is at 57.
        assert_eq!(strong(&token!("40"), Some(&holder(40)), &lock, 57), Ok(()));
        assert_eq!(strong(&token!("45"), Some(&holder(40)), &lock, 57), Ok(()));
        assert!(matches!(
            strong(&token!("39"), Some(&holder(40)), &lock, 57),
            Err(Unissued::BelowHolder { create: 40, .. })
        ));
        assert!(matches!(strong(&token!("58"), Some(&holder(40)), &lock, 57), Err(Unissued::AboveRevision { .. })));
        let free = strong(&token!("45"), None, &lock, 57).unwrap_err();
        assert!(free.to_string().contains("nobody holds the lock \"/locks/r\""), "{free}");
    }
}
