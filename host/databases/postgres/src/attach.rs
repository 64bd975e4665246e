//! `fencekeeper.check_fence()`: an event trigger at the end of `CREATE TRIGGER` and
//! `ALTER TABLE` that checks the token column of every `fencekeeper.fence` trigger on
//! the tables the command touched, so a token column of the wrong type or with a
//! DEFAULT is refused when the trigger is attached (or the column changed), not at
//! the first write. The command raises the column's error and is rolled back.
//!
//! The trigger still checks the column at every write ([`crate::token_column`]):
//! event triggers do not fire in single-user mode, and a domain's DEFAULT can be
//! added by an `ALTER DOMAIN` that names no table.

use crate::refusal::Refusal;
use crate::token_column;
use pgrx::pg_sys;
use pgrx::spi::Spi;
use pgrx::PgRelation;

/// The fence triggers on the relations the command created a trigger on or altered,
/// with their arguments (the statement names every catalog and operator with its
/// schema: it runs with the DDL's own `search_path`).
const FENCED: &str = "SELECT t.tgrelid, t.tgargs FROM pg_catalog.pg_trigger t \
     WHERE t.tgfoid OPERATOR(pg_catalog.=) 'fencekeeper.fence()'::pg_catalog.regprocedure \
     AND t.tgrelid OPERATOR(pg_catalog.=) ANY (ARRAY( \
         SELECT c.objid FROM pg_catalog.pg_event_trigger_ddl_commands() c \
         WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass \
         UNION ALL \
         SELECT r.tgrelid FROM pg_catalog.pg_event_trigger_ddl_commands() c \
         JOIN pg_catalog.pg_trigger r ON r.oid OPERATOR(pg_catalog.=) c.objid \
         WHERE c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_trigger'::pg_catalog.regclass))";

/// The event trigger's body.
///
/// # Safety
/// `fcinfo` is the server's call of the function.
pub unsafe fn check(fcinfo: pg_sys::FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: the server's call; its context is an EventTriggerData node when it is
    // called as an event trigger.
    let context = unsafe { (*fcinfo).context };
    // SAFETY: a node's first field is its tag.
    if context.is_null() || unsafe { (*context).type_ } != pg_sys::NodeTag::T_EventTriggerData {
        pgrx::error!("fencekeeper.check_fence() can only be called as an event trigger");
    }
    let fenced: Vec<(pg_sys::Oid, Vec<u8>)> = Spi::connect(|client| {
        let rows = client.select(FENCED, None, &[]).unwrap_or_else(|e| pgrx::error!("fencekeeper.check_fence(): {e}"));
        rows.filter_map(|row| Some((row.get(1).ok()??, row.get(2).ok()??))).collect()
    });
    for (relid, args) in fenced {
        // tgargs: each argument NUL-terminated; a trigger with other than two is
        // refused at its first write (39P01).
        let args: Vec<&[u8]> = args.strip_suffix(&[0]).unwrap_or_default().split(|b| *b == 0).collect();
        let [_, name] = args.as_slice() else { continue };
        let Ok(name) = std::str::from_utf8(name) else { continue };
        // SAFETY: the command already holds a stronger lock on the relation; an
        // AccessShareLock more is always safe to take. It is closed on drop, also
        // when the check raises.
        let relation = unsafe { PgRelation::with_lock(relid, pg_sys::AccessShareLock as pg_sys::LOCKMODE) };
        // SAFETY: the relation's own descriptor, valid while it is open.
        let _ = unsafe { token_column::column(relation.rd_att, name) };
    }
    Ok(pg_sys::Datum::from(0))
}
