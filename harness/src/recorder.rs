//! A recording store: a loopback HTTP/1.1 server that records every request that
//! reaches it (method, path, headers, body) and answers with a scripted status, headers,
//! body and delay, or hangs up. What a proxy forwards, and what it does with the store's answer, is
//! then asserted on the records.
//!
//! Each request's body is read whole (by `Content-Length`, or chunked) before it is
//! answered: closing a connection with a byte unread resets it, and the proxy could see
//! the reset before the answer. A request is recorded as it arrives, before the delay,
//! so one that the proxy gave up on is still seen. Dropping the handle stops the
//! listener and closes every connection.

use anyhow::{Context, Result};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request as the store received it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recorded {
    /// The method.
    pub method: String,
    /// The request target, as sent (path and query, still percent-encoded).
    pub path: String,
    /// The headers in arrival order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: Vec<u8>,
}

impl Recorded {
    /// Every value of header `name` (lower case), in arrival order.
    pub fn values(&self, name: &str) -> Vec<&str> {
        self.headers.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str()).collect()
    }
}

/// What the store answers.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The status.
    pub status: u16,
    /// Headers besides `content-length`.
    pub headers: Vec<(String, String)>,
    /// The body (not sent to a HEAD, whose `content-length` is still its length).
    pub body: Vec<u8>,
    /// How long the store takes before it answers.
    pub delay: Duration,
    /// Instead of answering, close the connection (after the delay): a store that
    /// broke off the exchange, the request read and recorded.
    pub hang_up: bool,
}

impl Default for Answer {
    fn default() -> Answer {
        Answer { status: 201, headers: Vec::new(), body: Vec::new(), delay: Duration::ZERO, hang_up: false }
    }
}

#[derive(Default)]
struct State {
    answer: Answer,
    seen: Vec<Recorded>,
    open: Vec<TcpStream>,
}

/// A running recording store.
pub struct Recorder {
    /// Where it listens.
    pub addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stopped: Arc<AtomicBool>,
}

impl Recorder {
    /// Listen on a free loopback port; every request gets `201` with no body until
    /// [`Recorder::answer`] says otherwise.
    pub fn start() -> Result<Recorder> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let state: Arc<Mutex<State>> = Arc::default();
        let stopped = Arc::new(AtomicBool::new(false));
        let (s, stop) = (state.clone(), stopped.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let Ok(kept) = stream.try_clone() else { continue };
                lock(&s).open.push(kept);
                let s = s.clone();
                std::thread::spawn(move || serve(stream, &s));
            }
        });
        Ok(Recorder { addr, state, stopped })
    }

    /// `HOST:PORT`.
    pub fn authority(&self) -> String {
        self.addr.to_string()
    }

    /// `http://HOST:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answer every request from now on with `answer`.
    pub fn answer(&self, answer: Answer) {
        lock(&self.state).answer = answer;
    }

    /// The requests received since the last call, in arrival order.
    pub fn take(&self) -> Vec<Recorded> {
        std::mem::take(&mut lock(&self.state).seen)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag, then close every connection:
        // their threads end on the closed socket.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        for stream in lock(&self.state).open.drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// One keep-alive connection: read a whole request, record it, answer, until the
/// peer closes or asks to.
fn serve(stream: TcpStream, state: &Mutex<State>) {
    let _ = stream.set_nodelay(true);
    let Ok(mut writer) = stream.try_clone() else { return };
    let mut reader = BufReader::new(stream);
    while let Ok(Some(request)) = read_request(&mut reader) {
        let answer = {
            let mut s = lock(state);
            s.seen.push(request.clone());
            s.answer.clone()
        };
        if !answer.delay.is_zero() {
            std::thread::sleep(answer.delay);
        }
        if answer.hang_up {
            // The listener keeps a clone of the socket: shut it, not just drop ours.
            let _ = writer.shutdown(Shutdown::Both);
            return;
        }
        let close = request.values("connection").iter().any(|v| v.eq_ignore_ascii_case("close"));
        let mut head = format!("HTTP/1.1 {} {}\r\n", answer.status, reason(answer.status));
        for (k, v) in &answer.headers {
            head.push_str(&format!("{k}: {v}\r\n"));
        }
        // 1xx, 204 and 304 answers have no body and no length.
        let bodiless = matches!(answer.status, 100..=199 | 204 | 304);
        if !bodiless {
            head.push_str(&format!("content-length: {}\r\n", answer.body.len()));
        }
        if close {
            head.push_str("connection: close\r\n");
        }
        head.push_str("\r\n");
        let mut out = head.into_bytes();
        if !bodiless && request.method != "HEAD" {
            out.extend_from_slice(&answer.body);
        }
        if writer.write_all(&out).is_err() || close {
            return;
        }
    }
}

/// Read one request: `Ok(None)` when the peer closed between requests.
fn read_request(reader: &mut BufReader<TcpStream>) -> Result<Option<Recorded>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut parts = line.split_whitespace();
    let method = parts.next().context("no method")?.to_owned();
    let path = parts.next().context("no target")?.to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        anyhow::ensure!(reader.read_line(&mut line)? > 0, "closed inside the head");
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (k, v) = line.split_once(':').context("a header line without a colon")?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let mut request = Recorded { method, path, headers, body: Vec::new() };
    let chunked = request.values("transfer-encoding").iter().any(|v| v.to_ascii_lowercase().contains("chunked"));
    if chunked {
        request.body = read_chunked(reader)?;
    } else if let Some(length) = request.values("content-length").first() {
        let mut body = vec![0; length.parse().context("a bad content-length")?];
        reader.read_exact(&mut body)?;
        request.body = body;
    }
    Ok(Some(request))
}

fn read_chunked(reader: &mut BufReader<TcpStream>) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        reader.read_line(&mut size)?;
        let size = usize::from_str_radix(size.trim().split(';').next().unwrap_or_default(), 16)?;
        if size == 0 {
            // Trailers, if any, up to the empty line.
            loop {
                let mut line = String::new();
                if reader.read_line(&mut line)? == 0 || line == "\r\n" {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size + 2, 0);
        reader.read_exact(&mut body[start..])?;
        body.truncate(start + size);
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        404 => "Not Found",
        412 => "Precondition Failed",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Answer",
    }
}
