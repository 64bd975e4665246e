//! `fencekeeper marks --verify | --raise RESOURCE TOKEN | --set RESOURCE TOKEN |
//! --clear RESOURCE | --upgrade | --compact --idle-for T`: check a store record by
//! record, raise a lost or damaged mark by hand, set or clear one by force, convert
//! an old store, forget idle marks under a retention floor.
//!
//! `--set RESOURCE TOKEN --force` and `--clear RESOURCE --force` replace or remove a
//! mark, lower included: to undo a mark a forged token raised.
//!
//! A raise only ever raises. Every change is logged: one line on stderr, and with
//! `--audit PATH` the audit record (`fencekeeper_core::audit`, the one format every
//! host writes) appended to that file, written before the command reports success; if
//! the file cannot be opened, nothing is changed.

use crate::compaction;
use crate::marks::{self, print_table, Args};
use anyhow::Context;
use fencekeeper::audit::{AuditLog, Change, Entry};
use fencekeeper::store::{EtcdStore, FileStore, Previous, Raise, Upgrade};
use fencekeeper::Token;
use std::process::ExitCode;
use std::time::Duration;

#[derive(serde::Serialize)]
struct Checked {
    resource: String,
    mark: Option<String>,
    damaged: Option<String>,
}

/// `--verify`: every record, each damaged one reported with its key; exit 2 if any.
pub fn verify(args: &Args) -> anyhow::Result<ExitCode> {
    let scanned = marks::open(args)?.scan()?;
    let checked: Vec<Checked> = scanned
        .into_iter()
        .map(|s| match s.mark {
            Ok(m) => Checked { resource: s.resource, mark: Some(m.to_string()), damaged: None },
            Err(e) => Checked { resource: s.resource, mark: None, damaged: Some(e.to_string()) },
        })
        .collect();
    let damaged = checked.iter().filter(|c| c.damaged.is_some()).count();
    if args.json {
        out!("{}", serde_json::to_string(&checked)?);
    } else {
        for c in &checked {
            if let Some(why) = &c.damaged {
                out!("damaged {:?}: {why}", c.resource);
            }
        }
        out!("{} records checked in {}, {damaged} damaged", checked.len(), args.describe());
    }
    Ok(if damaged == 0 { ExitCode::SUCCESS } else { ExitCode::from(2) })
}

/// `--raise RESOURCE TOKEN`: set the mark if that raises it; exit 1 if it would not.
pub fn raise(args: &Args, raise: &[String]) -> anyhow::Result<ExitCode> {
    let [resource, token] = raise else {
        anyhow::bail!("--raise takes RESOURCE TOKEN");
    };
    let to = Token::parse(token).map_err(|e| anyhow::anyhow!("cannot raise to {token:?}: {e}"))?;
    // Opened before the raise, so a raise that cannot be audited does not happen.
    let audit = open_audit(args)?;
    let store = marks::open(args)?;
    let previous = match store.raise(resource, &to)? {
        Raise::Raised(previous) => previous,
        Raise::Refused { floor, previous } => {
            let seen = match previous {
                Previous::Damaged(_) => format!("its damaged record still shows {floor}"),
                _ => format!("its mark is {floor}"),
            };
            out!("not raised: {to} is not above the mark of {resource:?} ({seen})");
            return Ok(ExitCode::from(1));
        }
    };
    let change = Changed { reason: Change::Raise, resource, previous, new: Some(to), token: Some(token) };
    out!("{}", change.summary(None));
    change.record(args, audit.as_ref())?;
    Ok(ExitCode::SUCCESS)
}

/// `--set RESOURCE TOKEN --force` and `--clear RESOURCE --force`: replace or remove a
/// mark whatever it is, lower included. Without `--force`, nothing is done (exit 2).
pub fn force(args: &Args, resource: &str, token: Option<&str>) -> anyhow::Result<ExitCode> {
    let to =
        token.map(|t| Token::parse(t).map_err(|e| anyhow::anyhow!("cannot set the mark to {t:?}: {e}"))).transpose()?;
    if !args.force {
        let act = if to.is_some() { "--set can lower" } else { "--clear removes" };
        anyhow::bail!(
            "{act} the mark of {resource:?}, which re-admits every token between the old mark and the new one, \
             stale writers' too; add --force to do it"
        );
    }
    let audit = open_audit(args)?;
    let store = marks::open(args)?;
    let previous = store.force(resource, to.as_ref())?;
    let reason = if to.is_some() { Change::Set } else { Change::Clear };
    let change = Changed { reason, resource, previous, new: to, token };
    out!("{}", change.summary(None));
    change.record(args, audit.as_ref())?;
    Ok(ExitCode::SUCCESS)
}

/// `--compact --idle-for T`: forget the marks idle for `idle_for`, under the floor.
pub fn compact(args: &Args, idle_for: Duration) -> anyhow::Result<ExitCode> {
    let audit = open_audit(args)?;
    let store = marks::Store::open(args)?.retention();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let compaction = store.compact(idle_for, now)?;
    let summary = compaction::summary(&compaction, idle_for, &args.describe());
    eprintln!("fencekeeper: audit: {summary}");
    if let Some(audit) = &audit {
        compaction::record(audit, &compaction, "cli", &args.audit_store())?;
    }
    if args.json {
        let forgotten: Vec<serde_json::Value> = compaction
            .forgotten
            .iter()
            .map(|(r, m)| serde_json::json!({"resource": r, "mark": m.to_string()}))
            .collect();
        let out = serde_json::json!({
            "forgotten": forgotten,
            "floor_before": compaction.floor_before.map(|f| f.to_string()),
            "floor": compaction.floor.map(|f| f.to_string()),
            "kept": compaction.kept,
            "other_arity": compaction.other_arity,
            "not_yet": compaction.not_yet,
        });
        out!("{out}");
    } else {
        out!("{summary}");
    }
    Ok(ExitCode::SUCCESS)
}

/// `--audit PATH`, opened before the store is touched: a change that cannot be
/// audited is not made.
fn open_audit(args: &Args) -> anyhow::Result<Option<AuditLog>> {
    Ok(args.audit.as_ref().map(AuditLog::open).transpose()?)
}

/// A change an operator made to a mark, to report.
struct Changed<'a> {
    reason: Change,
    resource: &'a str,
    previous: Previous,
    new: Option<Token>,
    token: Option<&'a str>,
}

impl Changed<'_> {
    fn shown_previous(&self) -> String {
        match &self.previous {
            Previous::None => "no mark".to_owned(),
            Previous::Mark(m) => m.to_string(),
            Previous::Damaged(why) => format!("a damaged record ({why})"),
        }
    }

    /// One line: what changed, from what to what (in `store`, when named).
    fn summary(&self, store: Option<&str>) -> String {
        let (resource, from) = (self.resource, self.shown_previous());
        let place = store.map(|s| format!(" in {s}")).unwrap_or_default();
        match (self.reason, self.new) {
            (Change::Clear, _) | (_, None) => format!("cleared the mark of {resource:?}{place} (it was {from})"),
            (Change::Raise, Some(to)) => format!("raised the mark of {resource:?}{place} from {from} to {to}"),
            (_, Some(to)) => format!("set the mark of {resource:?}{place} from {from} to {to}"),
        }
    }

    /// Log the change: a line on stderr, and the audit record in `audit`.
    fn record(&self, args: &Args, audit: Option<&AuditLog>) -> anyhow::Result<()> {
        eprintln!("fencekeeper: audit: {}", self.summary(Some(&args.describe())));
        let resource = self.resource;
        let Some(audit) = audit else {
            return Ok(());
        };
        let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).ok();
        let entry = Entry {
            unix_ms: fencekeeper::audit::now_ms(),
            host: "cli",
            reason: self.reason,
            resource,
            old: match &self.previous {
                Previous::Mark(m) => Some(*m),
                _ => None,
            },
            old_damaged: match &self.previous {
                Previous::Damaged(why) => Some(why),
                _ => None,
            },
            new: self.new,
            token: self.token,
            client: None,
            user: user.as_deref(),
            store: &args.audit_store(),
        };
        audit.append(&entry).context("the mark was changed, but writing the audit log failed")
    }
}

/// `--upgrade`: rewrite old-format marks (bare tokens) as checked records.
pub fn upgrade(args: &Args) -> anyhow::Result<ExitCode> {
    let marks = match &args.etcd {
        Some(url) => {
            let url = fencekeeper_gateway::config::with_scheme(url);
            EtcdStore::with_options(&url, &args.etcd_prefix, Duration::from_secs(5))?.upgrade()?
        }
        None => match FileStore::upgrade(&args.store)? {
            Upgrade::Upgraded(marks) => marks,
            Upgrade::Current => {
                out!("{} already holds checked records; nothing to upgrade", args.describe());
                return Ok(ExitCode::SUCCESS);
            }
        },
    };
    out!("upgraded {} marks in {} to checked records:", marks.len(), args.describe());
    let rows: Vec<(String, String)> = marks.into_iter().map(|(r, m)| (r, m.to_string())).collect();
    print_table(rows.iter().map(|(r, m)| (r.as_str(), m.as_str())));
    Ok(ExitCode::SUCCESS)
}
