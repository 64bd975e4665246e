//! What every VM of one proxy shares: the clock, shared data, shared queues,
//! metrics, the log, and what the host saw the filter do wrong.

use std::collections::{BTreeMap, HashMap, VecDeque};

/// The virtual clock's start (ms since the epoch): a fixed instant, so runs repeat.
pub const EPOCH_MS: u64 = 1_800_000_000_000;

/// One log line of a VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    /// The worker whose VM logged it.
    pub worker: usize,
    /// The ABI's level (0 trace .. 5 critical).
    pub level: i32,
    /// The message.
    pub text: String,
}

/// A shared queue.
pub(crate) struct Queue {
    pub name: String,
    /// The worker whose root registered it last (Envoy's queues are the VM id's and
    /// the name's: a second registration takes the notifications over).
    pub owner: usize,
    pub items: VecDeque<Vec<u8>>,
}

/// The proxy's shared state.
pub(crate) struct World {
    pub now_ms: u64,
    /// Shared data: value and its CAS stamp.
    pub shared: HashMap<String, (Vec<u8>, u32)>,
    next_cas: u32,
    /// Queue ids are indices + 1 (0 is never a queue).
    pub queues: Vec<Queue>,
    /// Queue-ready notifications to deliver: (worker, queue id).
    pub ready: VecDeque<(usize, u32)>,
    /// Metric names by id (ids are indices + 1), and their values.
    pub metric_names: Vec<String>,
    pub metrics: BTreeMap<String, i64>,
    pub logs: Vec<LogLine>,
    /// What a real host would have crashed on, or what broke the ABI's rules.
    pub violations: Vec<String>,
    /// Every context id handed out (unique across workers, as a real host's are per VM).
    pub next_context: u32,
    /// What WASI `random_get` draws from: deterministic per proxy.
    rng: u64,
    /// `proxy_grpc_call`s made (dispatched or refused).
    pub grpc_calls: usize,
}

impl World {
    pub fn new(seed: u64) -> World {
        World {
            now_ms: EPOCH_MS,
            shared: HashMap::new(),
            next_cas: 1,
            queues: Vec::new(),
            ready: VecDeque::new(),
            metric_names: Vec::new(),
            metrics: BTreeMap::new(),
            logs: Vec::new(),
            violations: Vec::new(),
            next_context: 1,
            rng: seed,
            grpc_calls: 0,
        }
    }

    /// Set `key` to `value` (`None`: delete), if `cas` is 0 or still the key's stamp.
    /// As in Envoy, a CAS on a key that does not exist is not checked.
    pub fn set_shared(&mut self, key: &str, value: Option<Vec<u8>>, cas: u32) -> bool {
        if let Some((_, stamp)) = self.shared.get(key) {
            if cas != 0 && cas != *stamp {
                return false;
            }
        }
        match value {
            Some(v) => {
                self.next_cas = self.next_cas.wrapping_add(1).max(1);
                self.shared.insert(key.to_owned(), (v, self.next_cas));
            }
            None => {
                self.shared.remove(key);
            }
        }
        true
    }

    /// Register queue `name` for `worker`'s root: its id.
    pub fn register_queue(&mut self, name: &str, worker: usize) -> u32 {
        if let Some(i) = self.queues.iter().position(|q| q.name == name) {
            self.queues[i].owner = worker;
            return i as u32 + 1;
        }
        self.queues.push(Queue { name: name.to_owned(), owner: worker, items: VecDeque::new() });
        self.queues.len() as u32
    }

    pub fn queue(&mut self, id: u32) -> Option<&mut Queue> {
        self.queues.get_mut((id as usize).checked_sub(1)?)
    }

    pub fn context_id(&mut self) -> u32 {
        let id = self.next_context;
        self.next_context += 1;
        id
    }

    /// The next 64 "random" bits: a counter from the seed. What the filter draws
    /// them for (its VM's name) needs them distinct, not unpredictable, and a test
    /// needs them the same on every run.
    pub fn random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(1);
        self.rng
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stale_cas_is_refused_and_a_fresh_one_taken() {
        let mut w = World::new(1);
        assert!(w.set_shared("k", Some(b"1".to_vec()), 0));
        let stamp = w.shared["k"].1;
        assert!(w.set_shared("k", Some(b"2".to_vec()), stamp));
        assert!(!w.set_shared("k", Some(b"3".to_vec()), stamp), "the stamp moved with the write");
        assert_eq!(w.shared["k"].0, b"2");
    }

    #[test]
    fn a_second_registration_of_a_name_takes_its_notifications_over() {
        let mut w = World::new(1);
        let id = w.register_queue("q", 0);
        assert_eq!(w.register_queue("q", 1), id);
        assert_eq!(w.queue(id).map(|q| q.owner), Some(1));
    }
}
