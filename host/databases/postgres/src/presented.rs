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
//! What the table itself puts in the column is not the writer's either:
//! [`crate::token_column`] refuses a token column with a DEFAULT.

use crate::token_column::TokenColumn;
use pgrx::pg_sys;

/// What a row presents as its writer's token.
pub enum Presented {
    /// The new row's token column (NULL there is missing too).
    Column,
    /// The setting `fencekeeper.token`.
    Setting(Vec<u8>),
    /// No token: why, for the refusal's message.
    Nothing(String),
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
