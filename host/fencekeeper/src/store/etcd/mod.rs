//! Marks in etcd, so that several gateways (and Envoys) in front of one resource agree.
//!
//! Talks to etcd's v3 gRPC API (`etcdserverpb.KV/Txn`: every read and write is a Txn,
//! a read one without compares) through the library's etcd client ([`crate::etcd`]),
//! with the protobuf of `fencekeeper-etcd-wire`'s `grpc` module. The key scheme is shared with
//! the Envoy filter's etcd mode, so gateways and proxies can share one etcd:
//!
//! * key: `/fencekeeper/marks/` + resource (the prefix is configurable);
//! * value: the mark's record (`fencekeeper_core::record`; `fk2 34 fc4dab37` for mark 34 of `orders/2026.csv`), whose
//!   CRC32C covers the resource and the token. Every value read is verified: one that
//!   another writer damaged is [`StoreError::Damaged`], never a lower mark; a bare
//!   token (format 1, from an earlier version) is [`StoreError::OldFormat`], which
//!   names the upgrade command ([`EtcdStore::upgrade`]).
//!
//! One round trip per admit: the store keeps the marks it has seen (a lower bound
//! of each, as marks only rise) and answers [`MarkStore::read`] from them, so the
//! guard goes to etcd once, with the Txn that decides: a compare-and-swap from the
//! copy for an advance, a compare without a put for an equal token
//! ([`MarkStore::confirm`]). A copy that turns out old costs a second round (the Txn
//! reads the current mark back on failure); a refusal is always checked with a
//! linearizable read first. Confirms that arrive while one is in flight share the
//! next Txn, whatever their resources (`confirms.rs`: each is answered by a Txn that
//! began after it arrived). Every answer rests on an etcd operation, so the admits
//! stay linearizable (tests/tests/all/concurrency.rs checks histories with this store).
//!
//! `get` is a linearizable range read. `compare_and_swap` is one Txn: compare the value
//! with the expected mark's record, which is deterministic (or `create_revision == 0`
//! when there is no mark), then put; when the compare fails, the same Txn reads the key, so a lost race
//! costs no extra round trip. etcd commits a Txn to its raft log before answering, so
//! an admit is durable (on a quorum) when it is reported.

mod confirms;
mod retention;
mod seen;

use super::repair::{judge, previous, Previous, Raise, Repair, Scanned};
use super::{AwaitableMarks, MarkStore, Pending, Read, StoreError, Swap};
use crate::etcd::{EtcdClient, EtcdOptions};
use confirms::Confirms;
use fencekeeper_core::Token;
use fencekeeper_etcd_wire::{self as wire, grpc, Expect, KeyValue, MarkError, Op, Range};
use seen::Seen;
use std::sync::Arc;
use std::time::Duration;

/// The default key prefix; the Envoy filter uses the same.
pub const DEFAULT_PREFIX: &str = wire::DEFAULT_PREFIX;

/// A [`MarkStore`] in etcd (its v3 gRPC API).
pub struct EtcdStore {
    client: Arc<EtcdClient>,
    prefix: String,
    seen: Seen,
    confirms: Confirms,
    /// The retention floor as last read (it only rises, so this is a lower bound).
    floor: std::sync::Mutex<Option<Token>>,
}

impl EtcdStore {
    /// A store at `endpoint` (`http://HOST:PORT`), checked by one read so that a wrong
    /// address fails here, at start-up, rather than on the first request.
    pub fn connect(endpoint: &str) -> Result<EtcdStore, StoreError> {
        Self::with_options(endpoint, DEFAULT_PREFIX, Duration::from_secs(2))
    }

    /// [`EtcdStore::connect`] with another key prefix and a per-call timeout.
    pub fn with_options(endpoint: &str, prefix: &str, timeout: Duration) -> Result<EtcdStore, StoreError> {
        Self::connect_with(endpoint, prefix, &EtcdOptions { timeout, ..EtcdOptions::default() })
    }

    /// A store of the marks under `prefix` ([`DEFAULT_PREFIX`] unless several
    /// deployments share one etcd) at `endpoint` (`http://HOST:PORT`, or
    /// `https://HOST:PORT` with [`EtcdOptions::tls`]), checked by one read (and an
    /// authentication, with [`EtcdOptions::auth`]) so that a wrong address, CA,
    /// certificate or password fails here, at start-up, with one line.
    pub fn connect_with(endpoint: &str, prefix: &str, options: &EtcdOptions) -> Result<EtcdStore, StoreError> {
        let store = EtcdStore {
            client: Arc::new(EtcdClient::new(endpoint, options)?),
            prefix: prefix.to_owned(),
            seen: Seen::new(),
            confirms: Confirms::default(),
            floor: std::sync::Mutex::default(),
        };
        store.read_range(Range { key: store.prefix.as_bytes(), prefix: true, limit: 1, ..Range::default() })?;
        // A damaged floor fails here, at start-up, rather than on a first mark.
        store.read_floor()?;
        Ok(store)
    }

    /// The store's etcd client, for a provenance check that shares it
    /// ([`crate::provenance::EtcdProvenance::sharing`]).
    pub(crate) fn client(&self) -> &Arc<EtcdClient> {
        &self.client
    }

    /// The etcd key holding `resource`'s mark.
    pub fn key(&self, resource: &str) -> String {
        wire::mark_key(&self.prefix, resource)
    }

    fn unavailable(&self, detail: impl std::fmt::Display) -> StoreError {
        self.client.unavailable(detail).into()
    }

    /// The command that upgrades format-1 values under this store's prefix.
    fn upgrade_command(&self) -> String {
        let prefix =
            if self.prefix == DEFAULT_PREFIX { String::new() } else { format!(" --etcd-prefix {}", self.prefix) };
        format!("fencekeeper marks --etcd {}{prefix} --upgrade", self.client.endpoint())
    }

    /// (resource, raw value) pairs of read key-values.
    fn raw(&self, kvs: Vec<KeyValue>) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        kvs.into_iter()
            .map(|kv| {
                let key = String::from_utf8(kv.key).map_err(|e| self.unavailable(format!("a non-UTF-8 key: {e}")))?;
                let resource = key.strip_prefix(&self.prefix).unwrap_or(&key).to_owned();
                Ok((resource, kv.value))
            })
            .collect()
    }

    /// Verify one value as `resource`'s record.
    fn verify(&self, resource: &str, value: &[u8]) -> Result<Token, StoreError> {
        wire::mark_of(resource, value).map_err(|e| self.mark_error(resource, &self.key(resource), e))
    }

    /// Why the value at `key` is not `resource`'s mark (or the floor's record).
    fn mark_error(&self, resource: &str, key: &str, e: MarkError) -> StoreError {
        let store = format!("etcd at {} key {key:?}", self.client.endpoint());
        match e {
            MarkError::OldFormat => StoreError::OldFormat { store, upgrade: self.upgrade_command() },
            MarkError::Damaged(detail) => {
                StoreError::Damaged { resource: resource.to_owned(), store, detail: detail.to_string() }
            }
        }
    }

    /// The verified mark among read key-values (the first: a key read holds one).
    fn mark(&self, kvs: Vec<KeyValue>) -> Result<Option<Token>, StoreError> {
        match self.raw(kvs)?.into_iter().next() {
            Some((resource, value)) => self.verify(&resource, &value).map(Some),
            None => Ok(None),
        }
    }

    /// A linearizable range read (a Txn that only reads); the revision it answered
    /// at is remembered.
    fn read_range(&self, range: Range<'_>) -> Result<Vec<KeyValue>, StoreError> {
        self.txn(grpc::txn(&[], &[Op::Range(range)], &[]))?.read(0).map_err(|e| self.unavailable(e))
    }

    fn range(&self, key: &str) -> Result<Vec<KeyValue>, StoreError> {
        self.read_range(Range::of(key.as_bytes()))
    }

    /// A Txn (a `TxnRequest`), over gRPC.
    fn txn(&self, message: Vec<u8>) -> Result<wire::TxnAnswer, StoreError> {
        Ok(self.client.txn(&message)?)
    }

    /// [`EtcdStore::txn`], awaited.
    async fn txn_async(&self, message: Vec<u8>) -> Result<wire::TxnAnswer, StoreError> {
        Ok(self.client.txn_async(&message).await?)
    }

    /// The mark etcd holds for each of `marks`' resources, confirmed with one read-only
    /// Txn per [`wire::MAX_CONFIRMS_PER_TXN`] of them: each compared with its mark,
    /// each read back when any moved. A value that is not its resource's verified
    /// record fails that resource alone.
    async fn confirm_many(&self, marks: Vec<(String, Token)>) -> Vec<confirms::Outcome> {
        let mut outcomes = Vec::with_capacity(marks.len());
        for chunk in marks.chunks(wire::MAX_CONFIRMS_PER_TXN) {
            let keys: Vec<String> = chunk.iter().map(|(resource, _)| self.key(resource)).collect();
            let items: Vec<(&str, &str, &Token)> =
                keys.iter().zip(chunk).map(|(key, (resource, mark))| (key.as_str(), resource.as_str(), mark)).collect();
            match self.txn_async(grpc::confirm_txn(&items)).await {
                Err(e) => outcomes.extend(chunk.iter().map(|_| Err(e.again()))),
                Ok(answer) if answer.succeeded => {
                    for (resource, mark) in chunk {
                        self.seen.set(resource, Some(*mark));
                        outcomes.push(Ok(Some(*mark)));
                    }
                }
                Ok(answer) => {
                    for (i, (resource, _)) in chunk.iter().enumerate() {
                        let read = answer.read(i).map_err(|e| self.unavailable(e));
                        let current = read.and_then(|kvs| self.mark(kvs));
                        if let Ok(mark) = &current {
                            self.seen.set(resource, *mark);
                        }
                        outcomes.push(current);
                    }
                }
            }
        }
        outcomes
    }

    /// Every (resource, raw value) under the prefix, sorted by resource: read in
    /// pages of [`PAGE_KEYS`] keys, each a linearizable read of its own (a listing of
    /// many marks is not one snapshot; marks only rise, and each is judged alone).
    fn range_all(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let mut all = self.raw(self.range_all_kv()?)?;
        all.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(all)
    }

    /// Every mark's key-value under the prefix, in key order, read in pages of
    /// [`PAGE_KEYS`] keys, each a linearizable read of its own (a listing of many marks
    /// is not one snapshot; marks only rise, and each is judged alone).
    ///
    /// etcd 3.4 counts every key of a ranged read's range, whatever its limit, so pages
    /// over the rest of the prefix would cost etcd the square of the marks (3 minutes
    /// of its CPU for a million). Each page reads a window instead: the keys that share
    /// the next key's first `depth` bytes, `depth` growing by a byte while a window
    /// holds more than [`WINDOW_KEYS`] keys (the count etcd answers) and shrinking
    /// while windows hold few. Windows follow each other in key order, so every key is
    /// read once.
    fn range_all_kv(&self) -> Result<Vec<KeyValue>, StoreError> {
        let prefix = self.prefix.as_bytes();
        let end = wire::prefix_end(prefix);
        let (mut from, mut depth) = (prefix.to_vec(), prefix.len());
        let mut all = Vec::new();
        loop {
            let window = window_end(&from, depth, &end);
            let range = Range { key: &from, end: Some(&window), limit: PAGE_KEYS, ..Range::default() };
            let page = self.client.range_within(&grpc::range_request(&range), LISTING_TIMEOUT)?;
            if page.count > WINDOW_KEYS {
                // Narrowed at once to the bytes the page's keys share and one more:
                // a byte at a time, each read over a long shared prefix (10^7 keys
                // named `bucket/objects/...`) would count them all again.
                let shared = match (page.kvs.first(), page.kvs.last()) {
                    (Some(a), Some(b)) => a.key.iter().zip(&b.key).take_while(|(x, y)| x == y).count(),
                    _ => 0,
                };
                depth = (depth + 1).max(shared + 1).max(prefix.len());
            } else if page.count < PAGE_KEYS / 4 && depth > prefix.len() {
                depth -= 1;
            }
            let last = page.kvs.last().map(|kv| kv.key.clone());
            // The prefix's own key is the retention floor's, no resource's (`retention`).
            all.extend(page.kvs.into_iter().filter(|kv| kv.key != prefix));
            match (page.more, last) {
                // The next page starts just after the last key read.
                (true, Some(last)) => from = last.into_iter().chain([0]).collect(),
                (true, None) => return Err(self.unavailable("etcd said more keys follow but sent none")),
                (false, _) if window >= end => break,
                (false, _) => from = window,
            }
        }
        Ok(all)
    }

    /// Put `value` at `resource`'s key if its value is still `current` (`None`: no
    /// key). True when it was put.
    fn swap_raw(&self, resource: &str, current: Option<&[u8]>, value: &[u8]) -> Result<bool, StoreError> {
        let expect = current.map_or(Expect::Absent, Expect::Value);
        Ok(self.txn(grpc::replace_txn(self.key(resource).as_bytes(), expect, Some(value)))?.succeeded)
    }

    /// Rewrite every format-1 value (a bare token) under the prefix as a checked
    /// record of the same token, each with a compare-and-swap on the old bytes, so a
    /// concurrent writer is never overwritten. Returns the marks upgraded. Values
    /// already in format 2 are left alone; a value that is neither fails the upgrade
    /// with its resource named, after the others are done. Safe to run again.
    pub fn upgrade(&self) -> Result<Vec<(String, Token)>, StoreError> {
        let mut upgraded = Vec::new();
        let mut damaged = None;
        for (resource, value) in self.range_all()? {
            match self.verify(&resource, &value) {
                Ok(_) => {}
                Err(StoreError::OldFormat { .. }) => {
                    let Some(mark) = std::str::from_utf8(&value).ok().and_then(|t| Token::parse(t).ok()) else {
                        continue;
                    };
                    let record = fencekeeper_core::record::encode(resource.as_bytes(), &mark);
                    if self.swap_raw(&resource, Some(&value), record.as_bytes())? {
                        upgraded.push((resource, mark));
                    }
                }
                Err(e) => {
                    damaged.get_or_insert(e);
                }
            }
        }
        match damaged {
            Some(e) => Err(e),
            None => Ok(upgraded),
        }
    }
}

/// Version chains of conditional writes (`crate::chain`) live beside the marks, under
/// the mark prefix with `.chains` in place of its last `/` (`/fencekeeper/marks.chains/`
/// + resource): outside the marks' range, so listing marks never meets one.
impl crate::chain::ChainStore for EtcdStore {
    fn get(&self, resource: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let kvs = self.range(&self.chain_key(resource))?;
        Ok(kvs.into_iter().next().map(|kv| kv.value))
    }

    fn swap(&self, resource: &str, expected: Option<&[u8]>, new: &[u8]) -> Result<bool, StoreError> {
        let expect = expected.map_or(Expect::Absent, Expect::Value);
        Ok(self.txn(grpc::replace_txn(self.chain_key(resource).as_bytes(), expect, Some(new)))?.succeeded)
    }

    fn describe(&self) -> String {
        format!("etcd at {} under {:?}", self.client.endpoint(), self.chain_key(""))
    }
}

impl EtcdStore {
    /// The etcd key holding `resource`'s version chain.
    fn chain_key(&self, resource: &str) -> String {
        fencekeeper_etcd_wire::chain_key(&self.prefix, resource)
    }
}

/// Keys per read when listing every mark: 512 of the longest keys (1 KiB) with their
/// records stay well under the 1 MiB one gRPC answer may hold.
const PAGE_KEYS: u64 = 512;

/// How long a listing's read may take: etcd 3.4 counts every key of the first window
/// (the whole prefix), longer than the 2 s call timeout for 10^7 marks on a 2-core
/// machine; a listing is never on a write's path.
const LISTING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The most keys a listing's window may hold before the next window narrows: what one
/// read makes etcd count.
const WINDOW_KEYS: u64 = 16 * PAGE_KEYS;

/// The end of the window of keys that share `from`'s first `depth` bytes, within the
/// prefix's range (which ends at `end`).
fn window_end(from: &[u8], depth: usize, end: &[u8]) -> Vec<u8> {
    let shared = from.get(..depth.min(from.len())).unwrap_or(from);
    let window = wire::prefix_end(shared);
    // `prefix_end` of all 0xff bytes is "to the end of the key space": [0].
    if window == [0] || window.as_slice() > end {
        end.to_vec()
    } else {
        window
    }
}

/// How many times a raise or a forced set reads and swaps again after another writer
/// changed the key.
const REPAIR_ROUNDS: usize = 16;

/// The admit's calls, awaited by the asynchronous admit ([`AwaitableMarks`]) and
/// blocked on by [`MarkStore`]'s: one implementation of each.
impl EtcdStore {
    async fn get_async(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        // Ranges are linearizable unless "serializable" is set.
        let key = self.key(resource);
        let read = grpc::txn(&[], &[Op::Range(Range::of(key.as_bytes()))], &[]);
        let kvs = self.txn_async(read).await?.read(0).map_err(|e| self.unavailable(e))?;
        let mark = self.mark(kvs)?;
        self.seen.set(resource, mark);
        Ok(mark)
    }

    async fn swap_async(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        // etcd compares bytes, not tokens: a swap that would not raise the mark is
        // refused here, before it is sent, whatever its caller asks (a swap from the
        // mark to itself would even be a confirm on the wire).
        if !super::raises(expected, new) {
            return Ok(Swap::Conflict(self.get_async(resource).await?));
        }
        if expected.is_none() {
            return self.create(resource, new).await;
        }
        let answer = self.txn_async(grpc::mark_txn(&self.key(resource), resource, expected, new)).await?;
        if answer.succeeded {
            self.seen.set(resource, Some(*new));
            return Ok(Swap::Swapped);
        }
        let current = self.mark(answer.read(0).map_err(|e| self.unavailable(e))?)?;
        self.seen.set(resource, current);
        Ok(Swap::Conflict(current))
    }

    async fn read_async(&self, resource: &str) -> Result<Read, StoreError> {
        match self.seen.get(resource) {
            Some(mark) => Ok(Read { mark: Some(mark), exact: false }),
            None => Ok(Read { mark: self.get_async(resource).await?, exact: true }),
        }
    }

    async fn confirm_async(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
        // A compare without a put, the current mark read back when it fails; the
        // confirms that arrive while one is in flight share the next (confirms.rs).
        self.confirms.confirm(resource, mark, |marks| self.confirm_many(marks)).await
    }
}

impl AwaitableMarks for EtcdStore {
    fn read<'a>(&'a self, resource: &'a str) -> Pending<'a, Read> {
        Box::pin(self.read_async(resource))
    }
    fn get<'a>(&'a self, resource: &'a str) -> Pending<'a, Option<Token>> {
        Box::pin(self.get_async(resource))
    }
    fn compare_and_swap<'a>(
        &'a self,
        resource: &'a str,
        expected: Option<&'a Token>,
        new: &'a Token,
    ) -> Pending<'a, Swap> {
        Box::pin(self.swap_async(resource, expected, new))
    }
    fn confirm<'a>(&'a self, resource: &'a str, mark: &'a Token) -> Pending<'a, Swap> {
        Box::pin(self.confirm_async(resource, mark))
    }
}

impl MarkStore for EtcdStore {
    fn get(&self, resource: &str) -> Result<Option<Token>, StoreError> {
        self.client.block_on(self.get_async(resource))
    }

    fn compare_and_swap(&self, resource: &str, expected: Option<&Token>, new: &Token) -> Result<Swap, StoreError> {
        self.client.block_on(self.swap_async(resource, expected, new))
    }

    fn read(&self, resource: &str) -> Result<Read, StoreError> {
        self.client.block_on(self.read_async(resource))
    }

    fn confirm(&self, resource: &str, mark: &Token) -> Result<Swap, StoreError> {
        self.client.block_on(self.confirm_async(resource, mark))
    }

    fn awaitable(&self) -> Option<&dyn AwaitableMarks> {
        Some(self)
    }

    fn floor(&self) -> Result<Option<Token>, StoreError> {
        Ok(*self.cached_floor())
    }

    fn list(&self) -> Result<Vec<(String, Token)>, StoreError> {
        self.range_all()?
            .into_iter()
            .map(|(resource, value)| {
                let mark = self.verify(&resource, &value)?;
                Ok((resource, mark))
            })
            .collect()
    }
}

impl Repair for EtcdStore {
    fn scan(&self) -> Result<Vec<Scanned>, StoreError> {
        Ok(self
            .range_all()?
            .into_iter()
            .map(|(resource, value)| {
                let mark = self.verify(&resource, &value);
                Scanned { resource, mark }
            })
            .collect())
    }

    fn raise(&self, resource: &str, to: &Token) -> Result<Raise, StoreError> {
        let put = fencekeeper_core::record::encode(resource.as_bytes(), to);
        for _ in 0..REPAIR_ROUNDS {
            let current = self.raw(self.range(&self.key(resource))?)?.into_iter().next().map(|(_, value)| value);
            let (previous, floor) = judge(resource, current.as_deref(), to);
            if let Some(floor) = floor {
                return Ok(Raise::Refused { floor, previous });
            }
            if self.swap_raw(resource, current.as_deref(), put.as_bytes())? {
                return Ok(Raise::Raised(previous));
            }
        }
        Err(self.unavailable("the key kept changing during the raise"))
    }

    fn force(&self, resource: &str, to: Option<&Token>) -> Result<Previous, StoreError> {
        let put = to.map(|t| fencekeeper_core::record::encode(resource.as_bytes(), t));
        for _ in 0..REPAIR_ROUNDS {
            let current = self.raw(self.range(&self.key(resource))?)?.into_iter().next().map(|(_, value)| value);
            let before = previous(resource, current.as_deref());
            if current.is_none() && put.is_none() {
                return Ok(before);
            }
            let expect = current.as_deref().map_or(Expect::Absent, Expect::Value);
            let body = grpc::replace_txn(self.key(resource).as_bytes(), expect, put.as_ref().map(|r| r.as_bytes()));
            if self.txn(body)?.succeeded {
                self.seen.forget(resource);
                return Ok(before);
            }
        }
        Err(self.unavailable("the key kept changing during the forced set"))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_etcd_is_unavailable_with_a_one_line_reason() {
        let port =
            std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(1);
        let err =
            EtcdStore::connect(&format!("http://127.0.0.1:{port}")).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.starts_with("mark store unavailable: etcd at http://127.0.0.1:"), "{err}");
        assert!(!err.contains('\n'));
    }

    /// A server that answers HTTP/1.1 (a proxy that does not carry gRPC, or not etcd
    /// at all) fails the connect in one line that says what is missing.
    #[test]
    fn an_endpoint_that_does_not_speak_http2_is_named_in_one_line() {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            for stream in listener.incoming().take(1) {
                let mut stream = stream.unwrap();
                let mut buf = [0u8; 1024];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            }
        });
        let err =
            EtcdStore::connect(&format!("http://127.0.0.1:{port}")).err().map(|e| e.to_string()).unwrap_or_default();
        server.join().unwrap();
        assert!(err.contains("does this endpoint speak gRPC"), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }
}
