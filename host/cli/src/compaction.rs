//! What a compaction (`fencekeeper marks --compact`, `serve --compact-idle-for`) says
//! it did: one summary line, and the audit records, the floor's rise first.

use anyhow::Context;
use fencekeeper::audit::{AuditLog, Change, Entry};
use fencekeeper::store::{Compaction, Retention};
use fencekeeper::Token;
use std::sync::Arc;
use std::time::Duration;

/// One line: what a compaction of `store` did.
pub fn summary(c: &Compaction, idle_for: Duration, store: &str) -> String {
    let show = |f: Option<Token>| f.map_or_else(|| "none".to_owned(), |f| f.to_string());
    let mut line = format!(
        "forgot {} marks idle for {}s in {store}; retention floor {} -> {}; kept {}",
        c.forgotten.len(),
        idle_for.as_secs(),
        show(c.floor_before),
        show(c.floor),
        c.kept
    );
    if c.other_arity > 0 {
        line.push_str(&format!(" ({} idle but of another arity than the floor)", c.other_arity));
    }
    if let Some(why) = &c.not_yet {
        line.push_str(&format!("; {why}"));
    }
    line
}

/// The audit records of a compaction by `host` of `store` (the audit log's spelling):
/// the floor's rise, then each mark forgotten.
pub fn record(audit: &AuditLog, c: &Compaction, host: &str, store: &str) -> anyhow::Result<()> {
    let user = std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).ok();
    let entry = |reason, resource, old, new| Entry {
        unix_ms: fencekeeper::audit::now_ms(),
        host,
        reason,
        resource,
        old,
        old_damaged: None,
        new,
        token: None,
        client: None,
        user: user.as_deref(),
        store,
    };
    let failed = "the marks were forgotten, but writing the audit log failed";
    if c.floor != c.floor_before {
        audit.append(&entry(Change::Floor, "(the retention floor)", c.floor_before, c.floor)).context(failed)?;
    }
    for (resource, mark) in &c.forgotten {
        audit.append(&entry(Change::Forget, resource, Some(*mark), None)).context(failed)?;
    }
    Ok(())
}

/// The gateway's periodic compaction: every `every`, forget the marks idle for
/// `idle_for`, logged, audited and counted in `metrics`. A failed run is logged and
/// tried again next time; it never stops the gateway (nothing is forgotten unless the
/// floor was raised first).
pub fn periodic(
    store: Arc<dyn Retention + Send + Sync>,
    idle_for: Duration,
    every: Duration,
    audit: Option<AuditLog>,
    described: String,
    metrics: Arc<fencekeeper_gateway::metrics::Metrics>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new().name("fencekeeper-compaction".into()).spawn(move || loop {
        std::thread::sleep(every);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        match store.compact(idle_for, now) {
            Ok(c) => {
                metrics.compaction(Some(c.forgotten.len()));
                tracing::info!(
                    forgotten = c.forgotten.len(),
                    floor = %c.floor.map_or_else(|| "none".to_owned(), |f| f.to_string()),
                    kept = c.kept,
                    "{}",
                    summary(&c, idle_for, &described)
                );
                if let Some(audit) = &audit {
                    if let Err(e) = record(audit, &c, "gateway", &described) {
                        tracing::error!("{e:#}");
                    }
                }
            }
            Err(e) => {
                metrics.compaction(None);
                tracing::error!("compaction of {described} failed, nothing forgotten by it: {e}")
            }
        }
    })
}
