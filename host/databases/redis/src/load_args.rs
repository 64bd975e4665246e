//! The module's load arguments: `--loadmodule libfencekeeper_redis.so [NAME VALUE]...`
//! (or `MODULE LOAD path NAME VALUE ...`).
//!
//! * `mode correctness|efficiency`: the policy's mode (default correctness).
//! * `strict yes|no`: strict mode, where a token equal to the mark is replayed
//!   (default no).
//! * `guest PATH`: a validator component to run instead of the bundled one. For
//!   administrators and tests (the fault-injection guest): the guest must pass the
//!   conformance vectors to load, and it runs without Spectre mitigations
//!   (`fencekeeper::validator::EngineSettings`), so load only a guest you trust.
//!
//! Anything else is a load error naming the argument: Redis then refuses to start
//! (or `MODULE LOAD` fails) rather than run with a policy nobody asked for.

use fencekeeper::{Mode, Policy};
use std::path::PathBuf;

/// What the module was loaded with.
#[derive(Debug, PartialEq, Eq)]
pub struct LoadArgs {
    /// The policy every fenced command decides under.
    pub policy: Policy,
    /// A guest to load instead of the bundled one.
    pub guest: Option<PathBuf>,
}

/// Parse the arguments (pairs of a name and a value).
pub fn parse(words: &[&[u8]]) -> Result<LoadArgs, String> {
    let mut args = LoadArgs { policy: Policy::default(), guest: None };
    let mut rest = words.chunks(2);
    for pair in &mut rest {
        let [name, value] = pair else {
            return Err(format!("argument {:?} has no value", text(pair[0])));
        };
        match (text(name).to_ascii_lowercase().as_str(), text(value).as_ref()) {
            ("mode", "correctness") => args.policy.mode = Mode::Correctness,
            ("mode", "efficiency") => args.policy.mode = Mode::Efficiency,
            ("strict", "yes") => args.policy.strict = true,
            ("strict", "no") => args.policy.strict = false,
            ("guest", _) => {
                let path = std::str::from_utf8(value).map_err(|_| "the guest path is not UTF-8".to_owned())?;
                args.guest = Some(PathBuf::from(path));
            }
            ("mode", other) => return Err(format!("mode {other:?}: expected correctness or efficiency")),
            ("strict", other) => return Err(format!("strict {other:?}: expected yes or no")),
            (other, _) => return Err(format!("unknown argument {other:?}: expected mode, strict or guest")),
        }
    }
    Ok(args)
}

/// An argument as text for a message (bytes that are not UTF-8 shown replaced).
fn text(word: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(word)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn parsed(words: &[&str]) -> Result<LoadArgs, String> {
        let bytes: Vec<&[u8]> = words.iter().map(|w| w.as_bytes()).collect();
        parse(&bytes)
    }

    #[test]
    fn no_arguments_is_correctness_mode_the_bundled_guest_and_not_strict() {
        assert_eq!(parsed(&[]).unwrap(), LoadArgs { policy: Policy::default(), guest: None });
        assert_eq!(Policy::default().mode, Mode::Correctness);
    }

    #[test]
    fn each_argument_sets_what_it_names() {
        let args = parsed(&["mode", "efficiency", "STRICT", "yes", "guest", "/tmp/g.wasm"]).unwrap();
        assert_eq!(args.policy, Policy { mode: Mode::Efficiency, strict: true });
        assert_eq!(args.guest, Some(PathBuf::from("/tmp/g.wasm")));
    }

    #[test]
    fn a_wrong_or_unknown_argument_is_an_error_naming_it() {
        assert_eq!(parsed(&["mode", "fast"]).unwrap_err(), "mode \"fast\": expected correctness or efficiency");
        assert_eq!(parsed(&["strict", "1"]).unwrap_err(), "strict \"1\": expected yes or no");
        assert!(parsed(&["audit", "x"]).unwrap_err().starts_with("unknown argument \"audit\""));
        assert_eq!(parsed(&["guest"]).unwrap_err(), "argument \"guest\" has no value");
        assert_eq!(parse(&[b"guest", b"/\xff"]).unwrap_err(), "the guest path is not UTF-8");
    }
}
