// A host's side of the validator contract (wit/fencekeeper.wit), for any JavaScript
// binding of the component: bounds before the guest runs, the check of every verdict
// against the mark passed in, decide-short and decide held to agree, and the
// conformance vectors. The decision itself is the guest's. What V8 cannot give a
// host (a fuel budget; a memory cap below what the module declares) is in
// docs/embedding.md, "Hosting the component elsewhere".
//
// A guest here is { decide(strict, text, mark), decideShort(strict, bytes, mark) }
// answering { kind, token, mark, advanced, reason } with tokens as arrays of BigInt:
// jco.mjs and core_module.mjs each make one.

import { readFileSync } from 'node:fs';

export const MAX_KEY_BYTES = 1024;
export const MAX_TOKEN_BYTES = 128;
export const SHORT_TEXT_BYTES = 56;
const U64_MAX = (1n << 64n) - 1n;
const CANONICAL = /^[0-9]+(\.[0-9]+){0,3}$/;

export class Breach extends Error {}

const utf8 = new TextEncoder();
const strictUtf8 = new TextDecoder('utf-8', { fatal: true });

/** The token a text in the canonical form says, or null. */
export function canonical(text) {
  if (text.length > MAX_TOKEN_BYTES || !CANONICAL.test(text)) return null;
  const parts = text.split('.').map(BigInt);
  return parts.every((p) => p <= U64_MAX) ? parts : null;
}

/** -1, 0, 1 for tokens of one arity. */
function compare(a, b) {
  for (let i = 0; i < a.length; i++) {
    if (a[i] !== b[i]) return a[i] < b[i] ? -1 : 1;
  }
  return 0;
}

const same = (a, b) => a !== null && b !== null && a.length === b.length && compare(a, b) === 0;
const show = (t) => (t === null ? 'none' : t.join('.'));

/** Rule 1: why a request is malformed on its bounds, or null. Bytes in, before any guest call. */
export function precheck(resource, presented) {
  try {
    strictUtf8.decode(resource);
  } catch {
    return 'resource key is not UTF-8';
  }
  if (resource.length < 1 || resource.length > MAX_KEY_BYTES) return `resource key is ${resource.length} bytes`;
  if (presented !== null && (presented.length < 1 || presented.length > MAX_TOKEN_BYTES)) {
    return `fencing token is ${presented.length} bytes; the limit is ${MAX_TOKEN_BYTES}`;
  }
  return null;
}

/** A token from a guest: arity 1 to 4, nothing past it. */
export function tokenIn({ arity, c0, c1, c2, c3 }) {
  const parts = [c0, c1, c2, c3].map(BigInt);
  if (arity < 1 || arity > 4 || parts.slice(arity).some((p) => p !== 0n)) {
    throw new Breach(`a token of arity ${arity} (or with components past it) is outside the contract`);
  }
  return parts.slice(0, arity);
}

/** Rule 3: throw Breach when the verdict is provably wrong. */
export function verify(strict, presented, read, v) {
  const text = presented === null ? null : canonical(presented);
  if (v.kind === 'missing') {
    if (presented !== null) throw new Breach('it answered missing for a presented token');
    return;
  }
  if (presented === null) throw new Breach('it decided on a token that was never presented');
  if (v.kind === 'malformed') return;
  if (v.kind === 'admit') {
    const t = v.token;
    if (text !== null && !same(text, t)) throw new Breach(`it read ${presented} as ${show(t)}`);
    if (read !== null && read.length !== t.length) throw new Breach(`it admitted ${show(t)} of another arity`);
    const order = read === null ? 1 : compare(t, read);
    if (order < 0) throw new Breach(`it admitted ${show(t)} below the mark`);
    if (order === 0 && strict) throw new Breach(`it admitted ${show(t)}, equal to the mark, in strict mode`);
    if (v.advanced !== (order > 0)) throw new Breach(`it admitted ${show(t)} with advanced = ${v.advanced}`);
    return;
  }
  if (!same(v.mark, read)) throw new Breach(`it reported mark ${show(v.mark)}, but the mark is ${show(read)}`);
  if (v.kind === 'stale') {
    if (text !== null && !same(text, v.token)) throw new Breach(`it read ${presented} as ${show(v.token)}`);
    if (v.token.length !== v.mark.length || compare(v.token, v.mark) >= 0) {
      throw new Breach(`it called ${show(v.token)} stale against mark ${show(v.mark)}`);
    }
    return;
  }
  if (v.kind === 'replayed') {
    if (text !== null && !same(text, v.mark)) throw new Breach(`it read ${presented} as ${show(v.mark)}`);
    if (!strict) throw new Breach('it refused a replay outside strict mode');
    return;
  }
  throw new Breach(`a verdict of unknown kind ${v.kind}`);
}

/** The decision on one request: bounds, then the guest (decide-short for a short
 * text, with decide for a malformed one's reason: the two must agree), then the check. */
export function admit(guest, strict, resource, presented, mark, { short = true } = {}) {
  const why = precheck(resource, presented);
  if (why !== null) return { kind: 'malformed', reason: why };
  const text = presented === null ? null : new TextDecoder().decode(presented);
  let verdict;
  if (short && presented !== null && presented.length <= SHORT_TEXT_BYTES) {
    verdict = guest.decideShort(strict, presented, mark);
    if (verdict.kind === 'malformed') {
      const full = guest.decide(strict, text, mark);
      if (full.kind !== 'malformed') throw new Breach('decide-short called the token malformed and decide did not');
      verdict = full;
    }
  } else {
    verdict = guest.decide(strict, text, mark);
  }
  verify(strict, text, mark, verdict);
  return verdict;
}

/** Every vector of the file, decided as `admit` decides: [{ name, passed, got }]. */
export function conformance(guest, vectorsPath, options) {
  const { vectors } = JSON.parse(readFileSync(vectorsPath, 'utf8'));
  return vectors.map((v) => {
    const mark = v.mark === null ? null : canonical(v.mark);
    const presented = v.presented === null ? null : utf8.encode(v.presented);
    let got;
    try {
      got = admit(guest, v.strict, utf8.encode(v.resource), presented, mark, options);
    } catch (e) {
      return { name: v.name, passed: false, got: `error: ${e.message}` };
    }
    const want = v.expect;
    const carried = got.kind === 'admit' ? got.token : got.mark ?? null;
    let passed = got.kind === want.verdict;
    if (want.mark != null) passed &&= same(carried, canonical(want.mark));
    if (want.advanced != null) passed &&= got.advanced === want.advanced;
    return { name: v.name, passed, got: `${got.kind} ${carried ? show(carried) : ''}`.trim() };
  });
}

/** Short text words, little-endian, eight bytes to a word (core's short_text::pack). */
export function shortWords(bytes) {
  const words = [];
  for (let i = 0; i < 7; i++) {
    let w = 0n;
    for (let j = 7; j >= 0; j--) w = (w << 8n) | BigInt(bytes[8 * i + j] ?? 0);
    words.push(w);
  }
  return words;
}
