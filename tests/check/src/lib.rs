//! The torture checker's rules, shared by the real-process torture run
//! (`tests/torture`) and the deterministic simulator (`tests/sim`): both write down a
//! history of the same records ([`record`]) and this crate judges it, so that a rule
//! is stated once. It reads nothing and writes nothing: each caller builds an
//! [`Input`] (the torture run from its log files, the simulator from its trace) and
//! calls [`rules::check`]. It shares no code path with what it checks, except the
//! max-register checker it reuses from the harness.
//!
//! Each answer is first classified from its raw form ([`classify`]), then the five
//! rules are judged ([`rules`]).

mod class;
pub mod record;
pub mod rules;
#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::panic)]
mod tests;

pub use class::{classify, Class};
use record::{Fault, Group, Landed, RunInfo, Snapshot, Write};

/// Everything a run wrote.
pub struct Input {
    /// The run's shape.
    pub info: RunInfo,
    /// Every write sent (the last record per id: a pending one was never answered).
    pub writes: Vec<Write>,
    /// Every write applied, by arrival.
    pub landed: Vec<Landed>,
    /// Every fault.
    pub faults: Vec<Fault>,
    /// Every read-back of marks.
    pub snapshots: Vec<Snapshot>,
}

impl Input {
    /// The group a resource belongs to (its path is `/t/<group>/...`).
    pub fn group_of(&self, resource: &str) -> Option<&Group> {
        let name = resource.strip_prefix("/t/")?.split('/').next()?;
        self.info.groups.iter().find(|g| g.name == name)
    }
}
