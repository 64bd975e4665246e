//! `fencekeeper-sim`: one simulated run (`scripts/simulate.sh` calls it).
//!
//! ```text
//! fencekeeper-sim [--seed N] [--requests N | --seconds S] [--shared-gate | --conditional] [--own-marks]
//!                 [--bug NAME] [--skip-faults 1,4] [--skip-pauses 2,9] [--no-shrink]
//! ```
//!
//! Prints the seed, the requests simulated, the violations and the trace's digest;
//! on a violation, the findings, then the run shrunk (fewer requests, faults and
//! pauses, the same rule broken) and its first finding's trace lines (from a replay),
//! and the commands that replay the run and the shrunk run, and exits 1. `--seconds`
//! stops sending after that much wall-clock time; the replay command then names the
//! request count it reached. `--skip-faults` and `--skip-pauses` mask faults and
//! pauses by number, as the shrunk replay command does; `--no-shrink` prints the
//! run's own trace lines instead.

/// A line on standard output. A reader that went away (`| head`) ends the output, not
/// the run: the line is dropped, and the exit code still says what the run found.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

use fencekeeper_sim::fence::Bug;
use fencekeeper_sim::queue::MS;
use fencekeeper_sim::shrink::{self, Budget, Shrunk};
use fencekeeper_sim::{run, Config, Outcome};
use std::collections::BTreeSet;
use std::io::Read;
use std::process::ExitCode;
use std::time::{Duration, Instant};

struct Args {
    seed: Option<u64>,
    requests: Option<u64>,
    seconds: Option<u64>,
    shared_gate: bool,
    own_marks: bool,
    conditional: bool,
    filter: bool,
    file_marks: bool,
    clock_skew_ms: u64,
    faults: Option<Vec<&'static str>>,
    bug: Option<Bug>,
    skip_faults: BTreeSet<u64>,
    skip_pauses: BTreeSet<u64>,
    no_shrink: bool,
}

const USAGE: &str = "usage: fencekeeper-sim [--seed N] [--requests N | --seconds S] [--shared-gate | --conditional] [--filter] \
                     [--own-marks | --file-marks] [--clock-skew MS] [--faults K1,K2] [--bug NAME] [--skip-faults 1,4] [--skip-pauses 2,9] [--no-shrink]; bugs: skip-gate, \
                     admit-stale, equal-passes, header-kept, cas-lowers, lost-marks, lend-unchecked, lend-stale, release-given-up, local-gate";

/// The kinds of fault the nemesis may draw.
const FAULT_KINDS: [&str; 5] = ["instance-crash", "store-slow", "store-past-bound", "etcd-stall", "etcd-lost-replies"];

/// Comma-separated fault kinds (`store-slow,etcd-stall`).
fn kinds(v: &str) -> Result<Vec<&'static str>, String> {
    v.split(',')
        .filter(|k| !k.is_empty())
        .map(|k| {
            FAULT_KINDS
                .iter()
                .find(|f| **f == k)
                .copied()
                .ok_or_else(|| format!("--faults: no fault {k:?} ({})", FAULT_KINDS.join(", ")))
        })
        .collect()
}

/// Comma-separated numbers (`1,4,7`).
fn numbers(v: &str, name: &str) -> Result<BTreeSet<u64>, String> {
    v.split(',').filter(|n| !n.is_empty()).map(|n| n.parse::<u64>().map_err(|e| format!("{name} {n:?}: {e}"))).collect()
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seed: None,
        requests: None,
        seconds: None,
        shared_gate: false,
        own_marks: false,
        conditional: false,
        filter: false,
        file_marks: false,
        clock_skew_ms: 0,
        faults: None,
        bug: None,
        skip_faults: BTreeSet::new(),
        skip_pauses: BTreeSet::new(),
        no_shrink: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |v: String, name: &str| v.parse::<u64>().map_err(|e| format!("{name} {v:?}: {e}"));
        match a.as_str() {
            "--seed" => args.seed = Some(number(value("--seed")?, "--seed")?),
            "--requests" => args.requests = Some(number(value("--requests")?, "--requests")?),
            "--seconds" => args.seconds = Some(number(value("--seconds")?, "--seconds")?),
            "--shared-gate" => args.shared_gate = true,
            "--own-marks" => args.own_marks = true,
            "--conditional" => args.conditional = true,
            "--filter" => args.filter = true,
            "--file-marks" => args.file_marks = true,
            "--faults" => args.faults = Some(kinds(&value("--faults")?)?),
            "--clock-skew" => args.clock_skew_ms = number(value("--clock-skew")?, "--clock-skew")?,
            "--bug" => args.bug = Some(value("--bug")?.parse()?),
            "--skip-faults" => args.skip_faults = numbers(&value("--skip-faults")?, "--skip-faults")?,
            "--skip-pauses" => args.skip_pauses = numbers(&value("--skip-pauses")?, "--skip-pauses")?,
            "--no-shrink" => args.no_shrink = true,
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.shared_gate && args.conditional {
        return Err("give --shared-gate or --conditional, not both: conditional writes need no ordering gate".into());
    }
    if args.file_marks && (args.filter || args.shared_gate) {
        return Err("--file-marks gives each instance its own file store: not with --filter or --shared-gate".into());
    }
    if args.filter && args.own_marks && (args.shared_gate || args.conditional) {
        return Err("--filter --shared-gate and --filter --conditional keep flights and chains in etcd: not with \
                    --own-marks"
            .into());
    }
    if args.shared_gate && args.clock_skew_ms > 0 {
        return Err(
            "--clock-skew with --shared-gate would test the simulator's model, not the hosts: its shared table \
                    compares a given-up flight's deadline on another instance's clock, where the hosts' registry holds \
                    a flight until its owner deletes its key (on the owner's clock) or etcd ends its lease"
                .into(),
        );
    }
    if args.bug == Some(Bug::LocalGate) && !args.shared_gate {
        return Err("--bug local-gate undoes --shared-gate: give both".into());
    }
    if args.requests.is_some() && args.seconds.is_some() {
        return Err("give --requests or --seconds, not both".into());
    }
    Ok(args)
}

fn random_seed() -> u64 {
    let mut bytes = [0u8; 8];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
        Ok(()) => u64::from_le_bytes(bytes),
        // Without /dev/urandom, the clock's nanoseconds are seed enough: it is printed.
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64),
    }
}

/// This process's CPU time (user and system) from /proc/self/stat, in seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let (utime, stime): (f64, f64) = (fields.get(11)?.parse().ok()?, fields.get(12)?.parse().ok()?);
    // USER_HZ is 100 on Linux.
    Some((utime + stime) / 100.0)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let seed = args.seed.unwrap_or_else(random_seed);
    let requests = args.requests.unwrap_or(if args.seconds.is_some() { u64::MAX } else { 100_000 });
    let mut config = if args.conditional {
        if args.filter {
            Config::filter_conditional(seed, requests)
        } else {
            Config::conditional(seed, requests)
        }
    } else if args.filter && args.own_marks {
        Config::filter_own_marks(seed, requests)
    } else if args.filter {
        Config::filter(seed, requests)
    } else {
        Config::new(seed, requests)
    };
    config.shared_gate = args.shared_gate;
    config.shared_marks = !args.own_marks && !args.file_marks;
    config.file_marks = args.file_marks;
    config.bug = args.bug;
    config.clock_skew = args.clock_skew_ms * MS;
    if args.faults.is_some() {
        config.fault_kinds = args.faults.clone();
    }
    config.skip_faults = args.skip_faults.clone();
    config.skip_pauses = args.skip_pauses.clone();
    out!("seed: {seed}");
    let (wall, cpu) = (Instant::now(), cpu_seconds());
    let deadline = args.seconds.map(|s| wall + Duration::from_secs(s));
    let stop = move || deadline.is_some_and(|d| Instant::now() >= d);
    let outcome = match run(&config, Some(&stop)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let elapsed = wall.elapsed().as_secs_f64();
    let cpu = cpu.zip(cpu_seconds()).map(|(a, b)| b - a);
    let r = &outcome.report;
    out!("requests: {} (and {} probes)", outcome.requests, outcome.probes);
    out!("virtual time: {:.1} s", outcome.virtual_time as f64 / (1000.0 * MS as f64));
    out!("store applied: {}", outcome.landed);
    out!("answers: {}", r.classes.iter().map(|(c, n)| format!("{c} {n}")).collect::<Vec<_>>().join(", "));
    out!(
        "faults: {}; holders paused {} (past their lease {})",
        outcome.faults.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "),
        outcome.pauses.0,
        outcome.pauses.1
    );
    out!(
        "counted apart: bound exceeded {}, window hits {}, crash hits {}",
        r.bound_exceeded.len(),
        r.window_hits.len(),
        r.crash_hits.len()
    );
    // Landings past the bound are the timing assumption broken, not a bug: shown, so
    // a reader sees which (with conditional writes: a version that came back after a
    // given-up write's lend ended, docs/architecture.md).
    for f in r.bound_exceeded.iter().take(3) {
        out!("  bound exceeded: {}", f.message);
    }
    let rate = |secs: f64| {
        if secs > 0.0 {
            format!("{:.0}", (outcome.requests + outcome.probes) as f64 / secs)
        } else {
            "-".into()
        }
    };
    match cpu {
        Some(c) => out!(
            "took: {elapsed:.1} s, {c:.1} s CPU ({} requests per CPU-second; the checker {:.1} s of it)",
            rate(c),
            outcome.checked_in.as_secs_f64()
        ),
        None => out!("took: {elapsed:.1} s ({} requests per second)", rate(elapsed)),
    }
    out!("violations: {}", outcome.violations());
    out!("digest: {} ({} trace lines)", outcome.digest, outcome.lines);
    if outcome.violations() == 0 {
        return ExitCode::SUCCESS;
    }
    for f in r.violations.iter().take(10) {
        out!("  rule {}: {}", f.rule, f.message);
    }
    // The run replays exactly, and so does a smaller config that still fails: print
    // the trace lines of the shrunk run's first finding, or of this run's.
    config.requests = outcome.requests;
    let shrunk = if args.no_shrink { None } else { shrink_and_print(&config, &outcome) };
    if shrunk.is_none() {
        print_focused(&config, &outcome);
    }
    out!("replay: {}", replay_command(&config));
    if let Some(s) = shrunk {
        out!("replay shrunk: {}", replay_command(&s.config));
    }
    ExitCode::FAILURE
}

/// Shrink the failing run and print what came of it: its sizes before and after,
/// its first finding of the rule and that finding's trace lines. `None` when the
/// shrink could not run.
fn shrink_and_print(config: &Config, outcome: &Outcome) -> Option<Shrunk> {
    let s = match shrink::shrink(config, outcome, Budget::default()) {
        Ok(s) => s?,
        Err(e) => {
            out!("the shrink failed: {e}");
            return None;
        }
    };
    let (b, a) = (s.before, s.after);
    out!(
        "shrunk: requests {} -> {}, faults {} -> {}, pauses {} -> {} ({} runs, {:.1} s{})",
        b.requests,
        a.requests,
        b.faults,
        a.faults,
        b.pauses,
        a.pauses,
        s.runs,
        s.took.as_secs_f64(),
        if s.exhausted { "; the budget ran out" } else { "" }
    );
    out!("shrunk digest: {} ({} trace lines)", s.digest, s.outcome.lines);
    if let Some(f) = s.outcome.report.violations.iter().find(|f| f.rule == s.rule) {
        out!("  rule {}: {}", f.rule, f.message);
    }
    if s.outcome.digest == s.digest {
        out!("the shrunk run's first finding's writes and resource in the trace, up to where it shows (replayed):");
        for line in &s.outcome.focused {
            out!("  {line}");
        }
    } else {
        out!("the replay's digest is {}, not {}: the shrunk run did not replay", s.outcome.digest, s.digest);
    }
    Some(s)
}

/// Replay the run keeping the trace lines of its first finding's writes and
/// resource, and print them.
fn print_focused(config: &Config, outcome: &Outcome) {
    let Some(rule) = outcome.report.violations.first().map(|f| f.rule) else { return };
    match shrink::focused(config, outcome, rule) {
        Ok(again) if again.digest == outcome.digest => {
            out!("the first finding's writes and resource in the trace, up to where it shows (replayed):");
            for line in &again.focused {
                out!("  {line}");
            }
        }
        Ok(again) => {
            out!("the replay's digest is {}, not {}: the run did not replay", again.digest, outcome.digest)
        }
        Err(e) => out!("the replay failed: {e}"),
    }
}

/// The command that replays `config`'s run.
fn replay_command(config: &Config) -> String {
    let mut replay = format!("scripts/simulate.sh --seed {} --requests {}", config.seed, config.requests);
    if config.shared_gate {
        replay += " --shared-gate";
    }
    if config.file_marks {
        replay += " --file-marks";
    } else if !config.shared_marks {
        replay += " --own-marks";
    }
    if config.conditional {
        replay += " --conditional";
    }
    if config.filter {
        replay += " --filter";
    }
    if let Some(kinds) = &config.fault_kinds {
        replay += &format!(" --faults {}", kinds.join(","));
    }
    if config.clock_skew > 0 {
        replay += &format!(" --clock-skew {}", config.clock_skew / MS);
    }
    if let Some(bug) = config.bug {
        replay += &format!(" --bug {}", bug.name());
    }
    let list = |set: &BTreeSet<u64>| set.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    if !config.skip_faults.is_empty() {
        replay += &format!(" --skip-faults {}", list(&config.skip_faults));
    }
    if !config.skip_pauses.is_empty() {
        replay += &format!(" --skip-pauses {}", list(&config.skip_pauses));
    }
    replay
}
