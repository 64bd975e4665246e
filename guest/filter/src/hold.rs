//! Whether this host lets the filter hold a request and act on it later.
//!
//! A write held at the ordering gate is answered, or resumed, by the root context
//! (its tick, its queue), after switching the effective context to the request with
//! `proxy_set_effective_context`. Envoy switches. ngx_wasm_module returns OK and
//! switches nothing: the root's answer then goes to the root, which has no request
//! (nginx crashed on it), and the held request is never answered. So before the
//! first write is held, the filter asks the host once, from the request's own
//! callback: switch to the root, and read a request header. A host that switched
//! answers for the root, which has no request headers; one that did not answers
//! for the request. Then it switches back. With `"host": "portable"` it does not ask:
//! nothing is held.
//!
//! Where the answer is no, a write that would wait is refused at once, from its own
//! context (503 with `Retry-After`: the lower write it waits for will end), never
//! left hanging and never answered from the root.

use proxy_wasm::hostcalls;
use std::cell::Cell;

/// What the filter knows of the host's context switch.
pub struct Hold {
    known: Cell<Option<bool>>,
}

impl Hold {
    /// Ask the host before the first hold (Envoy's behaviour is expected).
    pub fn ask() -> Hold {
        Hold { known: Cell::new(None) }
    }

    /// Never hold (`"host": "portable"`).
    pub fn never() -> Hold {
        Hold { known: Cell::new(Some(false)) }
    }

    /// Whether a request may be held for the root to act on later; asked of the host
    /// from `context`'s own callback (the effective context), the first time only.
    pub fn possible(&self, root: u32, context: u32) -> bool {
        if let Some(known) = self.known.get() {
            return known;
        }
        let switches = switches(root, context);
        if !switches {
            log::warn!(
                "fencekeeper: this proxy-wasm host does not switch contexts (proxy_set_effective_context): writes \
                 that would wait at the ordering gate are refused (503) instead of held"
            );
        }
        self.known.set(Some(switches));
        switches
    }
}

/// Whether the host switches the effective context from `context` to `root` and back.
fn switches(root: u32, context: u32) -> bool {
    if hostcalls::set_effective_context(root).is_err() {
        return false;
    }
    let sees_the_request = raw::request_header(":method");
    // Back to the request, whatever the answer: what follows answers it.
    if hostcalls::set_effective_context(context).is_err() {
        log::error!("fencekeeper: the host did not switch back to the request's context");
        return false;
    }
    !sees_the_request
}

#[cfg(target_arch = "wasm32")]
mod raw {
    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_get_header_map_value(
            map: u32,
            key: *const u8,
            size: usize,
            data: *mut *mut u8,
            len: *mut usize,
        ) -> u32;
    }

    /// Whether the effective context has request header `name`. The SDK's own call
    /// traps on any status but OK and not-found; a root context's answer may be
    /// another (Envoy: bad argument).
    pub fn request_header(name: &str) -> bool {
        let (mut data, mut len) = (std::ptr::null_mut(), 0usize);
        // SAFETY: `name` is valid for its length; two valid out-pointers. On success
        // the host allocated `len` bytes at `data` through the SDK's allocator, a
        // `Vec<u8>` of exactly that capacity, which is ours to free.
        let status = unsafe { proxy_get_header_map_value(0, name.as_ptr(), name.len(), &mut data, &mut len) };
        if status == 0 && !data.is_null() {
            // SAFETY: as above.
            drop(unsafe { Vec::from_raw_parts(data, len, len) });
        }
        status == 0
    }
}

/// Natively (unit tests) there is no host.
#[cfg(not(target_arch = "wasm32"))]
mod raw {
    pub fn request_header(_name: &str) -> bool {
        true
    }
}
