//! `fencekeeper-sim`: one simulated run (`scripts/simulate.sh` calls it).
//!
//! ```text
//! fencekeeper-sim [--seed N] [--requests N | --seconds S] [--shared-gate | --conditional] [--own-marks] [--bug NAME]
//! ```
//!
//! Prints the seed, the requests simulated, the violations and the trace's digest;
//! on a violation, the findings, the first one's trace lines (from a replay) and the
//! command that replays the run, and exits 1. `--seconds` stops sending after that
//! much wall-clock time; the replay command then names the request count it reached.

use fencekeeper_sim::fence::Bug;
use fencekeeper_sim::queue::MS;
use fencekeeper_sim::{run, Config};
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
    bug: Option<Bug>,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seed: None,
        requests: None,
        seconds: None,
        shared_gate: false,
        own_marks: false,
        conditional: false,
        bug: None,
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
            "--bug" => args.bug = Some(value("--bug")?.parse()?),
            "-h" | "--help" => {
                return Err(format!(
                    "usage: fencekeeper-sim [--seed N] [--requests N | --seconds S] [--shared-gate | --conditional] \
                     [--own-marks] [--bug NAME]; bugs: {}",
                    Bug::NAMES
                ))
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if args.shared_gate && args.conditional {
        return Err("give --shared-gate or --conditional, not both: conditional writes need no ordering gate".into());
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
    let mut config = if args.conditional { Config::conditional(seed, requests) } else { Config::new(seed, requests) };
    config.shared_gate = args.shared_gate;
    config.shared_marks = !args.own_marks;
    config.bug = args.bug;
    println!("seed: {seed}");
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
    println!("requests: {} (and {} probes)", outcome.requests, outcome.probes);
    println!("virtual time: {:.1} s", outcome.virtual_time as f64 / (1000.0 * MS as f64));
    println!("store applied: {}", outcome.landed);
    println!("answers: {}", r.classes.iter().map(|(c, n)| format!("{c} {n}")).collect::<Vec<_>>().join(", "));
    println!(
        "faults: {}; holders paused {} (past their lease {})",
        outcome.faults.iter().map(|(k, n)| format!("{k} {n}")).collect::<Vec<_>>().join(", "),
        outcome.pauses.0,
        outcome.pauses.1
    );
    println!(
        "counted apart: bound exceeded {}, window hits {}, crash hits {}",
        r.bound_exceeded.len(),
        r.window_hits.len(),
        r.crash_hits.len()
    );
    // Landings past the bound are the timing assumption broken, not a bug: shown, so
    // a reader sees which (with conditional writes: a version that came back after a
    // given-up write's lend ended, docs/architecture.md).
    for f in r.bound_exceeded.iter().take(3) {
        println!("  bound exceeded: {}", f.message);
    }
    let rate = |secs: f64| {
        if secs > 0.0 {
            format!("{:.0}", (outcome.requests + outcome.probes) as f64 / secs)
        } else {
            "-".into()
        }
    };
    match cpu {
        Some(c) => println!(
            "took: {elapsed:.1} s, {c:.1} s CPU ({} requests per CPU-second; the checker {:.1} s of it)",
            rate(c),
            outcome.checked_in.as_secs_f64()
        ),
        None => println!("took: {elapsed:.1} s ({} requests per second)", rate(elapsed)),
    }
    println!("violations: {}", outcome.violations());
    println!("digest: {} ({} trace lines)", outcome.digest, outcome.lines);
    if outcome.violations() == 0 {
        return ExitCode::SUCCESS;
    }
    for f in r.violations.iter().take(10) {
        println!("  rule {}: {}", f.rule, f.message);
    }
    // The run replays exactly: run it again keeping the trace lines of the first
    // finding's writes and resource.
    if let Some(first) = r.violations.first() {
        config.requests = outcome.requests;
        config.focus = first.ids.iter().cloned().chain(first.resource.clone()).collect();
        config.focus_until = first.at;
        match run(&config, None) {
            Ok(again) if again.digest == outcome.digest => {
                println!("the first finding's writes and resource in the trace, up to where it shows (replayed):");
                for line in &again.focused {
                    println!("  {line}");
                }
            }
            Ok(again) => {
                println!("the replay's digest is {}, not {}: the run did not replay", again.digest, outcome.digest)
            }
            Err(e) => println!("the replay failed: {e}"),
        }
    }
    let mut replay = format!("scripts/simulate.sh --seed {seed} --requests {}", outcome.requests);
    if args.shared_gate {
        replay += " --shared-gate";
    }
    if args.own_marks {
        replay += " --own-marks";
    }
    if args.conditional {
        replay += " --conditional";
    }
    if let Some(bug) = args.bug {
        replay += &format!(" --bug {}", bug.name());
    }
    println!("replay: {replay}");
    ExitCode::FAILURE
}
