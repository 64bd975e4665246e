//! The audit record: one JSON line for every change of a mark, written by the host that
//! made it. The gateway and the command line append it to a file (`--audit PATH`); the
//! Envoy filter writes it to Envoy's log at info level after [`LOG_PREFIX`]. One format
//! for every host, so one `jq` line answers "who advanced this mark to X, and when?"
//! across all of them (docs/operations.md).
//!
//! ```text
//! {"time":"2026-05-01T09:30:12.345Z","unix_ms":1777627812345,"host":"gateway","reason":"advance",
//!  "resource":"/orders/2026.csv","old":"33","old_damaged":null,"new":"34","token":"034",
//!  "client":"10.0.0.7:51234","user":null,"store":"etcd http://10.0.0.2:2379 prefix /fencekeeper/marks/"}
//! ```
//! (one line in the file). Every field is always present, `null` when unknown; the
//! names are [`FIELDS`]. Strings are JSON-escaped, control characters included, so a
//! record is one line whatever a resource key holds.
//!
//! A [`Display`](fmt::Display) implementation, so it costs no allocation here and each
//! host writes it where it writes.

use crate::token::Token;
use core::fmt;

/// What the Envoy filter's audit log lines start with (and the command's stderr copy).
pub const LOG_PREFIX: &str = "fencekeeper-audit: ";

/// The fields of every record, in the order they are written.
pub const FIELDS: [&str; 12] =
    ["time", "unix_ms", "host", "reason", "resource", "old", "old_damaged", "new", "token", "client", "user", "store"];

/// Why a mark changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// A write's token was admitted above the mark (or as a resource's first mark).
    Advance,
    /// An operator raised the mark by hand (`fencekeeper marks --raise`).
    Raise,
    /// An operator set the mark by force, possibly lower (`fencekeeper marks --set --force`).
    Set,
    /// An operator removed the mark by force (`fencekeeper marks --clear --force`).
    Clear,
    /// Retention forgot the mark of an idle resource (`fencekeeper marks --compact`),
    /// under a floor at or above it.
    Forget,
    /// Retention raised its floor (the record's resource is `(the retention floor)`).
    Floor,
}

impl Change {
    /// The stable name written in the `reason` field.
    pub fn name(self) -> &'static str {
        match self {
            Change::Advance => "advance",
            Change::Raise => "raise",
            Change::Set => "set",
            Change::Clear => "clear",
            Change::Forget => "forget",
            Change::Floor => "floor",
        }
    }
}

/// One change of one mark.
#[derive(Clone, Copy, Debug)]
pub struct Entry<'a> {
    /// When, in milliseconds since the Unix epoch (the host's clock).
    pub unix_ms: u64,
    /// Which host changed it: `gateway`, `envoy`, `cli`, or an embedding's own name.
    pub host: &'a str,
    /// Why.
    pub reason: Change,
    /// The resource.
    pub resource: &'a str,
    /// The mark before (`None`: no mark, or a damaged record).
    pub old: Option<Token>,
    /// What was wrong with the record before, when it was damaged.
    pub old_damaged: Option<&'a str>,
    /// The mark after (`None`: cleared).
    pub new: Option<Token>,
    /// The token text that caused the change: as the client sent it for an advance,
    /// as the operator typed it for a raise or a set.
    pub token: Option<&'a str>,
    /// The client's address, where the host knows it (gateway, Envoy).
    pub client: Option<&'a str>,
    /// The operating-system user, for changes made from the command line.
    pub user: Option<&'a str>,
    /// Where the mark lives: `file PATH`, `etcd URL prefix P`, `etcd cluster C prefix P`.
    pub store: &'a str,
}

impl fmt::Display for Entry<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [time, unix_ms, host, reason, resource, old, old_damaged, new, token, client, user, store] = FIELDS;
        write!(f, "{{\"{time}\":\"{}\",\"{unix_ms}\":{}", Time(self.unix_ms), self.unix_ms)?;
        write!(f, ",\"{host}\":{},\"{reason}\":\"{}\"", Json(self.host), self.reason.name())?;
        write!(f, ",\"{resource}\":{}", Json(self.resource))?;
        write!(
            f,
            ",\"{old}\":{},\"{old_damaged}\":{}",
            Nullable(self.old.as_ref()),
            Nullable(self.old_damaged.map(Json))
        )?;
        write!(f, ",\"{new}\":{},\"{token}\":{}", Nullable(self.new.as_ref()), Nullable(self.token.map(Json)))?;
        write!(f, ",\"{client}\":{},\"{user}\":{}", Nullable(self.client.map(Json)), Nullable(self.user.map(Json)))?;
        write!(f, ",\"{store}\":{}}}", Json(self.store))
    }
}

/// A value, or JSON `null`. A token is written as a JSON string of its canonical text.
struct Nullable<T>(Option<T>);

impl<T: JsonValue> fmt::Display for Nullable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.write(f),
            None => f.write_str("null"),
        }
    }
}

trait JsonValue {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result;
}

impl JsonValue for &Token {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Digits and dots: nothing to escape.
        write!(f, "\"{self}\"")
    }
}

impl JsonValue for Json<'_> {
    fn write(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// A JSON string: quoted, with `"`, `\` and every control character escaped.
#[derive(Clone, Copy)]
struct Json<'a>(&'a str);

impl fmt::Display for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("\"")?;
        let mut rest = self.0;
        while let Some(i) = rest.find(|c: char| c == '"' || c == '\\' || c.is_control()) {
            f.write_str(&rest[..i])?;
            let c = rest[i..].chars().next().unwrap_or_default();
            match c {
                '"' => f.write_str("\\\"")?,
                '\\' => f.write_str("\\\\")?,
                '\n' => f.write_str("\\n")?,
                '\r' => f.write_str("\\r")?,
                '\t' => f.write_str("\\t")?,
                // C1 controls too: a terminal reading the log must not act on them.
                other => write!(f, "\\u{:04x}", u32::from(other))?,
            }
            rest = &rest[i + c.len_utf8()..];
        }
        f.write_str(rest)?;
        f.write_str("\"")
    }
}

/// A Unix time in milliseconds as RFC 3339 UTC with milliseconds.
struct Time(u64);

impl fmt::Display for Time {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (days, ms) = (self.0 / 86_400_000, self.0 % 86_400_000);
        let (year, month, day) = civil(days);
        let (h, m, s, milli) = (ms / 3_600_000, ms / 60_000 % 60, ms / 1000 % 60, ms % 1000);
        write!(f, "{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{s:02}.{milli:03}Z")
    }
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::string::ToString;

    fn entry<'a>(resource: &'a str, client: Option<&'a str>) -> Entry<'a> {
        Entry {
            unix_ms: 1_777_627_812_345,
            host: "gateway",
            reason: Change::Advance,
            resource,
            old: Token::parse("33").ok(),
            old_damaged: None,
            new: Token::parse("34").ok(),
            token: Some("034"),
            client,
            user: None,
            store: "file marks.redb",
        }
    }

    #[test]
    fn a_record_is_one_json_line_with_every_field() {
        let line = entry("/orders/2026.csv", Some("10.0.0.7:51234")).to_string();
        assert_eq!(
            line,
            r#"{"time":"2026-05-01T09:30:12.345Z","unix_ms":1777627812345,"host":"gateway","reason":"advance","resource":"/orders/2026.csv","old":"33","old_damaged":null,"new":"34","token":"034","client":"10.0.0.7:51234","user":null,"store":"file marks.redb"}"#
        );
        for field in FIELDS {
            assert!(line.contains(&std::format!("\"{field}\":")), "{field}");
        }
    }

    #[test]
    fn strings_are_escaped_so_a_record_stays_one_line() {
        let line = entry("a\"b\\c\nd\u{1b}[2J\u{85}é", None).to_string();
        assert!(line.contains(r#""resource":"a\"b\\c\nd\u001b[2J\u0085é""#), "{line}");
        assert!(!line.contains('\n') && !line.contains('\u{1b}'));
        assert!(line.contains(r#""client":null"#));
    }

    #[test]
    fn times_are_utc_dates() {
        assert_eq!(Time(0).to_string(), "1970-01-01T00:00:00.000Z");
        assert_eq!(Time(951_782_400_000).to_string(), "2000-02-29T00:00:00.000Z");
        assert_eq!(Time(4_107_542_399_999).to_string(), "2100-02-28T23:59:59.999Z");
        assert_eq!(Time(1_709_251_199_000).to_string(), "2024-02-29T23:59:59.000Z");
    }
}
