//! The stall watch: disturbances nobody injected, seen as they happen.
//!
//! A shared 2-core machine can stop the run's services for seconds on its own: etcd
//! slow to answer (a leader election under CPU starvation, a stolen core), or the
//! whole machine paused. The hosts then do what they must, and refuse writes the
//! ordering gate held past its timeout (503). The checker must not call those
//! violations, nor must it be told to ignore them blindly: this thread measures.
//!
//! Every [`EVERY`] it reads one key from etcd (a linearizable read, trying each
//! member in turn) and times the read and its own sleep. A read slower than
//! [`SLOW`], a read no member answered, or a sleep that overslept by more than
//! [`SLOW`], starts a stall; the first quick read after it ends the stall. Each
//! stall is logged as a disturbance of every target whose marks live in etcd
//! (`observed-etcd-stall`) or of every target (`observed-pause`), with the same
//! linger as an injected fault, and the report counts it in its own row of the
//! fault table. Stalls inside an injected fault are logged too: they are that
//! fault's effect, seen from outside, and change nothing the fault did not explain.

use crate::clock;
use crate::lock::Etcd;
use crate::record::{Event, Fault, Log};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

/// How often etcd is read.
pub const EVERY: Duration = Duration::from_millis(200);
/// A read or an oversleep longer than this is a stall: a loopback etcd answers a
/// read in about a millisecond.
pub const SLOW: Duration = Duration::from_millis(500);
/// The first number given to an observed stall (injected faults count from 1).
pub const FIRST: u64 = 1_000_000;

/// The kind of a stall.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    /// etcd was slow to answer, or no member answered.
    Etcd,
    /// This thread overslept: the machine (or this process) was paused.
    Pause,
}

/// Watch until `stop`; log each stall to `log` as disturbing `etcd_targets` (an etcd
/// stall) or `all_targets` (a pause).
pub fn watch(
    etcd: &Etcd,
    log: &Log,
    stop: &AtomicBool,
    etcd_targets: &[String],
    all_targets: &[String],
    lingers: Duration,
    load_start: u64,
) {
    let mut open: Option<(Kind, u64)> = None;
    let mut n = 0;
    let mut close = |kind: Kind, since: u64, end: u64| {
        n += 1;
        let targets = if kind == Kind::Pause { all_targets } else { etcd_targets };
        let fault = Fault {
            n: FIRST + n,
            kind: if kind == Kind::Pause { "observed-pause" } else { "observed-etcd-stall" }.into(),
            targets: targets.to_vec(),
            start: since,
            healed: end,
            injected: true,
            detail: format!("{:.1} s, not injected: seen by the stall watch", (end - since) as f64 / 1e9),
            lingers_ms: lingers.as_millis() as u64,
            observed: true,
        };
        eprintln!(
            "torture: fault {} {} at {:.1} s: {}",
            fault.n,
            fault.kind,
            since.saturating_sub(load_start) as f64 / 1e9,
            fault.detail
        );
        let _ = log.write(&Event::Fault(fault));
    };
    let slow = SLOW.as_nanos() as u64;
    while !stop.load(Relaxed) {
        let before_sleep = clock::now();
        std::thread::sleep(EVERY);
        let woke = clock::now();
        let overslept = woke.saturating_sub(before_sleep).saturating_sub(EVERY.as_nanos() as u64);
        let read = etcd.range_prefix("/torture/stall-watch");
        let answered = clock::now();
        let seen = if overslept > slow {
            Some((Kind::Pause, before_sleep))
        } else if read.is_err() || answered.saturating_sub(woke) > slow {
            Some((Kind::Etcd, woke))
        } else {
            None
        };
        match (open, seen) {
            (None, Some(s)) => open = Some(s),
            // A pause within an etcd stall makes it a pause: it disturbed everything.
            (Some((Kind::Etcd, since)), Some((Kind::Pause, _))) => open = Some((Kind::Pause, since)),
            (Some((kind, since)), None) => {
                close(kind, since, answered);
                open = None;
            }
            _ => {}
        }
    }
    // A stall still open when the load stopped lasted at least until now.
    if let Some((kind, since)) = open {
        close(kind, since, clock::now());
    }
}
