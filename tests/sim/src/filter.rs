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
//! Marks are the filter's shared data, one Envoy's own (`--own-marks`), so the filter
//! runs in efficiency mode (it refuses correctness mode without etcd: such marks die
//! with the process). For the same reason instance crashes are not drawn for it, and
//! the marks are not read back (the checker's third rule is not judged here).

use crate::fence::{Answer, Bug, Fence, Out, Request, Settings};
use crate::queue::{Nanos, MS};
use fencekeeper_pwhost::{Binary, Profile, Proxy, Request as HttpRequest, State, StreamId};
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

/// A timer's tag for the root's tick (the upstream timeouts' are write ids, even).
const TICK: u64 = 1;

/// One Envoy with the filter.
pub struct FilterFence {
    proxy: Proxy,
    config: String,
    names: Rc<[String]>,
    settings: Settings,
    /// World time at the host's start, and what its clock read then (ms).
    base: Nanos,
    origin: u64,
    /// Open writes: their streams, and whether each went upstream.
    open: BTreeMap<u64, (StreamId, bool)>,
    ticking: bool,
}

impl FilterFence {
    /// An Envoy with the filter configured for `settings`, over the resources named in
    /// `names`. The filter's code is the committed binary's, so no bug can be put into
    /// it; `Bug::SkipGate` is its configuration with the gate off (`"gate": null`,
    /// documented as unsafe), and the others are refused.
    pub fn new(names: Rc<[String]>, settings: Settings, bug: Option<Bug>) -> Result<FilterFence, String> {
        let ms = |n: Nanos| n / MS;
        let gate = match bug {
            None => format!(
                r#"{{"budget_ms": {}, "apply_bound_ms": {}, "tick_ms": {TICK_MS}}}"#,
                ms(settings.gate_budget),
                ms(settings.apply_bound)
            ),
            Some(Bug::SkipGate) => "null".to_owned(),
            Some(other) => return Err(format!("--bug {} has no counterpart in the filter's binary", other.name())),
        };
        let config = format!(
            r#"{{"etcd": null, "mode": "efficiency", "start_grace_ms": {}, "gate": {gate}}}"#,
            ms(settings.start_grace)
        );
        let mut proxy = start(&config)?;
        // Started its start grace before the run: the other instances start with no
        // grace either (a restart has one).
        proxy.advance(ms(settings.start_grace) + 1);
        let origin = proxy.now_ms();
        Ok(FilterFence { proxy, config, names, settings, base: 0, origin, open: BTreeMap::new(), ticking: false })
    }

    /// Move the host's clock up to `now`, firing the ticks that came due.
    fn sync(&mut self, now: Nanos) {
        let target = self.origin + now.saturating_sub(self.base) / MS;
        let at = self.proxy.now_ms();
        if target > at {
            self.proxy.advance(target - at);
        }
    }

    /// Look at every open write: forward what the filter let go, answer what it
    /// answered.
    fn scan(&mut self, now: Nanos, out: &mut Vec<Out>) {
        let mut done = Vec::new();
        for (&id, (stream, sent)) in self.open.iter_mut() {
            match self.proxy.state(*stream) {
                State::Held => {}
                State::AtUpstream if *sent => {}
                State::AtUpstream => {
                    *sent = true;
                    let header = self.proxy.forwarded(*stream).and_then(|h| {
                        h.iter().find(|(n, _)| n.eq_ignore_ascii_case("fencing-admitted-token")).map(|(_, v)| v.clone())
                    });
                    let token = header.and_then(|v| v.parse().ok()).unwrap_or(0);
                    out.push(Out::Forward { id, token, precondition: None });
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

fn start(config: &str) -> Result<Proxy, String> {
    Proxy::start(binary()?, Profile::envoy(), config, 1).map_err(|e| format!("the filter did not start: {e}"))
}

impl Fence for FilterFence {
    fn request(&mut self, now: Nanos, req: Request, out: &mut Vec<Out>) {
        self.sync(now);
        let mut request = HttpRequest::put(&self.names[req.resource]).token(&req.token.to_string());
        if let Some(forged) = req.forged {
            request = request.header("fencing-admitted-token", &forged.to_string());
        }
        let stream = self.proxy.send(0, request);
        self.open.insert(req.id, (stream, false));
        self.scan(now, out);
    }

    fn store_answered(&mut self, now: Nanos, id: u64, status: u16, _etag: Option<&str>, out: &mut Vec<Out>) {
        self.sync(now);
        if let Some(&(stream, true)) = self.open.get(&id) {
            if self.proxy.state(stream) == State::AtUpstream {
                self.proxy.respond(stream, status);
            }
        }
        self.scan(now, out);
    }

    fn etcd_answered(&mut self, _: Nanos, _: u64, _: Result<crate::etcd::Answer, String>, _: &mut Vec<Out>) {}

    fn timer(&mut self, now: Nanos, tag: u64, out: &mut Vec<Out>) {
        self.sync(now);
        if tag == TICK {
            self.ticking = false;
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

    fn crash(&mut self, now: Nanos) {
        self.open.clear();
        self.ticking = false;
        self.base = now;
    }

    fn restart(&mut self, now: Nanos) {
        // A new process: its shared data (the marks, the flights) starts empty.
        if let Ok(proxy) = start(&self.config) {
            self.origin = proxy.now_ms();
            self.proxy = proxy;
        }
        self.base = now;
    }

    fn mark(&self, _resource: usize) -> Option<u64> {
        None
    }
}
