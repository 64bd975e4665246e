//! The token contract (`tests/contract/tokens.json`) against the C ABI, from C: the
//! rows are played through `host/capi/c/tokens.c`, compiled against the committed
//! header and linked against this build's library, which keeps one guard per policy
//! over a memory store and answers each admit with the outcome's class value and each
//! mark read with the mark (the program's first comment has its line protocol).

#![allow(clippy::unwrap_used, clippy::panic)]

use crate::c_callers::compile;
use anyhow::{bail, Context, Result};
use fencekeeper_harness::token_table::{self, Host, Table};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// `tokens.c`, running, and the pipes to it.
struct CProgram {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Drop for CProgram {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes as the program reads them: hex, "." for none.
fn hex(bytes: &[u8]) -> String {
    if bytes.is_empty() {
        return ".".into();
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl CProgram {
    fn start(program: &std::path::Path) -> CProgram {
        let mut child = Command::new(program).stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        CProgram { child, input, output }
    }

    /// Send one request line; the answer line.
    fn ask(&mut self, line: &str) -> Result<String> {
        writeln!(self.input, "{line}").context("writing to tokens.c")?;
        let mut answer = String::new();
        if self.output.read_line(&mut answer)? == 0 {
            bail!("tokens.c ended without an answer to {line:?}");
        }
        let answer = answer.trim_end().to_owned();
        if let Some(status) = answer.strip_prefix("E ") {
            bail!("the call returned status {status}, not FENCEKEEPER_OK");
        }
        Ok(answer)
    }
}

impl Host for CProgram {
    fn name(&self) -> &'static str {
        "c"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        let token = token.map_or("-".into(), hex);
        let class = self.ask(&format!("A {} {} {token}", u8::from(strict), hex(resource)))?;
        Ok(Value::from(class.parse::<i64>().context("a class value")?))
    }

    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>> {
        let mark = self.ask(&format!("M {} {}", u8::from(strict), hex(key.as_bytes())))?;
        Ok((mark != "-").then_some(mark))
    }
}

#[test]
fn every_row_holds_from_c() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("tokens");
    compile("tokens.c", &program, true);
    let table = Table::load();
    let misses = token_table::run(&table, &mut CProgram::start(&program));
    token_table::assert_kept("c", &misses);
    assert!(table.exceptions_of("c").is_empty(), "the C ABI answers every row as the table says");
}
