//! An etcd cluster of several members on loopback: real Raft, so a leader can be
//! killed, frozen or cut off from a quorum. Each member has its own client and peer
//! port and data directory; a killed member restarts on the same ports and data and
//! rejoins.

use crate::services::{free_port, http, poll_until, Process, WorkDir};
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// One member: stopped when `process` is `None`.
pub struct Member {
    /// The member's name (`m0`, `m1`, ...).
    pub name: String,
    /// The process, while it runs.
    pub process: Option<Process>,
    /// The client address (`http://` + this is its v3 JSON gateway).
    pub client: SocketAddr,
    peer: SocketAddr,
    dir: PathBuf,
}

impl Member {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.client)
    }
}

/// A running cluster; every member is killed when it drops.
pub struct EtcdCluster {
    /// The members, in `--initial-cluster` order.
    pub members: Vec<Member>,
    initial_cluster: String,
    _dir: WorkDir,
}

impl EtcdCluster {
    /// Start `size` members in `dir` and wait until each answers `/health` (which
    /// needs a leader and a quorum).
    pub fn start_in(dir: WorkDir, size: usize) -> Result<EtcdCluster> {
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            let client: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
            let peer: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
            let dir = dir.path().join(format!("m{i}"));
            std::fs::create_dir_all(&dir)?;
            members.push(Member { name: format!("m{i}"), process: None, client, peer, dir });
        }
        let initial_cluster =
            members.iter().map(|m| format!("{}=http://{}", m.name, m.peer)).collect::<Vec<_>>().join(",");
        let mut cluster = EtcdCluster { members, initial_cluster, _dir: dir };
        for i in 0..size {
            cluster.spawn(i)?;
        }
        for i in 0..size {
            cluster.wait_healthy(i, Duration::from_secs(60))?;
        }
        Ok(cluster)
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let m = &self.members[i];
        let mut cmd = Command::new("etcd");
        cmd.arg(format!("--name={}", m.name))
            .arg(format!("--data-dir={}", m.dir.join("data").display()))
            .arg(format!("--listen-client-urls=http://{}", m.client))
            .arg(format!("--advertise-client-urls=http://{}", m.client))
            .arg(format!("--listen-peer-urls=http://{}", m.peer))
            .arg(format!("--initial-advertise-peer-urls=http://{}", m.peer))
            .arg(format!("--initial-cluster={}", self.initial_cluster))
            .arg("--initial-cluster-token=fencekeeper-torture")
            .arg("--initial-cluster-state=new")
            .arg("--log-level=warn");
        let process = Process::spawn(&format!("etcd {}", m.name), cmd, &m.dir.join("etcd.log"))?;
        self.members[i].process = Some(process);
        Ok(())
    }

    /// True when member `i` runs and answers `/health` with `true`.
    pub fn healthy(&self, i: usize) -> bool {
        self.members[i].process.is_some()
            && matches!(http(self.members[i].client, "GET", "/health", &[], b""),
                Ok((200, body)) if String::from_utf8_lossy(&body).contains("true"))
    }

    /// Wait (at most `within`) until member `i` is healthy.
    pub fn wait_healthy(&self, i: usize, within: Duration) -> Result<()> {
        poll_until(&format!("etcd member {} healthy", self.members[i].name), within, || self.healthy(i))
    }

    /// SIGKILL member `i` (its data stays for [`EtcdCluster::restart`]).
    pub fn kill(&mut self, i: usize) {
        if let Some(mut p) = self.members[i].process.take() {
            p.kill();
        }
    }

    /// Start a killed member again on its ports and data (it rejoins). Does not wait:
    /// a member alone in a lost quorum is never healthy.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        self.spawn(i)
    }

    /// SIGSTOP member `i` (every thread stopped).
    pub fn freeze(&self, i: usize) -> Result<()> {
        self.members[i].process.as_ref().context("member not running")?.freeze()
    }

    /// SIGCONT member `i`.
    pub fn thaw(&self, i: usize) -> Result<()> {
        self.members[i].process.as_ref().context("member not running")?.signal("CONT")
    }

    /// The process id of member `i`, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.members[i].process.as_ref().map(|p| p.child.id())
    }

    /// The index of the member that the members answering believe leads, by the
    /// status endpoint (`leader` against each member's own `header.member_id`).
    pub fn leader(&self) -> Option<usize> {
        let mut ids: Vec<Option<String>> = vec![None; self.members.len()];
        let mut leader: Option<String> = None;
        for (i, m) in self.members.iter().enumerate() {
            if m.process.is_none() {
                continue;
            }
            let Ok((200, body)) = http_post(m.client, "/v3/maintenance/status", b"{}") else { continue };
            let Ok(v) = serde_json::from_slice::<serde_json::Value>(&body) else { continue };
            ids[i] = v["header"]["member_id"].as_str().map(str::to_owned);
            if let Some(l) = v["leader"].as_str().filter(|l| *l != "0") {
                leader = Some(l.to_owned());
            }
        }
        let leader = leader?;
        ids.iter().position(|id| id.as_deref() == Some(leader.as_str()))
    }

    /// The client URLs of every member.
    pub fn urls(&self) -> Vec<String> {
        self.members.iter().map(Member::url).collect()
    }
}

fn http_post(addr: SocketAddr, path: &str, body: &[u8]) -> Result<(u16, Vec<u8>)> {
    http(addr, "POST", path, &[("Content-Type", "application/json")], body)
}
