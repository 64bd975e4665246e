//! redis-server on loopback: as the lock service of the token tests (no persistence),
//! and as the host of the Fencekeeper module (`--loadmodule`), with whatever
//! configuration a test needs (AOF, a replica), restartable in place.
//!
//! Its directory (data, `redis.log`) is a temporary one; its port is fixed for its
//! life, so a restart (after a SIGKILL, say) is the same server to its clients.

use crate::resp::Client;
use crate::services::{free_port, wait_until, Process, WorkDir};
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A redis-server on loopback.
pub struct Redis {
    /// The process.
    pub process: Process,
    /// The client address.
    pub addr: SocketAddr,
    /// What it was started with beyond the address and directory.
    config: Vec<String>,
    dir: WorkDir,
}

impl Redis {
    /// A redis-server with no persistence (a test's counter need not survive it),
    /// ready when it answers `PING`.
    pub fn start() -> Result<Redis> {
        Redis::start_with(&["--save", "", "--appendonly", "no"])
    }

    /// A redis-server with `config` (command-line directives such as
    /// `--appendonly yes`), in a fresh directory.
    pub fn start_with(config: &[&str]) -> Result<Redis> {
        let dir = WorkDir::temporary()?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let config: Vec<String> = config.iter().map(|c| c.to_string()).collect();
        let process = spawn(addr, dir.path(), &config)?;
        Ok(Redis { process, addr, config, dir })
    }

    /// A redis-server with the Fencekeeper module loaded (its load arguments
    /// `module_args`, e.g. `["mode", "efficiency"]`) and `config`.
    pub fn with_module(module_args: &[&str], config: &[&str]) -> Result<Redis> {
        let module = module_path()?;
        let mut all = vec!["--loadmodule".to_owned(), module.display().to_string()];
        all.extend(module_args.iter().map(|a| a.to_string()));
        all.extend(config.iter().map(|c| c.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        Redis::start_with(&all)
    }

    /// Start it again on the same port, directory and configuration (after
    /// [`Redis::kill`], or killing it first), and wait until it has loaded its data.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        self.process = spawn(self.addr, self.dir.path(), &self.config)?;
        Ok(())
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// A new connection.
    pub fn client(&self) -> Result<Client> {
        Client::connect(self.addr)
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Its directory (data files, `redis.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Everything it logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.process.log).unwrap_or_default()
    }
}

/// The built module: `target/<profile>/libfencekeeper_redis.so`.
pub fn module_path() -> Result<PathBuf> {
    crate::workspace_bin("libfencekeeper_redis.so")
        .context("the Redis module is built by `cargo build --release -p fencekeeper-redis` (scripts/test.sh does)")
}

fn spawn(addr: SocketAddr, dir: &Path, config: &[String]) -> Result<Process> {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--bind", "127.0.0.1", "--port", &addr.port().to_string()]).arg("--dir").arg(dir).args(config);
    let mut process = Process::spawn("redis-server", cmd, &dir.join("redis.log"))?;
    // Loading an AOF or RDB answers -LOADING until done: only +PONG is ready.
    wait_until(&mut process, Duration::from_secs(30), || {
        let ping = || -> Result<bool> {
            let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
            s.set_read_timeout(Some(Duration::from_secs(1)))?;
            s.write_all(b"PING\r\n")?;
            let mut answer = [0; 7];
            s.read_exact(&mut answer)?;
            Ok(&answer == b"+PONG\r\n")
        };
        ping().unwrap_or(false)
    })?;
    Ok(process)
}
