//! The ordering gate across instances: the in-flight registry in etcd
//! (`fencekeeper_etcd_wire::flights`), for a store written through several gateways
//! or Envoys. Each gateway's own gate (`gate`) sees only its own writes in flight;
//! with the registry, a write that passed it is also registered in etcd, and goes
//! to the store only when no instance has a lower-token write on the resource that
//! the store may still apply.
//!
//! * A new lease every few seconds ([`LEASE_EVERY`]), granted by a thread of its own
//!   and never kept alive; each flight key is put under the newest. The TTL is the
//!   longest a flight may need to outlive its write's forwarding (the request timeout,
//!   until the gateway gives up on it, plus the store apply bound, until the store can
//!   no longer apply it), plus the period, plus margin. So every key goes within a TTL
//!   of its put: those of a gateway that died, and those a live gateway failed to
//!   delete (etcd did not answer the delete, or answered a put too late).
//! * A write is forwarded only while the lease of its key is known to last that long,
//!   counted from when the grant was sent; else its Txn puts the key again under the
//!   newest lease. A gateway that cannot reach etcd for new leases refuses writes
//!   (503) before its keys could vanish under a write the store may still apply.
//! * A token's flight is put by the first of its writes on the resource, and again
//!   only when its lease runs short (the ledger, `flights::Ledger`); a holder writing
//!   again mostly costs etcd a read-only Txn. It
//!   is deleted a little after the last of them is over (the store answered it, or the
//!   store apply bound passed after the gateway gave up on it), unless a new one came,
//!   and goes with its lease otherwise.

pub mod deferred;

use fencekeeper::etcd::EtcdClient;
use fencekeeper::etcd::EtcdError;
use fencekeeper_core::Token;
use fencekeeper_etcd_wire::flights::{self, Ledger, Registration, MAX_ASKED_AGAIN};
use fencekeeper_etcd_wire::grpc;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How often a new lease is granted.
pub const LEASE_EVERY: Duration = Duration::from_secs(5);
/// What a lease's TTL adds to what a flight needs and the period: several grants may
/// fail before writes are refused.
const LEASE_MARGIN: Duration = Duration::from_secs(5);
/// How soon a grant that failed is tried again.
const GRANT_RETRY: Duration = Duration::from_secs(1);
/// How often a waiting write asks etcd again.
const POLL_EVERY: Duration = Duration::from_millis(20);
/// How long a token's flight stays after its last write is over, for the next write
/// of the same holder to find it (then it needs no put).
const IDLE_DELETE: Duration = Duration::from_millis(100);
/// How soon a delete that failed is sent again.
const DELETE_RETRY: Duration = Duration::from_millis(500);

/// A gateway's part of the in-flight registry.
pub struct Registry {
    client: Arc<EtcdClient>,
    /// The key prefix of flights.
    prefix: String,
    /// The key prefix of marks (the registering Txn compares the mark).
    marks: String,
    /// This gateway's random id, in its flights' keys.
    instance: u64,
    /// Which tokens this gateway has flights of, and since when idle ones are idle.
    ledger: Mutex<Ledger>,
    /// The registry's clock: the ledger's times are milliseconds since this.
    epoch: Instant,
    /// How long a flight may need to outlive its write's forwarding.
    needed: Duration,
    /// The store apply bound.
    apply_bound: Duration,
    lease: Mutex<Lease>,
    ttl: Duration,
    /// Writes waiting now for other instances' lower-token writes.
    waiting: AtomicUsize,
    /// The writes asking for a pass, by resource, token and `at_floor`, while a Txn
    /// of theirs is being sent ([`Registry::pass`]).
    passes: Mutex<HashMap<(String, Token, bool), Vec<PassWaiter>>>,
}

/// One write waiting for a shared pass Txn's answer.
type PassWaiter = oneshot::Sender<Result<Registration, Refused>>;

#[derive(Clone, Copy)]
struct Lease {
    id: i64,
    /// The lease lasts at least until then: its grant's send plus the TTL.
    until: Instant,
}

/// Why a write did not pass the registry.
#[derive(Clone, Debug)]
pub enum Refused {
    /// A higher token was admitted (or is in flight): the write is stale.
    Stale(Token),
    /// The resource has no mark and the retention floor is above the token: stale.
    BelowFloor(Token),
    /// A lower-token write elsewhere kept the resource past the deadline.
    TimedOut,
    /// The registry could not be asked (etcd, or the lease).
    Unreachable(String),
    /// The mark moved below the token (an operator): nothing can be decided.
    Moved(String),
}

impl Registry {
    /// Join the registry under `prefix` in the etcd `client` reaches (marks under
    /// `marks`): grant this gateway's first lease, and a new one every
    /// [`LEASE_EVERY`] from a thread of its own for as long as the registry lives.
    /// Writes are given up on after `request_timeout`; the store may apply one up to
    /// `apply_bound` after that.
    pub fn join(
        client: Arc<EtcdClient>,
        prefix: &str,
        marks: &str,
        request_timeout: Duration,
        apply_bound: Duration,
    ) -> Result<Arc<Registry>, EtcdError> {
        let needed = request_timeout + apply_bound;
        let ttl = Duration::from_secs((needed + LEASE_EVERY + LEASE_MARGIN).as_secs_f64().ceil() as u64);
        let instance = std::collections::hash_map::RandomState::new().build_hasher().finish();
        let sent = Instant::now();
        let id = grant(&client, ttl)?;
        let registry = Arc::new(Registry {
            client,
            prefix: prefix.to_owned(),
            marks: marks.to_owned(),
            instance,
            ledger: Mutex::default(),
            epoch: Instant::now(),
            needed,
            apply_bound,
            lease: Mutex::new(Lease { id, until: sent + ttl }),
            ttl,
            waiting: AtomicUsize::new(0),
            passes: Mutex::default(),
        });
        let weak = Arc::downgrade(&registry);
        std::thread::Builder::new()
            .name("fencekeeper-registry-lease".into())
            .spawn(move || grant_every_period(&weak))
            .map_err(|e| EtcdError::Unavailable(format!("cannot start the registry's lease thread: {e}")))?;
        Ok(registry)
    }

    /// Writes waiting now for other instances' lower-token writes.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Relaxed)
    }

    /// Register the write admitted with `token` on `resource`, and wait (until
    /// `deadline`) until no other instance has a lower-token write on it in flight.
    pub async fn enter(self: &Arc<Self>, resource: &str, token: Token, deadline: Instant) -> Result<Flight, Refused> {
        // A write of a token etcd already showed a higher mark for is stale: it
        // neither asks nor begins (writes that are all refused would keep its flight,
        // and another instance's higher write waiting on it, alive).
        if let Some(higher) = lock(&self.ledger).stale(resource, token) {
            return Err(Refused::Stale(higher));
        }
        lock(&self.ledger).begin(resource, token);
        // From here the write is in the ledger: dropping `flight` takes it out.
        let flight = Flight { registry: self.clone(), resource: resource.to_owned(), token, ended: false };
        let mut waiting = None;
        let (mut at_floor, mut asked_again) = (false, 0);
        loop {
            match self.pass(resource, token, at_floor).await? {
                Registration::Go => return Ok(flight),
                Registration::Stale(higher) => {
                    lock(&self.ledger).superseded(resource, token, higher);
                    return Err(Refused::Stale(higher));
                }
                Registration::BelowFloor(floor) => return Err(Refused::BelowFloor(floor)),
                Registration::Moved(mark) => {
                    let mark = mark.map_or("none".to_owned(), |m| m.to_string());
                    return Err(Refused::Moved(format!(
                        "the mark of {resource:?} moved below the admitted token {token} (it is {mark}: lowered by an \
                         operator?) while it was registered in flight; retry"
                    )));
                }
                Registration::Again { .. } if asked_again == MAX_ASKED_AGAIN => {
                    return Err(Refused::Moved(format!(
                        "the mark of {resource:?} and the retention floor kept changing while the admitted token \
                         {token} was registered in flight; retry"
                    )));
                }
                Registration::Again { at_floor: floor } => (at_floor, asked_again) = (floor, asked_again + 1),
                Registration::Wait if Instant::now() + POLL_EVERY >= deadline => return Err(Refused::TimedOut),
                Registration::Wait => {
                    waiting.get_or_insert_with(|| Waiting::new(&self.waiting));
                    tokio::time::sleep(POLL_EVERY).await;
                }
            }
        }
    }

    /// The registration of a write of `token` on `resource`: from a Txn sent after
    /// the write asked, which the writes of that token on that resource that asked
    /// meanwhile share (as the store's confirms share one). A holder writing again on
    /// many connections then costs etcd a Txn per round trip, not one per write.
    async fn pass(self: &Arc<Self>, resource: &str, token: Token, at_floor: bool) -> Result<Registration, Refused> {
        let key = (resource.to_owned(), token, at_floor);
        let (told, answer) = oneshot::channel();
        let first = {
            let mut passes = lock(&self.passes);
            match passes.get_mut(&key) {
                Some(asking) => {
                    asking.push(told);
                    false
                }
                None => {
                    passes.insert(key.clone(), vec![told]);
                    true
                }
            }
        };
        if first {
            // On a task of its own: a writer whose client went away drops its own
            // future, never the Txn the others wait for.
            tokio::spawn(self.clone().send_passes(key));
        }
        answer.await.unwrap_or_else(|_| Err(Refused::Unreachable("the in-flight registry's pass was dropped".into())))
    }

    /// Send one Txn for the writes asking on `key`, answer them, and again for the
    /// ones that asked meanwhile, until none did.
    async fn send_passes(self: Arc<Self>, key: (String, Token, bool)) {
        loop {
            let asking = {
                let mut passes = lock(&self.passes);
                let asking = passes.get_mut(&key).map(std::mem::take).unwrap_or_default();
                if asking.is_empty() {
                    passes.remove(&key);
                    return;
                }
                asking
            };
            let (resource, token, at_floor) = (&key.0, key.1, key.2);
            let answer = self.pass_once(resource, token, at_floor).await;
            for told in asking {
                let _ = told.send(answer.clone());
            }
        }
    }

    /// One pass Txn, and what it found.
    async fn pass_once(&self, resource: &str, token: Token, at_floor: bool) -> Result<Registration, Refused> {
        let lease = self.lease_for_a_write()?;
        let needed_until = self.now_ms() + self.needed.as_millis() as u64;
        let put = lock(&self.ledger).must_put(resource, token, needed_until);
        let (prefix, marks) = (&self.prefix, &self.marks);
        let message =
            flights::pass_txn(prefix, marks, resource, &token, self.instance, put.then_some(lease.id), at_floor);
        let answer = match self.client.txn_async(&message).await {
            Ok(answer) => flights::passed(&answer, prefix, marks, resource, &token, self.instance, put)
                .map_err(|e| self.client.unavailable(e)),
            // etcd's authentication lets the user touch the marks but not the
            // registry: say what grants it.
            Err(EtcdError::Denied(line)) => {
                Err(EtcdError::Denied(format!("{line}; {}", flights::denied_hint(prefix, "--local-gate"))))
            }
            Err(e) => Err(e),
        };
        let (registration, revision) = answer.map_err(|e| Refused::Unreachable(e.to_string()))?;
        if let Some(revision) = revision {
            let lease_until = lease.until.saturating_duration_since(self.epoch).as_millis() as u64;
            lock(&self.ledger).put(resource, token, revision, lease_until);
        }
        Ok(registration)
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The newest lease, if it is known to outlive a write forwarded now.
    fn lease_for_a_write(&self) -> Result<Lease, Refused> {
        let lease = *lock(&self.lease);
        if lease.until < Instant::now() + self.needed {
            return Err(Refused::Unreachable(format!(
                "etcd at {} granted the in-flight registry no new lease lately: a write forwarded now could \
                 outlive the newest one",
                self.client.endpoint()
            )));
        }
        Ok(lease)
    }

    /// A write is over: out of the ledger, and the flights idle long enough deleted
    /// (each only if still the one put at its revision).
    fn end(self: &Arc<Self>, resource: &str, token: Token) {
        let now = self.now_ms();
        lock(&self.ledger).end(resource, token, now);
        let registry = self.clone();
        let sweep = async move {
            tokio::time::sleep(IDLE_DELETE).await;
            let idle = lock(&registry.ledger).idle(registry.now_ms(), IDLE_DELETE.as_millis() as u64);
            if idle.is_empty() {
                return;
            }
            let (client, prefix, instance) = (&registry.client, &registry.prefix, registry.instance);
            // A delete that fails is sent again until the key's lease (granted before
            // this) could have expired: a key left to its lease holds its resource,
            // for every other instance, for up to a TTL after an etcd blip. One whose
            // compare fails (gone, or put again since) is done.
            let give_up = Instant::now() + registry.ttl;
            let mut due = idle;
            while !due.is_empty() && Instant::now() < give_up {
                let mut failed = Vec::new();
                for (resource, token, revision) in due {
                    let message = flights::end_txn(prefix, &resource, instance, &token, revision);
                    if let Err(e) = client.txn_async(&message).await {
                        tracing::warn!(resource, error = %e, "a flight could not be deleted from the in-flight registry (sent again)");
                        failed.push((resource, token, revision));
                    }
                }
                due = failed;
                if !due.is_empty() {
                    tokio::time::sleep(DELETE_RETRY).await;
                }
            }
        };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(sweep);
        }
    }
}

/// Counts a write as waiting while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Waiting<'a> {
        count.fetch_add(1, Relaxed);
        Waiting(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// A write registered in flight in etcd. Ending it ([`Flight::answered`],
/// [`Flight::given_up`], or dropping it) takes it out of the ledger.
pub struct Flight {
    registry: Arc<Registry>,
    resource: String,
    token: Token,
    ended: bool,
}

impl Flight {
    /// The store answered the write: the flight ends now.
    pub fn answered(self) {}

    /// The gateway gave up on the write after sending it: the flight ends once the
    /// store apply bound has passed (the lease covers a gateway that dies first).
    pub fn given_up(mut self) {
        self.ended = true;
        let (registry, resource, token) = (self.registry.clone(), std::mem::take(&mut self.resource), self.token);
        let bound = registry.apply_bound;
        tokio::spawn(async move {
            tokio::time::sleep(bound).await;
            registry.end(&resource, token);
        });
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        if !self.ended {
            self.registry.end(&self.resource, self.token);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn grant(client: &EtcdClient, ttl: Duration) -> Result<i64, EtcdError> {
    let answer = client.unary(grpc::LEASE_SERVICE, grpc::LEASE_GRANT_METHOD, &grpc::lease_grant(ttl.as_secs()))?;
    grpc::parse_lease_grant(&answer).map_err(|e| client.unavailable(e))
}

/// Grant the registry a new lease every [`LEASE_EVERY`] while the registry lives
/// (one that fails is tried again every [`GRANT_RETRY`]). The old ones are left to
/// expire: what was put under them and never deleted goes with them.
fn grant_every_period(registry: &Weak<Registry>) {
    let mut wait = LEASE_EVERY;
    loop {
        std::thread::sleep(wait);
        let Some(r) = registry.upgrade() else { return };
        let sent = Instant::now();
        match grant(&r.client, r.ttl) {
            Ok(id) => {
                *lock(&r.lease) = Lease { id, until: sent + r.ttl };
                wait = LEASE_EVERY;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot grant the in-flight registry a new lease");
                wait = GRANT_RETRY;
            }
        }
    }
}
