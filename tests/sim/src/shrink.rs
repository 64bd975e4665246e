//! Shrinking a failing run: a smaller config that still breaks the same rule, so
//! that the trace printed for it is short.
//!
//! A run is fully determined by its [`Config`], so a smaller failing config is as
//! good a witness as the original, and replays as exactly. The cuts, in order:
//!
//! 1. the request count, bisected down to the smallest count that still fails (a
//!    run given fewer requests is the same run up to where it stops);
//! 2. each fault that happened, dropped one at a time ([`Config::skip_faults`]),
//!    kept dropped when the run still fails;
//! 3. each holder pause, the same way ([`Config::skip_pauses`]);
//! 4. the request count once more: without those faults and pauses the run may fail
//!    sooner (and the masks past the cut run's end are forgotten).
//!
//! "Still fails" means: some finding of the rule the original's first finding broke.
//! The whole search is bounded by a [`Budget`] of runs and wall-clock time (read
//! between runs, never inside one); what it found by then is the answer.

use crate::config::Config;
use crate::world::{run, Outcome, SimError};
use fencekeeper_check::rules::Finding;
use std::collections::BTreeSet;
use std::time::{Duration, Instant};

/// How much a shrink may spend.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    /// At most this many runs (the final focused replay aside).
    pub runs: u32,
    /// No run is started after this much wall-clock time.
    pub time: Duration,
}

impl Default for Budget {
    /// Enough for a run of a million requests: its bisection is some twenty runs,
    /// mostly short, and each fault and pause of the cut run one more short run.
    fn default() -> Budget {
        Budget { runs: 400, time: Duration::from_secs(30) }
    }
}

/// A run's size: what the shrinker cuts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size {
    /// Writes the lock holders sent.
    pub requests: u64,
    /// Faults injected.
    pub faults: usize,
    /// Holder pauses taken.
    pub pauses: usize,
}

impl Size {
    fn of(o: &Outcome) -> Size {
        Size { requests: o.requests, faults: o.fault_numbers.len(), pauses: o.pause_ordinals.len() }
    }
}

/// What a shrink found.
pub struct Shrunk {
    /// The smallest failing config found: the original's, with fewer requests and
    /// faults and pauses masked (no focus: it is what a replay command names).
    pub config: Config,
    /// The shrunk config's run, replayed with the focus on its first finding of
    /// [`Shrunk::rule`]: its `focused` lines are the ones to print.
    pub outcome: Outcome,
    /// The shrunk run's digest as the search saw it: the focused replay's must match.
    pub digest: String,
    /// The rule kept broken: the original's first finding's.
    pub rule: u8,
    /// The original run's size and the shrunk run's.
    pub before: Size,
    /// The shrunk run's size.
    pub after: Size,
    /// Runs made, the final focused replay included.
    pub runs: u32,
    /// Wall-clock time the shrink took.
    pub took: Duration,
    /// The budget ran out before every cut was tried.
    pub exhausted: bool,
}

/// The search's state: the rule to keep broken, the budget, and the smallest
/// failing config so far with its run (`None`: still the original's).
struct Search<'a> {
    rule: u8,
    budget: Budget,
    started: Instant,
    runs: u32,
    exhausted: bool,
    config: Config,
    best: Option<Outcome>,
    original: &'a Outcome,
}

impl Search<'_> {
    fn current(&self) -> &Outcome {
        self.best.as_ref().unwrap_or(self.original)
    }

    /// Run `config` if the budget allows: its outcome when it breaks the rule.
    fn fails(&mut self, config: &Config) -> Result<Option<Outcome>, SimError> {
        if self.runs >= self.budget.runs || self.started.elapsed() >= self.budget.time {
            self.exhausted = true;
            return Ok(None);
        }
        self.runs += 1;
        let o = run(config, None)?;
        Ok(o.report.violations.iter().any(|f| f.rule == self.rule).then_some(o))
    }

    /// Try `config`; keep it when it still fails.
    fn attempt(&mut self, config: Config) -> Result<bool, SimError> {
        let failed = self.fails(&config)?;
        let kept = failed.is_some();
        if let Some(o) = failed {
            self.config = config;
            self.best = Some(o);
        }
        Ok(kept)
    }

    /// Bisect the request count: `hi` always fails (it was run, or is the current
    /// run), `lo` is taken to pass.
    fn cut_requests(&mut self) -> Result<(), SimError> {
        let (mut lo, hi) = (0, self.current().requests);
        // A first guess: every write the first finding names had been sent by the
        // count one past its highest id (ids count probes too, so it is no less).
        if let Some(guess) = first_of(self.current(), self.rule).and_then(last_write).map(|w| w + 1) {
            if guess < hi && !self.attempt(Config { requests: guess, ..self.config.clone() })? {
                lo = guess;
            }
        }
        while self.current().requests - lo > 1 && !self.exhausted {
            let mid = lo + (self.current().requests - lo) / 2;
            if !self.attempt(Config { requests: mid, ..self.config.clone() })? {
                lo = mid;
            }
        }
        Ok(())
    }

    /// Forget the masks the cut run never reached (a fault or pause dropped while
    /// the run was longer), so that the replay command names only those that matter.
    /// They still name the config's first trace line, so the run is made again.
    fn prune(&mut self) -> Result<(), SimError> {
        let (faults, pauses) = self.current().slots;
        let mut config = self.config.clone();
        config.skip_faults.retain(|&n| n <= faults);
        config.skip_pauses.retain(|&n| n <= pauses);
        if (&config.skip_faults, &config.skip_pauses) != (&self.config.skip_faults, &self.config.skip_pauses) {
            self.attempt(config)?;
        }
        Ok(())
    }

    /// Drop each fault or pause that happened, one at a time, keeping each drop
    /// under which the run still fails. After a kept drop the run differs, so the
    /// next candidate is taken from the current run, not from a list made before.
    fn drop_each(&mut self, mask: Mask) -> Result<(), SimError> {
        let mut tried = BTreeSet::new();
        while !self.exhausted {
            let Some(n) = mask.happened(self.current()).into_iter().find(|n| !tried.contains(n)) else { break };
            tried.insert(n);
            let mut config = self.config.clone();
            mask.set(&mut config).insert(n);
            self.attempt(config)?;
        }
        Ok(())
    }
}

/// The faults or the pauses.
#[derive(Clone, Copy)]
enum Mask {
    Faults,
    Pauses,
}

impl Mask {
    /// The numbers of those that happened in a run.
    fn happened(self, o: &Outcome) -> Vec<u64> {
        match self {
            Mask::Faults => o.fault_numbers.clone(),
            Mask::Pauses => o.pause_ordinals.iter().map(|&(n, _)| n).collect(),
        }
    }

    fn set(self, c: &mut Config) -> &mut BTreeSet<u64> {
        match self {
            Mask::Faults => &mut c.skip_faults,
            Mask::Pauses => &mut c.skip_pauses,
        }
    }
}

/// A run's first finding of `rule`.
fn first_of(o: &Outcome, rule: u8) -> Option<&Finding> {
    o.report.violations.iter().find(|f| f.rule == rule)
}

/// The highest write number a finding names (`w1818` is 1818).
fn last_write(f: &Finding) -> Option<u64> {
    f.ids.iter().filter_map(|id| id.strip_prefix('w')?.parse().ok()).max()
}

/// Replay `config` keeping the trace lines that name the writes and resource of
/// its run's first finding of `rule`, up to where it shows. `outcome` is that run.
pub fn focused(config: &Config, outcome: &Outcome, rule: u8) -> Result<Outcome, SimError> {
    let mut config = Config { requests: outcome.requests, ..config.clone() };
    if let Some(first) = first_of(outcome, rule) {
        config.focus = first.ids.iter().cloned().chain(first.resource.clone()).collect();
        config.focus_until = first.at;
    }
    run(&config, None)
}

/// Shrink the failing run `outcome` of `config` within `budget`; `None` when it broke
/// no rule.
pub fn shrink(config: &Config, outcome: &Outcome, budget: Budget) -> Result<Option<Shrunk>, SimError> {
    let Some(rule) = outcome.report.violations.first().map(|f| f.rule) else { return Ok(None) };
    let started = Instant::now();
    // A run stopped by the clock is the run given the count it reached.
    let config = Config { requests: outcome.requests, focus: Vec::new(), focus_until: 0, ..config.clone() };
    let mut s = Search { rule, budget, started, runs: 0, exhausted: false, config, best: None, original: outcome };
    s.cut_requests()?;
    s.drop_each(Mask::Faults)?;
    s.drop_each(Mask::Pauses)?;
    s.cut_requests()?;
    s.prune()?;
    let (before, after, digest) = (Size::of(outcome), Size::of(s.current()), s.current().digest.clone());
    let replayed = focused(&s.config, s.current(), rule)?;
    Ok(Some(Shrunk {
        config: s.config,
        outcome: replayed,
        digest,
        rule,
        before,
        after,
        runs: s.runs + 1,
        took: started.elapsed(),
        exhausted: s.exhausted,
    }))
}
