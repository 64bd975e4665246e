//! A trigger's resource given as an SQL expression over the row's columns,
//! evaluated through SPI as the writing user:
//! `SELECT (EXPRESSION)::text FROM (SELECT ($1).*) AS fenced_row`, with the row as
//! `$1`. The plan is prepared once per trigger and backend, and prepared again when
//! the table's columns change (their types, names or number).

use crate::text;
use pgrx::datum::DatumWithOid;
use pgrx::pg_sys::{self, PgOid};
use pgrx::spi::{OwnedPreparedStatement, Spi};
use pgrx::PgTrigger;
use std::cell::RefCell;
use std::rc::Rc;

/// Plans kept per backend.
const KEPT: usize = 64;

struct Plan {
    trigger: pg_sys::Oid,
    expression: String,
    /// The table's columns (type, dropped, name) when the plan was made.
    shape: Vec<(pg_sys::Oid, bool, String)>,
    /// The table's row type: `$1`'s.
    rowtype: pg_sys::Oid,
    statement: OwnedPreparedStatement,
}

thread_local! {
    static PLANS: RefCell<Vec<Rc<Plan>>> = const { RefCell::new(Vec::new()) };
}

/// The value of `expression` for `tuple`, a row of the trigger's table, as text
/// bytes; `None` when it is NULL. An expression that fails raises its own error.
///
/// # Safety
/// `tuple` is a row of the relation the trigger fired on.
pub unsafe fn evaluate(trigger: &PgTrigger<'_>, expression: &str, tuple: pg_sys::HeapTuple) -> Option<Vec<u8>> {
    let data = trigger.trigger_data();
    let relation = data.tg_relation;
    // SAFETY: a row trigger's relation is open for the call; its descriptor and
    // pg_class row with it.
    let (tupdesc, rowtype) = unsafe { ((*relation).rd_att, (*(*relation).rd_rel).reltype) };
    let shape = shape(tupdesc);
    Spi::connect(|client| {
        let plan = plan(client, trigger.trigger().tgoid, expression, shape, rowtype);
        // SAFETY: the row as a composite datum of the table's row type (palloc'd in
        // the SPI connection's memory, freed when it closes).
        let row = unsafe { pg_sys::heap_copy_tuple_as_datum(tuple, tupdesc) };
        // SAFETY: the datum is of `plan.rowtype`, the type the statement declares.
        let args = [unsafe { DatumWithOid::new(row, plan.rowtype) }];
        let table = client.select(&plan.statement, None, &args).unwrap_or_else(|e| spi_failed(expression, e));
        let value = table.first().get_datum_by_ordinal(1).unwrap_or_else(|e| spi_failed(expression, e));
        // SAFETY: the statement casts its one column to text.
        value.map(|datum| unsafe { text::datum_bytes(datum, pg_sys::TEXTOID) })
    })
}

fn spi_failed(expression: &str, e: pgrx::spi::SpiError) -> ! {
    pgrx::error!("fencekeeper.fence(): the resource expression {expression:?} could not be evaluated: {e}")
}

/// The kept plan for this trigger and expression, if the table still has the shape
/// it was made for; otherwise a new one.
fn plan(
    client: &pgrx::spi::SpiClient<'_>,
    trigger: pg_sys::Oid,
    expression: &str,
    shape: Vec<(pg_sys::Oid, bool, String)>,
    rowtype: pg_sys::Oid,
) -> Rc<Plan> {
    let kept = PLANS.with_borrow(|plans| {
        plans
            .iter()
            .find(|p| p.trigger == trigger && p.expression == expression && p.shape == shape && p.rowtype == rowtype)
            .cloned()
    });
    if let Some(plan) = kept {
        return plan;
    }
    let query = format!("SELECT ({expression})::pg_catalog.text FROM (SELECT ($1).*) AS fenced_row");
    let statement = client
        .prepare_mut(query.as_str(), &[PgOid::from(rowtype)])
        .unwrap_or_else(|e| spi_failed(expression, e))
        .keep();
    let plan = Rc::new(Plan { trigger, expression: expression.to_owned(), shape, rowtype, statement });
    PLANS.with_borrow_mut(|plans| {
        plans.retain(|p| p.trigger != trigger);
        if plans.len() >= KEPT {
            plans.remove(0);
        }
        plans.push(plan.clone());
    });
    plan
}

/// What a plan over the row depends on: each column's type, whether it was dropped,
/// and its name (the expression names columns).
fn shape(tupdesc: pg_sys::TupleDesc) -> Vec<(pg_sys::Oid, bool, String)> {
    // SAFETY: the relation's descriptor, valid for the call; not copied, not freed.
    let desc = unsafe { pgrx::PgTupleDesc::from_pg_unchecked(tupdesc) };
    desc.iter().map(|att| (att.atttypid, att.attisdropped, att.name().to_owned())).collect()
}
