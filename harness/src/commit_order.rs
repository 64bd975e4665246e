//! A checker for fencing inside a database, read from the database alone: no row
//! committed with a token below its resource's mark at the moment it committed.
//!
//! The marks' history is the extension's audit (`fencekeeper.audit`, one row per
//! advance, inserted by the advancing transaction); commit times come from the
//! server (`track_commit_timestamp = on`). A row is in violation when an advance past
//! its token committed strictly before it did: the write was admitted at a mark that
//! a newer holder had already moved on from. Tokens are single numbers here.

use crate::pg_wire::{text, Client};
use anyhow::Result;

/// The rows of `table` (its columns `resource` and `token`) that committed after
/// an advance of their resource past their token, one line each.
pub fn violations(client: &mut Client, table: &str) -> Result<Vec<String>> {
    let sql = format!(
        "WITH written AS (
             SELECT resource, token::numeric AS token, pg_xact_commit_timestamp(xmin) AS at FROM {table}),
         advanced AS (
             SELECT resource, (entry->>'new')::numeric AS mark, pg_xact_commit_timestamp(xmin) AS at
             FROM fencekeeper.audit)
         SELECT w.resource || ' token ' || w.token || ' committed at ' || w.at
                || ' after the mark reached ' || max(a.mark)
         FROM written w JOIN advanced a ON a.resource = w.resource AND a.at < w.at
         GROUP BY w.resource, w.token, w.at
         HAVING max(a.mark) > w.token"
    );
    let rows = client.query(sql)?;
    Ok(rows.into_iter().filter_map(|row| row.into_iter().next().flatten().map(text)).collect())
}

/// How many rows of `table` have a commit time, and how many audit rows do: a
/// checker that compares nothing would pass anything.
pub fn coverage(client: &mut Client, table: &str) -> Result<(u64, u64)> {
    let count = |client: &mut Client, sql: String| -> Result<u64> {
        Ok(client.value(sql)?.and_then(|v| v.parse().ok()).unwrap_or(0))
    };
    let rows = count(client, format!("SELECT count(pg_xact_commit_timestamp(xmin)) FROM {table}"))?;
    let advances = count(client, "SELECT count(pg_xact_commit_timestamp(xmin)) FROM fencekeeper.audit".into())?;
    Ok((rows, advances))
}
