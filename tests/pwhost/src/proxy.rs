//! The proxy: workers, each a VM of the filter, driven request by request on a
//! virtual clock.
//!
//! A request goes headers → body → upstream; the test plays the upstream
//! ([`Proxy::respond`]), or the proxy gives up on it ([`Proxy::give_up`]), or the
//! client goes away ([`Proxy::hang_up`]). Then response headers and the log. Time moves
//! only through [`Proxy::advance`], which fires each root's tick when it is due.
//! Whatever a callback leaves for the host (a local reply, a resume, a queue
//! notification, a gRPC answer) runs once the callback has returned.

use crate::imports;
use crate::profile::{ConfigureFailure, Profile};
use crate::vm::{CallAnswer, Callout, LocalReply, Phase, Stream, VmState};
use crate::world::{LogLine, World};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;
use wasmtime::{Engine, Instance, Linker, Module, Store, Val};

/// The filter, compiled once.
#[derive(Clone)]
pub struct Binary {
    engine: Engine,
    module: Module,
}

impl Binary {
    /// Compile the `.wasm` at `path`.
    pub fn load(path: &Path) -> Result<Binary, Error> {
        let bytes = std::fs::read(path).map_err(|e| Error::Load(format!("{}: {e}", path.display())))?;
        let engine = Engine::default();
        let module = Module::new(&engine, &bytes).map_err(|e| Error::Load(format!("{}: {e}", path.display())))?;
        Ok(Binary { engine, module })
    }
}

/// Why the proxy did not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `.wasm` could not be read or compiled.
    #[error("cannot load the filter: {0}")]
    Load(String),
    /// The module could not be instantiated (an import this host lacks).
    #[error("cannot instantiate the filter: {0}")]
    Instantiate(String),
    /// `on_configure` failed on a host that refuses the configuration then.
    #[error("the {profile} host refused the configuration (worker {worker}): {why}")]
    Refused {
        /// The profile's name.
        profile: &'static str,
        /// The worker whose VM failed.
        worker: usize,
        /// The VM's log, or its trap.
        why: String,
    },
}

/// A request as the client sends it.
#[derive(Clone, Debug)]
pub struct Request {
    /// The method.
    pub method: String,
    /// The path.
    pub path: String,
    /// Headers other than the pseudo-headers.
    pub headers: Vec<(String, String)>,
    /// The body (none when empty).
    pub body: Vec<u8>,
}

impl Request {
    /// A PUT of `path`.
    pub fn put(path: &str) -> Request {
        Request { method: "PUT".into(), path: path.into(), headers: Vec::new(), body: Vec::new() }
    }

    /// With a header.
    pub fn header(mut self, name: &str, value: &str) -> Request {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// With `fencing-token: token`.
    pub fn token(self, token: &str) -> Request {
        self.header("fencing-token", token)
    }

    /// With a body.
    pub fn body(mut self, body: &[u8]) -> Request {
        self.body = body.to_vec();
        self
    }
}

/// An answer the client got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Its status.
    pub status: u16,
    /// Its headers.
    pub headers: Vec<(String, String)>,
    /// Its body, as text.
    pub body: String,
    /// The proxy gave it (a local reply), not the upstream.
    pub local: bool,
}

impl Answer {
    /// The first value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Where a request is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum State {
    /// Paused by the filter, not answered.
    Held,
    /// Forwarded; the upstream has not answered.
    AtUpstream,
    /// Answered.
    Answered(Answer),
    /// The client went away before an answer.
    Gone,
    /// Sent to a worker that is dead: never answered (nginx after a failed configure).
    Hung,
    /// The VM trapped while serving it.
    Trapped(String),
}

/// A request's handle: its worker and its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId {
    /// The worker it went to.
    pub worker: usize,
    /// Its context id.
    pub context: u32,
}

struct Worker {
    store: Store<VmState>,
    instance: Instance,
    alive: bool,
}

/// A proxy of one or more workers running the filter.
pub struct Proxy {
    workers: Vec<Worker>,
    world: Rc<RefCell<World>>,
    profile: Rc<Profile>,
    /// Requests that ended, and how; forwarded requests' headers.
    ended: BTreeMap<StreamId, State>,
    forwarded: BTreeMap<StreamId, Vec<(String, String)>>,
    forwarded_bodies: BTreeMap<StreamId, Vec<u8>>,
    hung: u32,
    /// What answers the filter's HTTP calls.
    callouts: Option<Box<Answerer>>,
    /// HTTP calls kept for the test to answer later ([`Proxy::start_deferring`]).
    deferred: Option<Vec<(CallId, Callout)>>,
    /// With deferred calls: answers whose headers the filter paused (for an etcd call),
    /// finished when it resumes them or answers itself ([`Proxy::resolve`]).
    paused_answers: BTreeMap<StreamId, Answer>,
}

/// An HTTP call the filter made, kept for [`Proxy::answer_call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CallId {
    worker: usize,
    context: u32,
    token: u32,
}

/// What answers an HTTP call the filter makes: the test's stand-in for the proxy's
/// cluster (a real etcd behind it, say).
pub type Answerer = dyn FnMut(&Callout) -> CallAnswer;

impl Proxy {
    /// Start `workers` workers of `binary` under `profile`, each configured with `config`.
    pub fn start(binary: &Binary, profile: Profile, config: &str, workers: usize) -> Result<Proxy, Error> {
        Proxy::start_seeded(binary, profile, config, workers, 0x5eed)
    }

    /// Start as [`Proxy::start`], WASI's random bits drawn from `seed`: two proxies
    /// that must not draw the same (each VM names itself with them, as the filter's
    /// workers do in etcd's in-flight registry) are given two seeds.
    fn start_seeded(
        binary: &Binary,
        profile: Profile,
        config: &str,
        workers: usize,
        seed: u64,
    ) -> Result<Proxy, Error> {
        let mut proxy = Proxy {
            workers: Vec::new(),
            world: Rc::new(RefCell::new(World::new(seed))),
            profile: Rc::new(profile),
            ended: BTreeMap::new(),
            forwarded: BTreeMap::new(),
            forwarded_bodies: BTreeMap::new(),
            hung: 0,
            callouts: None,
            deferred: None,
            paused_answers: BTreeMap::new(),
        };
        proxy.add_workers(binary, config, workers)?;
        Ok(proxy)
    }

    /// Start `workers` more workers, each configured with `config`.
    fn add_workers(&mut self, binary: &Binary, config: &str, workers: usize) -> Result<(), Error> {
        let mut linker = Linker::new(&binary.engine);
        imports::define(&mut linker).map_err(|e| Error::Instantiate(e.to_string()))?;
        for _ in 0..workers {
            let worker = self.workers.len();
            let mut state = VmState::new(worker, Rc::clone(&self.world), Rc::clone(&self.profile), config.into());
            state.callouts = self.callouts.is_some() || self.deferred.is_some();
            let mut store = Store::new(&binary.engine, state);
            let instance =
                linker.instantiate(&mut store, &binary.module).map_err(|e| Error::Instantiate(format!("{e:#}")))?;
            self.workers.push(Worker { store, instance, alive: true });
            if let Err(why) = self.configure(worker, config.len()) {
                match self.profile.configure_failure {
                    ConfigureFailure::Refused => {
                        return Err(Error::Refused { profile: self.profile.name, worker, why });
                    }
                    // The worker is gone and nobody starts another.
                    ConfigureFailure::Fatal => self.workers[worker].alive = false,
                }
            }
        }
        Ok(())
    }

    /// Start as [`Proxy::start`], with `answerer` answering every HTTP call the filter
    /// makes (from configure on), in the order made, once the callback that made it
    /// returns.
    pub fn start_answering(
        binary: &Binary,
        profile: Profile,
        config: &str,
        workers: usize,
        answerer: Box<Answerer>,
    ) -> Result<Proxy, Error> {
        let mut proxy = Proxy::start(binary, profile, "", 0)?;
        proxy.callouts = Some(answerer);
        proxy.add_workers(binary, config, workers)?;
        Ok(proxy)
    }

    /// Start as [`Proxy::start`], keeping every HTTP call the filter makes (from
    /// configure on) until the test answers it, in any order and at any time
    /// ([`Proxy::take_calls`], [`Proxy::answer_call`]): an etcd on a network of the
    /// test's, whose answers are late, or never come. WASI's random bits are drawn
    /// from `seed`: proxies sharing an etcd are given distinct seeds, as real ones
    /// draw distinct names. `clock_ms`: what its clock reads at its start (`None`:
    /// the epoch), so that a proxy started later in a test's run reads the same time
    /// as those started before it.
    pub fn start_deferring(
        binary: &Binary,
        profile: Profile,
        config: &str,
        workers: usize,
        seed: u64,
        clock_ms: Option<u64>,
    ) -> Result<Proxy, Error> {
        let mut proxy = Proxy::start_seeded(binary, profile, "", 0, seed)?;
        proxy.deferred = Some(Vec::new());
        if let Some(at) = clock_ms {
            proxy.world.borrow_mut().now_ms = at;
        }
        proxy.add_workers(binary, config, workers)?;
        Ok(proxy)
    }

    /// The HTTP calls made since the last take, in the order made (with
    /// [`Proxy::start_deferring`]; none otherwise).
    pub fn take_calls(&mut self) -> Vec<(CallId, Callout)> {
        self.deferred.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Answer call `id` (taken with [`Proxy::take_calls`]) with `answer`, and act on
    /// what the filter does then. A call whose request ended meanwhile is dropped, as
    /// a host cancels it with its stream.
    pub fn answer_call(&mut self, id: CallId, answer: CallAnswer) {
        self.deliver_call(id, answer);
        self.settle();
    }

    /// Initialize the VM, create its root context and configure it.
    fn configure(&mut self, worker: usize, size: usize) -> Result<(), String> {
        self.call(worker, "_initialize", &[])?;
        let root = self.world.borrow_mut().context_id();
        self.workers[worker].store.data_mut().root = root;
        self.on(worker, root, "proxy_on_context_create", &[root as i32, 0])?;
        if self.on(worker, root, "proxy_on_vm_start", &[root as i32, 0])? == 0 {
            return Err(self.log_of(worker));
        }
        if self.on(worker, root, "proxy_on_configure", &[root as i32, size as i32])? == 0 {
            return Err(self.log_of(worker));
        }
        self.settle();
        Ok(())
    }

    fn log_of(&self, worker: usize) -> String {
        let w = self.world.borrow();
        w.logs.iter().filter(|l| l.worker == worker).map(|l| l.text.as_str()).collect::<Vec<_>>().join("; ")
    }

    /// Call export `name`; its i32 result (0 when it has none).
    fn call(&mut self, worker: usize, name: &str, args: &[i32]) -> Result<i32, String> {
        let w = &mut self.workers[worker];
        let func = w.instance.get_func(&mut w.store, name).ok_or_else(|| format!("the filter exports no {name}"))?;
        let params: Vec<Val> = args.iter().map(|a| Val::I32(*a)).collect();
        let mut results = vec![Val::I32(0); func.ty(&w.store).results().len()];
        func.call(&mut w.store, &params, &mut results).map_err(|e| format!("trap in {name}: {e:#}"))?;
        Ok(results.first().and_then(Val::i32).unwrap_or(0))
    }

    /// Run callback `name` for `context` (made effective first). A trap kills the worker.
    fn on(&mut self, worker: usize, context: u32, name: &str, args: &[i32]) -> Result<i32, String> {
        if !self.workers[worker].alive {
            return Err(format!("worker {worker} is dead"));
        }
        self.workers[worker].store.data_mut().effective = context;
        let result = self.call(worker, name, args);
        if let Err(trap) = &result {
            self.workers[worker].alive = false;
            self.world.borrow_mut().violations.push(format!("worker {worker}: {trap}"));
        }
        result
    }

    /// Send `request` to `worker`.
    pub fn send(&mut self, worker: usize, request: Request) -> StreamId {
        if !self.workers[worker].alive {
            // Nginx's master still accepts the connection; nobody answers.
            self.hung += 1;
            let id = StreamId { worker, context: u32::MAX - self.hung };
            self.ended.insert(id, State::Hung);
            return id;
        }
        let context = self.world.borrow_mut().context_id();
        let id = StreamId { worker, context };
        let mut headers = vec![
            (":method".to_owned(), request.method.into_bytes()),
            (":path".to_owned(), request.path.into_bytes()),
            (":authority".to_owned(), b"store".to_vec()),
            (":scheme".to_owned(), b"http".to_vec()),
        ];
        headers.extend(request.headers.into_iter().map(|(n, v)| (n, v.into_bytes())));
        let vm = self.workers[worker].store.data_mut();
        let root = vm.root;
        vm.streams.insert(context, Stream::new(headers, request.body));
        if self.on(worker, context, "proxy_on_context_create", &[context as i32, root as i32]).is_err() {
            self.trapped(id);
            return id;
        }
        self.run(id, Phase::RequestHeaders);
        id
    }

    fn stream(&mut self, id: StreamId) -> Option<&mut Stream> {
        self.workers[id.worker].store.data_mut().streams.get_mut(&id.context)
    }

    fn trapped(&mut self, id: StreamId) {
        let why = self.world.borrow().violations.last().cloned().unwrap_or_default();
        self.workers[id.worker].store.data_mut().streams.remove(&id.context);
        self.ended.insert(id, State::Trapped(why));
    }

    /// Run the filter's callback for `phase`, then the next phase if it continues.
    fn run(&mut self, id: StreamId, phase: Phase) {
        let Some(stream) = self.stream(id) else { return };
        stream.phase = phase;
        let (headers, body) = (stream.request.len() as i32, stream.body.len() as i32);
        let (callback, args, next) = match phase {
            Phase::RequestHeaders => {
                let next = if body > 0 { Phase::RequestBody } else { Phase::Upstream };
                ("proxy_on_request_headers", [id.context as i32, headers, i32::from(body == 0)], next)
            }
            Phase::RequestBody => ("proxy_on_request_body", [id.context as i32, body, 1], Phase::Upstream),
            Phase::Upstream => {
                let forwarded =
                    stream.request.iter().map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())).collect();
                let body = stream.body.clone();
                self.forwarded.insert(id, forwarded);
                self.forwarded_bodies.insert(id, body);
                return;
            }
        };
        let action = match self.on(id.worker, id.context, callback, &args) {
            Ok(action) => action,
            Err(_) => return self.trapped(id),
        };
        // Recorded before anything the callback left runs: a resume may be among it.
        if action != 0 {
            if let Some(stream) = self.stream(id) {
                stream.paused = Some(next);
            }
        }
        self.settle();
        let live = self.stream(id).is_some_and(|s| !s.answered && s.local.is_none() && s.paused.is_none());
        if action == 0 && live {
            self.run(id, next);
        }
    }

    /// Act on what callbacks left, until nothing is left: local replies, resumes,
    /// gRPC answers, queue notifications.
    fn settle(&mut self) {
        loop {
            let mut progress = false;
            for worker in 0..self.workers.len() {
                let touched = std::mem::take(&mut self.workers[worker].store.data_mut().touched);
                for context in touched {
                    progress = true;
                    self.resolve(StreamId { worker, context });
                }
                let calls = std::mem::take(&mut self.workers[worker].store.data_mut().http);
                for (context, token, callout) in calls {
                    progress = true;
                    let id = CallId { worker, context, token };
                    match self.deferred.as_mut() {
                        Some(kept) => kept.push((id, callout)),
                        None => self.answer_now(id, &callout),
                    }
                }
                let calls = std::mem::take(&mut self.workers[worker].store.data_mut().grpc);
                for (context, token) in calls {
                    progress = true;
                    let vm = self.workers[worker].store.data();
                    if context == vm.root || vm.streams.contains_key(&context) {
                        // UNAVAILABLE: no etcd behind this host.
                        let _ = self.on(worker, context, "proxy_on_grpc_close", &[context as i32, token as i32, 14]);
                    }
                }
            }
            let ready = self.world.borrow_mut().ready.pop_front();
            if let Some((worker, queue)) = ready {
                progress = true;
                let root = self.workers[worker].store.data().root;
                if self.workers[worker].alive {
                    let _ = self.on(worker, root, "proxy_on_queue_ready", &[root as i32, queue as i32]);
                }
            }
            if !progress {
                return;
            }
        }
    }

    /// Answer HTTP call `id` with what the answerer says.
    fn answer_now(&mut self, id: CallId, callout: &Callout) {
        let Some(answerer) = self.callouts.as_mut() else { return };
        let answer = answerer(callout);
        self.deliver_call(id, answer);
    }

    /// Run the filter's `proxy_on_http_call_response` for call `id` with `answer`.
    fn deliver_call(&mut self, id: CallId, answer: CallAnswer) {
        let CallId { worker, context, token } = id;
        if !self.workers.get(worker).is_some_and(|w| w.alive) {
            return;
        }
        let vm = self.workers[worker].store.data_mut();
        if context != vm.root && !vm.streams.contains_key(&context) {
            // Its stream ended: a host cancels the call with it.
            return;
        }
        let args = [context as i32, token as i32, answer.headers.len() as i32, answer.body.len() as i32, 0];
        vm.call_answer = Some(answer);
        let _ = self.on(worker, context, "proxy_on_http_call_response", &args);
        self.workers[worker].store.data_mut().call_answer = None;
    }

    /// A stream a host call changed: answer it locally, or resume it.
    fn resolve(&mut self, id: StreamId) {
        let Some(stream) = self.stream(id) else { return };
        if stream.responding {
            // `respond_with` waits for it, or, with deferred calls, it is finished here
            // once the filter let it go or answered itself.
            if (stream.resume || stream.local.is_some()) && self.paused_answers.contains_key(&id) {
                if let Some(a) = self.paused_answers.remove(&id) {
                    self.finish_response(id, a);
                }
            }
            return;
        }
        if let Some(reply) = stream.local.take() {
            return self.answer_locally(id, reply);
        }
        if std::mem::take(&mut stream.resume) {
            if let Some(next) = stream.paused.take() {
                self.run(id, next);
            }
        }
    }

    fn answer_locally(&mut self, id: StreamId, reply: LocalReply) {
        let details = if reply.details.is_empty() { "wasm_local_reply".to_owned() } else { reply.details.clone() };
        let answer = Answer {
            status: reply.status,
            headers: reply.headers.iter().map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned())).collect(),
            body: String::from_utf8_lossy(&reply.body).into_owned(),
            local: true,
        };
        let mut response = vec![(":status".to_owned(), reply.status.to_string().into_bytes())];
        response.extend(reply.headers);
        self.respond_with(id, response, reply.body, details, answer);
    }

    /// The upstream answers request `id` with `status` (and no body).
    pub fn respond(&mut self, id: StreamId, status: u16) {
        self.respond_fully(id, status, &[], b"");
    }

    /// The upstream answers request `id` with `status`, `headers` and `body`; the
    /// client gets them as the filter leaves them (or the filter's own answer, if it
    /// gives one instead).
    pub fn respond_fully(&mut self, id: StreamId, status: u16, headers: &[(String, String)], body: &[u8]) {
        assert!(self.forwarded.contains_key(&id), "request {id:?} was never forwarded");
        let answer = Answer { status, headers: Vec::new(), body: String::new(), local: false };
        let mut response = vec![(":status".to_owned(), status.to_string().into_bytes())];
        response.extend(headers.iter().map(|(n, v)| (n.to_ascii_lowercase(), v.clone().into_bytes())));
        self.respond_with(id, response, body.to_vec(), "via_upstream".to_owned(), answer);
    }

    /// The upstream resets the stream before answering (it closed the connection): the
    /// proxy's local 503, as Envoy gives it.
    pub fn reset(&mut self, id: StreamId) {
        let body = "upstream connect error or disconnect/reset before headers. reset reason: connection termination";
        let answer = Answer { status: 503, headers: Vec::new(), body: body.into(), local: true };
        let response = vec![(":status".to_owned(), b"503".to_vec())];
        let details = "upstream_reset_before_response_started{connection_termination}".to_owned();
        self.respond_with(id, response, body.as_bytes().to_vec(), details, answer);
    }

    /// The proxy gives up on forwarded request `id` (its route timeout): a local 504.
    pub fn give_up(&mut self, id: StreamId) {
        let answer = Answer { status: 504, headers: Vec::new(), body: "upstream request timeout".into(), local: true };
        let response = vec![(":status".to_owned(), b"504".to_vec())];
        self.respond_with(id, response, Vec::new(), "upstream_response_timeout".to_owned(), answer);
    }

    /// Response headers (and body) through the filter, then the end of the stream.
    fn respond_with(
        &mut self,
        id: StreamId,
        response: Vec<(String, Vec<u8>)>,
        body: Vec<u8>,
        details: String,
        a: Answer,
    ) {
        let Some(stream) = self.stream(id) else { return };
        if stream.responding {
            return; // an answer is in the filter's hands already: the proxy has no second
        }
        stream.paused = None;
        stream.responding = true;
        let n = response.len() as i32;
        let body_len = body.len() as i32;
        (stream.response, stream.response_body, stream.code_details) = (response, body, Some(details));
        let context = id.context as i32;
        let action = match self.on(
            id.worker,
            id.context,
            "proxy_on_response_headers",
            &[context, n, i32::from(body_len == 0)],
        ) {
            Ok(action) => action,
            Err(_) => return self.trapped(id),
        };
        if action != 0 && self.deferred.is_some() {
            // Paused (for an etcd call) that the test answers when it will: the
            // answer is finished when the filter lets it go ([`Proxy::resolve`]).
            // The clock is the test's: nothing here moves it.
            self.paused_answers.insert(id, a);
            return self.settle();
        }
        if action != 0 {
            // Paused (for an etcd call): the calls are answered until the filter
            // resumes the answer or gives its own, on the clock, as long as a call may take.
            for _ in 0..1000 {
                self.settle();
                match self.stream(id) {
                    Some(s) if s.local.is_none() && !s.resume => self.advance(10),
                    _ => break,
                }
            }
        }
        self.finish_response(id, a);
    }

    /// The rest of an answer whose headers the filter has let go (or replaced with
    /// its own answer): its body, then the end of the stream.
    fn finish_response(&mut self, id: StreamId, a: Answer) {
        if let Some(stream) = self.stream(id) {
            stream.resume = false;
        }
        let context = id.context as i32;
        let body_len = self.stream(id).map_or(0, |s| s.response_body.len() as i32);
        // The filter answered itself instead: its answer replaces the upstream's.
        if let Some(reply) = self.stream(id).and_then(|s| s.local.take()) {
            let local = Answer {
                status: reply.status,
                headers: reply
                    .headers
                    .iter()
                    .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect(),
                body: String::from_utf8_lossy(&reply.body).into_owned(),
                local: true,
            };
            return self.end(id, State::Answered(local));
        }
        if let Some(stream) = self.stream(id) {
            stream.answered = true;
        }
        if body_len > 0 && self.on(id.worker, id.context, "proxy_on_response_body", &[context, body_len, 1]).is_err() {
            return self.trapped(id);
        }
        // What the client gets: the answer as the filter left it.
        let answer = match self.stream(id) {
            Some(s) if !a.local => Answer {
                status: a.status,
                headers: s
                    .response
                    .iter()
                    .filter(|(n, _)| !n.starts_with(':'))
                    .map(|(n, v)| (n.clone(), String::from_utf8_lossy(v).into_owned()))
                    .collect(),
                body: String::from_utf8_lossy(&s.response_body).into_owned(),
                local: false,
            },
            _ => a,
        };
        self.end(id, State::Answered(answer));
    }

    /// The client goes away before an answer.
    pub fn hang_up(&mut self, id: StreamId) {
        if self.stream(id).is_some() {
            self.end(id, State::Gone);
        }
    }

    /// The stream's end: the log, done, delete.
    fn end(&mut self, id: StreamId, state: State) {
        let context = id.context as i32;
        for callback in ["proxy_on_log", "proxy_on_done", "proxy_on_delete"] {
            if self.on(id.worker, id.context, callback, &[context]).is_err() {
                return self.trapped(id);
            }
        }
        self.workers[id.worker].store.data_mut().streams.remove(&id.context);
        self.ended.insert(id, state);
        self.settle();
    }

    /// The clock, in milliseconds since the proxy started.
    pub fn now_ms(&self) -> u64 {
        self.world.borrow().now_ms
    }

    /// Move the clock by `ms`, firing every root's tick as it comes due.
    pub fn advance(&mut self, ms: u64) {
        let until = self.world.borrow().now_ms + ms;
        loop {
            let due = (0..self.workers.len())
                .filter(|w| self.workers[*w].alive && self.workers[*w].store.data().tick_ms > 0)
                .map(|w| (self.workers[w].store.data().next_tick, w))
                .filter(|(at, _)| *at <= until)
                .min();
            let Some((at, worker)) = due else { break };
            self.world.borrow_mut().now_ms = at;
            let vm = self.workers[worker].store.data_mut();
            vm.next_tick = at + vm.tick_ms;
            let root = vm.root;
            let _ = self.on(worker, root, "proxy_on_tick", &[root as i32]);
            self.settle();
        }
        self.world.borrow_mut().now_ms = until;
    }

    /// Where request `id` is.
    pub fn state(&mut self, id: StreamId) -> State {
        if let Some(state) = self.ended.get(&id) {
            return state.clone();
        }
        match self.stream(id) {
            Some(s) if s.phase == Phase::Upstream && s.paused.is_none() => State::AtUpstream,
            Some(_) => State::Held,
            None => State::Gone,
        }
    }

    /// The request headers the upstream got for `id`, if it was forwarded.
    pub fn forwarded(&self, id: StreamId) -> Option<&[(String, String)]> {
        self.forwarded.get(&id).map(Vec::as_slice)
    }

    /// The body the upstream got for `id`, if it was forwarded.
    pub fn forwarded_body(&self, id: StreamId) -> Option<&[u8]> {
        self.forwarded_bodies.get(&id).map(Vec::as_slice)
    }

    /// Every VM's log lines so far.
    pub fn logs(&self) -> Vec<LogLine> {
        self.world.borrow().logs.clone()
    }

    /// A metric's value, by the name the filter defined it with.
    pub fn metric(&self, name: &str) -> Option<i64> {
        self.world.borrow().metrics.get(name).copied()
    }

    /// The shared-data entries whose keys start with `prefix`, in key order.
    pub fn shared(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        let world = self.world.borrow();
        let mut entries: Vec<(String, Vec<u8>)> = world
            .shared
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(k, (v, _))| (k.clone(), v.clone()))
            .collect();
        entries.sort();
        entries
    }

    /// What the filter did that a real host would crash on or refuse, and traps.
    pub fn violations(&self) -> Vec<String> {
        self.world.borrow().violations.clone()
    }

    /// How many `proxy_grpc_call`s the filter made.
    pub fn grpc_calls(&self) -> usize {
        self.world.borrow().grpc_calls
    }

    /// Whether worker `worker` is alive.
    pub fn alive(&self, worker: usize) -> bool {
        self.workers[worker].alive
    }

    /// The profile it runs under.
    pub fn profile(&self) -> &Profile {
        &self.profile
    }
}
