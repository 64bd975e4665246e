//! `fencekeeper admit`: decide on one write, through the wasm validator and a
//! durable mark store, exactly as an embedding engine would (Guard + Validator +
//! FileStore). Exit 0 admitted (or passed by efficiency mode), 1 refused, 2 error
//! (the guest or the store cannot be used, a damaged record included).

use anyhow::Context;
use fencekeeper::audit::{self, AuditLog, Change, Entry};
use fencekeeper::guard::Undecided;
use fencekeeper::store::FileStore;
use fencekeeper::validator::{Conformance, GuestSource, Limits, Validator};
use fencekeeper::{Guard, Mode, Policy, Verdict};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

/// Where `admit` and `marks` keep marks unless told otherwise.
pub const DEFAULT_STORE: &str = ".fencekeeper/marks.redb";

/// Arguments of `fencekeeper admit`.
#[derive(clap::Args)]
pub struct Args {
    /// The mark store file (created, with its directory, if missing).
    #[arg(long, value_name = "PATH", default_value = DEFAULT_STORE)]
    store: PathBuf,
    /// Refuse a token equal to the mark as a replay.
    #[arg(long)]
    strict: bool,
    /// correctness: fail closed; efficiency: let a write pass when the mark store
    /// cannot be read (a missing, malformed or stale token is refused in both).
    #[arg(long, value_enum, default_value_t = ModeArg::Correctness)]
    mode: ModeArg,
    /// A guest component implementing the fencekeeper world, instead of the bundled one.
    #[arg(long, value_name = "COMPONENT.wasm")]
    guest: Option<PathBuf>,
    /// Print one JSON object instead of a line of text.
    #[arg(long)]
    json: bool,
    /// When the write raises the mark, append the change to this file as a JSON line
    /// (the audit record every host writes); opened before the store is touched.
    #[arg(long, value_name = "PATH")]
    audit: Option<PathBuf>,
    /// The protected resource (1 to 1024 bytes of UTF-8).
    resource: String,
    /// The fencing token the writer holds; omit it for a write that carries none.
    /// (A token like `-1` is passed on, and refused as malformed.)
    #[arg(allow_hyphen_values = true)]
    token: Option<String>,
}

/// The policy modes, as command-line values.
#[derive(Clone, Copy, clap::ValueEnum)]
pub enum ModeArg {
    /// Fail closed.
    Correctness,
    /// Fail open, counted.
    Efficiency,
}

impl From<ModeArg> for Mode {
    fn from(m: ModeArg) -> Mode {
        match m {
            ModeArg::Correctness => Mode::Correctness,
            ModeArg::Efficiency => Mode::Efficiency,
        }
    }
}

/// The machine-readable answer (`--json`).
#[derive(serde::Serialize)]
struct Answer<'a> {
    resource: &'a str,
    token: Option<&'a str>,
    class: &'static str,
    admitted: bool,
    mark: Option<String>,
    advanced: bool,
    http_status: u16,
    reason: String,
}

/// Load the guest: the bundled component, or the one at `path`.
pub fn load_validator(path: Option<&Path>, policy: Policy, conformance: Conformance) -> anyhow::Result<Validator> {
    let source = match path {
        Some(p) => GuestSource::Path(p),
        None => GuestSource::Bundled,
    };
    Validator::load_with(source, policy, Limits::default(), conformance).with_context(|| match path {
        Some(p) => format!("cannot load guest {}", p.display()),
        None => "cannot load the bundled guest".to_owned(),
    })
}

/// Run the subcommand.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let policy = Policy { mode: args.mode.into(), strict: args.strict };
    let validator = load_validator(args.guest.as_deref(), policy, Conformance::Check)?;
    if let Some(dir) = args.store.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    // Opened first: an advance that could not be audited is not made.
    let audit = args.audit.as_ref().map(AuditLog::open).transpose()?;
    let store = FileStore::open(&args.store)?;
    let guard = Guard::new(Arc::new(validator), Arc::new(store));

    let decision = guard.admit(&args.resource, args.token.as_deref());
    // A store that fails (a damaged record, an unreadable file) is an error of the
    // command, in either mode, as a store that cannot be opened is: exit 2, one line.
    if let Some(Undecided::Store(e)) = decision.undecided {
        return Err(e.into());
    }
    if let (Some(log), Some(advance)) = (&audit, decision.advance) {
        let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).ok();
        log.append(&Entry {
            unix_ms: audit::now_ms(),
            host: "cli",
            reason: Change::Advance,
            resource: &args.resource,
            old: advance.from,
            old_damaged: None,
            new: Some(advance.to),
            token: args.token.as_deref(),
            client: None,
            user: user.as_deref(),
            store: &format!("file {}", args.store.display()),
        })
        .context("the mark advanced, but writing the audit log failed")?;
    }
    let reason = decision.reason(&args.resource);
    if args.json {
        let (mark, advanced) = match &decision.verdict {
            Some(Verdict::Admit { mark, advanced }) => (Some(*mark), *advanced),
            Some(Verdict::Stale { mark, .. } | Verdict::Replayed { mark }) => (Some(*mark), false),
            // No mark in the verdict: report the store's (unchanged) mark, if readable.
            _ => (guard.mark(&args.resource).ok().flatten(), false),
        };
        let answer = Answer {
            resource: &args.resource,
            token: args.token.as_deref(),
            class: decision.class().name(),
            admitted: decision.admitted(),
            mark: mark.map(|m| m.to_string()),
            advanced,
            http_status: decision.class().http_status(),
            reason,
        };
        out!("{}", serde_json::to_string(&answer)?);
    } else {
        out!("{reason}");
    }
    Ok(if decision.admitted() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}
