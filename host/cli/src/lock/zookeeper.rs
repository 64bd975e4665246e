//! A lock in ZooKeeper: the standard recipe (ephemeral sequential znodes), with nodes
//! named as kazoo names its own, so that a kazoo `Lock` and this client exclude each
//! other on one path:
//!
//! * NAME is the lock node's path (a leading `/` is added); it and its parents are
//!   created as persistent znodes when missing;
//! * each contender creates an ephemeral sequential child `<id>__lock__NNNNNNNNNN`,
//!   which lives as long as its session;
//! * the contender with the lowest sequence number holds the lock; each other one
//!   watches only the contender just before it (no herd), and looks again when that
//!   one is deleted;
//! * the token is the czxid of our child (the zxid of the transaction that created
//!   it) as `epoch.counter`: zxids only grow, across leader changes (the epoch goes
//!   up) and across the lock node being deleted and made again, where sequence
//!   numbers start over (docs/tokens.md).
//!
//! The session, the encoding and the recipe's names are the library's
//! (`fencekeeper::zookeeper`), shared with ZooKeeper provenance, so that the gateway
//! and this client agree on who holds a lock and on its token.

use super::{unique_id, Held, Patience, Renewal};
use anyhow::{bail, Context};
use fencekeeper::zookeeper::jute::{Jute, Reader};
use fencekeeper::zookeeper::lock_node::{self, sequence};
use fencekeeper::zookeeper::session::{code, describe, op};
use fencekeeper::zookeeper::Session;
use std::time::Duration;

/// CreateMode values.
const PERSISTENT: i32 = 0;
const EPHEMERAL_SEQUENTIAL: i32 = 3;

/// A held ZooKeeper lock.
pub struct ZooKeeperLock {
    session: Session,
    node: String,
    token: String,
}

/// Take lock `name` at `address` (`HOST:PORT`), in a session of `ttl`.
pub fn acquire(address: &str, name: &str, ttl: Duration, patience: Patience) -> anyhow::Result<ZooKeeperLock> {
    let path = lock_path(name)?;
    let context = || format!("taking lock {path:?} in ZooKeeper at {address}");
    let mut session = Session::open(address, ttl).with_context(context)?;
    match contend(&mut session, &path, patience) {
        Ok((node, czxid)) => Ok(ZooKeeperLock { session, node, token: lock_node::token_text(czxid) }),
        Err(e) => {
            // Closing the session deletes our node: we leave the queue.
            let _ = session.close();
            Err(e.context(context()))
        }
    }
}

fn lock_path(name: &str) -> anyhow::Result<String> {
    match lock_node::lock_path(name) {
        Some(path) => Ok(path),
        None => bail!("{name:?} is not a ZooKeeper path for a lock (like /locks/orders)"),
    }
}

/// Queue a node under `path` and wait for our turn: (our node's path, its czxid).
fn contend(session: &mut Session, path: &str, patience: Patience) -> anyhow::Result<(String, i64)> {
    for (i, _) in path.match_indices('/').skip(1).chain([(path.len(), "")]) {
        ensure(session, &path[..i])?;
    }
    let (err, body) =
        session.call(op::CREATE2, &create_request(&format!("{path}/{}__lock__", unique_id()), EPHEMERAL_SEQUENTIAL))?;
    check(err, "creating the lock's node")?;
    let mut reply = Reader(&body);
    let ours = reply.string()?;
    let czxid = reply.long()?; // Stat's first field.
    let node = ours.rsplit('/').next().unwrap_or_default().to_owned();
    let mine = sequence(&node).with_context(|| format!("ZooKeeper named our node {ours:?}"))?;
    loop {
        let mut list = Jute::default();
        list.string(path).bool(false);
        let (err, body) = session.call(op::GET_CHILDREN, &list.0)?;
        check(err, "listing the lock's contenders")?;
        let children = Reader(&body).strings()?;
        if !children.contains(&node) {
            bail!("our node {ours:?} is gone (the session expired?)");
        }
        let before = children.iter().filter_map(|c| Some((sequence(c)?, c))).filter(|(s, _)| *s < mine).max();
        let Some((_, predecessor)) = before else { return Ok((ours, czxid)) };
        let predecessor = format!("{path}/{predecessor}");
        let mut exists = Jute::default();
        exists.string(&predecessor).bool(true);
        let (err, _) = session.call(op::EXISTS, &exists.0)?;
        if err == code::NO_NODE {
            continue;
        }
        check(err, "watching the contender before us")?;
        while !session.wait_deleted(&predecessor, patience.next_check())? {
            patience.check(path)?;
        }
    }
}

fn create_request(path: &str, mode: i32) -> Vec<u8> {
    let mut create = Jute::default();
    create.string(path).buffer(&[]);
    // One ACL: world:anyone may do everything (ZooDefs.Ids.OPEN_ACL_UNSAFE).
    create.int(1).int(0x1f).string("world").string("anyone");
    create.int(mode);
    create.0
}

/// Create `path` as a persistent znode unless it exists.
fn ensure(session: &mut Session, path: &str) -> anyhow::Result<()> {
    let (err, _) = session.call(op::CREATE, &create_request(path, PERSISTENT))?;
    if err == code::NODE_EXISTS {
        return Ok(());
    }
    check(err, &format!("creating {path:?}"))
}

fn check(err: i32, doing: &str) -> anyhow::Result<()> {
    if err != 0 {
        bail!("{doing}: ZooKeeper answered {}", describe(err));
    }
    Ok(())
}

impl Held for ZooKeeperLock {
    fn token(&self) -> &str {
        &self.token
    }

    fn ttl(&self) -> Duration {
        self.session.timeout
    }

    /// Ask whether our node still exists: an answer proves the session alive now.
    fn renew(&mut self) -> Result<(), Renewal> {
        let mut exists = Jute::default();
        exists.string(&self.node).bool(false);
        match self.session.call(op::EXISTS, &exists.0) {
            Ok((0, _)) => Ok(()),
            Ok((err, _)) => Err(Renewal::Lost(format!("ZooKeeper answered {} for our node", describe(err)))),
            Err(e) if self.session.is_closed() => Err(Renewal::Lost(format!("{e:#}"))),
            Err(e) => Err(Renewal::Unreachable(format!("{e:#}"))),
        }
    }

    fn release(mut self: Box<Self>) -> anyhow::Result<()> {
        let mut delete = Jute::default();
        delete.string(&self.node).int(-1);
        let (err, _) = self.session.call(op::DELETE, &delete.0)?;
        self.session.close()?;
        if err != 0 && err != code::NO_NODE {
            bail!("deleting our node {:?}: ZooKeeper answered {}", self.node, describe(err));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_paths_are_absolute_without_empty_parts() {
        assert_eq!(lock_path("locks/orders").ok().as_deref(), Some("/locks/orders"));
        assert_eq!(lock_path("/locks/orders/").ok().as_deref(), Some("/locks/orders"));
        assert!(lock_path("/").is_err());
        assert!(lock_path("a//b").is_err());
    }
}
