//! The extension's settings (`SHOW fencekeeper.strict`, `ALTER DATABASE ... SET`).
//!
//! What decides the fencing policy (strict mode, the guest, the audit) is a
//! superuser's setting: a client cannot weaken the fence it is subject to. The token
//! of a DELETE (which has no new row to carry one), and of an UPDATE that does not
//! set the token column, is the client's own.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use std::ffi::CString;

/// `fencekeeper.strict`: refuse a token equal to the mark as replayed (FK002).
pub static STRICT: GucSetting<bool> = GucSetting::<bool>::new(false);

/// `fencekeeper.audit`: write every advance into `fencekeeper.audit`.
pub static AUDIT: GucSetting<bool> = GucSetting::<bool>::new(true);

/// `fencekeeper.guest`: a component file implementing the validator world, instead
/// of the bundled guest (empty: the bundled one). It must pass the conformance
/// vectors when it loads, like any guest.
pub static GUEST: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// `fencekeeper.token`: the token a fenced DELETE, or an UPDATE that does not set
/// the token column, presents (`SET LOCAL`: it ends with the transaction).
pub static TOKEN: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(None);

/// Register the settings (from `_PG_init`).
pub fn define() {
    GucRegistry::define_bool_guc(
        c"fencekeeper.strict",
        c"Refuse a fencing token equal to the mark (replayed), admitting each token once.",
        c"Off: the current lock holder may write again with its token. On: every write needs a new token.",
        &STRICT,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_bool_guc(
        c"fencekeeper.audit",
        c"Record every advance of a mark in fencekeeper.audit, in the transaction that made it.",
        c"",
        &AUDIT,
        GucContext::Suset,
        GucFlags::default(),
    );
    GucRegistry::define_string_guc(
        c"fencekeeper.guest",
        c"A validator component to run instead of the bundled guest (empty: the bundled guest).",
        c"The component must implement fencekeeper:validator@0.3.0 and pass the conformance vectors when it loads.",
        &GUEST,
        GucContext::Suset,
        GucFlags::SUPERUSER_ONLY,
    );
    GucRegistry::define_string_guc(
        c"fencekeeper.token",
        c"The fencing token a fenced DELETE, or an UPDATE that does not set the token column, presents (SET LOCAL fencekeeper.token = '...').",
        c"INSERT takes the token from the row, UPDATE from the token column when it sets it; a DELETE has no new row. Use SET LOCAL: a session-wide SET would present it for every later write of the session.",
        &TOKEN,
        GucContext::Userset,
        GucFlags::default(),
    );
}

/// The configured guest, `None` for the bundled one.
pub fn guest() -> Option<CString> {
    GUEST.get().filter(|path| !path.as_bytes().is_empty())
}
