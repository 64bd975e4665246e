//! `fencekeeper lock`: take a lock in etcd, ZooKeeper or Redis, run a command while
//! it is held, and hand the command the lock's fencing token.
//!
//! acquire (waiting while someone else holds it) -> spawn COMMAND with `FENCING_TOKEN`
//! (and `FENCING_RESOURCE`) -> keep the lease, session or key alive from a thread, a
//! third of its time-to-live apart -> if the service says the lock is gone (or cannot
//! be reached for a whole TTL): one stderr line, a signal to COMMAND -> when COMMAND
//! exits, release the lock (only if it is still ours).
//!
//! The token is what orders holders in each service (docs/tokens.md says why): the
//! acquisition revision in etcd, the lock znode's czxid as `epoch.counter` in
//! ZooKeeper, a counter incremented with the acquisition in Redis.
//!
//! Exit: COMMAND's code (128 + N when signal N ended it); [`LOST`] when the lock was
//! lost while COMMAND ran; 2 when the lock could not be taken or COMMAND not started.
//!
//! # Layout
//!
//! One module per service, each a small client of its own protocol: [`etcd`] (the v3
//! gRPC API: the etcd wire over the library's `EtcdClient`), [`zookeeper`] (the
//! recipe over the library's ZooKeeper session), [`redis`] (RESP over a TCP stream,
//! Lua scripts for each step).

mod etcd;
mod redis;
mod zookeeper;

use anyhow::{bail, Context};
use rustix::process::{kill_process, Pid, Signal};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// The variable COMMAND finds its fencing token in.
pub const TOKEN_ENV: &str = "FENCING_TOKEN";
/// The variable COMMAND finds `--resource` in.
pub const RESOURCE_ENV: &str = "FENCING_RESOURCE";
/// The exit code when the lock was lost while COMMAND ran: sysexits' EX_TEMPFAIL
/// ("try again later"), far from the small codes commands use for their own failures.
pub const LOST: u8 = 75;

/// Arguments of `fencekeeper lock`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("service").required(true).args(["etcd", "zookeeper", "redis"])))]
pub struct Args {
    /// Lock in etcd, through its v3 gRPC API (the client port; for a cluster, every
    /// member's, separated by commas, tried in turn).
    #[arg(long, value_name = "HOST:PORT[,HOST:PORT...]")]
    etcd: Option<String>,
    /// Lock in ZooKeeper (an ephemeral sequential znode, the standard lock recipe).
    #[arg(long, value_name = "HOST:PORT")]
    zookeeper: Option<String>,
    /// Lock in one Redis node (SET NX PX with a counter, in one Lua script).
    #[arg(long, value_name = "HOST:PORT")]
    redis: Option<String>,
    /// Time-to-live of the lease, session or key: how long a holder that stops
    /// (crashed, paused, cut off) keeps the others waiting. Seconds (`10`) or a
    /// duration (`10s`, `2m`), whole seconds (rounded up), 1s to 1d.
    #[arg(long, value_name = "T", default_value = "10", value_parser = parse_ttl)]
    ttl: Duration,
    /// Give up (exit 2) when the lock is not taken within T (seconds, or a duration
    /// like `30s`); by default wait as long as it takes.
    #[arg(long, value_name = "T", value_parser = parse_wait)]
    wait: Option<Duration>,
    /// Also set FENCING_RESOURCE to this for COMMAND (the resource its writes fence).
    #[arg(long)]
    resource: Option<String>,
    /// What COMMAND is sent when the lock is lost: a signal (SIGTERM, TERM, KILL, INT,
    /// HUP, USR1, USR2, QUIT) or `none` to let it run on (its writes are then refused
    /// by the fence, and the exit code is still 75).
    #[arg(long, value_name = "SIGNAL|none", default_value = "SIGTERM", value_parser = parse_on_loss)]
    on_loss: OnLoss,
    /// The lock's name: the key prefix in etcd (as `etcdctl lock NAME`), the lock
    /// node's path in ZooKeeper, the {NAME} in the Redis keys fencekeeper:lock:{NAME}
    /// and fencekeeper:token:{NAME}.
    name: String,
    /// The command to run while the lock is held (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
    /// TLS and user for etcd.
    #[command(flatten)]
    etcd_connection: crate::etcd_connection::EtcdConnection,
}

/// What COMMAND is sent when the lock is lost.
#[derive(Clone, Copy, Debug)]
pub enum OnLoss {
    /// Send this signal.
    Signal(Signal, &'static str),
    /// Leave it running.
    Nothing,
}

fn parse_on_loss(text: &str) -> Result<OnLoss, String> {
    if text.eq_ignore_ascii_case("none") {
        return Ok(OnLoss::Nothing);
    }
    let upper = text.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    let signal = match name {
        "TERM" => (Signal::TERM, "SIGTERM"),
        "KILL" => (Signal::KILL, "SIGKILL"),
        "INT" => (Signal::INT, "SIGINT"),
        "HUP" => (Signal::HUP, "SIGHUP"),
        "QUIT" => (Signal::QUIT, "SIGQUIT"),
        "USR1" => (Signal::USR1, "SIGUSR1"),
        "USR2" => (Signal::USR2, "SIGUSR2"),
        _ => {
            return Err(format!(
                "{text:?} is not a signal this command sends (TERM, KILL, INT, HUP, QUIT, USR1, USR2) nor none"
            ))
        }
    };
    Ok(OnLoss::Signal(signal.0, signal.1))
}

/// How long to wait for a lock someone else holds.
#[derive(Clone, Copy)]
pub struct Patience {
    deadline: Option<Instant>,
    asked: Option<Duration>,
}

impl Patience {
    /// When to look at the clock again while waiting: in a second, or at the deadline.
    pub fn next_check(&self) -> Instant {
        let soon = Instant::now() + Duration::from_secs(1);
        self.deadline.map_or(soon, |deadline| deadline.min(soon))
    }

    /// Fail when the lock is still held by someone else after the deadline.
    pub fn check(&self, name: &str) -> anyhow::Result<()> {
        if let (Some(deadline), Some(asked)) = (self.deadline, self.asked) {
            if Instant::now() >= deadline {
                bail!("lock {name:?} is still held by someone else after --wait {asked:?}");
            }
        }
        Ok(())
    }
}

/// A lock this process holds, kept alive by [`keep`] and released at the end.
pub trait Held: Send {
    /// The fencing token, as COMMAND receives it.
    fn token(&self) -> &str;
    /// How long the service keeps the lock without a renewal.
    fn ttl(&self) -> Duration;
    /// Renew the lease, session or key once.
    fn renew(&mut self) -> Result<(), Renewal>;
    /// Give the lock back, only if it is still ours.
    fn release(self: Box<Self>) -> anyhow::Result<()>;
}

/// Why a renewal failed.
#[derive(Debug)]
pub enum Renewal {
    /// The service says the lock is no longer ours: the lease, session or key expired
    /// or was taken away.
    Lost(String),
    /// The service could not be asked; the lock may still be ours until its TTL runs out.
    Unreachable(String),
}

/// Run the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let ttl = args.ttl;
    let patience = Patience { deadline: args.wait.map(|wait| Instant::now() + wait), asked: args.wait };
    let held: Box<dyn Held> = if let Some(address) = &args.etcd {
        let options = args.etcd_connection.options()?;
        let endpoint = args.etcd_connection.endpoint(address);
        Box::new(etcd::acquire(&endpoint, &options, &args.name, ttl, patience)?)
    } else if let Some(address) = &args.zookeeper {
        Box::new(zookeeper::acquire(address, &args.name, ttl, patience)?)
    } else if let Some(address) = &args.redis {
        Box::new(redis::acquire(address, &args.name, ttl, patience)?)
    } else {
        bail!("name a lock service: --etcd, --zookeeper or --redis");
    };
    let runtime =
        tokio::runtime::Builder::new_current_thread().enable_all().build().context("starting the async runtime")?;
    runtime.block_on(supervise(&args, held))
}

/// Run COMMAND while the lock is kept; release it when COMMAND exits.
async fn supervise(args: &Args, mut held: Box<dyn Held>) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let token = held.token().to_owned();
    let (program, rest) = args.command.split_first().context("no COMMAND to run")?;
    let mut command = tokio::process::Command::new(program);
    command.args(rest).env(TOKEN_ENV, &token);
    if let Some(resource) = &args.resource {
        command.env(RESOURCE_ENV, resource);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            let _ = held.release();
            bail!("cannot run {program:?}: {e}; the lock is released");
        }
    };
    let pid = child.id().and_then(|id| Pid::from_raw(i32::try_from(id).ok()?));

    let (lost_tx, mut lost_rx) = tokio::sync::oneshot::channel::<String>();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let keeper = std::thread::spawn(move || {
        if let Some(why) = keep(held.as_mut(), &stop_rx) {
            let _ = lost_tx.send(why);
        }
        held
    });

    let mut terminate = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
    let mut hangup = signal(SignalKind::hangup()).context("installing a SIGHUP handler")?;
    // Ctrl-C reaches COMMAND from the terminal (same process group): wait for it to
    // finish and release, rather than die holding the lock.
    let mut interrupt = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
    let (mut lost, mut keeper_done) = (false, false);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status.context("waiting for COMMAND")?,
            why = &mut lost_rx, if !keeper_done => {
                keeper_done = true;
                if let Ok(why) = why {
                    lost = true;
                    report_loss(args, &token, &why, pid);
                }
            }
            _ = terminate.recv() => send(pid, Signal::TERM),
            _ = hangup.recv() => send(pid, Signal::HUP),
            _ = interrupt.recv() => {}
        }
    };
    drop(stop_tx);
    let mut held = keeper.join().map_err(|_| anyhow::anyhow!("the keep-alive thread panicked"))?;
    // The command can end before the keep-alive's next renewal would have seen the
    // loss (both were paused past the lease, and the command finished first once
    // resumed): one last renewal says whether the lock was still held when it ended.
    if !lost {
        if let Err(Renewal::Lost(why)) = held.renew() {
            lost = true;
            let name = &args.name;
            eprintln!("fencekeeper: lost lock {name:?} (token {token}) while the command ran: {why}; the command had already exited");
        }
    }
    if let Err(e) = held.release() {
        if !lost {
            eprintln!("fencekeeper: releasing lock {:?}: {e:#}; it expires by itself within its TTL", args.name);
        }
    }
    if lost {
        return Ok(ExitCode::from(LOST));
    }
    let code = status.code().or_else(|| status.signal().map(|s| 128 + s)).unwrap_or(1);
    Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
}

fn report_loss(args: &Args, token: &str, why: &str, pid: Option<Pid>) {
    let action = match args.on_loss {
        OnLoss::Signal(signal, name) => {
            send(pid, signal);
            format!("sent {name} to the command")
        }
        OnLoss::Nothing => "the command runs on (--on-loss none)".to_owned(),
    };
    eprintln!("fencekeeper: lost lock {:?} (token {token}) while the command ran: {why}; {action}", args.name);
}

fn send(pid: Option<Pid>, signal: Signal) {
    if let Some(pid) = pid {
        // The command may have exited already: nothing to tell it then.
        let _ = kill_process(pid, signal);
    }
}

/// Renew the lock a third of its TTL apart until `stop` is dropped (None) or the lock
/// is lost (Some(why)). An unreachable service is retried until a whole TTL has passed
/// since the last renewal the service confirmed; after that nothing says the lock is
/// still ours.
fn keep(held: &mut dyn Held, stop: &Receiver<()>) -> Option<String> {
    let ttl = held.ttl();
    let period = (ttl / 3).max(Duration::from_millis(100));
    let mut confirmed = Instant::now();
    loop {
        match stop.recv_timeout(period) {
            Err(RecvTimeoutError::Timeout) => {}
            _ => return None,
        }
        match held.renew() {
            Ok(()) => confirmed = Instant::now(),
            Err(Renewal::Lost(why)) => return Some(why),
            Err(Renewal::Unreachable(why)) if confirmed.elapsed() >= ttl => {
                return Some(format!("no renewal confirmed for {} s: {why}", ttl.as_secs()))
            }
            Err(Renewal::Unreachable(_)) => {}
        }
    }
}

/// A TCP connection to `service` at `address` (`HOST:PORT`), with no delay on small
/// writes and bounded connect and write times.
pub fn connect(address: &str, service: &str) -> anyhow::Result<std::net::TcpStream> {
    use std::net::ToSocketAddrs;
    let addr = address
        .to_socket_addrs()
        .with_context(|| format!("{service} address {address:?} (expected HOST:PORT)"))?
        .next()
        .with_context(|| format!("{service} address {address:?} resolves to nothing"))?;
    let stream = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .with_context(|| format!("connecting to {service} at {address}"))?;
    stream.set_nodelay(true)?;
    stream.set_write_timeout(Some(Duration::from_secs(3)))?;
    Ok(stream)
}

/// A value no other client uses: it names this holder in the lock service.
pub fn unique_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // std seeds each RandomState from the OS's random source.
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("fencekeeper-{}-{nanos:x}-{:016x}", std::process::id(), hasher.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_loss_takes_signal_names_with_or_without_sig_and_none() {
        assert!(matches!(parse_on_loss("SIGTERM"), Ok(OnLoss::Signal(s, "SIGTERM")) if s == Signal::TERM));
        assert!(matches!(parse_on_loss("kill"), Ok(OnLoss::Signal(s, "SIGKILL")) if s == Signal::KILL));
        assert!(matches!(parse_on_loss("none"), Ok(OnLoss::Nothing)));
        assert!(parse_on_loss("SIGSEGV").is_err());
    }

    #[test]
    fn unique_ids_differ() {
        assert_ne!(unique_id(), unique_id());
    }
}

/// `--wait`: seconds (`30`) or a duration (`30s`, `2m`).
fn parse_wait(text: &str) -> Result<Duration, String> {
    match text.trim().parse::<u64>() {
        Ok(seconds) => Ok(Duration::from_secs(seconds)),
        Err(_) => crate::serve::parse_duration(text),
    }
}

/// `--ttl`: [`parse_wait`]'s forms, in whole seconds (a fraction rounds up: an etcd
/// lease is granted in seconds), 1 s to a day.
fn parse_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_wait(text)?;
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    if !(1..=86_400).contains(&seconds) {
        return Err(format!("{text:?} is out of range: 1s to 1d"));
    }
    Ok(Duration::from_secs(seconds))
}

#[cfg(test)]
mod duration_tests {
    use super::*;

    #[test]
    fn ttl_and_wait_take_seconds_or_durations() {
        assert_eq!(parse_ttl("10"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_ttl("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_ttl("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_ttl("1500ms"), Ok(Duration::from_secs(2)), "rounded up to whole seconds");
        for bad in ["0", "0s", "2d", "ten"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_wait("0"), Ok(Duration::ZERO));
        assert_eq!(parse_wait("500ms"), Ok(Duration::from_millis(500)));
    }
}
