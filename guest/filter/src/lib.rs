//! Fencekeeper as a proxy-wasm HTTP filter: drop one `.wasm` into Envoy (or any
//! proxy-wasm host) and an HTTP store that accepts any write gets fencing.
//!
//! The decision, the status mapping and the fail-open rules are fencekeeper-core's
//! (`decide`, `resolve`, `Class`, `Reason`); this crate only carries requests to it
//! and stores marks. docs/envoy.md is the user's guide and configuration reference.
//!
//! # Layout
//! * [`config`]: the JSON plugin configuration.
//! * [`headers`]: the request headers the filter reads, in one host call.
//! * [`slots`]: marks in the proxy's shared data, race-free for new resources.
//! * [`etcd`]: marks in etcd over its gRPC API (correctness mode).
//! * [`auth`]: etcd's user/password authentication (the token, per VM).
//! * [`env`]: the password, from the VM's environment (never from the configuration).
//! * [`vouch`]: the provenance step: etcd vouches for a token before it advances a mark.
//! * [`confirms`]: concurrent checks of a token equal to the mark share one etcd Txn.
//! * [`wake`]: how a request wakes the root context that sends those Txns, and a
//!   flight's end wakes the workers holding writes back for it.
//! * [`gate`]: the ordering gate: no admitted write goes upstream while a lower-token
//!   write on its resource may still reach the store.
//! * [`shared`]: the ordering gate across instances: the in-flight registry in etcd.
//! * [`hold`]: whether this host lets the root act on a request it holds.
//! * [`origin`]: whether an answer came from the store, or from the proxy.
//! * [`reply`]: forward or refuse a request, as the core resolves it.
//! * [`request`]: the per-request state machine (the HTTP context).

// Natively (unit tests) nothing registers the root context.
#![cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]

pub mod auth;
pub mod conditional;
pub mod config;
pub mod confirms;
pub mod env;
pub mod etcd;
pub mod gate;
pub mod headers;
pub mod hold;
pub mod origin;
pub mod reply;
pub mod request;
pub mod shared;
pub mod slots;
pub mod uploads;
pub mod vouch;
pub mod wake;

use config::{Config, Host};
use fencekeeper_core::Class;
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{ContextType, MetricType};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

/// The module's entry point (`_initialize`): registers the root context.
#[cfg(target_arch = "wasm32")]
#[allow(missing_docs)]
mod entry {
    use super::Root;
    use proxy_wasm::traits::RootContext;

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
        proxy_wasm::set_root_context(|id| -> Box<dyn RootContext> { Box::new(Root { id, filter: None }) });
    }}
}

/// The Envoy stat names (Envoy shows them prefixed with `wasmcustom.`).
pub fn metric_name(what: &str) -> String {
    format!("fencekeeper.{what}")
}

/// Counter ids, one per outcome class plus fail-open passes.
pub struct Metrics {
    by_class: [u32; Class::ALL.len()],
    failed_open: u32,
    batch_txns: u32,
    batch_requests: u32,
    gate_waited: u32,
    gate_timed_out: u32,
    gate_given_up: u32,
    shared_waited: u32,
    start_grace: u32,
    not_conditional: u32,
    too_large: u32,
    version_refused: u32,
    precondition_failed: u32,
}

impl Metrics {
    fn define() -> Result<Metrics, proxy_wasm::types::Status> {
        let mut by_class = [0; Class::ALL.len()];
        for (id, class) in by_class.iter_mut().zip(Class::ALL) {
            *id = hostcalls::define_metric(MetricType::Counter, &metric_name(class.name()))?;
        }
        let failed_open = hostcalls::define_metric(MetricType::Counter, &metric_name("failed_open"))?;
        let batch_txns = hostcalls::define_metric(MetricType::Counter, &metric_name("confirm_batch.txns"))?;
        let batch_requests = hostcalls::define_metric(MetricType::Counter, &metric_name("confirm_batch.requests"))?;
        let counter = |what: &str| hostcalls::define_metric(MetricType::Counter, &metric_name(what));
        Ok(Metrics {
            by_class,
            failed_open,
            batch_txns,
            batch_requests,
            gate_waited: counter("gate.waited")?,
            gate_timed_out: counter("gate.timed_out")?,
            gate_given_up: counter("gate.given_up")?,
            shared_waited: counter("gate.shared_waited")?,
            start_grace: counter("start_grace")?,
            not_conditional: counter("conditional.not_conditional")?,
            too_large: counter("too_large")?,
            version_refused: counter("conditional.version_refused")?,
            precondition_failed: counter("conditional.precondition_failed")?,
        })
    }

    /// Count one of the gate's events (`fencekeeper_engine::gate`).
    pub fn gate(&self, event: fencekeeper_engine::gate::Event) {
        use fencekeeper_engine::gate::Event;
        let id = match event {
            Event::Waited => self.gate_waited,
            Event::TimedOut => self.gate_timed_out,
            Event::GivenUp => self.gate_given_up,
            Event::StartGrace => self.start_grace,
        };
        let _ = hostcalls::increment_metric(id, 1);
    }

    /// An admitted write was held back for another instance's lower-token write.
    pub fn shared_waited(&self) {
        let _ = hostcalls::increment_metric(self.shared_waited, 1);
    }

    /// Count a conditional write's outcome (`fencekeeper_engine::conditional`): the
    /// class its client is told, and the conditional event it moves.
    pub fn conditional(&self, class: Option<Class>, event: Option<fencekeeper_engine::conditional::Event>) {
        use fencekeeper_engine::conditional::Event;
        if let Some(class) = class {
            let mut tally = Tally::default();
            tally.add(class, false);
            self.add(&tally);
        }
        let id = match event {
            None => return,
            Some(Event::NotConditional) => self.not_conditional,
            Some(Event::TooLarge) => self.too_large,
            Some(Event::VersionRefused) => self.version_refused,
            Some(Event::PreconditionFailed) => self.precondition_failed,
        };
        let _ = hostcalls::increment_metric(id, 1);
    }

    /// One batch's Txn sent.
    pub fn batch_sent(&self) {
        let _ = hostcalls::increment_metric(self.batch_txns, 1);
    }

    /// Add a tally: one host call per counter that moved (a batch's requests are
    /// counted together, not one call each).
    pub fn add(&self, tally: &Tally) {
        for (id, &n) in self.by_class.iter().zip(&tally.by_class) {
            if n > 0 {
                let _ = hostcalls::increment_metric(*id, n);
            }
        }
        for (id, n) in [(self.failed_open, tally.failed_open), (self.batch_requests, tally.batched)] {
            if n > 0 {
                let _ = hostcalls::increment_metric(id, n);
            }
        }
    }
}

/// Outcomes counted, not yet added to the stats.
#[derive(Default)]
pub struct Tally {
    by_class: [i64; Class::ALL.len()],
    failed_open: i64,
    /// Requests answered by a batch's Txn.
    pub batched: i64,
}

impl Tally {
    /// One outcome; `failed_open` when it was forwarded without an admit.
    pub fn add(&mut self, class: Class, failed_open: bool) {
        self.by_class[class.index()] += 1;
        self.failed_open += i64::from(failed_open);
    }
}

/// What every request of one configured filter shares.
pub struct Filter {
    /// The configuration.
    pub config: Config,
    /// The stats.
    pub metrics: Metrics,
    /// The shared-data marks.
    pub slots: slots::Slots,
    /// Where the marks live, as the audit record names it.
    pub store: String,
    /// The highest etcd revision this worker has seen in an answer: the weak
    /// provenance check of a token at or below it needs no read.
    pub revision: Cell<u64>,
    /// etcd's authentication, when the configuration names a user.
    pub auth: Option<auth::Auth>,
    /// The batches of confirms.
    pub confirms: confirms::Confirms,
    /// The shared queue that wakes the root to send them; `None`: no batching.
    pub wake: Option<u32>,
    /// This VM's queue, if the host registered one; `None`: the root's tick does what
    /// a wake would (`wake`).
    pub queue: Option<u32>,
    /// Whether the root can act on a request it holds (`hold`).
    pub hold: hold::Hold,
    /// The root context, which sends the batches' Txns.
    pub root: u32,
    /// The ordering gate; `None`: off.
    pub gate: Option<gate::Gate>,
    /// When the start grace ends (the proxy's clock, ms); 0: none.
    pub grace_until: u64,
}

/// When the start grace of `grace_ms` ends, on the proxy's clock (0 when off). The
/// grace counts from when the process's shared data got its start stamp: the first
/// worker to start writes it, and a VM reloaded after a fault finds it (its grace is
/// long over; the shared data kept the marks and the flights).
fn grace_start(grace_ms: u64) -> Result<u64, proxy_wasm::types::Status> {
    const STARTED: &str = "fencekeeper/started";
    if grace_ms == 0 {
        return Ok(0);
    }
    let started = match hostcalls::get_shared_data(STARTED)? {
        (Some(bytes), _) if bytes.len() == 8 => u64::from_le_bytes(bytes.as_slice().try_into().unwrap_or_default()),
        _ => {
            // Workers starting together may each write a stamp; they differ by the
            // milliseconds between their starts.
            let now = gate::now_ms();
            hostcalls::set_shared_data(STARTED, Some(&now.to_le_bytes()), None)?;
            now
        }
    };
    Ok(started.saturating_add(grace_ms))
}

impl Filter {
    /// Remember that etcd has reached `revision`.
    pub fn saw(&self, revision: u64) {
        self.revision.set(self.revision.get().max(revision));
    }
}

struct Root {
    /// The root context's id: batches' Txns are sent on it.
    id: u32,
    filter: Option<Rc<Filter>>,
}

impl Context for Root {
    /// The answer to a root's etcd call over gRPC.
    fn on_grpc_call_response(&mut self, token: u32, status_code: u32, size: usize) {
        self.on_etcd_answer(token, etcd::response(status_code, size));
    }

    /// The answer to a root's etcd call over etcd's JSON API (the root makes no other
    /// HTTP call).
    fn on_http_call_response(&mut self, token: u32, _headers: usize, body_size: usize, _trailers: usize) {
        self.on_etcd_answer(token, etcd::http_response(token, body_size));
    }
}

impl Root {
    /// The answer to a batch's Txn (the root sends them all), the root's
    /// authentication, or a call of the shared registry.
    fn on_etcd_answer(&mut self, token: u32, response: etcd::Response) {
        let Some(f) = &self.filter else { return };
        // With a user: the root's own authentication, or a root call refused for its
        // token (expired unused, or etcd restarted), which authenticates again.
        if let (Some(auth), Some(e)) = (&f.auth, &f.config.etcd) {
            if auth.root_answered(token, &response) {
                return;
            }
            if response.as_ref().err().is_some_and(fencekeeper_etcd_wire::grpc::token_refused) {
                auth.root_refused(e);
            }
        }
        if confirms::on_answer(f, token, &response) {
            return;
        }
        // The shared registry's calls (every one is the root's: a request's Txn, the
        // lease); the answers to its deletes need nothing.
        if let Some(shared) = f.gate.as_ref().and_then(|g| g.shared.as_ref()) {
            shared.on_root_answer(f, token, &response);
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let bytes = self.get_plugin_configuration().unwrap_or_default();
        let config = match Config::parse(&bytes) {
            Ok(c) => c,
            Err(e) => {
                log::error!("fencekeeper: bad plugin configuration: {e}");
                return false;
            }
        };
        // The bound spread over the slots, at least one mark each.
        let per_slot = config.shared_marks_max.map(|max| (max as usize).div_ceil(config.shared_slots as usize));
        let slots = slots::Slots { count: config.shared_slots, per_slot };
        if let Err(s) = slots.create_absent() {
            log::error!("fencekeeper: cannot create the shared-data slots ({s:?})");
            return false;
        }
        if config.protocol == fencekeeper_core::Protocol::S3 {
            if let Err(s) = uploads::create_absent() {
                log::error!("fencekeeper: cannot create the shared-data upload slots ({s:?})");
                return false;
            }
        }
        let metrics = match Metrics::define() {
            Ok(m) => m,
            Err(s) => {
                log::error!("fencekeeper: cannot define stats ({s:?})");
                return false;
            }
        };
        let auth = match config.etcd.as_ref().and_then(|e| e.auth.as_ref()) {
            None => None,
            Some(a) => match auth::Auth::new(&a.user, &a.password_env) {
                Ok(auth) => Some(auth),
                Err(e) => {
                    log::error!("fencekeeper: cannot start: {e}");
                    return false;
                }
            },
        };
        let store = match &config.etcd {
            Some(e) => format!("etcd cluster {} prefix {}", e.cluster, e.key_prefix),
            None => "envoy shared data".to_owned(),
        };
        // Batching needs etcd without authentication (a batch's Txn is the VM's and
        // carries no request's token).
        // A conditional write is lent after its admission, by its own request: never
        // answered by a batch.
        let batching =
            config.etcd.as_ref().is_some_and(|e| e.batch_confirms && e.auth.is_none()) && config.conditional.is_none();
        let vm = wake::vm_id();
        // Configure never fails for want of a queue: without one the tick does a wake's
        // work (docs/proxy-wasm-hosts.md).
        let queue = match config.host {
            Host::Portable => {
                let etcd = match &config.etcd {
                    None => "",
                    Some(_) if !config.reaches_etcd() => {
                        " (marks in etcd over gRPC: every fenced write is refused, 503)"
                    }
                    Some(_) if config.gate.is_some_and(|g| g.shared) => {
                        " (etcd over its JSON API; gate.shared cannot run here: every fenced write is refused, 503, \
                         until \"gate\": {\"shared\": false})"
                    }
                    Some(_) => " (etcd over its JSON API, confirms not batched)",
                };
                log::info!(
                    "fencekeeper: host \"portable\": no shared queue (held writes and confirms are not woken, the \
                     tick re-checks), no gRPC call{etcd}"
                );
                None
            }
            Host::Envoy => match wake::register(vm) {
                Ok(queue) => Some(queue),
                Err(e) => {
                    log::warn!(
                        "fencekeeper: {e}; the tick (gate.tick_ms) does the wakes' work, confirms are not batched"
                    );
                    None
                }
            },
        };
        let wake = queue.filter(|_| batching);
        let shared = config
            .gate
            // Its registry is the root's, which resumes the writes it passed: a portable
            // host cannot, and every fenced write is refused before it gets there.
            .filter(|g| g.shared && config.host == Host::Envoy)
            .zip(config.etcd.as_ref())
            .map(|(g, e)| shared::Shared::new(e.flight_prefix.clone(), g.flight_ms, g.apply_bound_ms, vm, queue));
        let gate = config.gate.map(|g| gate::Gate::new(g, vm, queue, shared));
        if let Some(g) = &gate {
            // Stamped before this worker serves: its flights are never taken for a
            // gone worker's.
            if let Err(s) = g.heartbeat() {
                log::error!("fencekeeper: cannot stamp the gate's heartbeat ({s:?})");
                return false;
            }
            self.set_tick_period(Duration::from_millis(g.config.tick_ms));
        }
        let grace_until = match grace_start(config.start_grace_ms) {
            Ok(until) => until,
            Err(s) => {
                log::error!("fencekeeper: cannot read the start time from shared data ({s:?})");
                return false;
            }
        };
        let confirms = confirms::Confirms::default();
        let hold = match config.host {
            Host::Envoy => hold::Hold::ask(),
            Host::Portable => hold::Hold::never(),
        };
        self.filter = Some(Rc::new(Filter {
            config,
            metrics,
            slots,
            store,
            revision: Cell::new(0),
            auth,
            confirms,
            wake,
            queue,
            hold,
            root: self.id,
            gate,
            grace_until,
        }));
        true
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        wake::drain(queue_id);
        if let Some(f) = &self.filter {
            if let Some(g) = &f.gate {
                g.recheck(f);
                if let Some(shared) = &g.shared {
                    shared.send(f);
                }
            }
            confirms::send_ready(f);
        }
    }

    fn on_tick(&mut self) {
        if let Some(f) = &self.filter {
            if let Some(g) = &f.gate {
                g.tick(f);
                // Without a queue nothing woke the root for the writes handed to it.
                if let (Some(shared), None) = (&g.shared, f.queue) {
                    shared.send(f);
                }
            }
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        let filter = self.filter.clone()?;
        Some(Box::new(request::Request::new(filter, context_id)))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
