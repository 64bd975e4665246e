//! The Prometheus rules and the Grafana dashboard that ship in `deploy/`: the rules
//! pass `promtool check rules` and their own unit tests (`promtool test rules`: the
//! alerts fire on the series the hosts export, after their `for`, and not before),
//! and every metric they or the dashboard read is one that a real gateway's
//! `/metrics` and a real Envoy's `/stats/prometheus` export, so a renamed metric
//! fails here instead of silencing an alert. And a real Prometheus, scraping a real
//! gateway, fires the undecided alert while the gateway's etcd is stopped and clears
//! it once etcd is back. promtool and Prometheus are Debian's `prometheus` package
//! (scripts/install-deps.sh).

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used, clippy::panic)]

use fencekeeper_harness::envoy::Envoy;
use fencekeeper_harness::gateway::{request, Gateway, RecordingUpstream};
use fencekeeper_harness::prometheus::Prometheus;
use fencekeeper_harness::repo_root;
use fencekeeper_harness::services::{poll_until, Etcd};
use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

fn deploy(path: &str) -> String {
    repo_root().join("deploy").join(path).display().to_string()
}

fn promtool(args: &[&str]) -> (bool, String) {
    let out = Command::new("promtool").args(args).output().expect("promtool (scripts/install-deps.sh installs it)");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr))
}

/// The names in `text` that start with `prefix` (metric names: letters, digits, `_`
/// and, for recorded series, `:`).
fn names(text: &str, prefix: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        let name: String =
            rest[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
        // Not the middle of a longer name, nor a prefix named in a comment (`fencekeeper_*`).
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':') && !name.ends_with('_') {
            found.insert(name.clone());
        }
        rest = &rest[at + name.len().max(1)..];
    }
    found
}

/// The metric names in a Prometheus text exposition.
fn exported(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.split(['{', ' ']).next().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn the_rules_pass_promtool_and_their_alerts_fire_as_their_unit_tests_say() {
    let (ok, said) = promtool(&["check", "rules", &deploy("prometheus/fencekeeper-rules.yml")]);
    assert!(ok, "{said}");
    let (ok, said) = promtool(&["test", "rules", &deploy("prometheus/fencekeeper-rules.test.yml")]);
    assert!(ok, "{said}");
}

#[test]
fn every_metric_the_rules_and_the_dashboard_read_is_one_a_real_gateway_or_envoy_exports() {
    let rules = std::fs::read_to_string(deploy("prometheus/fencekeeper-rules.yml")).unwrap();
    let dashboard = std::fs::read_to_string(deploy("grafana/fencekeeper.json")).unwrap();
    let read: BTreeSet<String> =
        names(&rules, "fencekeeper_").into_iter().chain(names(&dashboard, "fencekeeper_")).collect();
    assert!(read.len() > 20, "{read:?}");

    // A gateway and an Envoy, each answering an admitted write and a stale one.
    let upstream = RecordingUpstream::start().unwrap();
    let gateway = Gateway::start(&upstream.url(), &[]).unwrap();
    assert!((200..300).contains(&gateway.put("/r", Some("34"), b"x").unwrap().status));
    assert_eq!(gateway.put("/r", Some("33"), b"x").unwrap().status, 409);
    let scraped = request(&format!("http://{}", gateway.admin), "GET", "/metrics", &[], b"").unwrap();
    let address = upstream.url().trim_start_matches("http://").to_owned();
    let envoy = Envoy::start(1, &["--upstream", &address, "--no-etcd", "--mode", "efficiency"]).unwrap();
    assert!((200..300).contains(&envoy.put("/r", "34", b"x").unwrap().status));
    assert_eq!(envoy.put("/r", "33", b"x").unwrap().status, 409);
    let stats = request(&format!("http://{}", envoy.admin), "GET", "/stats/prometheus", &[], b"").unwrap();
    let exported: BTreeSet<String> = exported(&scraped.body).into_iter().chain(exported(&stats.body)).collect();

    let missing: Vec<&String> = read.iter().filter(|n| !exported.contains(*n)).collect();
    let ours: Vec<&String> = exported.iter().filter(|n| n.starts_with("fencekeeper")).collect();
    assert!(missing.is_empty(), "read by deploy/ but exported by neither host: {missing:?}\nexported: {ours:?}");

    // The dashboard reads the recorded vocabulary (or the gateway's histogram).
    let recorded = names(&rules, "fencekeeper:");
    for series in names(&dashboard, "fencekeeper:") {
        assert!(recorded.contains(&series), "the dashboard reads {series}, which no rule records");
    }
}

#[test]
fn a_real_prometheus_fires_the_undecided_alert_while_etcd_is_stopped_and_clears_it_after() {
    // The shipped rules with their windows shortened (a 5 m rate to 10 s, each `for`
    // to seconds), so that what takes minutes in production takes seconds here; the
    // expressions are the shipped ones.
    let shipped = std::fs::read_to_string(deploy("prometheus/fencekeeper-rules.yml")).unwrap();
    let mut rules = shipped.replace("[5m]", "[10s]");
    for minutes in ["1m", "2m", "5m", "10m"] {
        rules = rules.replace(&format!("for: {minutes}"), "for: 2s");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rules.yml");
    std::fs::write(&path, rules).unwrap();

    let etcd = Etcd::start().unwrap();
    let upstream = RecordingUpstream::start().unwrap();
    let gateway = Gateway::start(&upstream.url(), &["--etcd", &etcd.client.to_string()]).unwrap();
    let prometheus = Prometheus::start(&[("gateway", gateway.admin, "/metrics")], &path).unwrap();
    let firing = || prometheus.firing().unwrap().contains(&"FencekeeperUndecided".to_owned());
    let mut token = 33;
    let mut write = || {
        token += 1;
        gateway.put("/r", Some(&token.to_string()), b"x").unwrap().status
    };
    assert!((200..300).contains(&write()));
    assert!(!firing());

    etcd.process.signal("SIGSTOP").unwrap();
    let mut refused = 0;
    poll_until("the undecided alert firing while etcd is stopped", Duration::from_secs(90), || {
        if write() == 503 {
            refused += 1;
        }
        firing()
    })
    .unwrap();
    assert!(refused > 0, "the gateway refused writes it could not decide on");

    etcd.process.signal("SIGCONT").unwrap();
    poll_until("the undecided alert cleared once etcd is back", Duration::from_secs(90), || {
        let _ = write();
        !firing()
    })
    .unwrap();
    assert!((200..300).contains(&write()), "admitted again");
}
