//! A holder of an etcd lock taken by the real `etcdctl lock`, for tests of which tokens
//! a fence admits: the token is the `ETCD_LOCK_REV` etcdctl gives its command (the
//! revision at which it saw that it holds the lock).

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// `etcdctl lock NAME` holding the lock while its command runs. etcdctl gives the
/// command no stdin, so the command sleeps; the lock is released by ending it
/// ([`EtcdctlLock::release`]), and etcdctl is killed if the holder is dropped first.
pub struct EtcdctlLock {
    child: Child,
    /// The command's process id (the shell, become `sleep`).
    command: String,
    /// The token: `ETCD_LOCK_REV`.
    pub token: String,
    released: bool,
}

impl EtcdctlLock {
    /// Queue for lock `name` at `endpoint` (`http://HOST:PORT`); returns once the lock
    /// is held (the command printed its token), however long the queue took.
    pub fn take(endpoint: &str, name: &str) -> Result<EtcdctlLock> {
        let mut child = Command::new("etcdctl")
            .args(["--endpoints", endpoint, "lock", name, "--", "sh", "-c", "echo $ETCD_LOCK_REV $$; exec sleep 300"])
            .env("ETCDCTL_API", "3")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting etcdctl lock; is etcdctl installed? run scripts/install-deps.sh")?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("no stdout")?).read_line(&mut line)?;
        let (token, command) = line.trim().split_once(' ').unwrap_or_default();
        let mut lock = EtcdctlLock { child, command: command.to_owned(), token: token.to_owned(), released: false };
        if token.parse::<u64>().is_err() || command.parse::<u32>().is_err() {
            lock.child.kill()?;
            bail!("etcdctl lock {name} printed {line:?}, not a revision and a process id");
        }
        Ok(lock)
    }

    /// Release the lock: end the command, and wait until etcdctl has deleted its key
    /// and exited. The token stays readable.
    pub fn release(&mut self) -> Result<()> {
        if !self.released {
            self.end_command();
            self.child.wait()?;
            self.released = true;
        }
        Ok(())
    }

    fn end_command(&self) {
        let _ = Command::new("kill").arg(&self.command).status();
    }
}

impl Drop for EtcdctlLock {
    fn drop(&mut self) {
        if !self.released {
            self.end_command();
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
