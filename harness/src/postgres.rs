//! PostgreSQL 15 from Debian for the tests: `initdb` in a temporary directory, the
//! server on a free loopback port, stopped at the end (immediate shutdown). The
//! server refuses to run as root, so under root it runs as the `postgres` user that
//! Debian's package creates.
//!
//! The `fencekeeper` extension is not built here: `scripts/install-postgres-extension.sh`
//! installs it into the server's directories (scripts/test.sh runs it after the
//! build), and [`check_extension_installed`] fails a test that would otherwise run
//! against an older install.

use crate::pg_wire::{Client, PgError};
use crate::services::{free_port, Process, WorkDir};
use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The role the tests connect as (the cluster's superuser).
pub const USER: &str = "fk";

/// Where Debian's PostgreSQL 15 is, unless `PG_CONFIG` names another pg_config.
const DEFAULT_PG_CONFIG: &str = "/usr/lib/postgresql/15/bin/pg_config";

/// A PostgreSQL server: its postmaster, its data directory, its address.
pub struct Postgres {
    /// The postmaster.
    pub process: Process,
    /// Where clients connect.
    pub addr: SocketAddr,
    settings: Vec<String>,
    dir: WorkDir,
}

impl Postgres {
    /// initdb and start a server with `settings` (`name=value`, each passed as `-c`),
    /// and wait until it answers a query.
    pub fn start(settings: &[&str]) -> Result<Postgres> {
        let dir = WorkDir::temporary()?;
        let (uid, gid) = server_user()?;
        if let Some((uid, gid)) = uid.zip(gid) {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .context("giving the data directory to postgres")?;
        }
        let mut initdb = as_server(Command::new(bin("initdb")?), uid, gid);
        initdb.arg("-D").arg(dir.path().join("data")).args(["-A", "trust", "-U", USER, "-E", "UTF8", "--locale=C"]);
        let out =
            initdb.arg("--no-sync").output().context("running initdb (scripts/install-deps.sh installs PostgreSQL)")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let settings: Vec<String> = settings.iter().map(|s| (*s).to_owned()).collect();
        let process = Self::spawn(&dir, addr, &settings)?;
        let mut pg = Postgres { process, addr, settings, dir };
        pg.wait_ready(Duration::from_secs(60))?;
        Ok(pg)
    }

    /// [`check_extension_installed`], [`Postgres::start`], and `CREATE EXTENSION
    /// fencekeeper` in the database `postgres`.
    pub fn with_extension(settings: &[&str]) -> Result<Postgres> {
        check_extension_installed()?;
        let pg = Postgres::start(settings)?;
        pg.connect("postgres")?.query("CREATE EXTENSION fencekeeper")?;
        Ok(pg)
    }

    /// Write `bytes` to `name` in the server's directory, readable by the server
    /// (a guest for `fencekeeper.guest`), and return its path.
    pub fn place(&self, name: &str, bytes: &[u8]) -> Result<PathBuf> {
        let path = self.dir.path().join(name);
        std::fs::write(&path, bytes)?;
        Ok(path)
    }

    fn spawn(dir: &WorkDir, addr: SocketAddr, settings: &[String]) -> Result<Process> {
        let (uid, gid) = server_user()?;
        let mut cmd = as_server(Command::new(bin("postgres")?), uid, gid);
        cmd.arg("-D").arg(dir.path().join("data")).arg("-p").arg(addr.port().to_string());
        cmd.arg("-k").arg(dir.path()).args(["-c", "listen_addresses=127.0.0.1", "-c", "shared_buffers=16MB"]);
        for setting in settings {
            cmd.arg("-c").arg(setting);
        }
        Process::spawn("postgres", cmd, &dir.path().join("postgres.log"))
    }

    /// Poll until a connection answers `SELECT 1` (the server is started, or has
    /// finished crash recovery), at most `within`.
    pub fn wait_ready(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        loop {
            let answer = Client::connect(self.addr, USER, "postgres").and_then(|mut c| c.value("SELECT 1"));
            match answer {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    bail!("postgres not ready after {within:?} ({e}):\n{}", self.process.log_tail())
                }
                Err(_) => {}
            }
            self.process.check_alive()?;
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A connection to `database`.
    pub fn connect(&self, database: &str) -> Result<Client, PgError> {
        Client::connect(self.addr, USER, database)
    }

    /// Stop the server as `pg_ctl stop -m immediate` does (SIGQUIT: no checkpoint, no
    /// clean shutdown; the next start runs crash recovery) and wait until it exited.
    pub fn stop_immediate(&mut self) -> Result<()> {
        self.process.signal("QUIT")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.process.child.try_wait()?.is_none() {
            anyhow::ensure!(Instant::now() < deadline, "postgres still running 30 s after SIGQUIT");
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Start the server again on the same data and port, and wait until it is ready.
    pub fn restart(&mut self) -> Result<()> {
        if self.process.child.try_wait()?.is_none() {
            self.stop_immediate()?;
        }
        self.process = Self::spawn(&self.dir, self.addr, &self.settings)?;
        self.wait_ready(Duration::from_secs(120))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("postgres.log")).unwrap_or_default()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // Immediate shutdown ends every backend with the postmaster; SIGKILL (the
        // Process's own drop) only if that did not happen in time.
        if matches!(self.process.child.try_wait(), Ok(None)) {
            let _ = self.stop_immediate();
        }
    }
}

/// Send SIGKILL to a process (a backend, by its pid).
pub fn kill(pid: u32) -> Result<()> {
    let status = Command::new("kill").arg("-KILL").arg(pid.to_string()).status()?;
    anyhow::ensure!(status.success(), "kill -KILL {pid} failed");
    Ok(())
}

/// Fail unless the installed extension is this build's: the shared object, the
/// control file and the SQL scripts.
pub fn check_extension_installed() -> Result<()> {
    let pg_config = pg_config();
    let dir = |flag: &str| -> Result<PathBuf> {
        let out = Command::new(&pg_config).arg(flag).output().with_context(|| format!("running {pg_config}"))?;
        Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
    };
    let built = crate::workspace_bin("libfencekeeper_postgres.so")?;
    let source = crate::repo_root().join("host/databases/postgres");
    let mut pairs = vec![(built, dir("--pkglibdir")?.join("fencekeeper.so"))];
    let extension = dir("--sharedir")?.join("extension");
    pairs.push((source.join("fencekeeper.control"), extension.join("fencekeeper.control")));
    for script in std::fs::read_dir(source.join("sql"))? {
        let script = script?.path();
        let name = script.file_name().context("a script without a name")?.to_owned();
        pairs.push((script, extension.join(name)));
    }
    for (ours, installed) in pairs {
        if std::fs::read(&ours)? != std::fs::read(&installed).unwrap_or_default() {
            bail!(
                "{} is not this build's {}: run scripts/install-postgres-extension.sh",
                installed.display(),
                ours.display()
            );
        }
    }
    Ok(())
}

fn pg_config() -> String {
    std::env::var("PG_CONFIG").unwrap_or_else(|_| DEFAULT_PG_CONFIG.to_owned())
}

/// A server program (`initdb`, `postgres`) from `pg_config --bindir`.
fn bin(name: &str) -> Result<PathBuf> {
    let out = Command::new(pg_config()).arg("--bindir").output().context("pg_config (install postgresql-15)")?;
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()).join(name))
}

/// The user the server runs as: `postgres` when the tests run as root.
fn server_user() -> Result<(Option<u32>, Option<u32>)> {
    let me = String::from_utf8(Command::new("id").arg("-u").output()?.stdout)?;
    if me.trim() != "0" {
        return Ok((None, None));
    }
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let entry =
        passwd.lines().find(|l| l.starts_with("postgres:")).context("no postgres user (install postgresql-15)")?;
    let fields: Vec<&str> = entry.split(':').collect();
    Ok((fields.get(2).and_then(|u| u.parse().ok()), fields.get(3).and_then(|g| g.parse().ok())))
}

fn as_server(mut cmd: Command, uid: Option<u32>, gid: Option<u32>) -> Command {
    if let (Some(uid), Some(gid)) = (uid, gid) {
        cmd.gid(gid).uid(uid);
    }
    cmd
}
