//! The simulated world: lock holders taking leases from a lock service and writing
//! through fence instances to a store, and the faults between them, all on the
//! virtual clock of one [`Queue`] and drawing from one [`Rng`]. Every event is a trace
//! line. What the clients sent and got, what the store applied, the faults and the
//! marks read back are written down as the shared checker's records, for its rules.
//!
//! * **Lock service**: per resource, one holder at a time, each grant a higher token.
//!   A lease is kept alive while its holder runs and expires when the holder is paused
//!   for longer than the lease; the next waiter then gets the lock.
//! * **Holders**: take the lock, send a few writes one after another, release it. One
//!   paused past its lease wakes up and writes on with its old token (late writes),
//!   then takes the lock again.
//! * **Store**: applies each forwarded write after a delay of its own and answers the
//!   instance that sent it, even one that gave up on it or died meanwhile.
//! * **Faults**: the store slow (past the instances' upstream timeout, within the
//!   apply bound), the store past the apply bound, an instance crashed and restarted
//!   with its start grace (its memory lost, the marks kept). After each heals, a fresh
//!   holder probes each target it disturbed, as the torture run's nemesis does.

use crate::admits::Admits;
use crate::conditional::ConditionalFence;
use crate::config::Config;
use crate::etcd::{Answer as EtcdAnswer, Call, Client, SharedServer};
use crate::fence::{registry, Answer, Bug, Fence, GuardFence, Out, Request};
use crate::filter::{self, FilterFence};
use crate::queue::{Nanos, Queue, MS};
use crate::rng::Rng;
use crate::trace::Trace;
use fencekeeper::Guard;
use fencekeeper::Validator;
use fencekeeper_chain::{Chain, Change, Done};
use fencekeeper_check::record::{Fault, Group, Kind, Landed, RunInfo, Snapshot, Write};
use fencekeeper_check::Input;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::rc::Rc;
use std::sync::Arc;

/// How a client's write ended, as the client saw it.
#[derive(Clone, Debug)]
enum Reply {
    Http(Answer),
    /// The instance was down: never sent.
    Refused,
    /// The instance died with the write in it.
    Reset,
    /// No answer within the client's budget.
    Timeout,
}

#[derive(Debug)]
enum Ev {
    /// A holder asks the lock service for its resource's lock.
    Acquire(usize),
    /// A holder's next step (a write, a pause, or the end of its turn).
    Step(usize),
    /// A paused holder runs again.
    Wake(usize),
    /// A lease of (resource, token) runs out (its holder is paused).
    Expire(usize, u64),
    /// A write reaches its instance.
    Arrive(u64),
    /// A write's answer reaches its client.
    Reply(u64, Reply),
    /// A write's client stops waiting.
    ClientTimeout(u64),
    /// The store receives write (id, token) from instance (index, incarnation).
    Receive(u64, u64, usize, u64),
    /// The store applies it (id, token, instance, incarnation, received at).
    Apply(u64, u64, usize, u64, Nanos),
    /// The store's answer reaches the instance (id, instance, incarnation, status,
    /// ETag).
    StoreAnswer(u64, usize, u64, u16, Option<String>),
    /// The chain store makes write id's change (instance, incarnation, id, resource,
    /// change), as etcd commits a Txn: whether or not its sender is still there.
    ChainApply(usize, u64, u64, usize, Change),
    /// What the change came to reaches the instance (`None`: the answer was lost).
    ChainReply(usize, u64, u64, Option<Done>),
    /// Etcd makes an admit's call (instance, incarnation, call number, call), whether
    /// or not its sender is still up.
    EtcdApply(usize, u64, u64, Call),
    /// Its answer reaches the instance (`Err`: lost).
    EtcdReply(usize, u64, u64, Result<EtcdAnswer, String>),
    /// The store answers write id's `HEAD` (instance, incarnation, id, resource).
    Head(usize, u64, u64, usize),
    /// The `HEAD`'s answer reaches the instance (status, ETag).
    HeadReply(usize, u64, u64, u16, Option<String>),
    /// An instance's timer (instance, incarnation, tag).
    Timer(usize, u64, u64),
    /// Another instance changed a shared flight: tell this one (instance,
    /// incarnation, resource).
    Notify(usize, u64, usize),
    /// The nemesis's next fault (after the previous one healed).
    Fault,
    /// A store fault heals (fault index).
    Heal(usize),
    /// A crashed instance starts again (instance, fault index).
    Restart(usize, usize),
    /// A probe write after a fault healed (fault index, instance).
    Probe(usize, usize),
}

struct Holder {
    resource: usize,
    token: u64,
    writes_left: u32,
    late_left: u32,
    lost: bool,
}

#[derive(Default)]
struct Lock {
    next: u64,
    holder: Option<(usize, u64)>,
    waiters: VecDeque<usize>,
}

struct Instance {
    fence: Box<dyn Fence>,
    up: bool,
    incarnation: u64,
    open: BTreeSet<u64>,
}

/// What a client sent, beside its record: who, through which instance, still open.
struct Sent {
    holder: Option<usize>,
    resource: usize,
    instance: usize,
    open: bool,
    probe: Option<usize>,
    /// Which body it writes (conditional runs).
    content: u8,
    /// A `fencing-admitted-token` its client sent itself.
    forged: Option<u64>,
}

/// The counts of one run, and the checker's report on it.
pub struct Outcome {
    /// The seed.
    pub seed: u64,
    /// Writes the lock holders sent.
    pub requests: u64,
    /// Probe writes sent after faults healed.
    pub probes: u64,
    /// Writes the store applied.
    pub landed: u64,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Holders paused before a write, and those paused past their lease.
    pub pauses: (u64, u64),
    /// The numbers of the faults injected (those skipped are not among them).
    pub fault_numbers: Vec<u64>,
    /// The ordinals of the pauses taken, each with whether it outlasted the lease.
    pub pause_ordinals: Vec<(u64, bool)>,
    /// Faults and pauses drawn, skipped ones included: masks above these did nothing.
    pub slots: (u64, u64),
    /// Virtual time the run took, in ns.
    pub virtual_time: Nanos,
    /// Trace lines.
    pub lines: u64,
    /// The trace's digest (FNV-1a 64, hex).
    pub digest: String,
    /// The trace lines naming a word of [`Config::focus`].
    pub focused: Vec<String>,
    /// The checker's report.
    pub report: fencekeeper_check::rules::Report,
    /// How long the checker took (wall clock; not part of the run).
    pub checked_in: std::time::Duration,
}

impl Outcome {
    /// Breaches of a rule.
    pub fn violations(&self) -> usize {
        self.report.violations.len()
    }
}

/// Why a run could not start.
#[derive(Debug)]
pub enum SimError {
    /// The bundled validator did not load.
    Validator(String),
    /// The Envoy filter's `.wasm` did not load or start.
    Filter(String),
    /// A file store's directory could not be made, or a store did not open.
    Store(String),
}

impl std::fmt::Display for SimError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SimError::Validator(e) => write!(f, "the bundled validator did not load: {e}"),
            SimError::Filter(e) | SimError::Store(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for SimError {}

/// The bundled validator, loaded once per process (loading compiles the component).
fn validator() -> Result<Arc<Validator>, SimError> {
    static VALIDATOR: std::sync::OnceLock<Result<Arc<Validator>, String>> = std::sync::OnceLock::new();
    VALIDATOR
        .get_or_init(|| Validator::bundled(fencekeeper::Policy::default()).map(Arc::new).map_err(|e| e.to_string()))
        .clone()
        .map_err(SimError::Validator)
}

/// How long after the last write is sent the run goes on at most (virtual time):
/// far past every bound, lease and lend a write's answer may wait on.
const DRAIN: Nanos = 600_000 * MS;

/// Run one simulation. `stop`, when given, is asked after each holder's write
/// whether to stop sending: the run then behaves as if `requests` had been the
/// number sent so far, so that `(seed, requests)` replays it.
pub fn run(config: &Config, stop: Option<&dyn Fn() -> bool>) -> Result<Outcome, SimError> {
    let validator = validator()?;
    let mut world = World::new(config.clone(), validator)?;
    world.start();
    while let Some(ev) = world.q.take() {
        world.handle(ev, stop);
        // A write the fence never answers (a host that forgot to resume it) would
        // keep a host's ticks coming forever: the run ends long after the last
        // write was sent, and the write's missing answer is a finding (rule 5).
        if world.stopped_at.is_some_and(|at| world.q.now() > at + DRAIN) {
            world.trace.line(format_args!("{} drained: writes still open are unanswered", world.q.now()));
            break;
        }
    }
    Ok(world.finish())
}

struct World {
    cfg: Config,
    q: Queue<Ev>,
    rng: Rng,
    trace: Trace,
    names: Rc<[String]>,
    /// Per resource: its group's index.
    group_of: Vec<usize>,
    groups: Vec<Group>,
    /// Per probe target: its probe resource.
    probe_resource: Vec<usize>,
    locks: Vec<Lock>,
    holders: Vec<Holder>,
    instances: Vec<Instance>,
    writes: Vec<Write>,
    sent: Vec<Sent>,
    landed: Vec<Landed>,
    faults: Vec<Fault>,
    snapshots: Vec<Snapshot>,
    requests: u64,
    probes: u64,
    stopped: bool,
    /// When the holders stopped writing.
    stopped_at: Option<Nanos>,
    limit: u64,
    slow: u32,
    past_bound: u32,
    pauses: (u64, u64),
    /// Conditional runs: the chain store's chains (one shared, as in etcd, or one per
    /// instance), the store's version of each resource (`None`: absent), the
    /// precondition each forwarded write carries, and the chain store's faults.
    chains: Vec<BTreeMap<usize, Chain>>,
    versions: Vec<Option<String>>,
    preconditions: BTreeMap<u64, (&'static str, String)>,
    stalled: u32,
    losing: u32,
    /// The marks in etcd (shared marks with `etcd_marks`).
    server: SharedServer,
    /// The directory of the instances' file stores (`file_marks`), removed at the end.
    _files: Files,
    /// Each instance's clock offset from the world's (ns).
    offsets: Vec<i64>,
    /// Faults drawn and pauses drawn so far, skipped ones included: the numbers
    /// [`Config::skip_faults`] and [`Config::skip_pauses`] name.
    fault_slots: u64,
    pause_slots: u64,
    pause_ordinals: Vec<(u64, bool)>,
}

/// The directory the instances' file stores are in, for one run: made empty, and
/// removed when the run ends. Its path is in no trace line.
struct Files {
    path: std::path::PathBuf,
}

impl Files {
    fn new(cfg: &Config) -> Result<Files, String> {
        static RUNS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("fencekeeper-sim-{}-{run}", std::process::id()));
        if cfg.file_marks {
            let _ = std::fs::remove_dir_all(&path);
            std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
        Ok(Files { path })
    }
}

impl Drop for Files {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// The resources and their groups.
#[derive(Default)]
struct Shape {
    names: Vec<String>,
    group_of: Vec<usize>,
    groups: Vec<Group>,
}

impl Shape {
    fn add(&mut self, name: String, targets: Vec<String>, claims: bool, count: usize) {
        let resources: Vec<String> = (0..count).map(|r| format!("/t/{name}/{r}")).collect();
        for r in &resources {
            self.names.push(r.clone());
            self.group_of.push(self.groups.len());
        }
        self.groups.push(Group { name, targets, claims_order: claims, resources });
    }
}

/// The words to keep trace lines for: those given, and for a resource's name also
/// its index as the trace writes it (`r3`).
fn focus(words: &[String], names: &[String]) -> Vec<String> {
    let mut out = words.to_vec();
    out.extend(names.iter().enumerate().filter(|(_, n)| words.contains(n)).map(|(r, _)| format!("r{r}")));
    out
}

/// The masks for the config line: nothing when there are none, so that a run
/// without them has the trace it always had.
fn masks(c: &Config) -> String {
    let list = |set: &BTreeSet<u64>| set.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    let mut out = String::new();
    if !c.skip_faults.is_empty() {
        out += &format!(" skip-faults {}", list(&c.skip_faults));
    }
    if !c.skip_pauses.is_empty() {
        out += &format!(" skip-pauses {}", list(&c.skip_pauses));
    }
    out
}

/// Instance `i`'s name as a target: `f1`, `f2`, ...
fn target(filter: bool, i: usize) -> String {
    // The checker knows an Envoy by its name: its refusals report the filter's local
    // copy of the mark, which may be behind etcd's (a documented limit, judged apart).
    if filter {
        format!("envoy{}", i + 1)
    } else {
        format!("f{}", i + 1)
    }
}

/// The instance a target names ([`target`]'s inverse).
fn instance_of(target: &str) -> usize {
    let number = target.strip_prefix("envoy").or_else(|| target.strip_prefix('f'));
    number.and_then(|n| n.parse::<usize>().ok()).map_or(0, |n| n - 1)
}

impl World {
    fn new(cfg: Config, validator: Arc<Validator>) -> Result<World, SimError> {
        let n = cfg.instances.max(1);
        let mut shape = Shape::default();
        for i in 0..n {
            shape.add(
                format!("pin-{}", target(cfg.filter, i)),
                vec![target(cfg.filter, i)],
                true,
                cfg.resources_per_group,
            );
        }
        if cfg.shared_marks && n > 1 {
            // Through several gates that do not see each other's writes, the order is
            // not claimed; with the shared gate it is, and with conditional writes on
            // chains every instance shares.
            let claimed = cfg.shared_gate || cfg.conditional;
            shape.add(
                "spread".into(),
                (0..n).map(|i| target(cfg.filter, i)).collect(),
                claimed,
                cfg.resources_per_group,
            );
        }
        let holders_end = shape.names.len();
        let mut probe_resource = Vec::new();
        for i in 0..n {
            probe_resource.push(shape.names.len());
            shape.add(format!("probe-{}", target(cfg.filter, i)), vec![target(cfg.filter, i)], true, 1);
        }
        let Shape { names, group_of, groups } = shape;
        let names: Rc<[String]> = names.into();
        let shared_store = GuardFence::memory_guard(validator.clone());
        let shared_registry = registry();
        let server = SharedServer::default();
        let files = Files::new(&cfg).map_err(SimError::Store)?;
        let instances = (0..n)
            .map(|i| {
                // Shared marks are in etcd, each instance its own client; or in one
                // memory store that answers at once (`etcd_marks` off); own marks are
                // each instance's memory store (as a file store is).
                let admits = if cfg.shared_marks && cfg.etcd_marks {
                    let client = Arc::new(Client::new(server.clone()));
                    Admits::new(Arc::new(Guard::new(validator.clone(), client.clone())), Some(client))
                } else if cfg.shared_marks {
                    Admits::new(shared_store.clone(), None)
                } else if cfg.file_marks {
                    Admits::file(validator.clone(), files.path.join(format!("{}.redb", target(cfg.filter, i))), cfg.bug)
                        .map_err(SimError::Store)?
                } else {
                    Admits::new(GuardFence::memory_guard(validator.clone()), None)
                };
                // The local-gate bug: the spread group stays claimed, the table is not shared.
                let shared_gate = cfg.shared_gate && cfg.bug != Some(Bug::LocalGate);
                let gate = if shared_gate { shared_registry.clone() } else { registry() };
                let fence: Box<dyn Fence> = if cfg.filter {
                    let etcd = (cfg.shared_marks && cfg.etcd_marks).then(|| server.clone());
                    let fence =
                        FilterFence::new(i, names.clone(), cfg.settings, cfg.bug, etcd, shared_gate, cfg.conditional)
                            .map_err(SimError::Filter)?;
                    Box::new(fence)
                } else if cfg.conditional {
                    Box::new(ConditionalFence::new(admits, names.clone(), cfg.settings, cfg.bug))
                } else {
                    Box::new(GuardFence::new(i, admits, names.clone(), gate, shared_gate, cfg.settings, cfg.bug))
                };
                Ok(Instance { fence, up: true, incarnation: 0, open: BTreeSet::new() })
            })
            .collect::<Result<_, SimError>>()?;
        let holders = (0..holders_end)
            .flat_map(|r| (0..cfg.holders_per_resource).map(move |_| r))
            .map(|resource| Holder { resource, token: 0, writes_left: 0, late_left: 0, lost: false })
            .collect();
        let (cfg_shared, names_len) = (cfg.shared_marks, names.len());
        Ok(World {
            rng: Rng::new(cfg.seed),
            trace: Trace::new(focus(&cfg.focus, &names), cfg.focus_until),
            locks: (0..names.len()).map(|_| Lock::default()).collect(),
            limit: cfg.requests,
            cfg,
            q: Queue::default(),
            names,
            group_of,
            groups,
            probe_resource,
            holders,
            instances,
            writes: Vec::new(),
            sent: Vec::new(),
            landed: Vec::new(),
            faults: Vec::new(),
            snapshots: Vec::new(),
            requests: 0,
            probes: 0,
            stopped: false,
            stopped_at: None,
            slow: 0,
            past_bound: 0,
            pauses: (0, 0),
            chains: (0..if cfg_shared { 1 } else { n }).map(|_| BTreeMap::new()).collect(),
            versions: vec![None; names_len],
            preconditions: BTreeMap::new(),
            stalled: 0,
            losing: 0,
            server,
            _files: files,
            offsets: vec![0; n],
            fault_slots: 0,
            pause_slots: 0,
            pause_ordinals: Vec::new(),
        })
    }

    /// A network hop: 50 to 500 µs.
    fn hop(&mut self) -> Nanos {
        self.rng.between(50_000, 500_000)
    }

    fn start(&mut self) {
        // What makes the run, and only that: not the request limit (a run stopped by
        // the clock and its replay given the count it reached are the same run, and
        // their traces one trace), nor what a replay focuses on.
        let (c, s) = (&self.cfg, self.cfg.settings);
        self.trace.line(format_args!(
            "seed {} instances {} resources {} holders {} shared-marks {} shared-gate {} upstream-timeout {} \
             gate-budget {} apply-bound {} start-grace {} lease {} client-budget {} liveness-bound {} fault-gap {} \
             pauses-per-million {} bug {:?}{}",
            c.seed,
            c.instances,
            c.resources_per_group,
            c.holders_per_resource,
            c.shared_marks,
            c.shared_gate,
            s.upstream_timeout,
            s.gate_budget,
            s.apply_bound,
            s.start_grace,
            c.lease,
            c.client_budget,
            c.liveness_bound,
            c.fault_gap,
            c.pause_per_million,
            c.bug,
            masks(c)
        ));
        if self.cfg.conditional {
            // A line of its own, so that the other runs' traces stay as they were.
            self.trace
                .line(format_args!("conditional-writes lend-term {}", c.settings.upstream_timeout + s.apply_bound));
        }
        if self.cfg.clock_skew > 0 {
            // Each instance's clock is off the world's by up to the skew, either way.
            let skew = self.cfg.clock_skew;
            for i in 0..self.offsets.len() {
                self.offsets[i] = self.rng.between(0, 2 * skew) as i64 - skew as i64;
            }
            self.trace.line(format_args!("clock-offsets {:?}", self.offsets));
        }
        if self.cfg.shared_marks && !self.cfg.etcd_marks {
            self.trace.line(format_args!("marks-in-memory"));
        }
        if !self.cfg.past_bound_faults {
            self.trace.line(format_args!("no-past-bound-faults"));
        }
        if self.cfg.filter {
            self.trace.line(format_args!("envoy-filter"));
        }
        if self.cfg.filter && self.cfg.shared_marks {
            self.trace.line(format_args!("envoy-filter marks-in-etcd"));
        }
        if self.cfg.file_marks && !self.cfg.shared_marks {
            self.trace.line(format_args!("file-marks"));
        }
        if let Some(kinds) = &self.cfg.fault_kinds {
            self.trace.line(format_args!("fault-kinds {kinds:?}"));
        }
        for h in 0..self.holders.len() {
            let d = self.rng.between(0, 20 * MS);
            self.q.after(d, Ev::Acquire(h));
        }
        let gap = self.fault_gap();
        self.q.after(gap, Ev::Fault);
    }

    fn fault_gap(&mut self) -> Nanos {
        self.rng.between(self.cfg.fault_gap / 2, self.cfg.fault_gap * 3 / 2)
    }

    fn handle(&mut self, ev: Ev, stop: Option<&dyn Fn() -> bool>) {
        let now = self.q.now();
        match ev {
            Ev::Acquire(h) => self.acquire(now, h),
            Ev::Step(h) => self.step(now, h, stop),
            Ev::Wake(h) => {
                let holder = &mut self.holders[h];
                let lost = self.locks[holder.resource].holder.map(|(_, t)| t) != Some(holder.token);
                holder.lost = lost;
                if lost {
                    // It does not know yet: it writes on with its old token.
                    holder.late_left = 1 + (self.rng.next_u64() % 2) as u32;
                }
                self.trace.line(format_args!("{now} wake h{h} lost {lost}"));
                self.q.after(0, Ev::Step(h));
            }
            Ev::Expire(r, token) => {
                if self.locks[r].holder.map(|(_, t)| t) == Some(token) {
                    self.trace.line(format_args!("{now} expire r{r} t{token}"));
                    self.locks[r].holder = None;
                    self.grant(now, r);
                }
            }
            Ev::Arrive(id) => self.arrive(now, id),
            Ev::Reply(id, reply) => self.reply(now, id, reply),
            Ev::ClientTimeout(id) => {
                if self.sent[id as usize].open {
                    self.reply(now, id, Reply::Timeout);
                }
            }
            Ev::Receive(id, token, inst, inc) => {
                let took = if self.past_bound > 0 {
                    let b = self.cfg.settings.apply_bound;
                    self.rng.between(b + MS, 2 * b)
                } else if self.slow > 0 {
                    let s = self.cfg.settings;
                    self.rng.between(s.upstream_timeout + MS, s.apply_bound - MS)
                } else {
                    self.rng.between(200_000, 5 * MS)
                };
                self.trace.line(format_args!("{now} receive w{id} t{token} took {took}"));
                self.q.after(took, Ev::Apply(id, token, inst, inc, now));
            }
            Ev::Apply(id, token, inst, inc, received) => {
                let (status, etag) = self.store_check(id);
                if status != 200 {
                    self.trace.line(format_args!("{now} refuse w{id} t{token} {status}"));
                    let d = self.hop();
                    self.q.after(d, Ev::StoreAnswer(id, inst, inc, status, etag));
                    return;
                }
                let w = &self.writes[id as usize];
                self.landed.push(Landed {
                    seq: self.landed.len() as u64 + 1,
                    at: now,
                    received,
                    resource: w.resource.clone(),
                    // What the store takes for the admitted token: the header it got.
                    token: if token == 0 { String::new() } else { token.to_string() },
                    target: target(self.cfg.filter, inst),
                    id: w.id.clone(),
                });
                self.trace.line(format_args!("{now} apply w{id} t{token} {}", w.resource));
                let d = self.hop();
                self.q.after(d, Ev::StoreAnswer(id, inst, inc, status, etag));
            }
            Ev::StoreAnswer(id, inst, inc, status, etag) => {
                self.deliver(now, inst, inc, |fence, local, out| {
                    fence.store_answered(local, id, status, etag.as_deref(), out)
                });
            }
            Ev::ChainApply(inst, inc, id, r, change) => self.chain_apply(now, inst, inc, id, r, change),
            Ev::EtcdApply(inst, inc, call, op) => self.etcd_apply(now, inst, inc, call, op),
            Ev::EtcdReply(inst, inc, call, answer) => {
                self.deliver(now, inst, inc, |fence, local, out| fence.etcd_answered(local, call, answer, out));
            }
            Ev::ChainReply(inst, inc, id, done) => {
                self.deliver(now, inst, inc, |fence, local, out| fence.chain_done(local, id, done, out));
            }
            Ev::Head(inst, inc, id, r) => {
                let etag = self.versions[r].clone();
                let status = if etag.is_some() { 200 } else { 404 };
                self.trace.line(format_args!("{now} head w{id} r{r} {status} {etag:?}"));
                let d = self.hop();
                self.q.after(d, Ev::HeadReply(inst, inc, id, status, etag));
            }
            Ev::HeadReply(inst, inc, id, status, etag) => {
                self.deliver(now, inst, inc, |fence, local, out| {
                    fence.head_answered(local, id, status, etag.as_deref(), out)
                });
            }
            Ev::Timer(inst, inc, tag) => {
                self.deliver(now, inst, inc, |fence, local, out| fence.timer(local, tag, out));
            }
            Ev::Notify(inst, inc, r) => {
                self.deliver(now, inst, inc, |fence, local, out| fence.wake(local, r, out));
            }
            Ev::Fault => self.fault(now),
            Ev::Heal(f) => {
                match self.faults[f].kind.as_str() {
                    "store-slow" => self.slow -= 1,
                    "etcd-stall" => self.stalled -= 1,
                    "etcd-lost-replies" => self.losing -= 1,
                    _ => self.past_bound -= 1,
                }
                self.healed(now, f);
            }
            Ev::Restart(inst, f) => {
                self.instances[inst].up = true;
                let local = self.local(inst, now);
                self.instances[inst].fence.restart(local);
                self.trace.line(format_args!("{now} restart {}", target(self.cfg.filter, inst)));
                let source = if self.cfg.shared_marks { "etcd".to_owned() } else { target(self.cfg.filter, inst) };
                self.snapshot(now, Some(self.faults[f].n), source, inst);
                self.healed(now, f);
            }
            Ev::Probe(f, inst) => self.probe(now, f, inst),
        }
    }

    /// Whether the store applies write `id` now, and its answer (status, ETag): every
    /// write, unless the run is conditional, where the store honours preconditions as
    /// S3 does (checked when it applies the write, after any delay) and refuses a
    /// write without one (428), so a fence that forgot one shows as failed writes.
    fn store_check(&mut self, id: u64) -> (u16, Option<String>) {
        if !self.cfg.conditional {
            return (200, None);
        }
        let sent = &self.sent[id as usize];
        let current = &self.versions[sent.resource];
        let holds = match self.preconditions.remove(&id) {
            None => return (428, None),
            Some(("if-none-match", _)) => current.is_none(),
            Some((_, tag)) => current.as_deref() == Some(tag.as_str()),
        };
        if !holds {
            return (412, None);
        }
        // The filter hashes the body it holds; the library's instances take the
        // content's own digest.
        let etag =
            if self.cfg.filter { filter::etag_of(sent.content) } else { crate::conditional::etag_of(sent.content) };
        self.versions[sent.resource] = Some(etag.clone());
        (200, Some(etag))
    }

    /// The chain store makes a change, as etcd commits a Txn: atomically, whether its
    /// sender is still up or not; the answer goes back after a hop, unless a fault
    /// loses it (the sender then learns nothing after its call's timeout).
    fn chain_apply(&mut self, now: Nanos, inst: usize, inc: u64, id: u64, r: usize, change: Change) {
        let store = if self.cfg.shared_marks { 0 } else { inst };
        // `Chain::new`, not the default: a resource never written is known absent
        // (the default chain knows no version).
        #[allow(clippy::unwrap_or_default)]
        let chain = self.chains[store].entry(r).or_insert_with(Chain::new);
        let unchecked = self.cfg.bug == Some(Bug::LendUnchecked) && matches!(change, Change::Lend { .. });
        let lent = if unchecked { std::mem::take(&mut chain.lends) } else { Vec::new() };
        let unranked = self.cfg.bug == Some(Bug::LendStale) && matches!(change, Change::Lend { .. });
        let highest = if unranked { chain.highest.take() } else { None };
        let done = change.apply(chain);
        if let Some(h) = highest.filter(|h| chain.highest.is_none_or(|now| now < *h)) {
            chain.highest = Some(h);
        }
        if unchecked {
            let new = std::mem::replace(&mut chain.lends, lent);
            chain.lends.extend(new);
        }
        let lost = self.losing > 0 && self.rng.chance(500_000);
        self.trace.line(format_args!("{now} chain w{id} r{r} {change:?} {done:?} lost {lost}"));
        if lost {
            self.q.after(100 * MS, Ev::ChainReply(inst, inc, id, None));
        } else {
            let d = self.hop();
            self.q.after(d, Ev::ChainReply(inst, inc, id, Some(done)));
        }
    }

    /// Etcd makes an admit's call, linearizably, as its Txn: the answer goes back after
    /// a hop, unless a fault loses it (the sender's call fails after 100 ms, the
    /// change made or not).
    fn etcd_apply(&mut self, now: Nanos, inst: usize, inc: u64, call: u64, op: Call) {
        let lose_compare = self.cfg.bug == Some(Bug::CasLowers);
        let answer = {
            let mut server = self.server.lock().unwrap_or_else(|p| p.into_inner());
            server.advance(now / MS);
            server.apply(&op, lose_compare)
        };
        let lost = self.losing > 0 && self.rng.chance(500_000);
        self.trace
            .line(format_args!("{now} etcd {} c{call} {op:?} {answer:?} lost {lost}", target(self.cfg.filter, inst)));
        if lost {
            let why = "etcd's answer did not come within the call's timeout".to_owned();
            self.q.after(100 * MS, Ev::EtcdReply(inst, inc, call, Err(why)));
        } else {
            let d = self.hop();
            self.q.after(d, Ev::EtcdReply(inst, inc, call, Ok(answer)));
        }
    }

    /// What instance `inst`'s clock reads at `now`: the instances' clocks are skewed
    /// from the world's by a fixed offset each ([`Config::clock_skew`]).
    fn local(&self, inst: usize, now: Nanos) -> Nanos {
        now.saturating_add_signed(self.offsets[inst])
    }

    /// Tell instance `inst` something at `now` (on its clock), if the incarnation it
    /// was meant for is still up, and carry out what it says.
    fn deliver(&mut self, now: Nanos, inst: usize, inc: u64, tell: impl FnOnce(&mut dyn Fence, Nanos, &mut Vec<Out>)) {
        if !self.live(inst, inc) {
            return;
        }
        let mut out = Vec::new();
        let local = self.local(inst, now);
        tell(self.instances[inst].fence.as_mut(), local, &mut out);
        self.outs(now, inst, out);
    }

    fn live(&self, inst: usize, inc: u64) -> bool {
        let i = &self.instances[inst];
        i.up && i.incarnation == inc
    }

    fn acquire(&mut self, now: Nanos, h: usize) {
        if self.stopped {
            return;
        }
        let r = self.holders[h].resource;
        self.locks[r].waiters.push_back(h);
        self.trace.line(format_args!("{now} acquire h{h} r{r}"));
        if self.locks[r].holder.is_none() {
            self.grant(now, r);
        }
    }

    fn grant(&mut self, now: Nanos, r: usize) {
        let Some(h) = self.locks[r].waiters.pop_front() else { return };
        self.locks[r].next += 1;
        let token = self.locks[r].next;
        self.locks[r].holder = Some((h, token));
        let holder = &mut self.holders[h];
        holder.token = token;
        holder.writes_left = 1 + (self.rng.next_u64() % 8) as u32;
        holder.late_left = 0;
        holder.lost = false;
        self.trace.line(format_args!("{now} grant h{h} r{r} t{token}"));
        let d = self.hop();
        self.q.after(d, Ev::Step(h));
    }

    fn step(&mut self, now: Nanos, h: usize, stop: Option<&dyn Fn() -> bool>) {
        if !self.stopped && self.requests >= self.limit {
            self.stopped = true;
            self.stopped_at = Some(now);
            self.trace.line(format_args!("{now} stop after {}", self.requests));
        }
        if self.stopped {
            return;
        }
        let holder = &self.holders[h];
        let (r, token) = (holder.resource, holder.token);
        if holder.writes_left == 0 && holder.late_left == 0 {
            if self.locks[r].holder == Some((h, token)) {
                self.locks[r].holder = None;
                self.trace.line(format_args!("{now} release h{h} r{r} t{token}"));
                self.grant(now, r);
            }
            let d = self.rng.between(MS, 50 * MS);
            self.q.after(d, Ev::Acquire(h));
            return;
        }
        if holder.late_left == 0 && self.rng.chance(self.cfg.pause_per_million) {
            self.pause_slots += 1;
            let ordinal = self.pause_slots;
            if self.cfg.skip_pauses.contains(&ordinal) {
                // Masked by the shrinker: the holder writes on as if not paused.
                self.trace.line(format_args!("{now} skip pause {ordinal} h{h}"));
            } else {
                let lease = self.cfg.lease;
                let d = self.rng.between(lease / 2, 4 * lease);
                self.pauses.0 += 1;
                if d > lease {
                    self.pauses.1 += 1;
                    self.q.after(lease, Ev::Expire(r, token));
                }
                self.pause_ordinals.push((ordinal, d > lease));
                self.trace.line(format_args!("{now} pause h{h} for {d}"));
                self.q.after(d, Ev::Wake(h));
                return;
            }
        }
        let kind = if holder.late_left > 0 {
            self.holders[h].late_left -= 1;
            Kind::Late
        } else {
            self.holders[h].writes_left -= 1;
            Kind::Valid
        };
        let targets = self.groups[self.group_of[r]].targets.len();
        let pick = self.rng.index(targets);
        let inst = instance_of(&self.groups[self.group_of[r]].targets[pick]);
        self.requests += 1;
        self.send(now, Some(h), r, token, inst, kind, None);
        // Asked right after a write is sent, so that the next step stops exactly as it
        // does in a run given this many requests: the two runs are one run.
        if stop.is_some_and(|s| s()) {
            self.limit = self.requests;
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        now: Nanos,
        holder: Option<usize>,
        r: usize,
        token: u64,
        inst: usize,
        kind: Kind,
        fault: Option<usize>,
    ) {
        let id = self.writes.len() as u64;
        let group = &self.groups[self.group_of[r]];
        self.writes.push(Write {
            id: format!("w{id}"),
            client: holder.map_or_else(|| format!("probe{}", fault.unwrap_or(0)), |h| format!("h{h}")),
            group: group.name.clone(),
            resource: self.names[r].clone(),
            target: target(self.cfg.filter, inst),
            kind,
            token: Some(token.to_string()),
            start: now,
            end: u64::MAX,
            status: 0,
            highest: None,
            seq: None,
            upstream_error: false,
            error: None,
            body: String::new(),
            fault: fault.map(|f| self.faults[f].n),
        });
        let content = if self.cfg.conditional { self.rng.index(3) as u8 } else { 0 };
        // One write in two hundred carries a header its client may not send.
        let forged = (self.cfg.forged_headers && self.rng.chance(5_000)).then_some(token + 1_000);
        self.sent.push(Sent { holder, resource: r, instance: inst, open: true, probe: fault, content, forged });
        let lie = forged.map_or(String::new(), |f| format!(" forged t{f}"));
        self.trace.line(format_args!("{now} send w{id} r{r} t{token} {} {kind:?}{lie}", target(self.cfg.filter, inst)));
        let d = self.hop();
        self.q.after(d, Ev::Arrive(id));
        self.q.after(self.cfg.client_budget, Ev::ClientTimeout(id));
    }

    fn arrive(&mut self, now: Nanos, id: u64) {
        let inst = self.sent[id as usize].instance;
        if !self.instances[inst].up {
            let d = self.hop();
            self.q.after(d, Ev::Reply(id, Reply::Refused));
            return;
        }
        let r = self.sent[id as usize].resource;
        let token = self.writes[id as usize].token.as_deref().and_then(|t| t.parse().ok()).unwrap_or(0);
        let (content, forged) = (self.sent[id as usize].content, self.sent[id as usize].forged);
        self.instances[inst].open.insert(id);
        let mut out = Vec::new();
        let local = self.local(inst, now);
        self.instances[inst].fence.request(local, Request { id, resource: r, token, content, forged }, &mut out);
        self.outs(now, inst, out);
    }

    fn outs(&mut self, now: Nanos, inst: usize, out: Vec<Out>) {
        let inc = self.instances[inst].incarnation;
        for o in out {
            match o {
                Out::Answer { id, answer } => {
                    self.instances[inst].open.remove(&id);
                    self.trace.line(format_args!(
                        "{now} {} answers w{id} {} {:?}",
                        target(self.cfg.filter, inst),
                        answer.status,
                        answer.highest
                    ));
                    let d = self.hop();
                    self.q.after(d, Ev::Reply(id, Reply::Http(answer)));
                }
                Out::Forward { id, token, precondition } => {
                    self.trace.line(format_args!("{now} {} forwards w{id} t{token}", target(self.cfg.filter, inst)));
                    if let Some(p) = precondition {
                        self.preconditions.insert(id, p);
                    }
                    let d = self.hop();
                    self.q.after(d, Ev::Receive(id, token, inst, inc));
                }
                Out::Chain { id, resource, change } => {
                    // A stalled chain store takes its time to commit.
                    let stall = if self.stalled > 0 { self.rng.between(50 * MS, 400 * MS) } else { 0 };
                    let d = self.hop() + stall;
                    self.q.after(d, Ev::ChainApply(inst, inc, id, resource, change));
                }
                Out::Etcd { call, op } => {
                    let stall = if self.stalled > 0 { self.rng.between(50 * MS, 400 * MS) } else { 0 };
                    let d = self.hop() + stall;
                    self.q.after(d, Ev::EtcdApply(inst, inc, call, op));
                }
                Out::Head { id, resource } => {
                    let d = self.hop();
                    self.q.after(d, Ev::Head(inst, inc, id, resource));
                }
                // Asked for on the instance's clock: due when that clock reads `at`.
                Out::Timer { at, tag } => {
                    let due = at.saturating_add_signed(-self.offsets[inst]).max(now);
                    self.q.at(due, Ev::Timer(inst, inc, tag));
                }
                Out::Changed { resource } => {
                    for other in (0..self.instances.len()).filter(|&o| o != inst) {
                        let inc = self.instances[other].incarnation;
                        self.q.after(0, Ev::Notify(other, inc, resource));
                    }
                }
            }
        }
    }

    fn reply(&mut self, now: Nanos, id: u64, reply: Reply) {
        let sent = &mut self.sent[id as usize];
        if !sent.open {
            return;
        }
        sent.open = false;
        let (holder, probe, inst) = (sent.holder, sent.probe, sent.instance);
        let w = &mut self.writes[id as usize];
        w.end = now;
        match &reply {
            Reply::Http(a) => {
                w.status = a.status;
                w.highest = a.highest.map(|h| h.to_string());
                w.body = a.body.clone();
            }
            Reply::Refused => w.error = Some("refused".into()),
            Reply::Reset => w.error = Some("reset".into()),
            Reply::Timeout => w.error = Some("timeout".into()),
        }
        self.trace.line(format_args!("{now} reply w{id} {} {:?} {:?}", w.status, w.error, w.highest));
        if matches!(reply, Reply::Timeout) {
            self.instances[inst].open.remove(&id);
        }
        if let Some(h) = holder {
            // A holder refused for a fault's sake backs off before it tries again.
            let calm = matches!(&reply, Reply::Http(Answer { status: 200 | 409, .. }));
            let d = if calm { self.rng.between(0, 5 * MS) } else { self.rng.between(10 * MS, 100 * MS) };
            self.q.after(d, Ev::Step(h));
        }
        if let Some(f) = probe {
            let stored = matches!(reply, Reply::Http(Answer { status: 200, .. }));
            if !stored && now < self.faults[f].healed + self.cfg.liveness_bound {
                self.q.after(50 * MS, Ev::Probe(f, inst));
            }
        }
    }

    fn fault(&mut self, now: Nanos) {
        if self.stopped {
            return;
        }
        self.fault_slots += 1;
        let n = self.fault_slots;
        if self.cfg.skip_faults.contains(&n) {
            // Masked by the shrinker: the nemesis goes on as if it had healed at once.
            self.trace.line(format_args!("{now} skip fault {n}"));
            let gap = self.fault_gap();
            self.q.after(self.cfg.liveness_bound + gap, Ev::Fault);
            return;
        }
        let all: Vec<String> = (0..self.instances.len()).map(|i| target(self.cfg.filter, i)).collect();
        let s = self.cfg.settings;
        // Writes given up on hold their resources until the apply bound after the
        // upstream timeout: the gate's refusals meanwhile are the fault's doing.
        let lingers = (s.upstream_timeout + s.apply_bound) / MS + 2;
        // Etcd's faults only where marks or chains are in etcd.
        let etcd = self.cfg.conditional || (self.cfg.shared_marks && self.cfg.etcd_marks);
        let pick = self.rng.between(0, if etcd { 13 } else { 9 });
        let mut kind = match pick {
            0..=3 => "instance-crash",
            4..=7 => "store-slow",
            8 | 9 if self.cfg.past_bound_faults => "store-past-bound",
            8 | 9 => "store-slow",
            10 | 11 => "etcd-stall",
            _ => "etcd-lost-replies",
        };
        // Only the kinds asked for: the draw picks among them.
        if let Some(kinds) = self.cfg.fault_kinds.as_ref().filter(|k| !k.is_empty() && !k.contains(&kind)) {
            kind = kinds[pick as usize % kinds.len()];
        }
        // The filter's in-flight registry: a flight whose put was answered too late
        // or never (its Txn made), or whose owner died, is not deleted and holds its
        // resource until its lease ends.
        let flights_linger = if self.cfg.filter && self.cfg.shared_gate {
            filter::dead_flights_hold_ms(s.upstream_timeout / MS, s.apply_bound / MS) + 2
        } else {
            0
        };
        let (kind, targets, lingers_ms, detail) = if kind == "instance-crash" {
            let inst = self.rng.index(self.instances.len());
            let down = self.rng.between(50 * MS, 1_000 * MS);
            let i = &mut self.instances[inst];
            i.up = false;
            i.incarnation += 1;
            let open: Vec<u64> = std::mem::take(&mut i.open).into_iter().collect();
            let local = now.saturating_add_signed(self.offsets[inst]);
            let i = &mut self.instances[inst];
            i.fence.crash(local);
            for id in open {
                let d = self.hop();
                self.q.after(d, Ev::Reply(id, Reply::Reset));
            }
            if self.cfg.shared_gate {
                // Its flights now end at a deadline: the others' held writes may go then.
                for other in (0..self.instances.len()).filter(|&o| o != inst) {
                    let inc = self.instances[other].incarnation;
                    for r in 0..self.names.len() {
                        self.q.after(0, Ev::Notify(other, inc, r));
                    }
                }
            }
            self.q.after(down, Ev::Restart(inst, self.faults.len()));
            // With a shared gate its flights hold the others' writes; the restarted
            // instance refuses during its grace. With conditional writes on shared
            // chains, the lends of its writes in flight stay until their term, and
            // what the store did with them is news to the others: a 412, a version
            // the chain must ask for, a body that would repeat a lent version.
            let shared = self.cfg.shared_gate || (self.cfg.conditional && self.cfg.shared_marks);
            let targets = if shared { all } else { vec![target(self.cfg.filter, inst)] };
            // A dead Envoy's flights in etcd hold their resources until its lease ends:
            // the others' writes there wait, and are refused past the budget.
            let lingers = lingers.max(s.start_grace / MS + 2).max(flights_linger);
            ("instance-crash", targets, lingers, format!("{} down for {} ms", target(self.cfg.filter, inst), down / MS))
        } else if kind == "store-slow" {
            self.slow += 1;
            let span = self.rng.between(100 * MS, 1_000 * MS);
            self.q.after(span, Ev::Heal(self.faults.len()));
            ("store-slow", all, lingers, format!("for {} ms", span / MS))
        } else if kind == "store-past-bound" {
            self.past_bound += 1;
            let span = self.rng.between(100 * MS, 500 * MS);
            self.q.after(span, Ev::Heal(self.faults.len()));
            // Its writes take up to twice the bound: so long they may hold the gate.
            let lingers = lingers + s.apply_bound / MS;
            ("store-past-bound", all, lingers, format!("for {} ms", span / MS))
        } else if kind == "etcd-stall" {
            self.stalled += 1;
            let span = self.rng.between(100 * MS, 1_000 * MS);
            self.q.after(span, Ev::Heal(self.faults.len()));
            // A write whose lend waited may be given up on: its lend holds to its term.
            ("etcd-stall", all, (lingers + 400).max(flights_linger), format!("for {} ms", span / MS))
        } else {
            self.losing += 1;
            let span = self.rng.between(100 * MS, 1_000 * MS);
            self.q.after(span, Ev::Heal(self.faults.len()));
            // A change made whose answer was lost leaves a lend until its term.
            ("etcd-lost-replies", all, lingers.max(flights_linger), format!("for {} ms", span / MS))
        };
        // Deadlines and terms are on the clock of the instance that set them: read on
        // another's, they last up to twice the skew longer.
        let lingers_ms = lingers_ms + 2 * self.cfg.clock_skew / MS;
        self.trace.line(format_args!("{now} fault {n} {kind} {targets:?} {detail}"));
        self.faults.push(Fault {
            n,
            kind: kind.into(),
            targets,
            start: now,
            healed: u64::MAX,
            injected: true,
            detail,
            lingers_ms,
            observed: false,
        });
    }

    fn healed(&mut self, now: Nanos, f: usize) {
        self.faults[f].healed = now;
        self.trace.line(format_args!("{now} heal {}", self.faults[f].n));
        let targets: Vec<usize> = self.faults[f].targets.iter().map(|t| instance_of(t)).collect();
        for inst in targets {
            self.q.after(0, Ev::Probe(f, inst));
        }
        // One fault at a time, as the torture run's nemesis injects them: the next
        // comes once this one's probes had their liveness bound, so a probe is judged
        // on this fault alone.
        let gap = self.fault_gap();
        self.q.after(self.cfg.liveness_bound + gap, Ev::Fault);
    }

    fn probe(&mut self, now: Nanos, f: usize, inst: usize) {
        // A fresh holder: the next token of the probe resource's lock.
        let r = self.probe_resource[inst];
        self.locks[r].next += 1;
        let token = self.locks[r].next;
        self.probes += 1;
        self.send(now, None, r, token, inst, Kind::Probe, Some(f));
    }

    fn snapshot(&mut self, now: Nanos, after_fault: Option<u64>, source: String, inst: usize) {
        // The filter's own marks are in its shared data, which the simulator does not
        // decode: no read-back, and the third rule is not judged. In etcd they are.
        if self.cfg.filter && !self.cfg.shared_marks {
            return;
        }
        let fence = &self.instances[inst].fence;
        let marks: BTreeMap<String, String> =
            (0..self.names.len()).filter_map(|r| Some((self.names[r].clone(), fence.mark(r)?.to_string()))).collect();
        self.trace.line(format_args!("{now} snapshot {source} {} marks", marks.len()));
        self.snapshots.push(Snapshot { after_fault, source, start: now, end: now, marks });
    }

    fn finish(mut self) -> Outcome {
        let end = self.q.now();
        if self.cfg.shared_marks {
            self.snapshot(end, None, "etcd".into(), 0);
        } else {
            for inst in 0..self.instances.len() {
                self.snapshot(end, None, target(self.cfg.filter, inst), inst);
            }
        }
        let s = self.cfg.settings;
        let info = RunInfo {
            seed: self.cfg.seed,
            seconds: end / 1_000_000_000,
            groups: self.groups.clone(),
            targets: (0..self.instances.len()).map(|i| (target(self.cfg.filter, i), self.cfg.shared_marks)).collect(),
            liveness_bound_ms: self.cfg.liveness_bound / MS,
            start_grace_ms: s.start_grace / MS,
            apply_bound_ms: s.apply_bound / MS,
            conditional: self.cfg.conditional,
            start: 0,
            end,
        };
        let fault_numbers = self.faults.iter().map(|f| f.n).collect();
        let mut faults = BTreeMap::new();
        for f in &self.faults {
            *faults.entry(f.kind.clone()).or_default() += 1;
        }
        let digest = self.trace.digest();
        let lines = self.trace.lines();
        let focused = self.trace.kept().map(str::to_owned).collect();
        let input = Input {
            info,
            writes: std::mem::take(&mut self.writes),
            landed: std::mem::take(&mut self.landed),
            faults: std::mem::take(&mut self.faults),
            snapshots: std::mem::take(&mut self.snapshots),
        };
        let checking = std::time::Instant::now();
        let report = fencekeeper_check::rules::check(&input);
        let checked_in = checking.elapsed();
        Outcome {
            seed: self.cfg.seed,
            requests: self.requests,
            probes: self.probes,
            landed: input.landed.len() as u64,
            faults,
            pauses: self.pauses,
            fault_numbers,
            pause_ordinals: std::mem::take(&mut self.pause_ordinals),
            slots: (self.fault_slots, self.pause_slots),
            virtual_time: end,
            lines,
            digest,
            focused,
            report,
            checked_in,
        }
    }
}
