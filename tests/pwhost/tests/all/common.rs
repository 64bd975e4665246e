//! What every test here starts from: the filter under test, compiled once.

use fencekeeper_pwhost::{Answer, Binary, Profile, Proxy, State, StreamId};
use std::sync::OnceLock;

/// The filter under test (the committed artifact, or `$FENCEKEEPER_GUEST_DIR`'s).
pub fn filter() -> &'static Binary {
    static FILTER: OnceLock<Binary> = OnceLock::new();
    FILTER.get_or_init(|| {
        #[allow(clippy::expect_used)]
        Binary::load(&fencekeeper_harness::envoy::filter_path()).expect("the filter compiles")
    })
}

/// A proxy of `workers` workers under `profile`, configured with `config`, that started.
pub fn start(profile: Profile, config: &serde_json::Value, workers: usize) -> Proxy {
    match Proxy::start(filter(), profile, &config.to_string(), workers) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

/// Send `request` to `worker`; the store answers 201 if it gets it. The answer.
pub fn write(proxy: &mut Proxy, worker: usize, request: fencekeeper_pwhost::Request) -> Answer {
    let id = proxy.send(worker, request);
    if proxy.state(id) == State::AtUpstream {
        proxy.respond(id, 201);
    }
    answer(proxy, id)
}

/// The answer request `id` got (it must have one).
pub fn answer(proxy: &mut Proxy, id: StreamId) -> Answer {
    match proxy.state(id) {
        State::Answered(a) => a,
        other => panic!("{} profile: not answered: {other:?} ({:?})", proxy.profile().name, proxy.violations()),
    }
}
