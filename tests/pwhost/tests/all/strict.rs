//! What the strict profile (ngx_wasm_module's documented limits) does to a filter
//! that assumes Envoy.

use crate::common::filter;
use fencekeeper_pwhost::{Profile, Proxy, Request, State};
use serde_json::json;

#[test]
fn configured_for_envoy_the_filter_registers_an_undeclared_queue_and_its_worker_dies_with_requests_hanging() {
    let config = json!({"etcd": null, "mode": "efficiency"}).to_string();
    let Ok(mut proxy) = Proxy::start(filter(), Profile::strict(), &config, 1) else {
        panic!("a strict host does not refuse a configuration: its worker dies")
    };
    assert!(!proxy.alive(0));
    assert!(proxy.violations().iter().any(|v| v.contains("could not find queue")), "{:?}", proxy.violations());
    let id = proxy.send(0, Request::put("/r").token("1"));
    assert_eq!(proxy.state(id), State::Hung);
}

#[test]
fn the_envoy_profile_refuses_a_configuration_the_filter_fails() {
    let config = json!({"mode": "no such mode"}).to_string();
    let Err(e) = Proxy::start(filter(), Profile::envoy(), &config, 1) else { panic!("a bad mode configured") };
    assert!(e.to_string().contains("bad plugin configuration"), "{e}");
}

/// A host that refuses the queue's name with a status: the filter configures, says so
/// in one line, and its tick does the wake's work.
#[test]
fn a_queue_the_host_refuses_leaves_the_tick_to_resume_held_writes() {
    let profile = Profile { declared_queues: Some(Vec::new()), undeclared_queue_traps: false, ..Profile::envoy() };
    let config = crate::modes::efficiency(None);
    let mut proxy = crate::common::start(profile, &config, 2);
    let lines = proxy.logs().iter().filter(|l| l.text.contains("the host refused to register shared queue")).count();
    assert_eq!(lines, 2, "one line per worker: {:?}", proxy.logs());
    let a = proxy.send(0, Request::put("/r").token("33"));
    let b = proxy.send(1, Request::put("/r").token("34"));
    assert_eq!(proxy.state(b), State::Held);
    proxy.respond(a, 201);
    assert_eq!(proxy.state(b), State::Held, "nothing woke 34's worker");
    proxy.advance(100);
    assert_eq!(proxy.state(b), State::AtUpstream, "its tick re-checked it");
    assert!(proxy.violations().is_empty(), "{:?}", proxy.violations());
}

/// Marks in etcd over gRPC on a host without gRPC calls: the filter configures, and
/// refuses every fenced write (in both modes) with one line naming the missing call.
/// Reads pass.
#[test]
fn etcd_modes_without_grpc_calls_configure_and_refuse_each_fenced_write_naming_the_missing_call() {
    for mode in ["correctness", "efficiency"] {
        let config = json!({"host": "portable", "mode": mode, "provenance": "weak", "etcd": {"api": "grpc"}});
        let mut proxy = crate::common::start(Profile::strict(), &config, 1);
        let id = proxy.send(0, Request::put("/r").token("7"));
        let refused = crate::common::answer(&mut proxy, id);
        assert_eq!(refused.status, 503, "{mode}: {refused:?}");
        assert!(refused.body.contains("proxy_grpc_call"), "{mode}: {refused:?}");
        assert_eq!(refused.body.trim_end().lines().count(), 1, "{mode}: one line");
        let read = proxy.send(0, Request { method: "GET".into(), ..Request::put("/r") });
        assert_eq!(proxy.state(read), State::AtUpstream, "{mode}: a read is not fenced");
        proxy.advance(10_000);
        assert_eq!(proxy.grpc_calls(), 0, "{mode}: never asked the host for a gRPC call");
        assert_eq!(proxy.metric("fencekeeper.undecided"), Some(1), "{mode}");
        assert!(proxy.violations().is_empty(), "{mode}: {:?}", proxy.violations());
    }
}

/// The same configuration under Envoy's profile calls etcd (here unavailable: 503).
#[test]
fn under_envoy_the_etcd_mode_calls_etcd() {
    let mut proxy = crate::common::start(Profile::envoy(), &json!({"mode": "correctness"}), 1);
    let id = proxy.send(0, Request::put("/r").token("7"));
    let refused = crate::common::answer(&mut proxy, id);
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(proxy.grpc_calls() > 0);
    assert!(!refused.body.contains("proxy_grpc_call"), "{refused:?}");
}

/// Shared data in a namespace nginx.conf does not declare traps: the filter's keys are
/// `fencekeeper/...`, and configure writes them first.
#[test]
fn without_the_shm_kv_namespace_declared_the_filter_cannot_start_under_strict() {
    let config = crate::modes::efficiency(Some("portable")).to_string();
    let undeclared = Profile { kv_namespaces: Some(vec!["other".to_owned()]), ..Profile::strict() };
    let Ok(proxy) = Proxy::start(filter(), undeclared, &config, 1) else { panic!("strict: the worker dies") };
    assert!(!proxy.alive(0));
    assert!(proxy.violations().iter().any(|v| v.contains("could not resolve namespace")), "{:?}", proxy.violations());
    // The default namespace serves too.
    let default = Profile { kv_namespaces: Some(vec!["*".to_owned()]), ..Profile::strict() };
    let Ok(proxy) = Proxy::start(filter(), default, &config, 1) else { panic!("strict never refuses") };
    assert!(proxy.alive(0), "{:?}", proxy.violations());
}
