//! The column a fenced table carries its writers' tokens in: one only a writer
//! fills, of a type whose value is a token without loss, read as that token.
//!
//! A token is 1 to 4 unsigned 64-bit numbers joined by `.`. A column's value becomes
//! one through its text form, which is faithful only for some types:
//!
//! * `text`, `varchar`: the token as written (`'41'`, `'7.10'`).
//! * `smallint`, `integer`, `bigint`, and `numeric` with scale 0 (`numeric(20,0)`
//!   holds every u64; `bigint` stops at 2^63 - 1): the number.
//! * an array of `smallint`, `integer` or `bigint` for a tuple: `'{7,10}'` is `7.10`.
//!
//! Any other type is refused (42804) before its value is read. A `numeric` with a
//! fraction would make the decimal point a tuple separator: `7.10` and `7.1` are
//! the same number but the tuples 7.10 and 7.1, and `7.00` would be a tuple of two.
//! A `real`, `double precision` or `char(n)` text form (`1e+20`, blank padding) is
//! no token either, and every other type is no number.
//!
//! What the table puts in the column is not the writer's token: a DEFAULT, an
//! identity or generated column, or a domain with a DEFAULT fills the token for a
//! writer that sent none, and the trigger sees the row, not the INSERT's column
//! list. Such a column is refused (55000).

use crate::text;
use pgrx::pg_sys;
use pgrx::prelude::PgSqlErrorCode;
use pgrx::{ereport, PgTupleDesc};
use std::ffi::CStr;
use std::num::NonZeroUsize;

/// The token column of a fenced table.
pub struct TokenColumn<'a> {
    /// Its name, as the trigger's second argument gives it.
    pub name: &'a str,
    /// Its attribute number.
    pub attno: NonZeroUsize,
    /// The type its value is read as (a domain's base type).
    base: pg_sys::Oid,
    /// Whether it is an array, a tuple's numbers.
    array: bool,
}

/// How the text form of `base` (with `typmod`) carries a token: `Some(array)` for
/// a type that carries one faithfully, `None` otherwise.
fn carries(base: pg_sys::Oid, typmod: i32) -> Option<bool> {
    match base {
        pg_sys::TEXTOID | pg_sys::VARCHAROID | pg_sys::INT2OID | pg_sys::INT4OID | pg_sys::INT8OID => Some(false),
        pg_sys::INT2ARRAYOID | pg_sys::INT4ARRAYOID | pg_sys::INT8ARRAYOID => Some(true),
        // numeric(p, s) stores its typmod as ((p << 16) | s) + VARHDRSZ, s in the low
        // 11 bits (PostgreSQL 15 allows a negative scale); -1: no scale declared.
        pg_sys::NUMERICOID if typmod >= 4 && (typmod - 4) & 0x7ff == 0 => Some(false),
        _ => None,
    }
}

/// The token column named `name`, checked. Raises 42703 when the table has no such
/// column, 55000 when the table fills it itself, 42804 when its type cannot carry
/// a token.
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
    let mut typmod = att.atttypmod;
    // SAFETY: a catalog lookup by type oid; the typmod is written for a domain only.
    let base = unsafe { pg_sys::getBaseTypeAndTypmod(att.atttypid, &mut typmod) };
    let Some(array) = carries(base, typmod) else {
        ereport!(
            ERROR,
            PgSqlErrorCode::ERRCODE_DATATYPE_MISMATCH,
            format!(
                "fencekeeper.fence(): the token column {name:?} is of type {}, whose values do not carry a fencing token \
                 faithfully; use bigint (or numeric(20,0) for every u64), text, or bigint[] for a tuple \
                 (ALTER TABLE ... ALTER COLUMN {name:?} TYPE bigint)",
                type_name(att.atttypid, att.atttypmod)
            )
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
    TokenColumn { name, attno, base, array }
}

impl TokenColumn<'_> {
    /// The token `tuple` holds in this column, as text bytes; `None` when NULL.
    ///
    /// # Safety
    /// `tuple` is a row of the relation described by `tupdesc`, the one the column
    /// was found in.
    pub unsafe fn token(&self, tuple: pg_sys::HeapTuple, tupdesc: pg_sys::TupleDesc) -> Option<Vec<u8>> {
        // SAFETY: the caller's contract; the datum is of the column's type, whose
        // output function is its base type's.
        let bytes = unsafe {
            let datum = pgrx::htup::heap_getattr_raw(tuple, self.attno, tupdesc)?;
            text::datum_bytes(datum, self.base)
        };
        if !self.array {
            return Some(bytes);
        }
        // An integer array's text form is `{7,10}`: its numbers joined by `.`. Any
        // other form (NULL elements, more dimensions, other bounds: `[0:1]={7,10}`)
        // is left as it is, and is malformed.
        match bytes.strip_prefix(b"{").and_then(|b| b.strip_suffix(b"}")) {
            Some(inner) if !inner.contains(&b'{') => {
                Some(inner.iter().map(|&b| if b == b',' { b'.' } else { b }).collect())
            }
            _ => Some(bytes),
        }
    }
}

/// Whether `typoid` is a domain with a DEFAULT of its own, which an INSERT that
/// leaves the column out would use.
fn type_has_default(typoid: pg_sys::Oid) -> bool {
    // SAFETY: catalog lookups by type oid; get_typdefault returns a node palloc'd in
    // the call's memory context, or null.
    unsafe { pg_sys::get_typtype(typoid) as u8 == pg_sys::TYPTYPE_DOMAIN && !pg_sys::get_typdefault(typoid).is_null() }
}

/// The type as SQL writes it (`numeric(10,2)`), for a message.
fn type_name(typoid: pg_sys::Oid, typmod: i32) -> String {
    // SAFETY: format_type_with_typemod returns a palloc'd NUL-terminated string.
    unsafe { CStr::from_ptr(pg_sys::format_type_with_typemod(typoid, typmod)).to_string_lossy().into_owned() }
}
