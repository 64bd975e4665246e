//! A fence instance that is the Envoy filter itself: the committed `.wasm`
//! (`guest/artifacts/fencekeeper_filter.wasm`) run by the in-process proxy-wasm host
//! (`fencekeeper-pwhost`, under Envoy's profile), so that the filter's own admit and
//! its own ordering gate (its shared-data flights, held writes re-checked on the
//! root's tick, a given-up write holding its resource for the store apply bound) are
//! what the simulation judges, unchanged.
//!
//! The host has a clock of its own, moved up to the world's before each thing the
//! instance is told, which fires the root's ticks that came due. After each, the
//! instance looks at its open requests: a request the filter let go upstream is
//! forwarded to the world's store with the `fencing-admitted-token` the filter put on
//! it; one it answered is answered.
//!
//! Marks are in the world's simulated etcd, as `envoy-config` configures the filter:
//! correctness mode, every etcd call a Txn through etcd's JSON API (`"api": "json"`),
//! made by the world's etcd some hops later, linearizably, whether or not the Envoy
//! that sent it is still up, and answered late or never (then the host's call
//! timeout, `etcd.timeout_ms`, fails it). Crashes are drawn: a restarted Envoy's
//! shared data is empty, its marks are etcd's, read back and judged (rule 3). The
//! gate is each Envoy's own, or with `--shared-gate` also the filter's in-flight
//! registry in that etcd (`gate.shared`: flights put under leases the simulated etcd
//! ends on the world's clock), which claims the writes through every Envoy too.
//!
//! With `--conditional` the filter runs conditional writes instead of its gate, as
//! `envoy-config --conditional-writes` configures it: its version chains in the same
//! etcd, a lend's term the route timeout plus the apply bound, and the versions the
//! chain does not know asked of the store with a `HEAD` through the store's cluster,
//! which the world answers. Each write carries a body the filter hashes (S3's MD5
//! ETags, [`etag_of`]); the store checks the precondition the filter set on the
//! forwarded request.
//!
//! With `--own-marks` the marks are the filter's shared data, one Envoy's own, so the
//! filter runs in efficiency mode (it refuses correctness mode without etcd: such
//! marks die with the process); then no crashes are drawn and the marks are not read
//! back.

use crate::etcd::{Answer as EtcdAnswer, Call, SharedServer};
use crate::fence::{Answer, Bug, Fence, Out, Request, Settings};
use crate::queue::{Nanos, MS};
use fencekeeper_pwhost::{Binary, CallAnswer, CallId, Profile, Proxy, Request as HttpRequest, State, StreamId};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::OnceLock;

/// The filter's binary, compiled once per process.
fn binary() -> Result<&'static Binary, String> {
    static BINARY: OnceLock<Result<Binary, String>> = OnceLock::new();
    BINARY
        .get_or_init(|| {
            let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../guest/artifacts/fencekeeper_filter.wasm");
            Binary::load(&path).map_err(|e| format!("the filter {} did not load: {e}", path.display()))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// How often the filter's root ticks (re-checks held writes).
const TICK_MS: u64 = 10;

/// A timer's tag for the root's tick (the upstream timeouts' are write ids, even;
/// an etcd call's timeout is its number, odd and above this).
const TICK: u64 = 1;

/// The filter's etcd calls' budget (`etcd.timeout_ms`, its default).
const ETCD_TIMEOUT_MS: u64 = 1_000;

/// How long a flight in the shared registry that its Envoy did not delete (it died,
/// or etcd answered its put too late or never) may hold its resource (ms), for
/// `flight` and `bound` (ms): the worker's lease it was put under, granted at most 5 s
/// before, lasts the route timeout plus the bound plus 10 s (the grant period and a
/// margin), rounded up to whole seconds (docs/envoy.md).
pub fn dead_flights_hold_ms(flight: u64, bound: u64) -> u64 {
    (flight + bound + 10_000).div_ceil(1000) * 1000
}

/// The proxy's cluster of the store, which the filter's `HEAD`s go through.
const STORE_CLUSTER: &str = "store";

/// The body a write of `content` carries: with conditional writes the filter hashes
/// it (MD5, as S3's ETags), and the store's ETag is [`etag_of`] it.
pub fn body_of(content: u8) -> Vec<u8> {
    vec![b'a' + content; 16]
}

/// The ETag the store gives a write of `content` from the filter: the quoted hex MD5
/// of its body, so the same bytes bring a version back (A-B-A).
pub fn etag_of(content: u8) -> String {
    use md5::{Digest, Md5};
    match fencekeeper_chain::content_version(&Md5::digest(body_of(content)).into()) {
        fencekeeper_chain::Version::Tag(tag) => tag,
        fencekeeper_chain::Version::Absent => String::new(),
    }
}

/// Where the filter keeps its marks in etcd (`etcd.key_prefix`).
const KEY_PREFIX: &str = "/fencekeeper/marks";

/// One Envoy with the filter.
pub struct FilterFence {
    proxy: Proxy,
    config: String,
    names: Rc<[String]>,
    settings: Settings,
    /// What the host's clock read at world time 0 (ms): a restarted Envoy's clock
    /// goes on from the wall clock, as a new process's does.
    origin: u64,
    /// Open writes: their streams, and whether each went upstream.
    open: BTreeMap<u64, (StreamId, bool)>,
    ticking: bool,
    /// The world's etcd, with marks there (read back at once for rule 3).
    etcd: Option<SharedServer>,
    /// The filter's etcd calls in flight, by number (odd, so that each is its own
    /// timeout's tag).
    calls: BTreeMap<u64, CallId>,
    next_call: u64,
    /// Which Envoy this is, and how many times it started: its VMs' random bits.
    seed: u64,
}

impl FilterFence {
    /// An Envoy with the filter configured for `settings`, over the resources named in
    /// `names`, its marks in `etcd` (else its own shared data). The filter's code is
    /// the committed binary's, so no bug can be put into it; `Bug::SkipGate` is its
    /// configuration with the gate off (`"gate": null`, documented as unsafe), and the
    /// others are refused.
    pub fn new(
        instance: usize,
        names: Rc<[String]>,
        settings: Settings,
        bug: Option<Bug>,
        etcd: Option<SharedServer>,
        shared_gate: bool,
        conditional: bool,
    ) -> Result<FilterFence, String> {
        let ms = |n: Nanos| n / MS;
        let gate = match bug {
            // Conditional writes need no gate: the chain and the store's
            // preconditions keep the order (envoy-config writes "gate": null).
            None if conditional => "null".to_owned(),
            // With the shared gate (which the local-gate bug turns off: `shared_gate`
            // comes without it), a flight lives at most the route timeout before the
            // store answers or Envoy gives up (`gate.flight_ms`).
            None | Some(Bug::LocalGate) => format!(
                r#"{{"budget_ms": {}, "apply_bound_ms": {}, "tick_ms": {TICK_MS}, "shared": {}, "flight_ms": {}}}"#,
                ms(settings.gate_budget),
                ms(settings.apply_bound),
                shared_gate,
                ms(settings.upstream_timeout)
            ),
            Some(Bug::SkipGate) => "null".to_owned(),
            Some(other) => return Err(format!("--bug {} has no counterpart in the filter's binary", other.name())),
        };
        let marks = if etcd.is_some() {
            format!(
                r#""etcd": {{"cluster": "etcd", "api": "json", "key_prefix": "{KEY_PREFIX}", "timeout_ms": {ETCD_TIMEOUT_MS}}}, "mode": "correctness""#
            )
        } else {
            r#""etcd": null, "mode": "efficiency""#.to_owned()
        };
        let conditional = if conditional {
            // A lend lasts the route timeout plus the store apply bound, as
            // envoy-config sets it; versions the chain does not know are asked of the
            // store with a HEAD through its cluster.
            format!(
                r#", "conditional_writes": true, "conditional_lend_ms": {}, "conditional_store_cluster": "{STORE_CLUSTER}""#,
                ms(settings.upstream_timeout + settings.apply_bound)
            )
        } else {
            String::new()
        };
        let config =
            format!(r#"{{{marks}, "start_grace_ms": {}, "gate": {gate}{conditional}}}"#, ms(settings.start_grace));
        // Far apart per Envoy: each start draws a few words from its seed on.
        let seed = (instance as u64 + 1) << 40;
        let mut proxy = start(&config, seed, None)?;
        // Started its start grace before the run: the other instances start with no
        // grace either (a restart has one).
        proxy.advance(ms(settings.start_grace) + 1);
        let origin = proxy.now_ms();
        let (open, calls) = (BTreeMap::new(), BTreeMap::new());
        Ok(FilterFence {
            proxy,
            config,
            names,
            settings,
            origin,
            open,
            ticking: false,
            etcd,
            calls,
            next_call: 1,
            seed,
        })
    }

    /// Move the host's clock up to `now`, firing the ticks that came due.
    fn sync(&mut self, now: Nanos) {
        let target = self.origin + now / MS;
        let at = self.proxy.now_ms();
        if target > at {
            self.proxy.advance(target - at);
        }
    }

    /// Look at every open write: forward what the filter let go, answer what it
    /// answered; and send the etcd calls it made.
    fn scan(&mut self, now: Nanos, out: &mut Vec<Out>) {
        for (id, callout) in self.proxy.take_calls() {
            self.next_call += 2;
            let n = self.next_call;
            self.calls.insert(n, id);
            let path = callout.header(":path").unwrap_or_default();
            if callout.upstream == STORE_CLUSTER {
                // A conditional write's HEAD of its resource, answered by the store
                // (`head_answered`, under this call's number).
                match self.names.iter().position(|name| *name == path) {
                    Some(resource) => out.push(Out::Head { id: n, resource }),
                    None => drop(self.calls.remove(&n)),
                }
            } else {
                let body = String::from_utf8_lossy(&callout.body).into_owned();
                out.push(Out::Etcd { call: n, op: Call::Json { path, body } });
            }
            out.push(Out::Timer { at: now + u64::from(callout.timeout_ms) * MS, tag: n });
        }
        let mut done = Vec::new();
        for (&id, (stream, sent)) in self.open.iter_mut() {
            match self.proxy.state(*stream) {
                State::Held => {}
                State::AtUpstream if *sent => {}
                State::AtUpstream => {
                    *sent = true;
                    let headers = self.proxy.forwarded(*stream).unwrap_or_default();
                    let header =
                        |name: &str| headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
                    let token = header("fencing-admitted-token").and_then(|v| v.parse().ok()).unwrap_or(0);
                    let precondition = match (header("if-match"), header("if-none-match")) {
                        (Some(tag), _) => Some(("if-match", tag)),
                        (None, Some(any)) => Some(("if-none-match", any)),
                        (None, None) => None,
                    };
                    out.push(Out::Forward { id, token, precondition });
                    out.push(Out::Timer { at: now + self.settings.upstream_timeout, tag: id << 1 });
                }
                State::Answered(a) => {
                    let highest = a.header("fencing-highest").and_then(|h| h.parse().ok());
                    let body = if a.local || a.status >= 300 { a.body.trim_end().to_owned() } else { "stored".into() };
                    out.push(Out::Answer { id, answer: Answer { status: a.status, highest, body } });
                    done.push(id);
                }
                State::Gone | State::Hung | State::Trapped(_) => done.push(id),
            }
        }
        for id in done {
            self.open.remove(&id);
        }
        // The root's ticks matter while a write is open (held ones are re-checked on
        // them); otherwise the next request's clock catches them up, and a run whose
        // writes are all answered ends.
        if !self.ticking && !self.open.is_empty() {
            self.ticking = true;
            out.push(Out::Timer { at: now + TICK_MS * MS, tag: TICK });
        }
    }
}

/// Envoy number `seed`'s start: every call is kept for the world to carry (none are
/// made without etcd); each start draws other random bits, as a real Envoy's workers
/// name themselves in etcd's in-flight registry with distinct random ids.
fn start(config: &str, seed: u64, clock_ms: Option<u64>) -> Result<Proxy, String> {
    Proxy::start_deferring(binary()?, Profile::envoy(), config, 1, seed, clock_ms)
        .map_err(|e| format!("the filter did not start: {e}"))
}

impl Fence for FilterFence {
    fn request(&mut self, now: Nanos, req: Request, out: &mut Vec<Out>) {
        self.sync(now);
        let mut request =
            HttpRequest::put(&self.names[req.resource]).token(&req.token.to_string()).body(&body_of(req.content));
        if let Some(forged) = req.forged {
            request = request.header("fencing-admitted-token", &forged.to_string());
        }
        let stream = self.proxy.send(0, request);
        self.open.insert(req.id, (stream, false));
        self.scan(now, out);
    }

    fn store_answered(&mut self, now: Nanos, id: u64, status: u16, etag: Option<&str>, out: &mut Vec<Out>) {
        self.sync(now);
        // An answer after Envoy gave up on the write finds no stream: Envoy drops it.
        if let Some(&(stream, true)) = self.open.get(&id) {
            if self.proxy.state(stream) == State::AtUpstream {
                let headers: Vec<(String, String)> =
                    etag.map(|t| ("etag".to_owned(), t.to_owned())).into_iter().collect();
                self.proxy.respond_fully(stream, status, &headers, b"");
            }
        }
        self.scan(now, out);
    }

    fn head_answered(&mut self, now: Nanos, call: u64, status: u16, etag: Option<&str>, out: &mut Vec<Out>) {
        self.sync(now);
        if let Some(id) = self.calls.remove(&call) {
            let mut answer = CallAnswer::new(status, Vec::new());
            answer.headers.extend(etag.map(|t| ("etag".to_owned(), t.as_bytes().to_vec())));
            self.proxy.answer_call(id, answer);
        }
        self.scan(now, out);
    }

    fn etcd_answered(&mut self, now: Nanos, call: u64, answer: Result<EtcdAnswer, String>, out: &mut Vec<Out>) {
        self.sync(now);
        // Answered once: a call its timeout failed first gets nothing more.
        if let Some(id) = self.calls.remove(&call) {
            let answer = match answer {
                Ok(EtcdAnswer::Json(status, body)) => CallAnswer::new(status, body.into_bytes()),
                _ => CallAnswer::failed(),
            };
            self.proxy.answer_call(id, answer);
        }
        self.scan(now, out);
    }

    fn timer(&mut self, now: Nanos, tag: u64, out: &mut Vec<Out>) {
        self.sync(now);
        if tag == TICK {
            self.ticking = false;
        } else if tag & 1 == 1 {
            // An etcd call's timeout: the host fails it, as Envoy does a callout past
            // its timeout.
            if let Some(id) = self.calls.remove(&tag) {
                self.proxy.answer_call(id, CallAnswer::failed());
            }
        } else if let Some(&(stream, true)) = self.open.get(&(tag >> 1)) {
            // The route timeout: Envoy answers 504 and the filter sees the stream end
            // without the store's answer (given up on).
            if self.proxy.state(stream) == State::AtUpstream {
                self.proxy.give_up(stream);
            }
        }
        self.scan(now, out);
    }

    fn wake(&mut self, _: Nanos, _: usize, _: &mut Vec<Out>) {}

    fn crash(&mut self, _: Nanos) {
        self.open.clear();
        self.calls.clear();
        self.ticking = false;
    }

    fn restart(&mut self, now: Nanos) {
        // A new process: its shared data (the marks, the flights) starts empty.
        self.seed += 1 << 20;
        // Its clock is the wall clock, which went on while it was down; its start
        // grace begins now.
        if let Ok(proxy) = start(&self.config, self.seed, Some(self.origin + now / MS)) {
            self.proxy = proxy;
        }
    }

    fn mark(&self, resource: usize) -> Option<u64> {
        // The filter's own record, checked as it reads it: a damaged one is no mark.
        let name = self.names[resource].as_bytes();
        let key = [KEY_PREFIX.as_bytes(), name].concat();
        let value = self.etcd.as_ref()?.lock().unwrap_or_else(|p| p.into_inner()).value(&key)?;
        let token = fencekeeper_core::record::decode(name, &value).ok()?;
        token.to_string().parse().ok()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::Config;

    /// Carry out what the filter asked until it answers write `id`: its etcd calls made
    /// at once on `etcd`, its forward answered 201 by the store. The answer.
    fn drive(f: &mut FilterFence, etcd: &SharedServer, id: u64, mut out: Vec<Out>) -> Answer {
        let mut now = 10 * MS;
        for _ in 0..100 {
            now += MS;
            let mut next = Vec::new();
            for o in out.drain(..) {
                match o {
                    Out::Etcd { call, op } => {
                        let answer = etcd.lock().unwrap().apply(&op, false);
                        f.etcd_answered(now, call, Ok(answer), &mut next);
                    }
                    Out::Forward { id: w, .. } => f.store_answered(now, w, 201, None, &mut next),
                    Out::Answer { id: w, answer } if w == id => return answer,
                    _ => {}
                }
            }
            out = next;
        }
        panic!("no answer for w{id}");
    }

    #[test]
    fn marks_go_to_the_simulated_etcd_as_the_filters_own_records_and_a_new_envoy_reads_them() {
        let settings = Config::new(1, 1).settings;
        let names: Rc<[String]> = vec!["/r".to_owned()].into();
        let etcd = SharedServer::default();
        let mut first = FilterFence::new(0, names.clone(), settings, None, Some(etcd.clone()), false, false).unwrap();
        let write = |id, token| Request { id, resource: 0, token, content: 0, forged: None };
        let mut out = Vec::new();
        first.request(MS, write(1, 34), &mut out);
        assert!(out.iter().any(|o| matches!(o, Out::Etcd { op: Call::Json { .. }, .. })), "an etcd call: {out:?}");
        assert_eq!(drive(&mut first, &etcd, 1, out).status, 201);
        assert_eq!(first.mark(0), Some(34), "the record in etcd, read back");
        // Another Envoy, its shared data empty: etcd's mark refuses the stale token.
        let mut second = FilterFence::new(1, names, settings, None, Some(etcd.clone()), false, false).unwrap();
        let mut out = Vec::new();
        second.request(MS, write(2, 33), &mut out);
        let stale = drive(&mut second, &etcd, 2, out);
        assert_eq!((stale.status, stale.highest), (409, Some(34)), "{stale:?}");
        // An etcd call that is never answered fails at the filter's call timeout:
        // undecided (503), nothing forwarded.
        let mut out = Vec::new();
        second.request(2 * MS, write(3, 35), &mut out);
        let Some(Out::Timer { at, tag }) =
            out.iter().find(|o| matches!(o, Out::Timer { tag, .. } if tag & 1 == 1)).cloned()
        else {
            panic!("no call timeout: {out:?}")
        };
        let mut next = Vec::new();
        second.timer(at, tag, &mut next);
        let answer = next.iter().find_map(|o| match o {
            Out::Answer { id: 3, answer } => Some(answer.clone()),
            Out::Forward { .. } => panic!("forwarded without etcd's word"),
            _ => None,
        });
        assert_eq!(answer.map(|a| a.status), Some(503));
        assert_eq!(second.mark(0), Some(34));
    }

    #[test]
    fn a_conditional_writes_answer_waits_for_its_settle_in_etcd_and_the_clock_stays_the_worlds() {
        // The store answers the forwarded write; the filter holds that answer while it
        // settles the write's lend in etcd, a call the world answers when it will.
        // Nothing moves the Envoy's clock meanwhile but the world (the host used to
        // step it 10 s while it waited, which aged every call the filter had out).
        let settings = Config::conditional(1, 1).settings;
        let names: Rc<[String]> = vec!["/r".to_owned()].into();
        let etcd = SharedServer::default();
        let mut f = FilterFence::new(0, names, settings, None, Some(etcd.clone()), false, true).unwrap();
        let mut out = Vec::new();
        f.request(MS, Request { id: 1, resource: 0, token: 7, content: 1, forged: None }, &mut out);
        let mut now = MS;
        let mut forwarded = None;
        for _ in 0..20 {
            let mut next = Vec::new();
            for o in out.drain(..) {
                match o {
                    Out::Etcd { call, op } => {
                        now += MS;
                        let answer = etcd.lock().unwrap().apply(&op, false);
                        f.etcd_answered(now, call, Ok(answer), &mut next);
                    }
                    Out::Forward { id, precondition, .. } => forwarded = Some((id, precondition)),
                    _ => {}
                }
            }
            out = next;
        }
        let (id, precondition) = forwarded.expect("the write went to the store");
        assert_eq!(precondition, Some(("if-none-match", "*".to_owned())), "a new object's precondition");
        let clock = f.proxy.now_ms();
        let mut out = Vec::new();
        f.store_answered(now, id, 200, Some(&etag_of(1)), &mut out);
        assert_eq!(f.proxy.now_ms(), clock, "the host's clock moved while the filter held the answer");
        assert!(!out.iter().any(|o| matches!(o, Out::Answer { .. })), "answered before its settle: {out:?}");
        let settle = out.iter().find_map(|o| match o {
            Out::Etcd { call, op } => Some((*call, op.clone())),
            _ => None,
        });
        let (call, op) = settle.expect("the settle is an etcd call");
        let mut answered = Vec::new();
        f.etcd_answered(now + 500 * MS, call, Ok(etcd.lock().unwrap().apply(&op, false)), &mut answered);
        let answer = answered.iter().find_map(|o| match o {
            Out::Answer { id: 1, answer } => Some(answer.status),
            _ => None,
        });
        assert_eq!(answer, Some(200), "the store's answer, once settled: {answered:?}");
    }
}
