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

/// Register this VM's queue: the VM's 64 random bits (its id, also the ordering
/// gate's) and the queue's id, for [`wake`].
pub fn register() -> Result<(u64, u32), String> {
    let random = random_u64()?;
    let queue = hostcalls::register_shared_queue(&name(random))
        .map_err(|s| format!("cannot register a shared queue ({s:?})"))?;
    Ok((random, queue))
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
