// The validator as a bare core module, for runtimes without the component model
// (V8 or a browser without jco, wazero, WAMR): the core module inside the committed
// component (jco transpile writes it out as build/NAME/NAME.core.wasm, unchanged),
// called through its flat canonical-ABI exports with the WebAssembly API alone.
// This file is the whole of what such a host writes; docs/embedding.md has the
// layout in a table for other languages.
//
//   decide-short(mode i32, strict i32, len i32, w0..w6 i64, mark? i32, arity i32, c0..c3 i64) -> ret i32
//   decide(mode i32, strict i32, text? i32, ptr i32, len i32, mark? i32, arity i32, c0..c3 i64) -> ret i32
//   cabi_realloc(0, 0, align 1, len) -> ptr        the text of `decide`, in guest memory
//   cabi_post_...#decide(ret)                       frees what the answer holds
//
// The answer at `ret`: the case in its first byte (0 admit, 1 stale, 2 replayed,
// 3 malformed, 4 missing), the payload from ret + 8: a token is arity (u8) at +0 and
// its four components (u64) at +8..+32; admit is (token, advanced u8 at +40); stale
// and replayed are (token, mark at +40); malformed is (ptr u32 at +0, len u32 at +4),
// with no payload in decide-short's answer.

import { readFileSync } from 'node:fs';
import { shortWords, tokenIn, Breach } from './host.mjs';

const IFACE = 'fencekeeper:validator/validator@0.3.0';
const KINDS = ['admit', 'stale', 'replayed', 'malformed', 'missing'];

export async function load(path) {
  // No imports: instantiating with an empty import object proves it needs nothing.
  const { instance } = await WebAssembly.instantiate(readFileSync(path), {});
  const x = instance.exports;
  const decideShort = x[`${IFACE}#decide-short`];
  const decide = x[`${IFACE}#decide`];
  const postDecide = x[`cabi_post_${IFACE}#decide`];
  if (!decideShort || !decide || !postDecide || !x.cabi_realloc || !x.memory) {
    throw new Error(`${path} lacks the flat exports of ${IFACE}`);
  }
  const view = () => new DataView(x.memory.buffer);
  const markArgs = (mark) => {
    if (mark === null) return [0, 0, 0n, 0n, 0n, 0n];
    const [c0 = 0n, c1 = 0n, c2 = 0n, c3 = 0n] = mark;
    return [1, mark.length, c0, c1, c2, c3];
  };
  const token = (at) => {
    const m = view();
    const c = [0, 1, 2, 3].map((i) => m.getBigUint64(at + 8 + 8 * i, true));
    return tokenIn({ arity: m.getUint8(at), c0: c[0], c1: c[1], c2: c[2], c3: c[3] });
  };
  const answer = (ret, short) => {
    const m = view();
    if (ret % 8 !== 0 || ret + 96 > m.byteLength) throw new Breach(`an answer outside the guest's memory: ${ret}`);
    const kind = KINDS[m.getUint8(ret)];
    const at = ret + 8;
    switch (kind) {
      case 'admit':
        return { kind, token: token(at), advanced: m.getUint8(at + 40) === 1 };
      case 'stale':
      case 'replayed':
        return { kind, token: token(at), mark: token(at + 40) };
      case 'malformed': {
        if (short) return { kind };
        const [ptr, len] = [m.getUint32(at, true), Math.min(m.getUint32(at + 4, true), 256)];
        if (ptr + len > m.byteLength) throw new Breach('a reason outside the guest\'s memory');
        const reason = new TextDecoder().decode(new Uint8Array(x.memory.buffer, ptr, len)).replace(/\p{Cc}/gu, '?');
        return { kind, reason };
      }
      case 'missing':
        if (!short) return { kind };
      // fall through: decide-short has no missing case
      default:
        throw new Breach(`an answer outside the contract: case ${m.getUint8(ret)}`);
    }
  };
  return {
    decideShort(strict, bytes, mark) {
      const ret = decideShort(0, strict ? 1 : 0, bytes.length, ...shortWords(bytes), ...markArgs(mark));
      return answer(ret, true);
    },
    decide(strict, text, mark) {
      let some = 0, ptr = 0, len = 0;
      if (text !== null) {
        const bytes = new TextEncoder().encode(text);
        [some, len] = [1, bytes.length];
        ptr = x.cabi_realloc(0, 0, 1, len);
        new Uint8Array(x.memory.buffer, ptr, len).set(bytes);
      }
      const ret = decide(0, strict ? 1 : 0, some, ptr, len, ...markArgs(mark));
      try {
        return answer(ret, false);
      } finally {
        postDecide(ret);
      }
    },
  };
}
