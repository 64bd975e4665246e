//! What a command prints on standard output. A reader that goes away early
//! (`fencekeeper marks | head`) ends the output, not the command: its exit code still
//! says what was decided (`admit` refused is 1 whether or not anyone read why).
//! `println!` would panic there instead.

use anyhow::Context;
use std::io::{StdoutLock, Write};

/// One line (`out!`, the crate's `println!`). Another failure than a closed pipe is
/// said on stderr; the exit code stays the command's.
pub fn line(args: std::fmt::Arguments<'_>) {
    if let Err(e) = write(|out| writeln!(out, "{args}")) {
        eprintln!("fencekeeper: writing to standard output: {e}");
    }
}

/// Text as it is, without a newline added (a generated file, a report, a page): an
/// error, but for a closed pipe.
pub fn text(text: &[u8]) -> anyhow::Result<()> {
    write(|out| out.write_all(text)).context("writing to standard output")
}

fn write(f: impl FnOnce(&mut StdoutLock<'static>) -> std::io::Result<()>) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    match f(&mut out).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        written => written,
    }
}
