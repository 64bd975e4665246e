//! The audit of the marks: every advance as one row of `fencekeeper.audit`, holding
//! the line every Fencekeeper host writes (`fencekeeper_core::audit::Entry`).
//!
//! Inside a database the audit is part of the transaction: the row is inserted with
//! the advance and commits or rolls back with it, so the table holds exactly the
//! advances that happened, which no log written beside a store can promise. A log
//! line would be written even for an advance that then rolled back.

use crate::marks::{Marks, TABLE};
use fencekeeper::audit::{now_ms, Change, Entry};
use fencekeeper::{Advance, StoreError};
use pgrx::fcinfo::direct_function_call;
use pgrx::pg_sys;
use std::ffi::CStr;

/// Insert the audit row of `advance` on `resource`, made by `token` (as sent).
pub fn record(marks: &Marks<'_, '_>, resource: &str, advance: &Advance, token: &str) -> Result<(), StoreError> {
    let (client, user, database) = who();
    let store = format!("postgresql database {database} table {TABLE}");
    let entry = Entry {
        unix_ms: now_ms(),
        host: "postgres",
        reason: Change::Advance,
        resource,
        old: advance.from,
        old_damaged: None,
        new: Some(advance.to),
        token: Some(token),
        client: client.as_deref(),
        user: user.as_deref(),
        store: &store,
    };
    let line = entry.to_string();
    marks.run(&marks.statements().audit, &[&crate::text::to_server(resource), &crate::text::to_server(&line)])?;
    Ok(())
}

/// The client's address (`HOST:PORT`; `None` over a Unix socket), the session's
/// user and the database, as far as the backend knows them.
fn who() -> (Option<String>, Option<String>, String) {
    let text = |p: *const std::ffi::c_char| {
        // SAFETY: a NUL-terminated string from the server, or null.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    // SAFETY: inet_client_addr and inet_client_port take no argument and return NULL
    // without a client address (a Unix socket); their results are an inet and an
    // int4. The user and database names are palloc'd copies looked up by id
    // (`noerr`: null if gone).
    unsafe {
        let addr = direct_function_call::<pg_sys::Datum>(pg_sys::inet_client_addr, &[]);
        let port = direct_function_call::<i32>(pg_sys::inet_client_port, &[]);
        let client = addr.map(|addr| {
            let host = String::from_utf8_lossy(&crate::text::datum_bytes(addr, pg_sys::INETOID)).into_owned();
            match port {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        });
        let user = text(pg_sys::GetUserNameFromId(pg_sys::GetSessionUserId(), true));
        let database = text(pg_sys::get_database_name(pg_sys::MyDatabaseId)).unwrap_or_default();
        (client, user, database)
    }
}
