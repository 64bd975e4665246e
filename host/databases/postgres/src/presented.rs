//! Which token a fenced row presents: always one its writer sent, never the row's
//! leftover.
//!
//! The row alone cannot say who put the token there. An UPDATE that does not name
//! the token column leaves the old row's token in the new row, so a stale holder's
//! `UPDATE orders SET amount = 0` would carry the newest holder's token, and be
//! admitted. PostgreSQL (13 and later) hands a row trigger the columns the UPDATE
//! names as targets (`TriggerData.tg_updatedcols`, whatever values they are set to),
//! which tells "set to the value it had" from "not set": an UPDATE presents its new
//! row's token only when it names the token column; otherwise the setting
//! `fencekeeper.token` (`SET LOCAL`); otherwise nothing, and it is refused as missing.
//! A DELETE has no new row: the setting, or nothing.
//!
//! The same holds for what the table puts in the column: a DEFAULT, an identity or a
//! generated column fills the token for a writer that sent none, and the trigger
//! sees the row, not the INSERT's column list. Such a token column is refused.

use pgrx::pg_sys;
use pgrx::prelude::PgSqlErrorCode;
use pgrx::{ereport, PgTupleDesc};
use std::num::NonZeroUsize;

/// The token column of a fenced table.
pub struct TokenColumn<'a> {
    /// Its name, as the trigger's second argument gives it.
    pub name: &'a str,
    /// Its attribute number.
    pub attno: NonZeroUsize,
    /// Its type.
    pub typoid: pg_sys::Oid,
}

/// What a row presents as its writer's token.
pub enum Presented {
    /// The new row's token column (NULL there is missing too).
    Column,
    /// The setting `fencekeeper.token`.
    Setting(Vec<u8>),
    /// No token: why, for the refusal's message.
    Nothing(String),
}

/// The token column named `name`, checked to be one only a writer fills. Raises
/// 42703 when the table has no such column and 55000 when the table fills it
/// itself (a DEFAULT, the type's DEFAULT, an identity or generated column).
///
/// # Safety
/// `tupdesc` is the descriptor of the relation the trigger fired on.
pub unsafe fn column<'a>(tupdesc: pg_sys::TupleDesc, name: &'a str) -> TokenColumn<'a> {
    // SAFETY: the relation's descriptor (the caller's contract), valid for the call;
    // not copied, not freed.
    let desc = unsafe { PgTupleDesc::from_pg_unchecked(tupdesc) };
    let found = desc
        .iter()
        .enumerate()
        .find(|(_, att)| !att.attisdropped && att.name() == name)
        .and_then(|(i, att)| Some((NonZeroUsize::new(i + 1)?, att)));
    let Some((attno, att)) = found else {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_UNDEFINED_COLUMN,
            format!("fencekeeper.fence(): the table has no column {name:?} for the token")
        );
    };
    let filled = if att.attidentity != 0 {
        Some("is an identity column")
    } else if att.attgenerated != 0 {
        Some("is a generated column")
    } else if att.atthasdef {
        Some("has a DEFAULT")
    } else if type_has_default(att.atttypid) {
        Some("is of a domain with a DEFAULT")
    } else {
        None
    };
    if let Some(filled) = filled {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!(
                "fencekeeper.fence(): the token column {name:?} {filled}, so a row could carry a token its writer never \
                 sent; give the column no default (ALTER TABLE ... ALTER COLUMN {name:?} DROP DEFAULT, DROP IDENTITY \
                 or DROP EXPRESSION)"
            )
        );
    }
    TokenColumn { name, attno, typoid: att.atttypid }
}

/// Whether `typoid` is a domain with a DEFAULT of its own, which an INSERT that
/// leaves the column out would use.
fn type_has_default(typoid: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookups by type oid; get_typdefault returns a node palloc'd in
    // the call's memory context, or null.
    unsafe { pg_sys::get_typtype(typoid) as u8 == pg_sys::TYPTYPE_DOMAIN && !pg_sys::get_typdefault(typoid).is_null() }
}

/// The token of the setting `fencekeeper.token`, when set and not empty.
fn setting() -> Option<Vec<u8>> {
    crate::settings::TOKEN.get().map(|t| t.to_bytes().to_vec()).filter(|t| !t.is_empty())
}

/// What an UPDATE presents: its new row's token column when it names the column as
/// a target, else the setting, else nothing.
pub fn of_update(data: &pg_sys::TriggerData, column: &TokenColumn<'_>) -> Presented {
    // tg_updatedcols counts attribute numbers from FirstLowInvalidHeapAttributeNumber
    // (system columns are below 1), as the planner's column sets do.
    let member = i32::try_from(column.attno.get()).unwrap_or(i32::MAX) - pg_sys::FirstLowInvalidHeapAttributeNumber;
    // SAFETY: the trigger's own data: tg_updatedcols is a set the executor built for
    // this UPDATE (or null, the empty set), valid for the call.
    if unsafe { pg_sys::bms_is_member(member, data.tg_updatedcols) } {
        return Presented::Column;
    }
    match setting() {
        Some(token) => Presented::Setting(token),
        None => Presented::Nothing(format!(
            "an UPDATE presents the writer's token by setting the column {:?} (SET ..., {} = TOKEN) or with SET LOCAL \
             fencekeeper.token = 'TOKEN'; this one does neither, and the row's old token is not the writer's",
            column.name, column.name
        )),
    }
}

/// What a DELETE presents: the setting, or nothing.
pub fn of_delete() -> Presented {
    match setting() {
        Some(token) => Presented::Setting(token),
        None => Presented::Nothing(
            "a DELETE presents the setting fencekeeper.token, which is not set (SET LOCAL fencekeeper.token = '...')"
                .to_owned(),
        ),
    }
}
