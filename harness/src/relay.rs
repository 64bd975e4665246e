//! A TCP relay in front of a service that can spring a trap on one request, or cut
//! every connection at once.
//!
//! The relay passes bytes both ways unchanged, and passes a close on (a client's FIN
//! reaches the service as a FIN). Armed with [`Relay::trap`], it runs a hook the
//! moment a chosen request (found by a byte pattern, e.g. `POST /v3/kv/txn`) is about
//! to reach the service, before forwarding it. A fault test uses it to freeze etcd
//! (SIGSTOP) exactly when a gateway's Txn arrives, which a signal sent from outside
//! cannot time: the gateway reads the mark first, and a freeze before that read stalls
//! the read instead. [`Relay::sever`] stands for a network partition: from that
//! moment nothing more passes either way (a replication test lets a replica miss the
//! writes its primary acknowledged after it), until [`Relay::heal`].

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

type Hook = Box<dyn FnOnce() -> Result<()> + Send>;

/// An armed trap: what it waits for, what it runs, and whom it tells.
struct Armed {
    pattern: Vec<u8>,
    hook: Hook,
    fired: Sender<Result<()>>,
    reports: Reports,
}

/// What the connection that sprang a trap reports afterwards.
struct Reports {
    client_closed: Sender<()>,
    answered: Sender<Vec<u8>>,
}

/// A relay listening on loopback; its threads end with the process.
pub struct Relay {
    /// Where clients connect instead of the service.
    pub addr: SocketAddr,
    armed: Arc<Mutex<Option<Armed>>>,
    cut: Arc<Cut>,
}

/// Whether the relay was severed, and the connections to close when it is.
#[derive(Default)]
struct Cut {
    severed: AtomicBool,
    open: Mutex<Vec<TcpStream>>,
}

impl Cut {
    fn severed(&self) -> bool {
        self.severed.load(Ordering::SeqCst)
    }
}

/// A trap set by [`Relay::trap`]; each wait is bounded.
pub struct Trap {
    fired: Receiver<Result<()>>,
    client_closed: Receiver<()>,
    answered: Receiver<Vec<u8>>,
}

impl Trap {
    /// Wait until the hook has run, and return what it returned.
    pub fn wait_fired(&self, within: Duration) -> Result<()> {
        self.fired.recv_timeout(within).context("the trapped request never came through the relay")?
    }

    /// Wait until the client has closed the connection that carried the trapped
    /// request and the relay has passed the close on to the service.
    pub fn wait_client_closed(&self, within: Duration) -> Result<()> {
        self.client_closed.recv_timeout(within).context("the client kept the trapped connection open")
    }

    /// Wait until the service has closed that connection too, and return what it sent
    /// on it from the trapped request on (its answer, if it gave one).
    pub fn wait_answered(&self, within: Duration) -> Result<Vec<u8>> {
        self.answered.recv_timeout(within).context("the service kept the trapped connection open")
    }
}

impl Relay {
    /// Relay a free loopback port to `target`.
    pub fn start(target: SocketAddr) -> Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let armed: Arc<Mutex<Option<Armed>>> = Arc::default();
        let cut: Arc<Cut> = Arc::default();
        let (trap, cuts) = (armed.clone(), cut.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if cuts.severed() {
                    continue; // dropped: closed at once
                }
                let (trap, cuts) = (trap.clone(), cuts.clone());
                std::thread::spawn(move || relay(client, target, &trap, &cuts));
            }
        });
        Ok(Relay { addr, armed, cut })
    }

    /// Cut every connection now and refuse new ones: no byte read from either side
    /// after this call is passed on.
    pub fn sever(&self) {
        self.cut.severed.store(true, Ordering::SeqCst);
        for stream in self.cut.open.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }

    /// End a [`Relay::sever`]: new connections pass again (the network healed; those
    /// cut stay cut).
    pub fn heal(&self) {
        self.cut.severed.store(false, Ordering::SeqCst);
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Run `hook` once, on the next connection where a client sends `pattern` (at most
    /// 256 bytes), before the bytes holding it are forwarded. Replaces a trap that has
    /// not fired.
    pub fn trap(&self, pattern: &[u8], hook: impl FnOnce() -> Result<()> + Send + 'static) -> Trap {
        let (fired, fired_rx) = mpsc::channel();
        let (client_closed, closed_rx) = mpsc::channel();
        let (answered, answered_rx) = mpsc::channel();
        let reports = Reports { client_closed, answered };
        let armed = Armed { pattern: pattern.to_vec(), hook: Box::new(hook), fired, reports };
        *self.armed.lock().unwrap_or_else(|p| p.into_inner()) = Some(armed);
        Trap { fired: fired_rx, client_closed: closed_rx, answered: answered_rx }
    }
}

/// One connection: the service's bytes are copied back on a thread of their own (and
/// kept, for a trap's report); the client's bytes are checked for the trap's pattern,
/// then forwarded.
fn relay(client: TcpStream, target: SocketAddr, trap: &Mutex<Option<Armed>>, cut: &Arc<Cut>) {
    let Ok(service) = TcpStream::connect(target) else { return };
    let (Ok(mut from_service), Ok(mut to_client)) = (service.try_clone(), client.try_clone()) else { return };
    if let (Ok(a), Ok(b)) = (client.try_clone(), service.try_clone()) {
        cut.open.lock().unwrap_or_else(|p| p.into_inner()).extend([a, b]);
    }
    let severed = cut.clone();
    let sent_back: Arc<Mutex<Vec<u8>>> = Arc::default();
    let copy = sent_back.clone();
    let back = std::thread::spawn(move || {
        let mut chunk = [0u8; 16 * 1024];
        while let Ok(n @ 1..) = from_service.read(&mut chunk) {
            if severed.severed() {
                break;
            }
            copy.lock().unwrap_or_else(|p| p.into_inner()).extend_from_slice(&chunk[..n]);
            let _ = to_client.write_all(&chunk[..n]);
        }
        let _ = to_client.shutdown(Shutdown::Write);
    });
    let (mut from_client, mut to_service) = (client, service);
    // Set when this connection sprang the trap: its reports, and where its answer starts.
    let mut sprung: Option<(Reports, usize)> = None;
    // The end of what was already forwarded, so that a pattern split across reads is found.
    let mut tail: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = from_client.read(&mut chunk) {
        if sprung.is_none() {
            let new = tail.len();
            tail.extend_from_slice(&chunk[..n]);
            sprung = spring(trap, &tail, new)
                .map(|reports| (reports, sent_back.lock().unwrap_or_else(|p| p.into_inner()).len()));
            tail.drain(..tail.len().saturating_sub(256));
        }
        if cut.severed() || to_service.write_all(&chunk[..n]).is_err() {
            break;
        }
    }
    let _ = to_service.shutdown(Shutdown::Write);
    if let Some((reports, _)) = &sprung {
        let _ = reports.client_closed.send(());
    }
    let _ = back.join();
    if let Some((reports, from)) = sprung {
        let answer = sent_back.lock().unwrap_or_else(|p| p.into_inner()).split_off(from);
        let _ = reports.answered.send(answer);
    }
}

/// Fire the armed trap if its pattern ends in `seen[new..]` (the bytes just read: a
/// pattern forwarded before the trap was set does not count).
fn spring(trap: &Mutex<Option<Armed>>, seen: &[u8], new: usize) -> Option<Reports> {
    let mut slot = trap.lock().unwrap_or_else(|p| p.into_inner());
    let found = slot.as_ref().is_some_and(|a| {
        let from = new.saturating_sub(a.pattern.len().saturating_sub(1));
        seen[from..].windows(a.pattern.len()).any(|w| w == a.pattern.as_slice())
    });
    if !found {
        return None;
    }
    let armed = slot.take()?;
    // Run without the lock: a hook that holds its request must not stall the
    // relay's other connections.
    drop(slot);
    let _ = armed.fired.send((armed.hook)());
    Some(armed.reports)
}
