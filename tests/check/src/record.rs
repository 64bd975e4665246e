//! The records a run's history is made of, and that the rules judge: every write a
//! client sent ([`Write`]), every write the store applied ([`Landed`]), every fault
//! ([`Fault`]), the marks read back ([`Snapshot`]), and the run's shape ([`RunInfo`]).
//! Stamps are nanoseconds on one clock: the torture run's CLOCK_MONOTONIC, or the
//! simulator's virtual clock. The torture run writes them as JSON lines.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Why a client sent a write, and so what answers it may get.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A lock holder writing with its token.
    Valid,
    /// A holder that was paused past its lease, writing on with its old token.
    Late,
    /// An old token sent again long after (a nemesis fault).
    Replay,
    /// The liveness probe after a fault healed: a fresh holder's write.
    Probe,
    /// A token that is not a token.
    Malformed,
    /// No token.
    Missing,
    /// The test guests' trap: the gateway guest's `fault-trap` token, or the filter's
    /// fault header.
    Trap,
}

impl Kind {
    /// Writes that present a real token, and so are admits on the max-register.
    pub fn admits(self) -> bool {
        matches!(self, Kind::Valid | Kind::Late | Kind::Replay | Kind::Probe)
    }
}

/// One write a client sent, and what came back.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Write {
    /// Unique in the run; also the body sent, so the store's log names it.
    pub id: String,
    /// The client (thread or process) that sent it.
    pub client: String,
    /// The resource group ([`Group`]).
    pub group: String,
    /// The resource (the request path, which is the mark's key).
    pub resource: String,
    /// The target it went through (`gw1`, `envoy2`, ...).
    pub target: String,
    /// Why it was sent.
    pub kind: Kind,
    /// The token text sent, if any.
    pub token: Option<String>,
    /// Stamp before the request.
    pub start: u64,
    /// Stamp after the answer (or the error); `u64::MAX` while pending.
    pub end: u64,
    /// The HTTP status; 0 when none came.
    pub status: u16,
    /// The `fencing-highest` header of a refusal.
    pub highest: Option<String>,
    /// The store's arrival number (`x-torture-seq`), when the store answered it.
    pub seq: Option<u64>,
    /// The store itself answered with an injected error (`x-torture-upstream`).
    pub upstream_error: bool,
    /// A transport error: `refused` (never sent) or another one-word cause.
    pub error: Option<String>,
    /// The first bytes of the answer's body.
    pub body: String,
    /// The fault it belongs to (probes, the nemesis's own writes).
    pub fault: Option<u64>,
}

/// One write the store applied.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Landed {
    /// Arrival order, from 1, across store restarts.
    pub seq: u64,
    /// When it was applied.
    pub at: u64,
    /// When the store received it (its body had arrived): `at - received` is how long
    /// the store took to apply it, judged against the store apply bound.
    #[serde(default)]
    pub received: u64,
    /// The request path.
    pub resource: String,
    /// The token the fence admitted (`fencing-admitted-token`), empty if none.
    pub token: String,
    /// The target that forwarded it (`x-torture-target`).
    pub target: String,
    /// The write's id (its body).
    pub id: String,
}

/// One fault the nemesis injected (or could not).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Fault {
    /// Its number in the run.
    pub n: u64,
    /// The kind (a row of the fault table).
    pub kind: String,
    /// The targets it may disturb: their undecided answers are expected meanwhile.
    pub targets: Vec<String>,
    /// Stamp when injected.
    pub start: u64,
    /// Stamp when healed (the process back and ready, the knob reset).
    pub healed: u64,
    /// False when this machine could not inject it (then said why in `detail`).
    pub injected: bool,
    /// What exactly was done.
    pub detail: String,
    /// How long after the heal its consequences may still refuse writes (ms): writes
    /// given up on hold their resources for the store apply bound, and an instance that
    /// was killed or frozen holds its flights in the shared registry until its lease
    /// expires; writes waiting for those get 503 at the gate.
    #[serde(default)]
    pub lingers_ms: u64,
    /// Not injected but seen: a stall the stall watch measured (`stall.rs`). It has
    /// no probes; its window is its span plus the linger.
    #[serde(default)]
    pub observed: bool,
}

/// Marks read back (after a restart, and at the end).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Snapshot {
    /// The fault whose heal it follows; `None` at the end of the run.
    pub after_fault: Option<u64>,
    /// Where from: `etcd` (the shared marks) or a file-store gateway's name.
    pub source: String,
    /// Stamp before the read.
    pub start: u64,
    /// Stamp after it.
    pub end: u64,
    /// Resource -> mark.
    pub marks: BTreeMap<String, String>,
}

/// A line of `nemesis.jsonl`.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Event {
    /// A fault.
    Fault(Fault),
    /// Marks read back.
    Snapshot(Snapshot),
}

/// A group of resources written through the same targets.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Group {
    /// Its name, also the resources' path prefix (`/t/<name>/<i>`).
    pub name: String,
    /// The targets its writes go through (each write picks one).
    pub targets: Vec<String>,
    /// The store-order claim holds for it (one gateway's ordering gate).
    pub claims_order: bool,
    /// Its resources.
    pub resources: Vec<String>,
}

/// The run's shape, for the checker.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct RunInfo {
    /// The seed of the fault schedule and the clients.
    pub seed: u64,
    /// The load's length.
    pub seconds: u64,
    /// The resource groups.
    pub groups: Vec<Group>,
    /// Every target, and whether its marks are in etcd (`true`) or a file.
    pub targets: BTreeMap<String, bool>,
    /// After a fault heals, a fresh holder writes successfully within this bound.
    pub liveness_bound_ms: u64,
    /// The gateways' `--start-grace`, in ms. Longer than the store may take to apply a
    /// write, it makes a write in flight through a killed gateway that lands after a
    /// newer one a violation; without it (0), such a landing is a counted crash hit.
    #[serde(default)]
    pub start_grace_ms: u64,
    /// The store apply bound the hosts were given, in ms: the store applies a write
    /// within this long of receiving it, except under the `upstream-past-bound` fault.
    /// A write that landed out of order after taking longer is counted apart (*bound
    /// exceeded*), not as a violation: it is the one timing assumption's limit. 0: none.
    #[serde(default)]
    pub apply_bound_ms: u64,
    /// The gateways sent every write with a precondition the store honoured
    /// (`--conditional`): a write in flight through a killed gateway that lands out of
    /// order is then a violation, not a crash hit.
    #[serde(default)]
    pub conditional: bool,
    /// Stamp when the load began.
    pub start: u64,
    /// Stamp when it ended.
    pub end: u64,
}
