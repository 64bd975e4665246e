//! The fencing gateway (`fencekeeper serve`) as a child process for tests, a client
//! that sees response headers, and an upstream store the test controls.

use crate::services::{free_port, http, wait_until, Process, WorkDir};
use crate::workspace_bin;
use anyhow::{bail, Context, Result};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A running gateway on loopback; SIGKILLed when dropped.
pub struct Gateway {
    /// The process.
    pub process: Process,
    /// Where clients connect.
    pub addr: SocketAddr,
    /// The admin listener (`/metrics`, marks, health).
    pub admin: SocketAddr,
    /// The embedded mark store's file (unused with `--etcd`).
    pub store: PathBuf,
    args: Vec<String>,
    dir: WorkDir,
}

impl Gateway {
    /// Start `fencekeeper serve --upstream <upstream> <extra...>` on free ports, with
    /// its mark file in a fresh directory, and wait until `/healthz` answers.
    pub fn start(upstream: &str, extra: &[&str]) -> Result<Gateway> {
        let dir = WorkDir::temporary()?;
        let store = dir.path().join("marks.redb");
        Self::start_in(dir, store, upstream, extra)
    }

    /// [`Gateway::start`] with its log (`gateway.log`) in `dir`, and the mark file `store`
    /// (to keep it, share it, or corrupt it first).
    pub fn start_in(dir: WorkDir, store: PathBuf, upstream: &str, extra: &[&str]) -> Result<Gateway> {
        Self::launch(dir, store, upstream, extra, true)
    }

    /// [`Gateway::start`] with the gateway's own default provenance check (weak
    /// with `--etcd`), for tokens that are etcd revisions.
    pub fn start_with_default_provenance(upstream: &str, extra: &[&str]) -> Result<Gateway> {
        let dir = WorkDir::temporary()?;
        let store = dir.path().join("marks.redb");
        Self::launch(dir, store, upstream, extra, false)
    }

    fn launch(dir: WorkDir, store: PathBuf, upstream: &str, extra: &[&str], made_up_tokens: bool) -> Result<Gateway> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut args: Vec<String> =
            ["serve", "--upstream", upstream, "--listen", &addr.to_string(), "--admin", &admin.to_string()]
                .iter()
                .map(|s| s.to_string())
                .collect();
        // Marks in etcd, or where a settings file says.
        if !extra.contains(&"--etcd") && !extra.contains(&"--config") {
            args.extend(["--store".to_owned(), store.display().to_string()]);
        }
        // Most tests' tokens are made up, not revisions of their etcd: no provenance
        // check unless a test asks for one (the gateway's default with etcd is the weak
        // check: [`Gateway::start_with_default_provenance`]).
        if made_up_tokens && extra.contains(&"--etcd") && !extra.contains(&"--provenance") {
            args.extend(["--provenance".to_owned(), "off".to_owned()]);
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let process = Self::spawn(&args, &dir)?;
        let mut gateway = Gateway { process, addr, admin, store, args, dir };
        gateway.wait_ready()?;
        Ok(gateway)
    }

    fn spawn(args: &[String], dir: &WorkDir) -> Result<Process> {
        let mut cmd = Command::new(workspace_bin("fencekeeper")?);
        cmd.args(args).env("RUST_LOG", "info");
        Process::spawn("fencekeeper serve", cmd, &dir.path().join("gateway.log"))
    }

    fn wait_ready(&mut self) -> Result<()> {
        let admin = self.admin;
        wait_until(&mut self.process, Duration::from_secs(30), || {
            matches!(http(admin, "GET", "/healthz", &[], b""), Ok((200, _)))
        })
    }

    /// True once the gateway admits fenced writes (`/readyz`: its start grace is over).
    pub fn ready_for_writes(&self) -> bool {
        matches!(http(self.admin, "GET", "/readyz", &[], b""), Ok((200, _)))
    }

    /// SIGKILL the gateway (no chance to finish anything).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Start it again with the same arguments, ports and mark store.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        self.process = Self::spawn(&self.args, &self.dir)?;
        self.wait_ready()
    }

    /// SIGTERM the gateway and wait (at most `within`) for it to exit.
    pub fn terminate(&mut self, within: Duration) -> Result<ExitStatus> {
        self.process.signal("TERM")?;
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.process.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!("gateway still running {within:?} after SIGTERM:\n{}", self.process.log_tail());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The gateway's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.process.log).unwrap_or_default()
    }

    /// The base URL clients use, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A sample of `/metrics` by its full name with labels, e.g.
    /// `fencekeeper_gateway_requests_total{class="stale"}`.
    pub fn metric(&self, name: &str) -> Result<u64> {
        let (status, body) = http(self.admin, "GET", "/metrics", &[], b"")?;
        anyhow::ensure!(status == 200, "/metrics answered {status}");
        let text = String::from_utf8(body)?;
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .with_context(|| format!("no metric {name}"))?;
        Ok(line.split_whitespace().nth(1).context("no value")?.parse::<f64>()? as u64)
    }

    /// A resource's mark through the admin lookup (None: no mark).
    pub fn mark(&self, resource: &str) -> Result<Option<String>> {
        let (status, body) = http(self.admin, "GET", &format!("/fencekeeper/marks/{resource}"), &[], b"")?;
        let text = String::from_utf8(body)?.trim().to_owned();
        match status {
            200 => Ok(Some(text)),
            404 => Ok(None),
            _ => bail!("mark lookup answered {status}: {text}"),
        }
    }

    /// `PUT path` with an optional fencing token, through the gateway.
    pub fn put(&self, path: &str, token: Option<&str>, body: &[u8]) -> Result<Reply> {
        let headers: Vec<(&str, &str)> = token.map(|t| ("fencing-token", t)).into_iter().collect();
        request(&self.url(), "PUT", path, &headers, body)
    }
}

/// `fencekeeper serve ARGS...` that is expected not to start (an upstream nothing
/// listens on, free ports, a fresh mark file): (exit code, the last stderr line, all
/// of stderr).
pub fn start_up_error(args: &[&str]) -> Result<(Option<i32>, String, String)> {
    start_up_error_in_front_of("127.0.0.1:9", args)
}

/// [`start_up_error`] in front of `upstream`.
pub fn start_up_error_in_front_of(upstream: &str, args: &[&str]) -> Result<(Option<i32>, String, String)> {
    let dir = WorkDir::temporary()?;
    let store = dir.path().join("marks.redb").display().to_string();
    let out = Command::new(workspace_bin("fencekeeper")?)
        .args(["serve", "--upstream", upstream, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--store", &store])
        .args(args)
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    Ok((out.status.code(), last, stderr))
}

/// An HTTP answer with its headers.
#[derive(Debug)]
pub struct Reply {
    /// The status code.
    pub status: u16,
    /// A header's value, when present, by lower-case name.
    pub headers: Vec<(String, String)>,
    /// The body, as text.
    pub body: String,
}

impl Reply {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }
}

/// One request with ureq (keep-alive, headers visible), never failing on a status.
pub fn request(base: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Result<Reply> {
    thread_local! {
        static AGENT: ureq::Agent = ureq::Agent::new_with_config(
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(30))).build(),
        );
    }
    let mut builder = ureq::http::Request::builder().method(method).uri(format!("{base}{path}"));
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    let req = builder.body(body.to_vec())?;
    let mut response = AGENT.with(|agent| agent.run(req))?;
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let status = response.status().as_u16();
    let body = response.body_mut().read_to_string().unwrap_or_default();
    Ok(Reply { status, headers, body })
}

/// One write the upstream applied: in the order it applied them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The request path (the resource, for path resources).
    pub path: String,
    /// The `fencing-admitted-token` header the gateway added.
    pub token: String,
    /// The body.
    pub body: Vec<u8>,
}

#[derive(Default)]
struct Shared {
    applied: Vec<Applied>,
    hold: HashSet<String>,
    held: HashSet<String>,
    /// Tokens whose writes get their connection reset on arrival, and are applied
    /// anyway once released: a store that drops the exchange but not the write.
    reset: HashSet<String>,
}

/// A store that accepts any write and records the order it applied them in; writes
/// carrying a chosen token can be held (not applied, not answered) until released.
pub struct RecordingUpstream {
    /// Where it listens.
    pub addr: SocketAddr,
    shared: Arc<(Mutex<Shared>, Condvar)>,
}

impl RecordingUpstream {
    /// Start it on a free loopback port; its threads end with the test process.
    pub fn start() -> Result<RecordingUpstream> {
        Self::start_jittered(Duration::ZERO)
    }

    /// [`RecordingUpstream::start`], taking a pseudo-random 0..`jitter` before applying
    /// each write, so that concurrent writes reach the store in shuffled order.
    pub fn start_jittered(jitter: Duration) -> Result<RecordingUpstream> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let shared: Arc<(Mutex<Shared>, Condvar)> = Arc::default();
        let s = shared.clone();
        std::thread::spawn(move || {
            for (n, stream) in listener.incoming().flatten().enumerate() {
                let s = s.clone();
                std::thread::spawn(move || serve(stream, &s, jitter, n as u64));
            }
        });
        Ok(RecordingUpstream { addr, shared })
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Hold writes admitted with `token` until [`RecordingUpstream::release`].
    pub fn hold(&self, token: &str) {
        self.lock().hold.insert(token.to_owned());
    }

    /// Hold writes admitted with `token`, and reset their connection as they arrive
    /// (the proxy sees the exchange fail): the store still applies them once
    /// [`RecordingUpstream::release`]d, as a store does that received a write whose
    /// answer it could not send.
    pub fn hold_and_reset(&self, token: &str) {
        let mut s = self.lock();
        s.hold.insert(token.to_owned());
        s.reset.insert(token.to_owned());
    }

    /// Apply and answer the held writes with `token`.
    pub fn release(&self, token: &str) {
        self.lock().hold.remove(token);
        self.shared.1.notify_all();
    }

    /// Wait (at most 10 s) until a write with `token` has arrived and is being held.
    pub fn wait_held(&self, token: &str) -> Result<()> {
        self.wait(|s| s.held.contains(token)).with_context(|| format!("no write with token {token} arrived"))
    }

    /// Whether a write with `token` arrives and is held within `within`.
    pub fn wait_held_for(&self, token: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut shared = self.lock();
        while !shared.held.contains(token) {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
            shared = match self.shared.1.wait_timeout(shared, left) {
                Ok((s, _)) => s,
                Err(_) => return false,
            };
        }
        true
    }

    /// Every write applied so far, in order.
    pub fn applied(&self) -> Vec<Applied> {
        self.lock().applied.clone()
    }

    /// The tokens of the writes applied so far, in the order the store applied them:
    /// what the gate tests' "never lands after a higher one" is asserted on.
    pub fn tokens(&self) -> Vec<String> {
        self.lock().applied.iter().map(|a| a.token.clone()).collect()
    }

    fn wait(&self, done: impl Fn(&Shared) -> bool) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut shared = self.lock();
        while !done(&shared) {
            let left = deadline.checked_duration_since(Instant::now()).context("timed out")?;
            shared = self.shared.1.wait_timeout(shared, left).map_err(|_| anyhow::anyhow!("poisoned"))?.0;
        }
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared> {
        self.shared.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One keep-alive connection: read a request, hold it if asked, apply, answer.
fn serve(stream: TcpStream, shared: &(Mutex<Shared>, Condvar), jitter: Duration, seed: u64) {
    let _ = stream.set_nodelay(true);
    let mut random = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    loop {
        let mut head = String::new();
        let mut line = String::new();
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => head.push_str(&line),
            }
        }
        let header = |name: &str| {
            head.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.trim().eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
            })
        };
        let length: usize = header("content-length").and_then(|v| v.parse().ok()).unwrap_or(0);
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let path = head.split_whitespace().nth(1).unwrap_or_default().to_owned();
        let token = header("fencing-admitted-token").unwrap_or_default();
        if !jitter.is_zero() {
            // xorshift: cheap, deterministic per connection.
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            std::thread::sleep(jitter.mul_f64((random % 1000) as f64 / 1000.0));
        }
        {
            let (lock, changed) = shared;
            let mut s = lock.lock().unwrap_or_else(|p| p.into_inner());
            s.held.insert(token.clone());
            if s.reset.contains(&token) {
                // SO_LINGER 0 would be a true RST; a shutdown is what the proxy sees as
                // the upstream resetting before its response started.
                let _ = writer.shutdown(std::net::Shutdown::Both);
            }
            changed.notify_all();
            while s.hold.contains(&token) {
                s = changed.wait(s).unwrap_or_else(|p| p.into_inner());
            }
            s.applied.push(Applied { path, token, body });
            changed.notify_all();
        }
        if writer.write_all(b"HTTP/1.1 201 Created\r\ncontent-length: 0\r\n\r\n").is_err() {
            return;
        }
    }
}
