//! Which proxy-wasm host the test host behaves as.
//!
//! Two profiles, each a set of capabilities rather than a name checked here and
//! there, so a test can take one and change one capability:
//!
//! * [`Profile::envoy`]: Envoy's behaviour, as the filter was written for;
//! * [`Profile::strict`]: ngx_wasm_module's documented limits (its
//!   `docs/PROXY_WASM.md` support tables and its host functions): shared queues
//!   exist only when nginx.conf declares them (`shm_queue`), and registering any
//!   other name traps; `proxy_grpc_call` is not implemented; `proxy_on_queue_ready` is
//!   never called; `proxy_set_effective_context` returns OK and switches nothing;
//!   `response.code_details` is not a property there; a failed `on_configure` kills
//!   the worker, whose requests then hang.

/// What happens when a VM's `on_configure` fails (returns false or traps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigureFailure {
    /// The proxy refuses the configuration: it does not start (Envoy).
    Refused,
    /// The worker dies and is not respawned; its requests are never answered (nginx).
    Fatal,
}

/// A proxy-wasm host's capabilities, as the test host honours them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The profile's name, for messages.
    pub name: &'static str,
    /// `None`: any queue name registers (Envoy). `Some(names)`: only these do, and
    /// registering another traps (ngx_wasm_module's `shm_queue`).
    pub declared_queues: Option<Vec<String>>,
    /// Registering an undeclared queue traps (ngx_wasm_module); else it returns a
    /// status (`NotFound`), as a host that refuses without trapping would.
    pub undeclared_queue_traps: bool,
    /// `None`: shared data takes any key (Envoy). `Some(names)`: a key's namespace (its
    /// text before the first `/`) must be one of these, or `*` (the default namespace)
    /// must be, else the call traps (ngx_wasm_module's `shm_kv NAME SIZE;`).
    pub kv_namespaces: Option<Vec<String>>,
    /// `proxy_grpc_call` dispatches (else it returns `Unimplemented`).
    pub grpc: bool,
    /// The host calls `proxy_on_queue_ready` after an enqueue.
    pub queue_ready: bool,
    /// `proxy_set_effective_context` switches the context later calls act on (else it
    /// returns OK and does nothing).
    pub switches_context: bool,
    /// The `response.code_details` property exists.
    pub code_details: bool,
    /// What a failed `on_configure` does.
    pub configure_failure: ConfigureFailure,
}

impl Profile {
    /// Envoy's behaviour.
    pub fn envoy() -> Profile {
        Profile {
            name: "envoy",
            declared_queues: None,
            undeclared_queue_traps: false,
            kv_namespaces: None,
            grpc: true,
            queue_ready: true,
            switches_context: true,
            code_details: true,
            configure_failure: ConfigureFailure::Refused,
        }
    }

    /// ngx_wasm_module's documented limits, with no queue declared and the shared-data
    /// namespace `fencekeeper` declared.
    pub fn strict() -> Profile {
        Profile {
            name: "strict",
            declared_queues: Some(Vec::new()),
            undeclared_queue_traps: true,
            // As docs/proxy-wasm-hosts.md tells an operator to declare.
            kv_namespaces: Some(vec!["fencekeeper".to_owned()]),
            grpc: false,
            queue_ready: false,
            switches_context: false,
            code_details: false,
            configure_failure: ConfigureFailure::Fatal,
        }
    }

    /// This profile with the queue `name` declared (`shm_queue name SIZE;`).
    pub fn declaring_queue(mut self, name: &str) -> Profile {
        if let Some(names) = &mut self.declared_queues {
            names.push(name.to_owned());
        }
        self
    }

    /// Whether shared-data key `key` resolves to a declared namespace.
    pub fn kv_declared(&self, key: &str) -> bool {
        let Some(names) = &self.kv_namespaces else { return true };
        let namespace = key.split_once('/').map(|(ns, _)| ns);
        names.iter().any(|n| n == "*" || Some(n.as_str()) == namespace)
    }

    /// Whether a queue of this name may be registered.
    pub fn queue_declared(&self, name: &str) -> bool {
        self.declared_queues.as_ref().is_none_or(|names| names.iter().any(|n| n == name))
    }
}
