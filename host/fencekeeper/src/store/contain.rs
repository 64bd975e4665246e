//! The panic boundary around the store library.
//!
//! redb verifies every page's checksum when a file store opens, so damage at rest
//! is an error before any of it is parsed. Damage that reaches redb later (the file
//! changed under a running process) can still make it panic: invalid UTF-8, an
//! `unreachable!` in a cursor, a slice out of range. A panic there must not take
//! the process down (exit 101 with a backtrace); it becomes the one-line store
//! error of the file it came from.
//!
//! A caught panic would still print its message and backtrace through the panic
//! hook, so the first containment installs a hook that stays silent for panics
//! raised inside a containment on the same thread and passes every other panic to
//! the hook that was there before.

use super::StoreError;
use std::cell::Cell;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::Once;

thread_local! {
    /// How many containments this thread is inside.
    static INSIDE: Cell<usize> = const { Cell::new(0) };
}

fn install_quiet_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if INSIDE.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
}

/// Run `f`, a call into the store library for the store at `path`; a panic in it is
/// [`StoreError::Corrupt`] naming that file.
pub(crate) fn contained<T>(path: &Path, f: impl FnOnce() -> Result<T, StoreError>) -> Result<T, StoreError> {
    install_quiet_hook();
    INSIDE.with(|n| n.set(n.get() + 1));
    // The store's handle may be left inconsistent by the panic; every later call on
    // it fails the same way, which is what a damaged store should do.
    let outcome = panic::catch_unwind(AssertUnwindSafe(f));
    INSIDE.with(|n| n.set(n.get().saturating_sub(1)));
    outcome.unwrap_or_else(|payload| {
        let what = payload
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".to_owned());
        let first_line = what.lines().next().unwrap_or_default().to_owned();
        Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: format!("the store library failed on its contents ({first_line})"),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[allow(clippy::panic)]
    fn a_panic_inside_is_a_one_line_corrupt_error_naming_the_file() {
        let err = contained::<()>(Path::new("/x/marks.redb"), || panic!("index out of range\nsecond line"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(err.contains("/x/marks.redb") && err.contains("index out of range"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        // Outside, panics are what they were.
        assert!(panic::catch_unwind(|| panic!("outside")).is_err());
        assert_eq!(INSIDE.with(Cell::get), 0);
    }
}
