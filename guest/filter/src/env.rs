//! One variable of the VM's environment: where the etcd password comes from.
//!
//! A password in the plugin configuration would be shown to anyone with Envoy's
//! admin `/config_dump`. Envoy instead copies the variables that
//! `vm_config.environment_variables.host_env_keys` names from its own process
//! environment into the VM's, which a module reads with WASI's `environ_sizes_get`
//! and `environ_get` (Envoy provides both to every module, whatever it was built
//! for); only the variable's name is in the configuration. The filter is built for
//! wasm32-unknown-unknown, whose std has no environment, so it imports the two
//! functions itself.
//!
//! Only the one named variable is kept; the copy of the whole environment is
//! overwritten before it is freed. A value is never logged nor put in an error.

use std::fmt;

/// The most bytes of the VM's whole environment read (Envoy passes only the
/// variables named in the configuration, so it is small): a bound, not a guess.
const MAX_ENVIRONMENT_BYTES: usize = 64 * 1024;
/// The most entries of the VM's environment read.
const MAX_ENTRIES: usize = 1024;
/// The longest password accepted.
pub const MAX_SECRET_BYTES: usize = 1024;

/// A secret read from the environment. Its `Debug` does not show it, and its memory
/// is overwritten when it is dropped.
pub struct Secret(String);

impl Secret {
    /// The secret, for the one request body that carries it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        wipe(std::mem::take(&mut self.0).into_bytes());
    }
}

/// Overwrite `bytes` before they are freed: a later allocation must not find a
/// password in memory the VM hands out again.
pub(crate) fn wipe(mut bytes: Vec<u8>) {
    for b in bytes.iter_mut() {
        // Volatile, so the compiler keeps writes to memory about to be freed.
        // SAFETY: `b` is a valid, aligned, exclusive reference into the vector.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
}

/// Why the variable could not be read; names the variable, never a value.
#[derive(Debug, PartialEq, Eq)]
pub struct EnvError(pub String);

impl fmt::Display for EnvError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The value of `name` in the VM's environment: present, not empty, UTF-8 (it goes
/// into a JSON body) and at most [`MAX_SECRET_BYTES`].
pub fn secret(name: &str) -> Result<Secret, EnvError> {
    let environment =
        environment().map_err(|why| EnvError(format!("cannot read the VM's environment for {name}: {why}")))?;
    let found = find(&environment, name).map(<[u8]>::to_vec);
    wipe(environment);
    let missing = || {
        EnvError(format!(
            "environment variable {name} (etcd.password_env) is not set in the VM: Envoy must run with it \
             and list it in vm_config.environment_variables.host_env_keys"
        ))
    };
    let value = found.ok_or_else(missing)?;
    let problem = if value.is_empty() {
        Some("is empty".to_owned())
    } else if value.len() > MAX_SECRET_BYTES {
        Some(format!("is longer than {MAX_SECRET_BYTES} bytes"))
    } else {
        None
    };
    if let Some(problem) = problem {
        wipe(value);
        return Err(EnvError(format!("environment variable {name} (etcd.password_env) {problem}")));
    }
    match String::from_utf8(value) {
        Ok(text) => Ok(Secret(text)),
        Err(e) => {
            wipe(e.into_bytes());
            Err(EnvError(format!("environment variable {name} (etcd.password_env) is not UTF-8")))
        }
    }
}

/// The value of `name` in `environment`, WASI's `NAME=VALUE\0` entries one after the
/// other.
fn find<'a>(environment: &'a [u8], name: &str) -> Option<&'a [u8]> {
    environment.split(|&b| b == 0).find_map(|entry| {
        let rest = entry.strip_prefix(name.as_bytes())?;
        rest.strip_prefix(b"=")
    })
}

#[cfg(target_arch = "wasm32")]
mod wasi {
    // WASI preview 1, as Envoy's proxy-wasm host provides it (errno 0 = success).
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    extern "C" {
        pub fn environ_sizes_get(count: *mut usize, buf_size: *mut usize) -> u16;
        pub fn environ_get(environ: *mut *mut u8, environ_buf: *mut u8) -> u16;
    }
}

/// The VM's environment, as WASI hands it over: `NAME=VALUE\0` entries.
#[cfg(target_arch = "wasm32")]
fn environment() -> Result<Vec<u8>, String> {
    let (mut count, mut size) = (0usize, 0usize);
    // SAFETY: both pointers are valid for a write of one usize (u32 on wasm32).
    let errno = unsafe { wasi::environ_sizes_get(&mut count, &mut size) };
    if errno != 0 {
        return Err(format!("environ_sizes_get failed (WASI errno {errno})"));
    }
    if count > MAX_ENTRIES || size > MAX_ENVIRONMENT_BYTES {
        return Err(format!("it holds {count} variables in {size} bytes, more than the filter reads"));
    }
    let mut pointers: Vec<*mut u8> = vec![std::ptr::null_mut(); count];
    let mut buffer = vec![0u8; size];
    // SAFETY: the host writes `count` pointers and `size` bytes, the sizes it gave
    // just above, into buffers of exactly those lengths.
    let errno = unsafe { wasi::environ_get(pointers.as_mut_ptr(), buffer.as_mut_ptr()) };
    if errno != 0 {
        wipe(buffer);
        return Err(format!("environ_get failed (WASI errno {errno})"));
    }
    Ok(buffer)
}

/// Natively (unit tests): the process environment, in WASI's layout.
#[cfg(not(target_arch = "wasm32"))]
fn environment() -> Result<Vec<u8>, String> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for (name, value) in std::env::vars_os() {
        out.extend_from_slice(name.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(0);
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_named_variable_is_found_and_no_other() {
        let env = b"FK_PASSWORD_X=no\0FK_PASSWORD=a=b c\0EMPTY=\0";
        assert_eq!(find(env, "FK_PASSWORD"), Some(&b"a=b c"[..]));
        assert_eq!(find(env, "EMPTY"), Some(&b""[..]));
        assert_eq!(find(env, "FK_PASS"), None);
        assert_eq!(find(env, "HOME"), None);
    }

    #[test]
    fn a_missing_or_empty_variable_is_named_and_a_value_never_shown() {
        // Natively the process environment stands in for the VM's. Only this test
        // sets these names.
        std::env::set_var("FK_TEST_ENV_SECRET", "s3cret value");
        std::env::set_var("FK_TEST_ENV_EMPTY", "");
        let e = secret("FK_TEST_ENV_UNSET").unwrap_err();
        assert!(
            e.0.contains("FK_TEST_ENV_UNSET") && e.0.contains("is not set") && e.0.contains("host_env_keys"),
            "{e}"
        );
        let e = secret("FK_TEST_ENV_EMPTY").unwrap_err();
        assert_eq!(e.0, "environment variable FK_TEST_ENV_EMPTY (etcd.password_env) is empty");
        let found = secret("FK_TEST_ENV_SECRET").unwrap();
        assert_eq!(found.expose(), "s3cret value");
        assert_eq!(format!("{found:?}"), "Secret(..)");
        std::env::set_var("FK_TEST_ENV_LONG", "x".repeat(MAX_SECRET_BYTES + 1));
        let e = secret("FK_TEST_ENV_LONG").unwrap_err();
        assert!(e.0.contains("longer than") && !e.0.contains("xx"), "{e}");
    }
}
