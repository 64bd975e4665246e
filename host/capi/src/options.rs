//! What a guard is opened with: the validator, the policy, the store, the audit
//! file. A zeroed `fencekeeper_options` is the default guard: the bundled validator,
//! correctness mode, not strict, marks in memory, no audit file.

use crate::boundary::{Failure, FENCEKEEPER_ERR_AUDIT, FENCEKEEPER_ERR_LOAD, FENCEKEEPER_ERR_STORE};
use crate::raw;
use fencekeeper::audit::AuditLog;
use fencekeeper::etcd::{EtcdAuth, EtcdOptions, EtcdTls};
use fencekeeper::store::{EtcdStore, MarkStore, ETCD_DEFAULT_PREFIX};
use fencekeeper::{FileStore, Guard, GuestSource, Limits, MemoryStore, Mode, Policy, Validator};
use std::ffi::c_char;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The policy's mode: one of the `FENCEKEEPER_MODE_*` values.
#[allow(non_camel_case_types)]
pub type fencekeeper_mode = i32;
/// Fail closed: refuse whenever no verdict can be reached (the default).
pub const FENCEKEEPER_MODE_CORRECTNESS: fencekeeper_mode = 0;
/// Let a write through when the mark store fails (and say so: `failed_open`).
/// Nothing a request carries opens it.
pub const FENCEKEEPER_MODE_EFFICIENCY: fencekeeper_mode = 1;

/// Where the guard's own marks live: one of the `FENCEKEEPER_STORE_KIND_*` values.
#[allow(non_camel_case_types)]
pub type fencekeeper_store_kind = i32;
/// In memory, for the guard's lifetime (the default; also the choice of a guard
/// used only with `fencekeeper_admit_in`).
pub const FENCEKEEPER_STORE_KIND_MEMORY: fencekeeper_store_kind = 0;
/// A durable file (`store_path`): each advance fsync'd before the admit returns.
pub const FENCEKEEPER_STORE_KIND_FILE: fencekeeper_store_kind = 1;
/// etcd (`etcd_endpoint`, with TLS and a user when set): marks shared by every
/// host that uses the same etcd and prefix.
pub const FENCEKEEPER_STORE_KIND_ETCD: fencekeeper_store_kind = 2;

/// How to open a guard. Zero every field you do not set (`= {0}` in C): zero is
/// each field's default. Strings are NUL-terminated; the library copies what it
/// keeps and holds no pointer into this struct after `fencekeeper_guard_open`.
#[allow(non_camel_case_types)]
#[repr(C)]
pub struct fencekeeper_options {
    /// A validator component file implementing `fencekeeper:validator@0.3.0`
    /// (NULL: the bundled validator). It must pass the conformance vectors to load.
    pub guest_path: *const c_char,
    /// One of `FENCEKEEPER_MODE_*`.
    pub mode: fencekeeper_mode,
    /// Nonzero: strict, a token equal to the mark is refused as replayed.
    pub strict: u8,
    /// One of `FENCEKEEPER_STORE_KIND_*`.
    pub store: fencekeeper_store_kind,
    /// `FENCEKEEPER_STORE_KIND_FILE`: the store's file (created if missing, and
    /// the directories it is in).
    pub store_path: *const c_char,
    /// `FENCEKEEPER_STORE_KIND_ETCD`: `http://HOST:PORT`, or `https://HOST:PORT`
    /// with `etcd_ca`.
    pub etcd_endpoint: *const c_char,
    /// The etcd key prefix of marks (NULL: `/fencekeeper/marks/`, the one the
    /// gateway and the Envoy filter use).
    pub etcd_prefix: *const c_char,
    /// Per-call timeout in milliseconds (0: 2000).
    pub etcd_timeout_ms: u32,
    /// PEM file of the CA that signed etcd's certificate (required for https).
    pub etcd_ca: *const c_char,
    /// PEM client certificate and its key, for an etcd that asks for one.
    pub etcd_cert: *const c_char,
    /// See `etcd_cert`.
    pub etcd_key: *const c_char,
    /// etcd user and password, for an etcd with authentication on.
    pub etcd_user: *const c_char,
    /// See `etcd_user`.
    pub etcd_password: *const c_char,
    /// A file to append one JSON line to for every mark `fencekeeper_admit` raises
    /// (fdatasync'd before the admit returns; NULL: none). Opened before the store.
    pub audit_path: *const c_char,
    /// The `host` of audit lines (NULL: "capi").
    pub host_name: *const c_char,
}

/// A guard as the ABI holds it.
pub(crate) struct Opened {
    pub(crate) guard: Guard,
    pub(crate) audit: Option<AuditLog>,
    pub(crate) host: String,
    /// The guard's own store, as audit lines name it.
    pub(crate) store_name: String,
}

/// The options, copied out of the caller's struct and strings.
struct Settings {
    policy: Policy,
    guest: Option<PathBuf>,
    store: fencekeeper_store_kind,
    store_path: Option<PathBuf>,
    etcd_endpoint: Option<String>,
    etcd: EtcdOptions,
    etcd_prefix: String,
    audit: Option<PathBuf>,
    host: String,
}

/// Open what `options` describe.
///
/// # Safety
/// Every non-NULL string pointer in `options` points at a NUL-terminated string.
pub(crate) unsafe fn open(options: &fencekeeper_options) -> Result<Opened, Failure> {
    // SAFETY: this function's contract.
    let settings = unsafe { Settings::read(options)? };
    let source = settings.guest.as_deref().map_or(GuestSource::Bundled, GuestSource::Path);
    let validator = Validator::load(source, settings.policy, Limits::default())
        .map_err(|e| Failure::new(FENCEKEEPER_ERR_LOAD, format!("cannot load the validator: {e}")))?;
    // Opened before the store: an advance that cannot be audited is never made by a
    // guard that was asked to audit.
    let audit =
        settings.audit.as_ref().map(AuditLog::open).transpose().map_err(|e| Failure::new(FENCEKEEPER_ERR_AUDIT, e))?;
    let (store, store_name) = settings.open_store()?;
    Ok(Opened { guard: Guard::new(Arc::new(validator), store), audit, host: settings.host, store_name })
}

type Store = Arc<dyn MarkStore + Send + Sync>;

impl Settings {
    /// # Safety
    /// As for [`open`].
    unsafe fn read(o: &fencekeeper_options) -> Result<Settings, Failure> {
        let mode = match o.mode {
            FENCEKEEPER_MODE_CORRECTNESS => Mode::Correctness,
            FENCEKEEPER_MODE_EFFICIENCY => Mode::Efficiency,
            other => return Err(Failure::argument(format!("mode {other} is not a FENCEKEEPER_MODE_* value"))),
        };
        let text = |ptr, what| {
            // SAFETY: `read`'s contract covers every string of the options.
            unsafe { raw::text(ptr, what) }.map(|t| t.map(str::to_owned))
        };
        // SAFETY: as above.
        let path = |ptr, what| unsafe { raw::path(ptr, what) };
        let cert = path(o.etcd_cert, "etcd_cert")?;
        let key = path(o.etcd_key, "etcd_key")?;
        let tls = match path(o.etcd_ca, "etcd_ca")? {
            Some(ca) => Some(EtcdTls { ca, cert, key }),
            None if cert.is_some() || key.is_some() => {
                return Err(Failure::argument(
                    "etcd_cert and etcd_key need etcd_ca (the CA that signed etcd's certificate)",
                ))
            }
            None => None,
        };
        let auth = match (text(o.etcd_user, "etcd_user")?, text(o.etcd_password, "etcd_password")?) {
            (Some(user), Some(password)) => Some(EtcdAuth { user, password }),
            (None, None) => None,
            _ => return Err(Failure::argument("etcd_user and etcd_password go together")),
        };
        let timeout = match o.etcd_timeout_ms {
            0 => Duration::from_secs(2),
            ms => Duration::from_millis(u64::from(ms)),
        };
        let prefix = text(o.etcd_prefix, "etcd_prefix")?.unwrap_or_else(|| ETCD_DEFAULT_PREFIX.to_owned());
        Ok(Settings {
            policy: Policy { mode, strict: o.strict != 0 },
            guest: path(o.guest_path, "guest_path")?,
            store: o.store,
            store_path: path(o.store_path, "store_path")?,
            etcd_endpoint: text(o.etcd_endpoint, "etcd_endpoint")?,
            etcd: EtcdOptions { timeout, tls, auth, runtime: None },
            etcd_prefix: prefix,
            audit: path(o.audit_path, "audit_path")?,
            host: text(o.host_name, "host_name")?.unwrap_or_else(|| "capi".to_owned()),
        })
    }

    fn open_store(&self) -> Result<(Store, String), Failure> {
        let failed = |e: fencekeeper::StoreError| Failure::new(FENCEKEEPER_ERR_STORE, e);
        match self.store {
            FENCEKEEPER_STORE_KIND_MEMORY => Ok((Arc::new(MemoryStore::new()), "memory".to_owned())),
            FENCEKEEPER_STORE_KIND_FILE => {
                let path =
                    self.store_path.as_ref().ok_or_else(|| Failure::argument("a file store needs store_path"))?;
                Ok((Arc::new(FileStore::open(path).map_err(failed)?), format!("file {}", path.display())))
            }
            FENCEKEEPER_STORE_KIND_ETCD => {
                let endpoint = self
                    .etcd_endpoint
                    .as_deref()
                    .ok_or_else(|| Failure::argument("an etcd store needs etcd_endpoint"))?;
                let name = format!("etcd {endpoint} prefix {}", self.etcd_prefix);
                let store = EtcdStore::connect_with(endpoint, &self.etcd_prefix, &self.etcd).map_err(failed)?;
                Ok((Arc::new(store), name))
            }
            other => Err(Failure::argument(format!("store {other} is not a FENCEKEEPER_STORE_KIND_* value"))),
        }
    }
}
