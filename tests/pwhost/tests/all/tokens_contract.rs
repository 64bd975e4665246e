//! The token contract (`tests/contract/tokens.json`) through the filter's `.wasm` in
//! the in-process host, under both profiles: Envoy's, with the filter configured for
//! Envoy, and the strict one (ngx_wasm_module's limits) with `"host": "portable"`.
//! Efficiency mode, marks in shared data, one proxy per policy. Each row is a PUT of
//! the resource's path with the token in `fencing-token` (its surrounding spaces taken
//! off, as every real host's HTTP parser does); the store answers 201. A mark is read
//! from the filter's shared-data slots.

use crate::common::{answer, start};
use anyhow::{bail, ensure, Context, Result};
use fencekeeper_harness::token_table::{self, http_path, ByPolicy, Host, Table};
use fencekeeper_pwhost::{Profile, Proxy, Request, State};
use serde_json::Value;

struct Filter {
    proxies: ByPolicy<Proxy>,
}

impl Filter {
    fn start(profile: fn() -> Profile, host: Option<&str>) -> Filter {
        Filter {
            proxies: ByPolicy::start(|strict| {
                let mut config = crate::modes::efficiency(host);
                config["strict"] = Value::Bool(strict);
                start(profile(), &config, 1)
            }),
        }
    }
}

impl Host for Filter {
    fn name(&self) -> &'static str {
        "http"
    }

    fn write(&mut self, strict: bool, resource: &[u8], token: Option<&[u8]>) -> Result<Value> {
        let proxy = self.proxies.of(strict);
        let mut request = Request::put(&http_path(resource));
        if let Some(token) = token {
            request = request.token(std::str::from_utf8(token.trim_ascii()).context("the table's tokens are UTF-8")?);
        }
        let id = proxy.send(0, request);
        if proxy.state(id) == State::AtUpstream {
            proxy.respond(id, 201);
        }
        ensure!(proxy.violations().is_empty(), "{:?}", proxy.violations());
        Ok(answer(proxy, id).status.into())
    }

    fn mark(&mut self, strict: bool, key: &str) -> Result<Option<String>> {
        let resource = format!("/{key}");
        for (slot, bytes) in self.proxies.of(strict).shared("fencekeeper/slot/") {
            if let Some(mark) = slot_mark(&bytes, &resource).with_context(|| format!("slot {slot}"))? {
                return Ok(mark);
            }
        }
        Ok(None)
    }
}

/// Bytes read off the front of a slot's value.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        ensure!(self.0.len() >= n, "the slot ends early");
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<usize> {
        Ok(usize::from(u16::from_le_bytes([self.take(1)?[0], self.take(1)?[0]])))
    }

    fn token(&mut self) -> Result<Option<String>> {
        let len = usize::from(self.take(1)?[0]);
        let text = std::str::from_utf8(self.take(len)?)?;
        Ok((len > 0).then(|| text.to_owned()))
    }
}

/// In a slot's value (version 2: entries of key, token, flights and wakers; the
/// filter's `slots.rs` gives the layout), the mark of `resource`: `None` when the
/// slot has no entry for it, `Some(None)` when the entry has no mark.
fn slot_mark(bytes: &[u8], resource: &str) -> Result<Option<Option<String>>> {
    let mut r = Reader(bytes);
    let version = r.take(1)?[0];
    if version != 2 {
        bail!("slot version {version}");
    }
    while !r.0.is_empty() {
        let len = r.u16()?;
        let key = r.take(len)?;
        let mark = r.token()?;
        for _ in 0..r.u16()? {
            r.take(8 + 4 + 8)?;
            r.token()?;
        }
        let wakers = r.u16()?;
        r.take(4 * wakers)?;
        if key == resource.as_bytes() {
            return Ok(Some(mark));
        }
    }
    Ok(None)
}

fn every_row_holds(name: &str, filter: &mut Filter) {
    let table = Table::load();
    let misses = token_table::run(&table, filter);
    token_table::assert_kept(name, &misses);
}

#[test]
fn every_row_holds_under_envoys_profile() {
    every_row_holds("the filter under the envoy profile", &mut Filter::start(Profile::envoy, None));
}

#[test]
fn every_row_holds_under_the_strict_profile_configured_portable() {
    every_row_holds("the filter under the strict profile", &mut Filter::start(Profile::strict, Some("portable")));
}
