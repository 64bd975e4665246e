//! `fencekeeper.fence(resource, token)`: a BEFORE row trigger that admits each
//! written row's token for its resource, in the row's own transaction.
//!
//! ```sql
//! CREATE TRIGGER fenced BEFORE INSERT OR UPDATE OR DELETE ON imports
//!     FOR EACH ROW EXECUTE FUNCTION fencekeeper.fence('batch', 'token');
//! ```
//!
//! * `resource`: a column of the table, or an SQL expression over the row's columns
//!   (`'invoice/' || customer_id`), evaluated as the writing user.
//! * `token`: the column holding the writer's fencing token (text, varchar, an
//!   integer, or an integer array for a tuple: [`crate::token_column`]).
//!
//! An INSERT presents the new row's token for the new row's resource. An UPDATE
//! presents, for the new row's resource, the new row's token when it sets the token
//! column, else the `fencekeeper.token` setting (`SET LOCAL fencekeeper.token =
//! '35'`), else nothing (refused as missing: the old row's token is not the
//! writer's, [`crate::presented`]); one that moves a row to another resource
//! presents the same for the old one. A DELETE has no new row: it presents the
//! setting for the old row's resource. A refused row raises, and the statement and
//! its transaction abort.

use crate::presented::{self, Presented};
use crate::refusal::Refusal;
use crate::write::{self, Write};
use crate::{expression, text, token_column};
use pgrx::pg_sys::{self, FunctionCallInfo};
use pgrx::prelude::PgSqlErrorCode;
use pgrx::{ereport, PgTrigger};
use std::num::NonZeroUsize;

/// Where a row's resource comes from.
enum Resource<'a> {
    /// A column, by attribute number.
    Column(NonZeroUsize, pg_sys::Oid),
    /// An SQL expression over the row.
    Expression(&'a str),
}

/// The trigger's body.
///
/// # Safety
/// `fcinfo` is the server's call of the trigger function.
pub unsafe fn fence(fcinfo: FunctionCallInfo) -> Result<pg_sys::Datum, Refusal> {
    // SAFETY: the server's call; `from_fcinfo` checks it is a trigger call.
    let trigger = match unsafe { PgTrigger::from_fcinfo(&*fcinfo) } {
        Ok(trigger) => trigger,
        Err(_) => protocol("fencekeeper.fence() can only be called as a trigger"),
    };
    let event = trigger.event();
    if !event.fired_for_row() || !event.fired_before() {
        protocol("fencekeeper.fence() must be a BEFORE ... FOR EACH ROW trigger");
    }
    let args = trigger.extra_args().unwrap_or_default();
    let [resource_arg, token_arg] = args.as_slice() else {
        protocol("fencekeeper.fence() takes two arguments: the resource column or expression, and the token column")
    };
    let data = trigger.trigger_data();
    // SAFETY: a row trigger's relation is open for the whole call.
    let tupdesc = unsafe { (*data.tg_relation).rd_att };
    let resource = match column(tupdesc, resource_arg) {
        Some((attno, typoid)) => Resource::Column(attno, typoid),
        None => Resource::Expression(resource_arg),
    };
    let resource_of = |tuple: pg_sys::HeapTuple| -> Option<Vec<u8>> {
        match resource {
            // SAFETY: `tuple` is a row of this relation, described by `tupdesc`.
            Resource::Column(attno, typoid) => unsafe { attribute(tuple, tupdesc, attno, typoid) },
            // SAFETY: the same row, in the same relation.
            Resource::Expression(expr) => unsafe { expression::evaluate(&trigger, expr, tuple) },
        }
    };
    // SAFETY: the descriptor of the relation the trigger fired on.
    let column = unsafe { token_column::column(tupdesc, token_arg) };
    // SAFETY: a row of this relation, described by `tupdesc`.
    let token_column = |tuple: pg_sys::HeapTuple| unsafe { column.token(tuple, tupdesc) };
    let column_is_null = format!("the column {token_arg:?} is NULL");
    // The token the writer presented, and what its absence means.
    let token_of = |presented: Presented, new: Option<pg_sys::HeapTuple>| match presented {
        Presented::Column => (new.and_then(token_column), column_is_null.clone()),
        Presented::Setting(token) => (Some(token), String::new()),
        Presented::Nothing(why) => (None, why),
    };
    if event.fired_by_delete() {
        let old = data.tg_trigtuple;
        let (token, missing) = token_of(presented::of_delete(), None);
        write::admit(&Write { resource: resource_of(old).as_deref(), token: token.as_deref(), missing: &missing })?;
        return Ok(pg_sys::Datum::from(old));
    }
    let (new, old, presented) = if event.fired_by_update() {
        (data.tg_newtuple, Some(data.tg_trigtuple), presented::of_update(data, &column))
    } else {
        (data.tg_trigtuple, None, Presented::Column)
    };
    let (token, missing) = token_of(presented, Some(new));
    let resource = resource_of(new);
    write::admit(&Write { resource: resource.as_deref(), token: token.as_deref(), missing: &missing })?;
    if let Some(old_resource) = old.map(resource_of).filter(|r| *r != resource) {
        // A row moved to another resource writes both: the old one loses a row.
        write::admit(&Write { resource: old_resource.as_deref(), token: token.as_deref(), missing: &missing })?;
    }
    Ok(pg_sys::Datum::from(new))
}

/// Raise a misuse of the trigger (not a refusal: the trigger is wrongly declared).
fn protocol(message: &str) -> ! {
    ereport!(ERROR, PgSqlErrorCode::ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, message);
}

/// The attribute number and type of the live column `name`.
fn column(tupdesc: pg_sys::TupleDesc, name: &str) -> Option<(NonZeroUsize, pg_sys::Oid)> {
    // SAFETY: the relation's descriptor, valid for the call; not copied, not freed.
    let desc = unsafe { pgrx::PgTupleDesc::from_pg_unchecked(tupdesc) };
    desc.iter()
        .position(|att| !att.attisdropped && att.name() == name)
        .and_then(|i| Some((NonZeroUsize::new(i + 1)?, desc.get(i)?.atttypid)))
}

/// Attribute `attno` of `tuple` as text bytes, `None` when NULL.
///
/// # Safety
/// `tuple` is described by `tupdesc`, and `typoid` is the attribute's type.
unsafe fn attribute(
    tuple: pg_sys::HeapTuple,
    tupdesc: pg_sys::TupleDesc,
    attno: NonZeroUsize,
    typoid: pg_sys::Oid,
) -> Option<Vec<u8>> {
    // SAFETY: the caller's contract.
    unsafe {
        let datum = pgrx::htup::heap_getattr_raw(tuple, attno, tupdesc)?;
        Some(text::datum_bytes(datum, typoid))
    }
}
