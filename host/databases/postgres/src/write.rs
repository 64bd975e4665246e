//! One fenced write: what it presents, checked, decided by the guard against the
//! marks of this transaction, and its outcome as the client will see it.

use crate::marks::Marks;
use crate::owner::AsOwner;
use crate::refusal::Refusal;
use crate::{audit, guests, settings, text};
use fencekeeper::{Class, Decision};
use pgrx::spi::Spi;

/// What a write presents, as the server holds it (text in the database's encoding).
pub struct Write<'a> {
    /// The resource key (`None`: SQL NULL).
    pub resource: Option<&'a [u8]>,
    /// The token (`None`: SQL NULL, or no token given).
    pub token: Option<&'a [u8]>,
    /// What a missing token means here, for its message (`the column "token" is
    /// NULL`, `the setting fencekeeper.token is not set`).
    pub missing: &'a str,
}

/// Admit `write` in this transaction: `Ok(true)` when it advanced the mark,
/// `Ok(false)` when its token equals the mark; otherwise the refusal to raise.
pub fn admit(write: &Write<'_>) -> Result<bool, Refusal> {
    let resource = match write.resource.map(text::to_utf8) {
        None => return Err(Refusal::new(Class::Malformed, "malformed request: the resource is NULL")),
        Some(Err(e)) => {
            let message = format!("malformed request: the resource is not UTF-8 (byte {})", e.at);
            return Err(Refusal::new(Class::Malformed, message));
        }
        Some(Ok(resource)) => resource,
    };
    let token = match write.token.map(text::to_utf8) {
        Some(Err(e)) => {
            let message = format!("malformed request: the fencing token for {resource:?} is not UTF-8 (byte {})", e.at);
            return Err(Refusal::new(Class::Malformed, message));
        }
        Some(Ok(token)) => Some(token),
        None => None,
    };
    let undecided = |why: String| Refusal::new(Class::Undecided, format!("cannot decide on {resource:?}: {why}"));
    let guard = guests::guard(settings::guest().as_deref(), settings::STRICT.get()).map_err(undecided)?;
    let decision = Spi::connect(|client| {
        let _owner = AsOwner::switch().map_err(undecided)?;
        let marks = Marks::new(client).map_err(|e| undecided(e.to_string()))?;
        let decision = guard.admit_in(&marks, &resource, token.as_deref());
        if let (Some(advance), true) = (&decision.advance, settings::AUDIT.get()) {
            let token = token.as_deref().unwrap_or_default();
            audit::record(&marks, &resource, advance, token).map_err(|e| undecided(e.to_string()))?;
        }
        Ok::<Decision, Refusal>(decision)
    })?;
    if decision.admitted() {
        return Ok(decision.advance.is_some());
    }
    let message = match decision.class() {
        Class::Missing => format!("missing fencing token for {resource:?}: {}", write.missing),
        _ => decision.reason(&resource),
    };
    let highest = matches!(decision.class(), Class::Stale | Class::Replayed).then_some(decision.action.token).flatten();
    Err(Refusal { class: decision.class(), message, highest })
}
