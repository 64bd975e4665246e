//! Waking this VM's root context from a request: a shared queue of the VM's own.
//!
//! A request that queues a confirm on an idle resource (`confirms`) must get the
//! root to send the batch's Txn. Enqueueing on a shared queue makes the host call the
//! root context that registered it (`on_queue_ready`), on this worker, right after
//! the current callback. Envoy keys queues by VM id and name, and every worker runs a
//! VM of the same id: a second registration of one name takes the queue's
//! notifications over. So each VM names its queue with 64 random bits from the host
//! (WASI `random_get`), which no other worker draws.
//!
//! Where no queue can be registered (a host that refuses the name with a status, or
//! `"host": "portable"`, for hosts that trap on a name they were not given or never
//! call `on_queue_ready`), nothing is woken: the root's tick does the work instead
//! (`gate.tick_ms`), and confirms are not batched.
//!
//! The ordering gate uses the same queue across workers: a worker holding a write
//! back lists its queue on the resource's shared entry, and the worker whose flight
//! ends enqueues on it; Envoy runs the listing worker's `on_queue_ready` on that
//! worker's thread.

use proxy_wasm::hostcalls;
use proxy_wasm::types::Status;

/// The queue's name: a fixed prefix and 64 random bits.
fn name(random: u64) -> String {
    format!("fencekeeper/wake/{random:016x}")
}

/// This VM's 64 random bits: its id (the ordering gate's owner of its flights, the
/// name of its heartbeat and of its queue). Should the host give no random bytes,
/// the clock's nanoseconds serve: workers start microseconds apart.
pub fn vm_id() -> u64 {
    random_u64().unwrap_or_else(|e| {
        log::warn!("fencekeeper: {e}; this worker's id is taken from the clock");
        hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos() as u64)
    })
}

/// Register VM `vm`'s queue, for [`wake`]. Never traps on a host that refuses the
/// name with a status (the SDK's own call would): the caller then does without.
/// A host that traps instead (ngx_wasm_module, on a name nginx.conf does not
/// declare) is never asked: `"host": "portable"` registers no queue.
pub fn register(vm: u64) -> Result<u32, String> {
    let name = name(vm);
    raw::register(&name)
        .map_err(|status| format!("the host refused to register shared queue {name:?} (status {status})"))
}

#[cfg(target_arch = "wasm32")]
mod raw {
    #[link(wasm_import_module = "env")]
    extern "C" {
        fn proxy_register_shared_queue(name: *const u8, size: usize, id: *mut u32) -> u32;
    }

    /// The queue's id, or the host's status (0 = OK).
    pub fn register(name: &str) -> Result<u32, u32> {
        let mut id = 0u32;
        // SAFETY: `name` is valid for its length; `id` is a valid out-pointer.
        match unsafe { proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) } {
            0 => Ok(id),
            status => Err(status),
        }
    }
}

/// Natively (unit tests) there is no host.
#[cfg(not(target_arch = "wasm32"))]
mod raw {
    pub fn register(_name: &str) -> Result<u32, u32> {
        Err(12)
    }
}

/// Wake the root that registered `queue` (this VM's own) to send batches.
pub fn wake(queue: u32) -> Result<(), Status> {
    hostcalls::enqueue_shared_queue(queue, Some(b"w"))
}

/// Wake the root that registered `queue` (any worker's: queue ids are the process's)
/// to re-check the writes it holds at the ordering gate.
pub fn wake_gate(queue: u32) -> Result<(), Status> {
    hostcalls::enqueue_shared_queue(queue, Some(b"g"))
}

/// Empty `queue` (the root reads it when woken; one wake may stand for many).
pub fn drain(queue: u32) {
    while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue) {}
}

#[cfg(target_arch = "wasm32")]
mod wasi {
    // WASI preview 1, as Envoy's proxy-wasm host provides it (errno 0 = success).
    #[link(wasm_import_module = "wasi_snapshot_preview1")]
    extern "C" {
        pub fn random_get(buf: *mut u8, len: usize) -> u16;
    }
}

#[cfg(target_arch = "wasm32")]
fn random_u64() -> Result<u64, String> {
    let mut bytes = [0u8; 8];
    // SAFETY: the host writes exactly `bytes.len()` bytes into the array.
    let errno = unsafe { wasi::random_get(bytes.as_mut_ptr(), bytes.len()) };
    if errno != 0 {
        return Err(format!("random_get failed (WASI errno {errno})"));
    }
    Ok(u64::from_le_bytes(bytes))
}

/// Natively (unit tests): the clock's nanoseconds are random enough.
#[cfg(not(target_arch = "wasm32"))]
fn random_u64() -> Result<u64, String> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_err(|e| e.to_string())?;
    Ok(now.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn queue_names_carry_all_64_bits() {
        assert_eq!(super::name(u64::MAX), "fencekeeper/wake/ffffffffffffffff");
        assert_ne!(super::name(1), super::name(2));
    }
}
