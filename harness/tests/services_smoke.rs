//! The harness itself: each real service starts, answers, and stores what it is given.

// A test states its expectations by panicking.
#![allow(clippy::unwrap_used)]

use fencekeeper_harness::services::{http, Etcd, NginxDav};

#[test]
fn nginx_dav_stores_any_put() {
    let nginx = NginxDav::start().unwrap();
    let (status, _) = http(nginx.addr, "PUT", "/a/b.txt", &[], b"hello").unwrap();
    assert!(status == 201 || status == 204, "status {status}");
    assert_eq!(nginx.read("/a/b.txt").as_deref(), Some(&b"hello"[..]));
}

#[test]
fn etcd_answers_health_and_survives_restart() {
    let mut etcd = Etcd::start().unwrap();
    let (status, _) = http(etcd.client, "GET", "/health", &[], b"").unwrap();
    assert_eq!(status, 200);
    etcd.restart().unwrap();
}
