//! Everything a run starts, on loopback: a 3-member etcd cluster (the lock service and
//! the shared mark store), the instrumented upstream store, two gateways with marks in
//! etcd (`gw1` on member 0, `gw2` on member 1: the gateway takes one etcd endpoint, so
//! killing a gateway's member is an outage of that gateway until it returns), two
//! Envoys with the filter given all three members (`envoy-config --etcd A,B,C`: the
//! generated etcd cluster health-checks them), and a gateway with the embedded file store (`gwfile`) on a size-limited
//! tmpfs. The gateways run the test guest (`guest_faults.wasm`: the token text
//! `fault-trap` traps) and the Envoys the filter's test build (a header traps): the
//! shipped code plus one fault path each.

use crate::client::Target;
use anyhow::{Context, Result};
use fencekeeper::validator::guest_path;
use fencekeeper_harness::envoy::{self, Envoy};
use fencekeeper_harness::etcd_cluster::EtcdCluster;
use fencekeeper_harness::gateway::Gateway;
use fencekeeper_harness::services::{free_port, http, poll_until, wait_until, Process, WorkDir};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Which targets run.
#[derive(Clone, Copy, Debug)]
pub struct Choice {
    /// gw1 and gw2 (etcd marks).
    pub gateways: bool,
    /// envoy1 and envoy2.
    pub envoys: bool,
    /// gwfile (file store).
    pub file: bool,
    /// The gateways send every write with a precondition (`--conditional-writes`), the
    /// upstream honours it, and nothing bounds when the store applies a write: no
    /// store apply bound, no start grace. Envoys cannot run this way.
    pub conditional: bool,
}

/// The instrumented store as a child process (restartable on its ports and log).
pub struct Upstream {
    /// The process.
    pub process: Process,
    /// Where writes go.
    pub addr: SocketAddr,
    /// The knobs.
    pub admin: SocketAddr,
    log: PathBuf,
    seed: u64,
    conditional: bool,
}

impl Upstream {
    fn start(dir: &Path, seed: u64, conditional: bool) -> Result<Upstream> {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let admin: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let log = dir.join("store.jsonl");
        let process = Self::spawn(addr, admin, &log, seed, conditional, dir)?;
        let mut upstream = Upstream { process, addr, admin, log, seed, conditional };
        upstream.wait_ready()?;
        Ok(upstream)
    }

    fn spawn(
        addr: SocketAddr,
        admin: SocketAddr,
        log: &Path,
        seed: u64,
        conditional: bool,
        dir: &Path,
    ) -> Result<Process> {
        let mut cmd = Command::new(std::env::current_exe()?);
        cmd.args(["upstream", "--listen", &addr.to_string(), "--admin", &admin.to_string(), "--seed"])
            .arg(seed.to_string())
            .arg("--log")
            .arg(log);
        if conditional {
            cmd.arg("--conditional");
        }
        Process::spawn("upstream", cmd, &dir.join("upstream.log"))
    }

    fn wait_ready(&mut self) -> Result<()> {
        let admin = self.admin;
        wait_until(&mut self.process, Duration::from_secs(20), || {
            matches!(http(admin, "GET", "/healthz", &[], b""), Ok((200, _)))
        })
    }

    /// SIGKILL and start again on the same ports, continuing the log.
    pub fn restart(&mut self) -> Result<()> {
        self.process.kill();
        let dir = self.log.parent().context("log dir")?.to_owned();
        self.process = Self::spawn(self.addr, self.admin, &self.log, self.seed, self.conditional, &dir)?;
        self.wait_ready()
    }

    /// Set the fault knobs (`delay_pct=..&error_pct=..`; empty: none).
    pub fn knobs(&self, query: &str) -> Result<()> {
        let (status, _) = http(self.admin, "POST", &format!("/faults?{query}"), &[], b"")?;
        anyhow::ensure!(status == 200, "the store refused knobs {query}: {status}");
        Ok(())
    }
}

/// A size-limited tmpfs, unmounted when dropped.
pub struct Tmpfs {
    /// Where it is mounted.
    pub path: PathBuf,
}

impl Tmpfs {
    fn mount(path: &Path, size: &str) -> Result<Tmpfs> {
        std::fs::create_dir_all(path)?;
        let out =
            Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(path).output()?;
        anyhow::ensure!(out.status.success(), "mount -t tmpfs: {}", String::from_utf8_lossy(&out.stderr).trim());
        Ok(Tmpfs { path: path.to_owned() })
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

/// Everything running.
pub struct System {
    /// The etcd cluster.
    pub etcd: EtcdCluster,
    /// The store.
    pub upstream: Upstream,
    /// Gateways by name (`gw1`, `gw2`, `gwfile`).
    pub gateways: Vec<(String, Gateway)>,
    /// Envoys by name.
    pub envoys: Vec<(String, Envoy)>,
    /// The file store's tmpfs, when it could be mounted.
    pub disk: Option<Tmpfs>,
    /// Why the tmpfs could not be mounted.
    pub no_disk: Option<String>,
}

/// The file-store gateway's `--start-grace`: longer than the store takes to apply any
/// write it was sent (the store apply bound), so a restarted gateway forwards nothing
/// while writes its killed predecessor sent may still land. The etcd gateways need
/// none: their predecessor's flights stay in the shared registry until its lease
/// expires.
pub const START_GRACE: Duration = Duration::from_secs(9);

/// The store apply bound every host is given: the store applies a write within this
/// long of receiving it (the nemesis delays writes by at most 4 s), except under the
/// `upstream-past-bound` fault, which shows what happens past it.
pub const APPLY_BOUND: Duration = Duration::from_secs(5);

/// The store apply bound the gateways are given: none with conditional writes, where
/// the store itself refuses a write that arrives late.
pub fn apply_bound(choice: Choice) -> Duration {
    if choice.conditional {
        Duration::ZERO
    } else {
        APPLY_BOUND
    }
}

/// The hosts' request timeout (the gateways' `--request-timeout`, the Envoys' route
/// timeout): longer than the store's slowest honest write.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(6);

/// Whether `target` keeps its marks in etcd: every target but the file-store gateway.
pub fn marks_in_etcd(target: &str) -> bool {
    target != "gwfile"
}

/// The hosts' ordering gate timeout (their default, not set here): how long a write
/// waits for lower-token writes before it is refused with 503.
pub const GATE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long after it died an instance's flights may hold resources in the shared
/// registry: its leases' TTL (request timeout + bound + the hosts' 5 s between
/// leases + their 5 s margin), plus the gate timeout of the writes waiting for them.
pub const LINGER: Duration = Duration::from_secs(6 + 5 + 5 + 5 + GATE_TIMEOUT.as_secs());

impl System {
    /// Start what `choice` asks for, logs and data under `dir`.
    ///
    /// Returns once every gateway's start grace is over: the load begins in calm.
    pub fn start(dir: &Path, choice: Choice, seed: u64) -> Result<System> {
        // etcd's data on tmpfs where there is one: SIGKILL keeps the page cache either
        // way, and three members' fsyncs on one disk would eat the CI budget.
        let shm = Path::new("/dev/shm");
        let etcd_dir =
            if shm.is_dir() { WorkDir::Temporary(tempfile::tempdir_in(shm)?) } else { WorkDir::temporary()? };
        let etcd = EtcdCluster::start_in(etcd_dir, 3)?;
        let upstream = Upstream::start(dir, seed, choice.conditional)?;
        let upstream_url = format!("http://{}", upstream.addr);
        let guest = guest_path("test-guests/guest_faults.wasm").display().to_string();
        let grace = format!("{}ms", START_GRACE.as_millis());
        let (timeout, bound) =
            (format!("{}ms", REQUEST_TIMEOUT.as_millis()), format!("{}ms", apply_bound(choice).as_millis()));
        // Conditional writes: the upstream is known to honour preconditions (no probe,
        // which a nemesis's injected 503 could fail at a restart).
        let conditional: &[&str] =
            if choice.conditional { &["--conditional-writes", "--precondition-probe", "off"] } else { &[] };
        let mut gateways = Vec::new();
        if choice.gateways {
            for (name, member) in [("gw1", 0), ("gw2", 1)] {
                let gdir = WorkDir::kept(&dir.join(name))?;
                let store = gdir.path().join("unused.redb");
                let url = etcd.members[member].url();
                let mut args = vec!["--etcd", url.as_str(), "--guest", guest.as_str(), "--request-timeout", &timeout];
                // Written by both gateways and both Envoys: one gate for all, in etcd;
                // conditional writes replace it (and its bound), as in the Envoys.
                match choice.conditional {
                    true => args.extend(conditional),
                    false => args.extend(["--shared-gate", "--store-apply-bound", &bound]),
                }
                gateways.push((name.to_owned(), Gateway::start_in(gdir, store, &upstream_url, &args)?));
            }
        }
        let (mut disk, mut no_disk) = (None, None);
        if choice.file {
            let mount = dir.join("gwfile-disk");
            match Tmpfs::mount(&mount, "4m") {
                Ok(t) => disk = Some(t),
                Err(e) => {
                    eprintln!("torture: no size-limited tmpfs ({e:#}); the full-disk fault will not be injected");
                    no_disk = Some(format!("{e:#}"));
                    std::fs::create_dir_all(&mount)?;
                }
            }
            let gdir = WorkDir::kept(&dir.join("gwfile"))?;
            let mut args =
                vec!["--guest", guest.as_str(), "--request-timeout", &timeout, "--store-apply-bound", &bound];
            if !choice.conditional {
                args.extend(["--start-grace", grace.as_str()]);
            }
            args.extend(conditional);
            gateways
                .push(("gwfile".to_owned(), Gateway::start_in(gdir, mount.join("marks.redb"), &upstream_url, &args)?));
        }
        let mut envoys = Vec::new();
        if choice.envoys {
            let filter = guest_path("test-guests/filter_faults.wasm").display().to_string();
            let members: Vec<String> = etcd.members.iter().map(|m| m.client.to_string()).collect();
            let members = members.join(",");
            for name in ["envoy1", "envoy2"] {
                let (listen, admin) = (free_port()?, free_port()?);
                let upstream_addr = upstream.addr.to_string();
                let mut args = vec![
                    "--upstream",
                    &upstream_addr,
                    "--etcd",
                    &members,
                    "--filter",
                    &filter,
                    "--test-fault-header",
                    crate::client::FILTER_FAULT_HEADER,
                    "--request-timeout",
                    &timeout,
                ];
                // Conditional writes replace the ordering gate (and its bound).
                match choice.conditional {
                    true => args.extend(conditional),
                    false => args.extend(["--shared-gate", "--store-apply-bound", &bound]),
                }
                let yaml = envoy::generate(listen, admin, &args)?;
                envoys.push((name.to_owned(), Envoy::start_with(2, listen, admin, &yaml)?));
            }
        }
        // The gateways refuse fenced writes for their start grace: the load begins once
        // every one says it is ready for them.
        for (name, g) in &gateways {
            poll_until(&format!("{name}'s start grace over"), START_GRACE * 3, || g.ready_for_writes())?;
        }
        Ok(System { etcd, upstream, gateways, envoys, disk, no_disk })
    }

    /// Every target, by name.
    pub fn targets(&self) -> Vec<Target> {
        let gateways = self.gateways.iter().map(|(n, g)| Target { name: n.clone(), url: g.url(), envoy: false });
        let envoys = self.envoys.iter().map(|(n, e)| Target {
            name: n.clone(),
            url: format!("http://{}", e.listen),
            envoy: true,
        });
        gateways.chain(envoys).collect()
    }

    /// The gateway called `name`.
    pub fn gateway(&mut self, name: &str) -> Option<&mut Gateway> {
        self.gateways.iter_mut().find(|(n, _)| n == name).map(|(_, g)| g)
    }

    /// The Envoy called `name`.
    pub fn envoy(&mut self, name: &str) -> Option<&mut Envoy> {
        self.envoys.iter_mut().find(|(n, _)| n == name).map(|(_, e)| e)
    }
}
