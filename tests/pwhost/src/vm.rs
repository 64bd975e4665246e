//! One worker's VM: what the host keeps for it between calls (the store's data).

use crate::profile::Profile;
use crate::world::World;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

/// Where a request is on its way through the filter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    RequestHeaders,
    RequestBody,
    /// Forwarded: the upstream has it.
    Upstream,
}

/// A local response the filter sent (`proxy_send_local_response`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LocalReply {
    pub status: u16,
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub details: String,
}

/// One HTTP stream of a worker.
pub(crate) struct Stream {
    pub request: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub response: Vec<(String, Vec<u8>)>,
    pub response_body: Vec<u8>,
    /// The phase it is in; with `paused`, the phase it resumes into.
    pub phase: Phase,
    pub paused: Option<Phase>,
    /// `proxy_continue_stream` was called for it.
    pub resume: bool,
    pub local: Option<LocalReply>,
    /// Its answer has been given (no second one may be).
    pub answered: bool,
    /// Envoy's `response.code_details` for its response.
    pub code_details: Option<String>,
    /// The upstream's answer is in the filter's hands (its response callbacks): a
    /// resume or a local reply is acted on there, not as a request's.
    pub responding: bool,
}

impl Stream {
    pub fn new(request: Vec<(String, Vec<u8>)>, body: Vec<u8>) -> Stream {
        Stream {
            request,
            body,
            response: Vec::new(),
            response_body: Vec::new(),
            phase: Phase::RequestHeaders,
            paused: None,
            resume: false,
            local: None,
            answered: false,
            code_details: None,
            responding: false,
        }
    }
}

/// An HTTP call the filter made (`proxy_http_call`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callout {
    /// The cluster (Envoy) or `host:port` (ngx_wasm_module) it names.
    pub upstream: String,
    /// Its headers, pseudo-headers included.
    pub headers: Vec<(String, Vec<u8>)>,
    /// Its body.
    pub body: Vec<u8>,
    /// The timeout the filter gave it.
    pub timeout_ms: u32,
}

impl Callout {
    /// The value of header `name`, as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }
}

/// What answered an HTTP call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallAnswer {
    /// Its headers, `:status` among them (none: the call failed).
    pub headers: Vec<(String, Vec<u8>)>,
    /// Its body.
    pub body: Vec<u8>,
}

impl CallAnswer {
    /// An answer of `status` with `body`.
    pub fn new(status: u16, body: Vec<u8>) -> CallAnswer {
        CallAnswer { headers: vec![(":status".to_owned(), status.to_string().into_bytes())], body }
    }

    /// A call that got no answer (a reset, a timeout): no headers, no body.
    pub fn failed() -> CallAnswer {
        CallAnswer::default()
    }
}

/// The host's side of one VM.
pub struct VmState {
    pub(crate) worker: usize,
    pub(crate) world: Rc<RefCell<World>>,
    pub(crate) profile: Rc<Profile>,
    pub(crate) root: u32,
    /// The context host calls act on now.
    pub(crate) effective: u32,
    pub(crate) streams: BTreeMap<u32, Stream>,
    pub(crate) plugin_config: Vec<u8>,
    /// The root's tick period (0: none) and when it next fires.
    pub(crate) tick_ms: u64,
    pub(crate) next_tick: u64,
    /// gRPC calls dispatched and not answered yet: (context, token).
    pub(crate) grpc: Vec<(u32, u32)>,
    /// Whether HTTP calls are dispatched (the proxy has something to answer them);
    /// else `proxy_http_call` is refused.
    pub(crate) callouts: bool,
    /// HTTP calls dispatched and not answered yet: (context, token, call).
    pub(crate) http: Vec<(u32, u32, Callout)>,
    /// The answer `proxy_on_http_call_response` is running for.
    pub(crate) call_answer: Option<CallAnswer>,
    pub(crate) next_token: u32,
    /// Streams a call changed (a local reply, a resume), for the host to act on once
    /// the callback returns: a host never calls into the guest from a host call.
    pub(crate) touched: Vec<u32>,
}

impl VmState {
    pub(crate) fn new(worker: usize, world: Rc<RefCell<World>>, profile: Rc<Profile>, config: Vec<u8>) -> VmState {
        VmState {
            worker,
            world,
            profile,
            root: 0,
            effective: 0,
            streams: BTreeMap::new(),
            plugin_config: config,
            tick_ms: 0,
            next_tick: 0,
            grpc: Vec::new(),
            callouts: false,
            http: Vec::new(),
            call_answer: None,
            next_token: 1,
            touched: Vec::new(),
        }
    }

    /// The stream of the effective context (none when it is the root's).
    pub(crate) fn stream(&mut self) -> Option<&mut Stream> {
        self.streams.get_mut(&self.effective)
    }

    /// Record what a real host would have crashed on, or refused.
    pub(crate) fn violation(&self, what: String) {
        self.world.borrow_mut().violations.push(format!("worker {}: {what}", self.worker));
    }
}
