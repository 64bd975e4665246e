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
