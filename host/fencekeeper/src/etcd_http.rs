//! One HTTP client to etcd's v3 JSON gateway, shared by the etcd mark store and the
//! etcd provenance check when they talk to the same etcd: one connection pool, and one
//! record of the highest revision any answer carried (revisions only grow, so a token
//! at or below it was issued; the weak provenance check then needs no round trip).

use fencekeeper_etcd_wire as wire;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The transport: the endpoint, a blocking agent, the highest revision seen.
pub(crate) struct EtcdHttp {
    endpoint: String,
    agent: ureq::Agent,
    revision: AtomicU64,
}

impl EtcdHttp {
    /// A client of `endpoint` (`http://HOST:PORT`) whose calls time out after `timeout`.
    /// Nothing is sent yet. The error is one line.
    pub(crate) fn new(endpoint: &str, timeout: Duration) -> Result<EtcdHttp, String> {
        let endpoint = endpoint.trim_end_matches('/').to_owned();
        if !endpoint.starts_with("http://") {
            return Err(format!("etcd endpoint {endpoint:?} must look like http://HOST:PORT (TLS is not supported)"));
        }
        let config = ureq::Agent::config_builder()
            .timeout_global(Some(timeout))
            .http_status_as_error(false)
            // The gateway calls from many blocking threads at once.
            .max_idle_connections(64)
            .max_idle_connections_per_host(64)
            .build();
        Ok(EtcdHttp { endpoint, agent: ureq::Agent::new_with_config(config), revision: AtomicU64::new(0) })
    }

    /// `http://HOST:PORT`.
    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// One request: the body of its 200 answer, or why there is none (one line, naming
    /// the endpoint).
    pub(crate) fn call(&self, path: &str, body: String) -> Result<Vec<u8>, String> {
        let failed = |detail: &dyn std::fmt::Display| format!("etcd at {}: {detail}", self.endpoint);
        let mut response = self
            .agent
            .post(format!("{}{path}", self.endpoint))
            .content_type("application/json")
            .send(body)
            .map_err(|e| failed(&e))?;
        let status = response.status().as_u16();
        let bytes = response.body_mut().read_to_vec().map_err(|e| failed(&e))?;
        if status != 200 {
            return Err(failed(&wire::status_error(status, &bytes)));
        }
        Ok(bytes)
    }

    /// Remember that the cluster has reached `revision`.
    pub(crate) fn saw(&self, revision: u64) {
        self.revision.fetch_max(revision, Relaxed);
    }

    /// The highest revision any answer carried (0 before the first).
    pub(crate) fn revision(&self) -> u64 {
        self.revision.load(Relaxed)
    }
}
