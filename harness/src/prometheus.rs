//! A real Prometheus (Debian's `prometheus` package, scripts/install-deps.sh) that
//! scrapes the given targets every second and evaluates a rules file every second,
//! for the tests of the shipped alert rules.

use crate::services::{free_port, http, wait_until, Process, WorkDir};
use anyhow::{Context, Result};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A running Prometheus, killed when dropped.
pub struct Prometheus {
    /// The process.
    pub process: Process,
    /// Its web address (the HTTP API).
    pub addr: SocketAddr,
    _dir: WorkDir,
}

impl Prometheus {
    /// Start one scraping each `(job, address, metrics path)` and evaluating `rules`,
    /// and wait until it is ready.
    pub fn start(targets: &[(&str, SocketAddr, &str)], rules: &Path) -> Result<Prometheus> {
        let dir = WorkDir::temporary()?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut config = format!(
            "global: {{scrape_interval: 1s, evaluation_interval: 1s}}\nrule_files: [{:?}]\nscrape_configs:\n",
            rules.display().to_string()
        );
        for (job, target, path) in targets {
            config.push_str(&format!(
                "  - job_name: {job}\n    metrics_path: {path}\n    static_configs: [{{targets: [\"{target}\"]}}]\n"
            ));
        }
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config)?;
        let mut cmd = Command::new("prometheus");
        cmd.arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn");
        let mut process = Process::spawn("prometheus", cmd, &dir.path().join("prometheus.log"))?;
        wait_until(&mut process, Duration::from_secs(30), || {
            matches!(http(addr, "GET", "/-/ready", &[], b""), Ok((200, _)))
        })?;
        Ok(Prometheus { process, addr, _dir: dir })
    }

    /// The names of the alerts firing now (`/api/v1/alerts`).
    pub fn firing(&self) -> Result<Vec<String>> {
        let (status, body) = http(self.addr, "GET", "/api/v1/alerts", &[], b"")?;
        anyhow::ensure!(status == 200, "/api/v1/alerts answered {status}");
        let answer: serde_json::Value = serde_json::from_slice(&body)?;
        let alerts = answer["data"]["alerts"].as_array().context("no data.alerts")?;
        Ok(alerts
            .iter()
            .filter(|a| a["state"] == "firing")
            .filter_map(|a| a["labels"]["alertname"].as_str().map(str::to_owned))
            .collect())
    }
}
