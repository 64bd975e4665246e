//! The instrumented upstream store (`fencekeeper-torture upstream`): a blind store that
//! accepts any write, as a real one does, and appends every write it applies to its
//! log (`store.jsonl`, one [`Landed`] a line, written before the answer, unbuffered,
//! so a SIGKILL loses no applied write). The log is the ground truth of what landed.
//!
//! With `--conditional` it honours preconditions as S3 does, for runs of gateways with
//! conditional writes: each object's version is the quoted MD5 of its body (its
//! ETag, answered on every write and read), a write is applied only if its
//! `If-Match` names the current version or its `If-None-Match: *` finds no object,
//! checked when it is applied (after any injected delay), else answered 412 and not
//! applied. A write with no precondition is refused (428): a fence that forgot one
//! shows up as failed writes, never as blind ones. Versions are rebuilt from the log
//! when it restarts.
//!
//! Its admin listener takes the nemesis's knobs: `POST /faults?delay_pct=P&delay_min_ms=A&delay_max_ms=B&error_pct=E`
//! delays P% of writes by A..B ms before applying them, and answers E% with 503
//! (`x-torture-upstream: error`, not applied). `GET /healthz` answers `ok`.

use crate::clock;
use crate::record::{read_lines, Landed, Log};
use crate::rng::Rng;
use anyhow::{Context, Result};
use bytes_body::full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Arguments of `fencekeeper-torture upstream`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Where writes arrive.
    #[arg(long)]
    listen: SocketAddr,
    /// Where the nemesis sets the fault knobs.
    #[arg(long)]
    admin: SocketAddr,
    /// The log of applied writes (appended; its last sequence number is continued).
    #[arg(long)]
    log: PathBuf,
    /// Seeds the choice of delayed and failed writes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Honour If-Match / If-None-Match (S3's conditional writes, MD5 ETags).
    #[arg(long)]
    conditional: bool,
}

#[derive(Default, Clone, Copy)]
struct Knobs {
    delay_pct: u64,
    delay_min_ms: u64,
    delay_max_ms: u64,
    error_pct: u64,
}

struct Store {
    log: Log,
    /// The last sequence number given, under the lock that orders the log's lines.
    seq: Mutex<u64>,
    /// With `--conditional`: each object's version (its ETag), changed under `seq`.
    versions: Option<Mutex<HashMap<String, String>>>,
    knobs: Mutex<Knobs>,
    draws: AtomicU64,
    seed: u64,
}

mod bytes_body {
    use http_body_util::Full;
    use hyper::body::Bytes;

    pub type Body = Full<Bytes>;

    pub fn full(text: impl Into<Bytes>) -> Body {
        Full::new(text.into())
    }
}

/// Serve until killed.
pub fn run(args: Args) -> Result<()> {
    let landed = if args.log.exists() { read_lines::<Landed>(&args.log)? } else { Vec::new() };
    let last = landed.iter().map(|l| l.seq).max();
    let versions = args.conditional.then(|| {
        let mut by_seq: Vec<&Landed> = landed.iter().collect();
        by_seq.sort_by_key(|l| l.seq);
        Mutex::new(by_seq.into_iter().map(|l| (l.resource.clone(), etag(l.id.as_bytes()))).collect())
    });
    let store = Arc::new(Store {
        log: Log::append(&args.log, true)?,
        seq: Mutex::new(last.unwrap_or(0)),
        versions,
        knobs: Mutex::default(),
        draws: AtomicU64::new(0),
        seed: args.seed,
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async move {
        let writes = tokio::net::TcpListener::bind(args.listen).await.context("binding the store")?;
        let admin = tokio::net::TcpListener::bind(args.admin).await.context("binding the admin listener")?;
        let s = store.clone();
        tokio::spawn(async move { accept(admin, s, true).await });
        accept(writes, store, false).await;
        Ok(())
    })
}

async fn accept(listener: tokio::net::TcpListener, store: Arc<Store>, admin: bool) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let _ = stream.set_nodelay(true);
        let store = store.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let store = store.clone();
                async move {
                    let answer = if admin { knobs(&store, req) } else { write(&store, req).await };
                    Ok::<_, std::convert::Infallible>(answer)
                }
            });
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn answer(status: StatusCode, headers: &[(&'static str, String)], body: &str) -> Response<bytes_body::Body> {
    let mut response = Response::new(full(body.to_owned()));
    *response.status_mut() = status;
    for (k, v) in headers {
        if let Ok(v) = hyper::header::HeaderValue::from_str(v) {
            response.headers_mut().insert(*k, v);
        }
    }
    response
}

fn knobs(store: &Store, req: Request<Incoming>) -> Response<bytes_body::Body> {
    if req.uri().path() == "/healthz" {
        return answer(StatusCode::OK, &[], "ok");
    }
    let mut k = Knobs::default();
    for pair in req.uri().query().unwrap_or_default().split('&') {
        let Some((name, value)) = pair.split_once('=') else { continue };
        let value: u64 = value.parse().unwrap_or(0);
        match name {
            "delay_pct" => k.delay_pct = value,
            "delay_min_ms" => k.delay_min_ms = value,
            "delay_max_ms" => k.delay_max_ms = value,
            "error_pct" => k.error_pct = value,
            _ => return answer(StatusCode::BAD_REQUEST, &[], "unknown knob"),
        }
    }
    *store.knobs.lock().unwrap_or_else(|p| p.into_inner()) = k;
    answer(StatusCode::OK, &[], "set")
}

async fn write(store: &Arc<Store>, req: Request<Incoming>) -> Response<bytes_body::Body> {
    use http_body_util::BodyExt;
    let header =
        |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_owned).unwrap_or_default();
    let (token, target) = (header("fencing-admitted-token"), header("x-torture-target"));
    let precondition = match (header("if-match"), header("if-none-match")) {
        (m, _) if !m.is_empty() => Some(Precondition::Match(m)),
        (_, n) if n == "*" => Some(Precondition::Absent),
        _ => None,
    };
    let resource = req.uri().path().to_owned();
    // Reads (a gateway with conditional writes asks for a version with a HEAD).
    if req.method() == hyper::Method::GET || req.method() == hyper::Method::HEAD {
        let version = store.versions.as_ref().map(|v| lock(v).get(&resource).cloned());
        return match version {
            Some(Some(etag)) => answer(StatusCode::OK, &[("etag", etag)], ""),
            Some(None) => answer(StatusCode::NOT_FOUND, &[], ""),
            None => answer(StatusCode::OK, &[], ""),
        };
    }
    if store.versions.is_some() && precondition.is_none() {
        return answer(StatusCode::PRECONDITION_REQUIRED, &[], "a write without a precondition");
    }
    let Ok(body) = req.into_body().collect().await else {
        return answer(StatusCode::BAD_REQUEST, &[], "body");
    };
    let id = String::from_utf8_lossy(&body.to_bytes()).into_owned();
    let received = clock::now();
    // Applied in a task of its own: a write whose body arrived is applied even if the
    // proxy hangs up meanwhile (it timed out, or crashed), as a blind store does.
    let store = store.clone();
    let applied = tokio::spawn(async move {
        let k = *store.knobs.lock().unwrap_or_else(|p| p.into_inner());
        let mut rng = Rng::new(store.seed, store.draws.fetch_add(1, Relaxed));
        if k.delay_pct > 0 && rng.chance(k.delay_pct, 100) {
            tokio::time::sleep(Duration::from_millis(rng.between(k.delay_min_ms, k.delay_max_ms))).await;
        }
        if k.error_pct > 0 && rng.chance(k.error_pct, 100) {
            return Err(StatusCode::SERVICE_UNAVAILABLE);
        }
        let mut seq = store.seq.lock().unwrap_or_else(|p| p.into_inner());
        let etag = etag(id.as_bytes());
        if let Some(versions) = &store.versions {
            let mut versions = lock(versions);
            let current = versions.get(&resource);
            let holds = match &precondition {
                Some(Precondition::Match(m)) => current == Some(m),
                Some(Precondition::Absent) => current.is_none(),
                None => false,
            };
            if !holds {
                return Err(StatusCode::PRECONDITION_FAILED);
            }
            versions.insert(resource.clone(), etag.clone());
        }
        *seq += 1;
        let landed = Landed { seq: *seq, at: clock::now(), received, resource, token, target, id };
        store.log.write(&landed).map_err(|_| StatusCode::INSUFFICIENT_STORAGE)?;
        Ok((*seq, etag))
    });
    let (seq, etag) = match applied.await {
        Ok(Ok(applied)) => applied,
        Ok(Err(StatusCode::PRECONDITION_FAILED)) => {
            return answer(StatusCode::PRECONDITION_FAILED, &[], "precondition")
        }
        Ok(Err(status)) => return answer(status, &[("x-torture-upstream", "error".into())], "injected"),
        Err(_) => return answer(StatusCode::INTERNAL_SERVER_ERROR, &[("x-torture-upstream", "error".into())], "task"),
    };
    answer(StatusCode::CREATED, &[("x-torture-seq", seq.to_string()), ("etag", etag)], "")
}

enum Precondition {
    Match(String),
    Absent,
}

/// An object's version: the quoted MD5 of its body, as S3's single-part ETag.
fn etag(body: &[u8]) -> String {
    use md5::{Digest, Md5};
    format!("\"{:x}\"", Md5::digest(body))
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
