//! A lock holder for the token tests: a lock client process (`fencekeeper lock`,
//! `etcdctl lock`, kazoo, redis-cli) whose command is `fencekeeper-lock-worker`, and
//! the paused-holder story told with two of them.
//!
//! The worker reports on stdout (`holding TOKEN pid PID`, then `wrote STATUS` twice);
//! the client's stderr goes to a file. Between its two writes the worker waits for a
//! file this handle creates ([`Holder::go`]), so a test decides when a late write is
//! sent. Everything waited for is a line the worker prints, bounded in time.

use crate::gateway::Gateway;
use crate::services::{freeze, kill_child_tree, NginxDav};
use anyhow::{bail, ensure, Context, Result};
use fencekeeper_core::Token;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

/// How long a holder may take to acquire: a lease or session must expire first.
pub const ACQUIRE_WITHIN: Duration = Duration::from_secs(60);

/// A lock client running the worker.
pub struct Holder {
    /// Its name in messages.
    pub name: String,
    /// The lock client process.
    pub child: Child,
    /// The token the worker received.
    pub token: String,
    /// The worker's process id (the client's own, when the client execs it).
    pub worker: u32,
    lines: Receiver<String>,
    /// A line read ahead by [`Holder::has_acquired`].
    pending: Option<String>,
    stderr: PathBuf,
    go: PathBuf,
    _dir: tempfile::TempDir,
}

impl Holder {
    /// Spawn `client` (its command the worker) and wait until the worker says it holds
    /// the lock, at most `within`.
    pub fn start(name: &str, client: Command, within: Duration) -> Result<Holder> {
        let mut holder = Self::spawn(name, client)?;
        holder.acquired(within)?;
        Ok(holder)
    }

    /// Spawn `client` without waiting for it to acquire: see [`Holder::acquired`].
    pub fn spawn(name: &str, mut client: Command) -> Result<Holder> {
        let dir = tempfile::tempdir()?;
        let (stderr, go) = (dir.path().join("stderr"), dir.path().join("go"));
        let mut child = client
            .env("FK_WORKER_GO", &go)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&stderr)?)
            .spawn()
            .with_context(|| format!("starting {name} ({:?}); run scripts/install-deps.sh", client.get_program()))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (send, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let holder = Holder {
            name: name.to_owned(),
            child,
            token: String::new(),
            worker: 0,
            lines,
            pending: None,
            stderr,
            go,
            _dir: dir,
        };
        Ok(holder)
    }

    /// Wait (at most `within`) until the worker says it holds the lock.
    pub fn acquired(&mut self, within: Duration) -> Result<()> {
        let line = self.line(within)?;
        let words: Vec<&str> = line.split_whitespace().collect();
        let ["holding", token, "pid", pid] = words.as_slice() else {
            bail!("{}: expected `holding TOKEN pid PID`, got {line:?}; stderr: {}", self.name, self.stderr());
        };
        self.token = (*token).to_owned();
        self.worker = pid.parse()?;
        Ok(())
    }

    /// True if the worker has said it holds the lock, without waiting.
    pub fn has_acquired(&mut self) -> bool {
        if self.pending.is_none() {
            self.pending = self.lines.try_recv().ok();
        }
        self.pending.as_deref().is_some_and(|line| line.starts_with("holding"))
    }

    /// The status of the worker's next write (at most 30 s).
    pub fn wrote(&mut self) -> Result<u16> {
        let line = self.line(Duration::from_secs(30))?;
        let status =
            line.strip_prefix("wrote ").with_context(|| format!("{}: expected `wrote`, got {line:?}", self.name))?;
        Ok(status.parse()?)
    }

    /// Let the worker send its second write.
    pub fn go(&self) -> Result<()> {
        Ok(std::fs::write(&self.go, b"go")?)
    }

    /// Freeze the client, then the worker (SIGSTOP, every thread stopped): the lease
    /// is no longer renewed, and nothing is written.
    pub fn freeze(&self) -> Result<()> {
        freeze(self.child.id())?;
        freeze(self.worker)
    }

    /// Resume the client and the worker (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        for pid in [self.child.id(), self.worker] {
            let status = Command::new("kill").arg("-CONT").arg(pid.to_string()).status()?;
            anyhow::ensure!(status.success(), "kill -CONT {pid} failed");
        }
        Ok(())
    }

    /// Wait (at most 30 s) for the client to exit.
    pub fn exit(&mut self) -> Result<ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("{} still running 30 s on; stderr: {}", self.name, self.stderr());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The second write and the exit: (its status, the client's exit status).
    pub fn finish(&mut self) -> Result<(u16, ExitStatus)> {
        self.go()?;
        let status = self.wrote()?;
        Ok((status, self.exit()?))
    }

    /// What the client printed on stderr.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn line(&mut self, within: Duration) -> Result<String> {
        if let Some(line) = self.pending.take() {
            return Ok(line);
        }
        let deadline = Instant::now() + within;
        loop {
            // A client that exited has said all it will: fail now, not at the deadline.
            let exited = self.child.try_wait()?;
            let wait = if exited.is_some() { Duration::from_millis(100) } else { Duration::from_millis(50) };
            if let Ok(line) = self.lines.recv_timeout(wait) {
                return Ok(line);
            }
            if exited.is_some() || Instant::now() > deadline {
                let state = exited.map_or("still running".to_owned(), |s| s.to_string());
                bail!("{}: nothing reported within {within:?} ({state}); stderr: {}", self.name, self.stderr());
            }
        }
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        // The worker is the client's descendant (or the client itself, exec'd): it
        // goes with the client's whole tree.
        kill_child_tree(&mut self.child);
    }
}

/// What the paused-holder story saw.
pub struct Paused {
    /// The holder that was paused: it has exited.
    pub a: Holder,
    /// The holder that took over: it still holds the lock, its second write not sent.
    pub b: Holder,
    /// A's first write, while it held the lock.
    pub a_first: u16,
    /// B's first write.
    pub b_first: u16,
    /// A's write after it was resumed, with its old token.
    pub a_late: u16,
    /// How A's lock client exited.
    pub a_exit: ExitStatus,
    /// From A's freeze to B's acquisition: the lease or session running out.
    pub b_waited: Duration,
}

impl Paused {
    /// What the story shows whatever the lock service: both first writes were stored;
    /// B acquired only `at_least` after A froze (A's lease had to run out: the two
    /// clients exclude each other); B's token is above A's; A's late write was refused
    /// with 409.
    pub fn check_fenced(&self, at_least: Duration) -> Result<()> {
        ensure!(stored(self.a_first) && stored(self.b_first), "first writes: A {} B {}", self.a_first, self.b_first);
        ensure!(self.b_waited >= at_least, "B acquired {:?} after A froze: A's lock did not hold", self.b_waited);
        let (a, b) = (token(&self.a.token)?, token(&self.b.token)?);
        ensure!(b > a, "B's token {b} is not above A's {a}");
        ensure!(self.a_late == 409, "A's late write with token {a} was answered {}", self.a_late);
        Ok(())
    }

    /// B writes again and releases the lock; the store keeps B's second write, and the
    /// resource's mark is B's token.
    pub fn finish_b(&mut self, nginx: &NginxDav, gateway: &Gateway, resource: &str) -> Result<()> {
        let (status, exit) = self.b.finish()?;
        ensure!(stored(status), "B's second write was answered {status}");
        ensure!(exit.success(), "B's lock client: {exit}; {}", self.b.stderr());
        let kept = String::from_utf8(nginx.read(resource).context("the store lost the resource")?)?;
        ensure!(kept == format!("B wrote its second write with token {}\n", self.b.token), "the store holds {kept:?}");
        let mark = gateway.mark(resource)?;
        ensure!(mark.as_deref() == Some(self.b.token.as_str()), "the mark is {mark:?}, not B's {}", self.b.token);
        Ok(())
    }
}

/// The store took the write: 201 (created) or 204 (replaced).
pub fn stored(status: u16) -> bool {
    status == 201 || status == 204
}

/// A token a holder was given.
pub fn token(text: &str) -> Result<Token> {
    Token::parse(text).map_err(|e| anyhow::anyhow!("{text:?} is not a token: {e}"))
}

/// The seeds' story with real processes: A acquires and writes; A (client and worker)
/// is frozen past its lease; B acquires (only once A's lease or session has expired)
/// and writes; A is resumed and writes again with its old token; A exits. B still
/// holds the lock when this returns ([`Holder::finish`] ends it).
pub fn pause_past_lease(a: Command, b: Command) -> Result<Paused> {
    let mut a = Holder::start("A", a, ACQUIRE_WITHIN)?;
    let a_first = a.wrote()?;
    a.freeze()?;
    let frozen = Instant::now();
    let mut b = Holder::start("B", b, ACQUIRE_WITHIN)?;
    let b_waited = frozen.elapsed();
    let b_first = b.wrote()?;
    a.thaw()?;
    a.go()?;
    let a_late = a.wrote()?;
    let a_exit = a.exit()?;
    Ok(Paused { a, b, a_first, b_first, a_late, a_exit, b_waited })
}

/// The worker's command line, writing through `target` as `name` (`extra`: its
/// `--resource R`, `--token-from VAR`).
pub fn worker(target: &str, name: &str, extra: &[&str]) -> Result<Vec<String>> {
    let mut line = vec![crate::workspace_bin("fencekeeper-lock-worker")?.display().to_string()];
    line.extend(["--target", target].iter().chain(extra).map(|s| s.to_string()));
    line.push(name.to_owned());
    Ok(line)
}

/// `fencekeeper lock LOCK_ARGS... -- COMMAND...`.
pub fn fencekeeper_lock(lock_args: &[&str], command: &[String]) -> Result<Command> {
    let mut cmd = Command::new(crate::workspace_bin("fencekeeper")?);
    cmd.arg("lock").args(lock_args).arg("--").args(command);
    Ok(cmd)
}

/// A worker's report to its [`Holder`]: one line on stdout, flushed at once.
pub fn report(line: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}")?;
    Ok(out.flush()?)
}

/// In a worker: wait until the file named by `FK_WORKER_GO` exists ([`Holder::go`]
/// creates it), at most 2 minutes.
pub fn await_go(go: &std::path::Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    while !go.exists() {
        ensure!(Instant::now() < deadline, "{} did not appear", go.display());
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
