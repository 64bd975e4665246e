//! What a run is made of: its seed and length, its shape (instances, resources,
//! holders, whether marks and the gate are shared), its timing, and how often faults
//! come. [`Config::new`] gives the defaults every run of `scripts/simulate.sh` uses.

use crate::fence::{Bug, Settings};
use crate::queue::{Nanos, MS};
use std::collections::BTreeSet;

/// One run's configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// The seed every draw comes from.
    pub seed: u64,
    /// The lock holders send no more writes after this many (probes aside).
    pub requests: u64,
    /// Fence instances.
    pub instances: usize,
    /// Resources in each group (one group pinned to each instance, and one written
    /// through all of them when they share marks).
    pub resources_per_group: usize,
    /// Lock holders taking turns on each resource.
    pub holders_per_resource: usize,
    /// Every instance's marks in one store (as etcd shares them), else each its own.
    pub shared_marks: bool,
    /// Shared marks are in a simulated etcd: each admit's calls take network hops, are
    /// made one at a time, and may stall or lose their answers (faults). Off: one
    /// memory store that answers at once.
    pub etcd_marks: bool,
    /// The instances share one registry of flights (the shared gate), else each gate
    /// sees only its own writes.
    pub shared_gate: bool,
    /// Every write goes with a precondition, lent on its resource's version chain,
    /// to a store that honours it (the gateway's `--conditional-writes`), instead of
    /// through the ordering gate.
    pub conditional: bool,
    /// The nemesis may make the store apply writes later than the store apply bound
    /// (the timing assumption broken; such landings are counted apart). Off: those
    /// faults are the store slow within the bound instead.
    pub past_bound_faults: bool,
    /// Each instance's clock is off the world's by a fixed offset drawn within this
    /// much either way (ns; 0: one clock). The gate's deadlines and the lends' terms
    /// are on the clock of the instance that set them, read by others on theirs.
    pub clock_skew: Nanos,
    /// One write in two hundred carries a `fencing-admitted-token` of its client's
    /// own, which the fence must not pass to the store.
    pub forged_headers: bool,
    /// Only these kinds of fault (`instance-crash`, `store-slow`, `store-past-bound`,
    /// `etcd-stall`, `etcd-lost-replies`), as the torture run's `--faults`; `None`:
    /// every kind the run's shape has.
    pub fault_kinds: Option<Vec<&'static str>>,
    /// Each instance is the Envoy filter's `.wasm` in the in-process proxy-wasm host,
    /// its marks in the simulated etcd (with `shared_marks` and `etcd_marks`), else its
    /// own shared data.
    pub filter: bool,
    /// With `shared_marks` off, each instance's marks are in the library's file store
    /// (a file in a directory of the run's own, removed after it), opened again when
    /// the instance restarts; else in a memory store kept across its crashes.
    pub file_marks: bool,
    /// The instances' timing.
    pub settings: Settings,
    /// A holder's lease: a pause longer than this loses the lock.
    pub lease: Nanos,
    /// A client gives up on an answer after this long.
    pub client_budget: Nanos,
    /// After a fault heals, a fresh holder's write is stored within this long.
    pub liveness_bound: Nanos,
    /// The mean quiet time between one fault's liveness bound and the next fault.
    pub fault_gap: Nanos,
    /// The chance, per million writes, that a holder is paused before one.
    pub pause_per_million: u64,
    /// A bug put into every instance, to show the checker finds it.
    pub bug: Option<Bug>,
    /// Words whose trace lines are kept (write ids such as `w795`, resource names):
    /// set on the replay of a failing run, to print what happened to its writes.
    pub focus: Vec<String>,
    /// Trace lines are kept for [`Config::focus`] up to this instant (ns).
    pub focus_until: Nanos,
    /// Faults not injected, by number (`fault N` in the trace, 1-based): set by the
    /// shrinker to find the faults a failure does not need.
    pub skip_faults: BTreeSet<u64>,
    /// Holder pauses not taken, by ordinal in the run (1-based), as for faults.
    pub skip_pauses: BTreeSet<u64>,
}

impl Config {
    /// The defaults, for `seed` and `requests`.
    pub fn new(seed: u64, requests: u64) -> Config {
        Config {
            seed,
            requests,
            instances: 3,
            resources_per_group: 4,
            holders_per_resource: 3,
            shared_marks: true,
            etcd_marks: true,
            shared_gate: false,
            conditional: false,
            past_bound_faults: true,
            clock_skew: 0,
            forged_headers: true,
            fault_kinds: None,
            filter: false,
            file_marks: false,
            settings: Settings {
                upstream_timeout: 200 * MS,
                gate_budget: 500 * MS,
                apply_bound: 1_000 * MS,
                // Longer than a write forwarded before a crash may take to be applied.
                start_grace: 1_500 * MS,
            },
            lease: 300 * MS,
            client_budget: 3_000 * MS,
            liveness_bound: 4_000 * MS,
            fault_gap: 1_000 * MS,
            pause_per_million: 20_000,
            bug: None,
            focus: Vec::new(),
            focus_until: 0,
            skip_faults: BTreeSet::new(),
            skip_pauses: BTreeSet::new(),
        }
    }

    /// The defaults with the Envoy filter as every instance, as `envoy-config`
    /// configures it: correctness mode, marks in the simulated etcd through its JSON
    /// API, each Envoy's own gate. Every kind of fault is drawn.
    pub fn filter(seed: u64, requests: u64) -> Config {
        Config { filter: true, ..Config::new(seed, requests) }
    }

    /// The Envoy filter with each Envoy's marks its own shared data (efficiency mode),
    /// which die with it, so no instance crashes (nor etcd faults) are drawn.
    pub fn filter_own_marks(seed: u64, requests: u64) -> Config {
        let faults = vec!["store-slow", "store-past-bound"];
        Config { filter: true, shared_marks: false, fault_kinds: Some(faults), ..Config::new(seed, requests) }
    }

    /// The Envoy filter with conditional writes, as `envoy-config
    /// --conditional-writes` configures it: its chains in the simulated etcd, no
    /// gate, a lend's term the route timeout plus the store apply bound, versions the
    /// chain does not know asked of the store with a `HEAD`, S3's MD5 ETags (the same
    /// bytes give the same version).
    pub fn filter_conditional(seed: u64, requests: u64) -> Config {
        Config { filter: true, ..Config::conditional(seed, requests) }
    }

    /// The defaults with conditional writes: no start grace (the chain and the store's
    /// preconditions alone keep the order after a crash, as in the conditional
    /// torture run).
    pub fn conditional(seed: u64, requests: u64) -> Config {
        let mut config = Config { conditional: true, ..Config::new(seed, requests) };
        config.settings.start_grace = 0;
        config
    }
}
