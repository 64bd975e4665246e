//! rclone (Debian's `rclone`), the WebDAV client the tests drive the fence with, as a
//! user would: an on-the-fly `:webdav:` remote (no config file), the token sent on
//! every request with `--header` (rclone's `--header-upload` reaches only PUT, and
//! its MKCOL of the parent directory is a write too).

use anyhow::{Context, Result};
use std::path::Path;
use std::process::{Command, Output};

/// What one rclone run did.
pub struct Run {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its standard error: rclone's log, where a refusal's text appears.
    pub log: String,
}

impl Run {
    fn of(out: Output) -> Run {
        Run { code: out.status.code(), log: String::from_utf8_lossy(&out.stderr).into_owned() }
    }
}

/// rclone against the WebDAV server at `url`, sending `token` (when given) in the
/// `fencing-token` header of every request.
pub struct Rclone {
    url: String,
    token: Option<String>,
    /// rclone's `--retries`: how often it runs a failed copy again whole.
    retries: u32,
    /// rclone's `--ignore-times`: copy even a file whose size matches the remote's.
    ignore_times: bool,
}

impl Rclone {
    /// A client of `url` (`http://HOST:PORT`) with `token`, and rclone's default
    /// retries (3).
    pub fn new(url: &str, token: Option<&str>) -> Rclone {
        Rclone { url: url.to_owned(), token: token.map(str::to_owned), retries: 3, ignore_times: false }
    }

    /// The same, with `--ignore-times`: a WebDAV remote of vendor `other` has no
    /// modification times, so rclone compares sizes alone and skips a changed file of
    /// the same size unless told to copy regardless.
    pub fn ignore_times(mut self) -> Rclone {
        self.ignore_times = true;
        self
    }

    /// The same, running a failed copy `retries` times at most.
    pub fn retries(mut self, retries: u32) -> Rclone {
        self.retries = retries;
        self
    }

    /// `rclone copyto LOCAL :webdav:REMOTE`.
    pub fn copyto(&self, local: &Path, remote: &str) -> Result<Run> {
        let local = local.to_str().context("a local path that is not UTF-8")?;
        self.run(&["copyto", local, &format!(":webdav:{remote}")])
    }

    /// `rclone moveto :webdav:FROM :webdav:TO` (a server-side WebDAV MOVE).
    pub fn moveto(&self, from: &str, to: &str) -> Result<Run> {
        self.run(&["moveto", &format!(":webdav:{from}"), &format!(":webdav:{to}")])
    }

    /// `rclone lsf :webdav:DIR` (a PROPFIND listing), with the listing on success.
    pub fn lsf(&self, dir: &str) -> Result<(Run, String)> {
        let out = self.command(&["lsf", &format!(":webdav:{dir}")]).output().context("running rclone")?;
        let listing = String::from_utf8_lossy(&out.stdout).into_owned();
        Ok((Run::of(out), listing))
    }

    fn run(&self, args: &[&str]) -> Result<Run> {
        Ok(Run::of(self.command(args).output().context("running rclone (Debian's rclone)")?))
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("rclone");
        cmd.args(args).args(["--webdav-url", &self.url, "--webdav-vendor", "other", "--config", "/dev/null"]).args([
            "--retries",
            &self.retries.to_string(),
            "--retries-sleep",
            "0s",
            "-v",
        ]);
        if let Some(token) = &self.token {
            cmd.args(["--header", &format!("fencing-token: {token}")]);
        }
        if self.ignore_times {
            cmd.arg("--ignore-times");
        }
        cmd
    }
}
