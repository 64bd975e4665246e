//! Real services for tests, each a child process on loopback that dies with its handle.
//!
//! Readiness is always checked (a health request or a TCP accept), never slept for.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free TCP port on 127.0.0.1 (bound, then released for the service to take).
///
/// Tests in one binary run in parallel, and a port that was free and released can be
/// handed out again before its service binds it: then two services share a port and a
/// readiness check answers for the wrong one (seen in CI: nginx's PUT reset by etcd's
/// listener). So this process never hands out the same port twice.
///
/// The port is taken below the kernel's ephemeral range (`ip_local_port_range`), where
/// the kernel never picks the source port of an outgoing connection: a port from the
/// range itself (`bind` to port 0) could become some test client's source port between
/// its release here and the service's bind (seen under load: Envoy's "Address already
/// in use"). Without room below the range, it falls back to the kernel's choice.
pub fn free_port() -> Result<u16> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    let (low, high) = below_ephemeral();
    // Spread across processes (several test binaries, torture) by the pid and clock.
    let seed = u64::from(std::process::id()).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    for i in 0..200u64 {
        let port = if high > low {
            let span = u64::from(high - low);
            low + ((seed.wrapping_add(i.wrapping_mul(7919))) % span) as u16
        } else {
            TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()
        };
        if given.contains(&port) || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        given.push(port);
        return Ok(port);
    }
    bail!("no fresh loopback port after 200 tries")
}

/// Ports for services: from 10000 up to the start of the ephemeral range, when the
/// range leaves at least a thousand of them (else empty).
fn below_ephemeral() -> (u16, u16) {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let start = range.split_whitespace().next().and_then(|s| s.parse::<u16>().ok()).unwrap_or(0);
    if start >= 11_000 {
        (10_000, start)
    } else {
        (0, 0)
    }
}

/// A child process killed (SIGKILL) and reaped when dropped, with every process it
/// started: see [`kill_tree`].
pub struct Process {
    /// The child.
    pub child: Child,
    /// What it is, for messages.
    pub name: String,
    /// Where its output goes.
    pub log: PathBuf,
}

impl Process {
    /// Spawn `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Process> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let err = out.try_clone()?;
        let child =
            cmd.stdin(Stdio::null()).stdout(Stdio::from(out)).stderr(Stdio::from(err)).spawn().with_context(|| {
                format!("starting {name} ({:?}); is it installed? run scripts/install-deps.sh", cmd.get_program())
            })?;
        Ok(Process { child, name: name.to_owned(), log: log.to_owned() })
    }

    /// The tail of the log, for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Fail if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited ({status}):\n{}", self.name, self.log_tail());
        }
        Ok(())
    }

    /// Send a signal (e.g. `SIGSTOP`, `SIGCONT`, `SIGTERM`) by name to the process.
    pub fn signal(&self, signal: &str) -> Result<()> {
        let status = Command::new("kill").arg(format!("-{signal}")).arg(self.child.id().to_string()).status()?;
        if !status.success() {
            bail!("kill -{signal} {} failed", self.name);
        }
        Ok(())
    }

    /// Freeze the process: see [`freeze`].
    pub fn freeze(&self) -> Result<()> {
        freeze(self.child.id())
    }

    /// Kill (SIGKILL) the process and its descendants ([`kill_tree`]), and reap it.
    pub fn kill(&mut self) {
        kill_child_tree(&mut self.child);
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        // A failing test shows what its services said last (libtest prints a failed
        // test's output): whether each one had exited, and the tail of its log.
        if std::thread::panicking() {
            let state = match self.child.try_wait() {
                Ok(Some(status)) => format!("had exited ({status})"),
                _ => "was running".to_owned(),
            };
            eprintln!("--- {} {state}; the end of its log ({}):\n{}", self.name, self.log.display(), self.log_tail());
        }
        self.kill();
    }
}

/// Kill (SIGKILL) `child` and every process descended from it ([`kill_tree`]), and
/// reap it.
pub fn kill_child_tree(child: &mut Child) {
    // Only a child not yet reaped: the number of one reaped may be another process's now.
    if matches!(child.try_wait(), Ok(None)) {
        kill_tree(child.id());
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// Kill (SIGKILL) process `pid` and every process descended from it, and wait (at most
/// 5 s) until none of them runs. A service that forks (httpd's workers, PostgreSQL's
/// backends, Redis's background saves) leaves its children running when only it is
/// killed: handed to init, they keep their ports and outlive the test. Each process is
/// stopped (SIGSTOP) before its children are listed, so that it forks none unseen.
///
/// `pid` must not have been reaped (its number could be another process's by now).
/// The services stay in the test's process group, so that Ctrl-C still reaches them.
pub fn kill_tree(pid: u32) {
    let mut tree = vec![pid];
    let mut listed = 0;
    while listed < tree.len() {
        let parents = tree[listed..].to_vec();
        listed = tree.len();
        send("STOP", &parents);
        for &p in &parents {
            wait_for_tasks(p, Duration::from_secs(1), |state| matches!(state, 'T' | 't' | 'Z' | 'X'));
        }
        tree.extend(children_of(&parents));
    }
    send("KILL", &tree);
    for &p in &tree {
        wait_for_tasks(p, Duration::from_secs(5), |state| matches!(state, 'Z' | 'X'));
    }
}

/// `kill -SIGNAL PID...`; a process that has exited meanwhile is no error.
fn send(signal: &str, pids: &[u32]) {
    let _ = Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// The processes whose parent is one of `parents`, by the fourth field of /proc/PID/stat.
fn children_of(parents: &[u32]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let pids = entries.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    pids.filter(|pid| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let ppid = stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        ppid.is_some_and(|ppid| parents.contains(&ppid))
    })
    .collect()
}

/// Poll (at most `within`) until every thread of `pid` is in a state `done` accepts,
/// or the process is gone.
fn wait_for_tasks(pid: u32, within: Duration, done: impl Fn(char) -> bool) {
    let deadline = Instant::now() + within;
    while !task_states(pid).iter().all(|&state| done(state)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The state of each thread of `pid` (none once it is gone), from /proc/PID/task/*/stat.
fn task_states(pid: u32) -> Vec<char> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    tasks
        .filter_map(|task| {
            let stat = std::fs::read_to_string(task.ok()?.path().join("stat")).ok()?;
            // "TID (comm) STATE ...": comm may hold spaces and parentheses.
            stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next())
        })
        .collect()
}

/// Freeze process `pid` (SIGSTOP) and wait (at most 5 s) until every one of its threads
/// has stopped, so that it reads nothing more until SIGCONT: what is sent to it from
/// now on waits in its sockets.
pub fn freeze(pid: u32) -> Result<()> {
    let status = Command::new("kill").arg("-STOP").arg(pid.to_string()).status()?;
    anyhow::ensure!(status.success(), "kill -STOP {pid} failed");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !all_threads_stopped(pid)? {
        anyhow::ensure!(Instant::now() < deadline, "process {pid} not stopped 5 s after SIGSTOP");
        std::thread::sleep(Duration::from_millis(1));
    }
    Ok(())
}

/// True when every thread of `pid` is in state T (stopped), by /proc/PID/task/*/stat.
fn all_threads_stopped(pid: u32) -> Result<bool> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let stat = std::fs::read_to_string(task?.path().join("stat"))?;
        // "TID (comm) STATE ...": comm may hold spaces and parentheses; the state follows the last ')'.
        let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
        if state != Some('T') {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Poll `ready` every few milliseconds until it answers true or `timeout` passes,
/// failing early if `process` dies.
pub fn wait_until(process: &mut Process, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        process.check_alive()?;
        if Instant::now() > deadline {
            bail!("{} not ready after {timeout:?}:\n{}", process.name, process.log_tail());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Poll `ready` every few milliseconds until it answers true; fail after `timeout`,
/// saying what did not happen.
pub fn poll_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            bail!("{what}: not within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A minimal blocking HTTP/1.1 request on loopback, for readiness checks and test
/// assertions: returns (status, body). Sends `Connection: close`.
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<(u16, Vec<u8>)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    // One write: a server that answers from the headers alone (a refusal) and closes
    // with the body still unread sends a reset, which can discard its answer before
    // it is read; a body sent with the headers is read with them.
    let mut request = req.into_bytes();
    request.extend_from_slice(body);
    s.write_all(&request)?;
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        // A reset once the answer's head arrived (a server closing on an unread body)
        // keeps what was read, which the caller checks; before it, it is an error.
        let answered = raw.windows(4).any(|w| w == b"\r\n\r\n");
        if e.kind() != std::io::ErrorKind::ConnectionReset || !answered {
            return Err(e.into());
        }
    }
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").context("no HTTP header end")?;
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let status: u16 = head.split_whitespace().nth(1).context("no status")?.parse()?;
    let mut body = raw[split + 4..].to_vec();
    if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    Ok((status, body))
}

fn dechunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(end) = raw.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&raw[..end]).trim(), 16).unwrap_or(0);
        if size == 0 || raw.len() < end + 2 + size {
            break;
        }
        out.extend_from_slice(&raw[end + 2..end + 2 + size]);
        raw = &raw[(end + 4 + size).min(raw.len())..];
    }
    out
}

/// Where a service keeps its files: a temporary directory, removed with the handle, or
/// a directory the caller keeps (the demo's `--work-dir`, a benchmark's work area).
pub enum WorkDir {
    /// Removed when dropped.
    Temporary(tempfile::TempDir),
    /// Left in place.
    Kept(PathBuf),
}

impl WorkDir {
    /// A fresh temporary directory.
    pub fn temporary() -> Result<WorkDir> {
        Ok(WorkDir::Temporary(tempfile::tempdir()?))
    }

    /// `dir`, created if missing, and kept.
    pub fn kept(dir: &Path) -> Result<WorkDir> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(WorkDir::Kept(dir.to_owned()))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        match self {
            WorkDir::Temporary(dir) => dir.path(),
            WorkDir::Kept(dir) => dir,
        }
    }
}

/// A single-member etcd on loopback: data in `etcd/`, log in `etcd.log` of its directory.
pub struct Etcd {
    /// The process.
    pub process: Process,
    /// Client address (`http://` + this is the v3 JSON gateway too).
    pub client: SocketAddr,
    peer: SocketAddr,
    /// Flags added to etcd's command line (kept across [`Etcd::restart`]).
    extra: Vec<String>,
    /// The directory (kept across [`Etcd::restart`]).
    pub dir: WorkDir,
}

impl Etcd {
    /// Start etcd in a temporary directory and wait until it answers `/health`.
    pub fn start() -> Result<Etcd> {
        Self::start_in(WorkDir::temporary()?)
    }

    /// [`Etcd::start`] in `dir`.
    pub fn start_in(dir: WorkDir) -> Result<Etcd> {
        Self::start_with(dir, &[])
    }

    /// [`Etcd::start_in`] with `extra` flags on etcd's command line.
    pub fn start_with(dir: WorkDir, extra: &[&str]) -> Result<Etcd> {
        let client: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let peer: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let extra: Vec<String> = extra.iter().map(|s| (*s).to_owned()).collect();
        let process = Self::spawn(dir.path(), client, peer, &extra)?;
        let mut etcd = Etcd { process, client, peer, extra, dir };
        etcd.wait_ready()?;
        Ok(etcd)
    }

    /// Enable etcd's authentication: a root user (password `root-password`), and
    /// `user` with `password`, read-write on the keys under `prefixes` only.
    pub fn enable_auth(&self, user: &str, password: &str, prefixes: &[&str]) -> Result<()> {
        let ctl = |args: &[&str]| -> Result<()> {
            let out = Command::new("etcdctl")
                .env("ETCDCTL_API", "3")
                .arg(format!("--endpoints={}", self.url()))
                .args(args)
                .output()
                .context("running etcdctl")?;
            anyhow::ensure!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr).trim());
            Ok(())
        };
        add_users_and_enable_auth(&ctl, user, password, prefixes)
    }

    fn spawn(dir: &Path, client: SocketAddr, peer: SocketAddr, extra: &[String]) -> Result<Process> {
        let mut cmd = Command::new("etcd");
        cmd.arg("--name=fk")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls=http://{client}"))
            .arg(format!("--advertise-client-urls=http://{client}"))
            .arg(format!("--listen-peer-urls=http://{peer}"))
            .arg(format!("--initial-advertise-peer-urls=http://{peer}"))
            .arg(format!("--initial-cluster=fk=http://{peer}"))
            .arg("--log-level=warn")
            .args(extra);
        Process::spawn("etcd", cmd, &dir.join("etcd.log"))
    }

    fn wait_ready(&mut self) -> Result<()> {
        let client = self.client;
        wait_until(
            &mut self.process,
            Duration::from_secs(30),
            || matches!(http(client, "GET", "/health", &[], b""), Ok((200, body)) if String::from_utf8_lossy(&body).contains("true")),
        )
    }

    /// The client URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.client)
    }

    /// Stop etcd (SIGKILL); the data directory stays for [`Etcd::restart`].
    pub fn stop(&mut self) {
        self.process.kill();
    }

    /// Start etcd again on the same ports and data, and wait until it is healthy.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        self.process = Self::spawn(self.dir.path(), self.client, self.peer, &self.extra)?;
        self.wait_ready()
    }
}

/// With `ctl` running etcdctl as root: a root user (password `root-password`), and
/// `user` with `password`, read-write on the keys under `prefixes` only (role
/// `marks`); then authentication on.
pub(crate) fn add_users_and_enable_auth(
    ctl: &dyn Fn(&[&str]) -> Result<()>,
    user: &str,
    password: &str,
    prefixes: &[&str],
) -> Result<()> {
    ctl(&["user", "add", "root", "--new-user-password=root-password"])?;
    ctl(&["user", "grant-role", "root", "root"])?;
    ctl(&["user", "add", user, &format!("--new-user-password={password}")])?;
    ctl(&["role", "add", "marks"])?;
    for prefix in prefixes {
        ctl(&["role", "grant-permission", "marks", "--prefix=true", "readwrite", prefix])?;
    }
    ctl(&["user", "grant-role", user, "marks"])?;
    ctl(&["auth", "enable"])
}

/// nginx serving a directory with WebDAV PUT/DELETE: a real store that accepts any
/// write and cannot fence. Files written by PUT land in `data/` of its directory; its
/// configuration, logs and temporary files are in `nginx/`.
pub struct NginxDav {
    /// The process.
    pub process: Process,
    /// Where it listens.
    pub addr: SocketAddr,
    /// The served directory: files written by PUT land here.
    pub root: PathBuf,
    _dir: WorkDir,
}

impl NginxDav {
    /// Start nginx in a temporary directory and wait until it accepts a request.
    pub fn start() -> Result<NginxDav> {
        Self::start_in(WorkDir::temporary()?)
    }

    /// [`NginxDav::start`] in `dir`.
    pub fn start_in(dir: WorkDir) -> Result<NginxDav> {
        Self::start_serving(dir, None)
    }

    /// [`NginxDav::start`] serving TLS only, with this certificate and key (PEM).
    pub fn start_tls(cert: &Path, key: &Path) -> Result<NginxDav> {
        Self::start_serving(WorkDir::temporary()?, Some((cert, key)))
    }

    fn start_serving(dir: WorkDir, tls: Option<(&Path, &Path)>) -> Result<NginxDav> {
        let root = dir.path().join("data");
        let prefix = dir.path().join("nginx");
        std::fs::create_dir_all(&root)?;
        std::fs::create_dir_all(&prefix)?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let conf = prefix.join("nginx.conf");
        let d = prefix.display();
        std::fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\nworker_processes 1;\nerror_log {d}/error.log warn;\npid {d}/nginx.pid;\n\
                 events {{ worker_connections 1024; }}\n\
                 http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n\
                   fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
                   client_max_body_size 64m;\n\
                   server {{\n    listen {addr}{ssl};\n    root {root};\n    dav_methods PUT DELETE MKCOL COPY MOVE;\n\
                     create_full_put_path on;\n    dav_access user:rw group:rw all:r;\n    autoindex on;\n  }}\n}}\n",
                root = root.display(),
                ssl = match tls {
                    Some((cert, key)) => format!(
                        " ssl;\n    ssl_certificate {};\n    ssl_certificate_key {}",
                        cert.display(),
                        key.display()
                    ),
                    None => String::new(),
                },
            ),
        )?;
        let mut cmd = Command::new(nginx_binary());
        cmd.arg("-c").arg(&conf).arg("-p").arg(&prefix);
        let mut process = Process::spawn("nginx", cmd, &dir.path().join("nginx.log"))?;
        wait_until(&mut process, Duration::from_secs(20), || TcpStream::connect(addr).is_ok())?;
        Ok(NginxDav { process, addr, root, _dir: dir })
    }

    /// The base URL, `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The contents of a file the store holds, by its URL path.
    pub fn read(&self, path: &str) -> Option<Vec<u8>> {
        std::fs::read(self.root.join(path.trim_start_matches('/'))).ok()
    }
}

fn nginx_binary() -> PathBuf {
    // Debian installs nginx in /usr/sbin, which is not on every PATH.
    for p in ["/usr/sbin/nginx", "/usr/bin/nginx"] {
        if Path::new(p).exists() {
            return PathBuf::from(p);
        }
    }
    PathBuf::from("nginx")
}

/// ZooKeeper on loopback (Debian's `zookeeperd` jars): an ensemble of one member, so
/// that it elects itself leader at each start and zxid epochs move on as in a real
/// ensemble (a standalone server keeps epoch 0). A short tick makes session timeouts
/// seconds: the server grants 2 to 20 ticks. Data in `data/`, configuration in
/// `zoo.cfg`, log in `zookeeper.log` of its directory.
pub struct ZooKeeper {
    /// The JVM.
    pub process: Process,
    /// The client address.
    pub addr: SocketAddr,
    /// The tick: the shortest session ZooKeeper grants is two of them.
    pub tick: Duration,
    conf: PathBuf,
    dir: WorkDir,
}

/// Where Debian's packages put ZooKeeper's jar (its manifest names its dependencies)
/// and SLF4J's simple logger (a dependency of the same package), for a log on stderr.
const ZOOKEEPER_JARS: [&str; 2] = ["/usr/share/java/zookeeper.jar", "/usr/share/java/slf4j-simple.jar"];

impl ZooKeeper {
    /// Start ZooKeeper with a 250 ms tick (sessions of 0.5 to 5 s) in a temporary
    /// directory, and wait until it serves.
    pub fn start() -> Result<ZooKeeper> {
        Self::start_in(WorkDir::temporary()?, Duration::from_millis(250))
    }

    /// [`ZooKeeper::start`] in `dir` with `tick`.
    pub fn start_in(dir: WorkDir, tick: Duration) -> Result<ZooKeeper> {
        for jar in ZOOKEEPER_JARS {
            anyhow::ensure!(Path::new(jar).exists(), "{jar} is missing; install zookeeperd (scripts/install-deps.sh)");
        }
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let (quorum, election) = (free_port()?, free_port()?);
        let data = dir.path().join("data");
        std::fs::create_dir_all(&data)?;
        std::fs::write(data.join("myid"), "1\n")?;
        let conf = dir.path().join("zoo.cfg");
        std::fs::write(
            &conf,
            format!(
                "tickTime={}\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={}\nclientPortAddress={}\n\
                 standaloneEnabled=false\nserver.1=127.0.0.1:{quorum}:{election}\nadmin.enableServer=false\n\
                 4lw.commands.whitelist=ruok,srvr\n",
                tick.as_millis(),
                data.display(),
                addr.port(),
                addr.ip()
            ),
        )?;
        let process = Self::spawn(&conf, dir.path())?;
        let mut zookeeper = ZooKeeper { process, addr, tick, conf, dir };
        zookeeper.wait_serving()?;
        Ok(zookeeper)
    }

    fn spawn(conf: &Path, dir: &Path) -> Result<Process> {
        let mut cmd = Command::new("java");
        // A small heap and the quick compiler: the server does little, and starts sooner.
        cmd.args(["-Xms16m", "-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
            .arg("-Dorg.slf4j.simpleLogger.defaultLogLevel=warn")
            .arg("-cp")
            .arg(ZOOKEEPER_JARS.join(":"))
            .arg("org.apache.zookeeper.server.quorum.QuorumPeerMain")
            .arg(conf);
        Process::spawn("zookeeper", cmd, &dir.join("zookeeper.log"))
    }

    /// Until `srvr` shows a mode: the member has elected itself and serves clients.
    fn wait_serving(&mut self) -> Result<()> {
        let addr = self.addr;
        wait_until(&mut self.process, Duration::from_secs(60), || {
            four_letters(addr, "srvr").is_ok_and(|answer| answer.contains("Mode: leader"))
        })
    }

    /// Kill ZooKeeper (SIGKILL) and start it again on the same ports and data: it
    /// elects itself anew, in a new epoch.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        self.process = Self::spawn(&self.conf, self.dir.path())?;
        self.wait_serving()
    }

    /// `127.0.0.1:PORT`, as `fencekeeper lock --zookeeper` and kazoo take it.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }
}

/// A four-letter command (`ruok`, `srvr`) and ZooKeeper's answer.
pub fn four_letters(addr: SocketAddr, command: &str) -> Result<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    s.set_read_timeout(Some(Duration::from_secs(1)))?;
    s.write_all(command.as_bytes())?;
    let mut answer = String::new();
    s.read_to_string(&mut answer)?;
    Ok(answer)
}

pub use crate::redis::Redis;
