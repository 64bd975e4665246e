//! The extension's statements on its tables run as the tables' owner.
//!
//! Nobody but the owner (whoever ran `CREATE EXTENSION`) has a privilege on
//! `fencekeeper.marks`: a client that could write it could lower a mark and let a
//! stale writer in. The functions themselves run as their caller (they are not
//! `SECURITY DEFINER`), because a trigger's resource expression is the table owner's
//! SQL and must not run with more rights than the caller has; only the few fixed
//! statements on the marks and the audit switch user, the way the server itself runs
//! maintenance as a table's owner. They name every table and operator with its
//! schema, so no `search_path` can redirect them.

use pgrx::pg_sys;
use pgrx::PgRelation;

/// While alive, the current user is the marks table's owner, in a security-restricted
/// operation. Dropping it (also while unwinding from an error) restores the caller;
/// the server restores it too when the transaction or subtransaction aborts.
pub struct AsOwner {
    user: pg_sys::Oid,
    context: i32,
}

impl AsOwner {
    /// Become the owner of `fencekeeper.marks`. The error is one line: the extension
    /// is not installed in this database.
    pub fn switch() -> Result<AsOwner, String> {
        let marks = PgRelation::open_with_name_and_share_lock("fencekeeper.marks")
            .map_err(|_| "the table fencekeeper.marks does not exist: run CREATE EXTENSION fencekeeper".to_owned())?;
        // SAFETY: an open relation's `rd_rel` is its pg_class row, valid while the
        // relation is open (`marks` is, to the end of this function).
        let owner = unsafe { (*marks.rd_rel).relowner };
        let (mut user, mut context) = (pg_sys::Oid::INVALID, 0);
        // SAFETY: plain reads and writes of the backend's current user and security
        // context, which the server keeps per process; the context flags are the ones
        // the server uses for the same purpose (see the restore in Drop).
        unsafe {
            pg_sys::GetUserIdAndSecContext(&mut user, &mut context);
            pg_sys::SetUserIdAndSecContext(
                owner,
                context | pg_sys::SECURITY_LOCAL_USERID_CHANGE as i32 | pg_sys::SECURITY_RESTRICTED_OPERATION as i32,
            );
        }
        Ok(AsOwner { user, context })
    }
}

impl Drop for AsOwner {
    fn drop(&mut self) {
        // SAFETY: restores exactly what `switch` read.
        unsafe { pg_sys::SetUserIdAndSecContext(self.user, self.context) }
    }
}
