// The token contract (tests/contract/tokens.json) against the committed validator
// component in jco: the component keeps no marks, so this runner keeps them, passes
// each resource's mark into the decide (the story's tokens decided in turn) and keeps
// the mark an admit leaves. The table's own rules are checked by the Rust driver.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { admit } from './host.mjs';
import * as jco from './jco.mjs';

const TABLE = JSON.parse(readFileSync(new URL('../../../tests/contract/tokens.json', import.meta.url), 'utf8'));
const HOST = 'component';
const encode = (s) => new TextEncoder().encode(s);

/** A resource or a token as the table writes it, as bytes (null: no token). */
function text(value) {
  if (value === null || value === undefined) return null;
  if (typeof value === 'string') return encode(value);
  if (value.hex !== undefined) return Uint8Array.from(value.hex.match(/../g) ?? [], (h) => parseInt(h, 16));
  return encode(value.repeat.repeat(value.times) + (value.then ?? ''));
}

function expected(row) {
  const e = TABLE.exceptions.find((x) => x.host === HOST && x.row === row.name);
  if (e) return [e.class !== undefined ? TABLE.renderings[HOST][e.class] : e.rendering, e.mark ?? null];
  return [TABLE.renderings[HOST][row.class], row.mark ?? null];
}

test('jco: every row of the token contract holds', async () => {
  const guest = await jco.load('fencekeeper_validator');
  const marks = new Map();
  const misses = [];
  TABLE.rows.forEach((row, i) => {
    const strict = row.strict ?? false;
    const resource = row.resource !== undefined ? text(row.resource) : encode(`tokens/row-${String(i + 1).padStart(2, '0')}`);
    const slot = `${strict}/${Buffer.from(resource).toString('hex')}`;
    const write = (token) => {
      const verdict = admit(guest, strict, resource, token, marks.get(slot) ?? null);
      if (verdict.kind === 'admit' && verdict.advanced) marks.set(slot, verdict.token);
      return verdict.kind;
    };
    for (const before of row.before ?? []) {
      const answer = write(encode(before));
      if (answer !== 'admit') misses.push(`${row.name}: its story's token ${before} was answered ${answer}`);
    }
    const answer = write(text(row.token));
    const mark = marks.has(slot) ? marks.get(slot).map(String).join('.') : null;
    const want = expected(row);
    if (answer !== want[0] || mark !== want[1]) {
      misses.push(`${row.name}: expected ${JSON.stringify(want)}, got ${JSON.stringify([answer, mark])}`);
    }
  });
  assert.ok(TABLE.rows.length >= 40);
  assert.deepEqual(misses, []);
});
