//! `fencekeeper-services`: the harness's services for shell scripts (the benchmarks).
//!
//! ```text
//! fencekeeper-services [--dir DIR] etcd nginx-dav > services.env &
//! ```
//!
//! Starts each service as the tests do, waits until each is ready, then prints shell
//! assignments (`FK_ETCD=http://127.0.0.1:PORT`, `FK_NGINX_DAV=...`,
//! `FK_NGINX_DAV_ROOT=...`) and last `FK_READY=1`, so a script polls for that line and
//! sources the file. The services run until this process gets SIGTERM, SIGINT or
//! SIGHUP, and are stopped before it exits; if one of them dies first, this exits 2.

use anyhow::Result;
use clap::{Parser, ValueEnum};
use fencekeeper_harness::services::{Etcd, NginxDav, WorkDir};
use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{signal, SignalKind};

/// Start local services for a script and keep them until told to stop.
#[derive(Parser)]
#[command(name = "fencekeeper-services", version)]
struct Args {
    /// Keep the services' files and logs here (default: a temporary directory, removed).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// The services to start.
    #[arg(required = true)]
    services: Vec<Service>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Service {
    /// A single-member etcd (the lock service, the shared mark store).
    Etcd,
    /// nginx with WebDAV PUT/DELETE (a store that accepts any write).
    NginxDav,
}

fn main() -> ExitCode {
    match run(Args::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fencekeeper-services: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<()> {
    let dir = |name: &str| match &args.dir {
        Some(dir) => WorkDir::kept(&dir.join(name)),
        None => WorkDir::temporary(),
    };
    let mut etcd = None;
    let mut nginx = None;
    let mut out = std::io::stdout().lock();
    for service in &args.services {
        match service {
            Service::Etcd if etcd.is_none() => {
                let started = Etcd::start_in(dir("etcd")?)?;
                writeln!(out, "FK_ETCD={}", started.url())?;
                etcd = Some(started);
            }
            Service::NginxDav if nginx.is_none() => {
                let started = NginxDav::start_in(dir("nginx-dav")?)?;
                writeln!(out, "FK_NGINX_DAV={}", started.url())?;
                writeln!(out, "FK_NGINX_DAV_ROOT={}", quoted(&started.root.display().to_string()))?;
                nginx = Some(started);
            }
            _ => {}
        }
    }
    writeln!(out, "FK_READY=1")?;
    out.flush()?;
    drop(out);

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let (mut term, mut int, mut hup) =
            (signal(SignalKind::terminate())?, signal(SignalKind::interrupt())?, signal(SignalKind::hangup())?);
        let mut check = tokio::time::interval(Duration::from_millis(200));
        loop {
            tokio::select! {
                _ = term.recv() => return Ok(()),
                _ = int.recv() => return Ok(()),
                _ = hup.recv() => return Ok(()),
                _ = check.tick() => {
                    // A service that died would leave the script measuring nothing.
                    if let Some(etcd) = &mut etcd {
                        etcd.process.check_alive()?;
                    }
                    if let Some(nginx) = &mut nginx {
                        nginx.process.check_alive()?;
                    }
                }
            }
        }
    })
    // The handles drop here, after the runtime: each service is killed and reaped.
}

/// `text` in single quotes for a POSIX shell.
fn quoted(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
