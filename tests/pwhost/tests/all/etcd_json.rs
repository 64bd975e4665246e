//! Marks in a real etcd through its JSON API (`"etcd": {"api": "json"}`, the default
//! on a portable host): the filter's HTTP calls go to the etcd the test starts, as
//! ngx_wasm_module's `proxy_http_call` would send them to `host:port`.

use crate::common::{answer, filter, write};
use fencekeeper_harness::services::{self, Etcd};
use fencekeeper_pwhost::{CallAnswer, Callout, Profile, Proxy, Request};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::net::SocketAddr;
use std::rc::Rc;

/// The calls the filter made: (upstream, path).
type Calls = Rc<RefCell<Vec<(String, String)>>>;

/// A proxy whose HTTP calls go to `etcd`'s client port, each recorded in `calls`;
/// `down` makes every call fail as an unreachable etcd does.
fn proxy(profile: Profile, config: &Value, workers: usize, calls: &Calls, down: Rc<RefCell<bool>>) -> Proxy {
    let calls = Rc::clone(calls);
    let answerer = Box::new(move |call: &Callout| {
        let path = call.header(":path").unwrap_or_default();
        calls.borrow_mut().push((call.upstream.clone(), path.clone()));
        if *down.borrow() {
            return CallAnswer::failed();
        }
        let Ok(addr) = call.upstream.parse::<SocketAddr>() else { return CallAnswer::failed() };
        let method = call.header(":method").unwrap_or_default();
        let mut headers = Vec::new();
        for name in ["content-type", "authorization"] {
            if let Some(v) = call.header(name) {
                headers.push((name, v));
            }
        }
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        match services::http(addr, &method, &path, &headers, &call.body) {
            Ok((status, body)) => CallAnswer::new(status, body),
            Err(_) => CallAnswer::failed(),
        }
    });
    match Proxy::start_answering(filter(), profile, &config.to_string(), workers, answerer) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Correctness mode on a portable host, marks in `etcd` through its JSON API, the
/// gate of this proxy only.
fn portable(etcd: &Etcd) -> Value {
    json!({
        "host": "portable",
        "etcd": {"cluster": etcd.client.to_string()},
        "gate": {"shared": false},
    })
}

#[test]
fn correctness_mode_keeps_its_marks_in_etcd_through_the_json_api_under_both_profiles() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("etcd: {e:#}"));
    for (profile, api) in [(Profile::strict(), None), (Profile::envoy(), Some("json"))] {
        let mut config = portable(&etcd);
        let prefix = format!("/fk-{}/", profile.name);
        config["etcd"]["key_prefix"] = json!(prefix);
        if let Some(api) = api {
            // Envoy makes HTTP calls too: the JSON API chosen by configuration.
            config["host"] = json!("envoy");
            config["etcd"]["api"] = json!(api);
        }
        let name = format!("{} profile", profile.name);
        let calls: Calls = Rc::default();
        let mut first = proxy(profile.clone(), &config, 2, &calls, Rc::default());
        let a = write(&mut first, 0, Request::put("/r").token("34"));
        assert_eq!((a.status, a.local), (201, false), "{name}: {a:?}");
        let again = write(&mut first, 1, Request::put("/r").token("34"));
        assert_eq!(again.status, 201, "{name}: the holder writes again: {again:?}");
        let stale = write(&mut first, 1, Request::put("/r").token("33"));
        assert_eq!(stale.status, 409, "{name}: {stale:?}");
        assert_eq!(stale.header("fencing-highest"), Some("34"), "{name}");
        assert!(first.violations().is_empty(), "{name}: {:?}", first.violations());
        assert!(!calls.borrow().is_empty(), "{name}: etcd was called");
        for (upstream, path) in calls.borrow().iter() {
            assert_eq!((upstream.as_str(), path.as_str()), (etcd.client.to_string().as_str(), "/v3/kv/txn"), "{name}");
        }
        // A second proxy on the same etcd, with nothing in its shared data: the mark
        // is etcd's.
        let mut second = proxy(profile.clone(), &config, 1, &calls, Rc::default());
        let stale = write(&mut second, 0, Request::put("/r").token("33"));
        assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("34")), "{name}: {stale:?}");
        let next = write(&mut second, 0, Request::put("/r").token("35"));
        assert_eq!(next.status, 201, "{name}: {next:?}");
        let stale = write(&mut first, 0, Request::put("/r").token("34"));
        assert_eq!((stale.status, stale.header("fencing-highest")), (409, Some("35")), "{name}: {stale:?}");
        // The record in etcd, read through the gateway as a client would.
        // The resource is the request's path.
        let key = format!("{prefix}/r");
        let (status, body) = read_key(etcd.client, &key);
        assert_eq!(status, 200);
        let record = fencekeeper_core::record::encode(b"/r", &fencekeeper_core::token!("35"));
        assert!(
            String::from_utf8_lossy(&body).contains(&b64(record.as_bytes())),
            "{name}: {}",
            String::from_utf8_lossy(&body)
        );
    }
}

#[test]
fn an_unreachable_etcd_refuses_the_write_and_forwards_nothing() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("etcd: {e:#}"));
    let calls: Calls = Rc::default();
    let down = Rc::new(RefCell::new(true));
    let mut proxy = proxy(Profile::strict(), &portable(&etcd), 1, &calls, Rc::clone(&down));
    let id = proxy.send(0, Request::put("/r").token("7"));
    let refused = answer(&mut proxy, id);
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("etcd"), "{refused:?}");
    assert_eq!(refused.body.trim_end().lines().count(), 1, "one line: {refused:?}");
    assert!(proxy.forwarded(id).is_none(), "nothing forwarded");
    // etcd back: the same write goes.
    *down.borrow_mut() = false;
    let a = write(&mut proxy, 0, Request::put("/r").token("7"));
    assert_eq!(a.status, 201, "{a:?}");
}

#[test]
fn provenance_reads_etcds_revision_through_the_json_api() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("etcd: {e:#}"));
    let mut config = portable(&etcd);
    config["provenance"] = json!("weak");
    let calls: Calls = Rc::default();
    let mut proxy = proxy(Profile::strict(), &config, 1, &calls, Rc::default());
    // A token etcd never issued (far above its revision) is refused, and sets no mark.
    let forged = write(&mut proxy, 0, Request::put("/r").token("18446744073709551615"));
    assert_eq!(forged.status, 403, "{forged:?}");
    let honest = write(&mut proxy, 0, Request::put("/r").token("1"));
    assert_eq!(honest.status, 201, "a revision etcd has reached: {honest:?}");
}

#[test]
fn the_shared_gate_cannot_run_on_a_portable_host_and_each_fenced_write_says_so() {
    let etcd = Etcd::start().unwrap_or_else(|e| panic!("etcd: {e:#}"));
    let mut config = portable(&etcd);
    config["gate"] = json!({});
    let calls: Calls = Rc::default();
    let mut proxy = proxy(Profile::strict(), &config, 1, &calls, Rc::default());
    let refused = write(&mut proxy, 0, Request::put("/r").token("7"));
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("gate.shared") && refused.body.contains("\"shared\": false"), "{refused:?}");
    assert!(calls.borrow().is_empty(), "nothing asked of etcd");
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}

fn b64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for i in 0..4 {
            out.push(if i <= chunk.len() { A[(n >> (18 - 6 * i) & 63) as usize] as char } else { '=' });
        }
    }
    out
}

/// etcd's answer to a range read of `key` through its JSON API.
fn read_key(etcd: SocketAddr, key: &str) -> (u16, Vec<u8>) {
    let body = json!({"key": b64(key.as_bytes())}).to_string();
    services::http(etcd, "POST", "/v3/kv/range", &[], body.as_bytes()).unwrap_or_else(|e| panic!("{e:#}"))
}
