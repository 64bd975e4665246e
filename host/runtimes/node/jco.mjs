// The validator component through jco's transpiled bindings (`npm run transpile`
// writes build/NAME/NAME.js from the committed .wasm): the same bytes, hosted by V8.

import { shortWords, tokenIn, Breach } from './host.mjs';

const policy = (strict) => ({ mode: 'correctness', strict });

function tokenOut(mark) {
  if (mark === null) return undefined;
  const [c0 = 0n, c1 = 0n, c2 = 0n, c3 = 0n] = mark;
  return { arity: mark.length, c0, c1, c2, c3 };
}

function verdictOf({ tag, val }) {
  switch (tag) {
    case 'admit':
      return { kind: 'admit', token: tokenIn(val.token), advanced: val.advanced };
    case 'stale':
    case 'replayed':
      return { kind: tag, token: tokenIn(val.token), mark: tokenIn(val.mark) };
    case 'malformed':
      // A guest's text is hostile: capped and without control characters.
      return { kind: 'malformed', reason: typeof val === 'string' ? val.slice(0, 256).replace(/\p{Cc}/gu, '?') : null };
    case 'missing':
      return { kind: 'missing' };
    default:
      throw new Breach(`an answer outside the contract: ${tag}`);
  }
}

/** A guest (host.mjs) over the transpiled component at build/NAME/NAME.js. */
export async function load(name) {
  const { validator } = await import(new URL(`./build/${name}/${name}.js`, import.meta.url));
  return {
    decide: (strict, text, mark) => verdictOf(validator.decide(policy(strict), text ?? undefined, tokenOut(mark))),
    decideShort(strict, bytes, mark) {
      const [w0, w1, w2, w3, w4, w5, w6] = shortWords(bytes);
      const text = { len: bytes.length, w0, w1, w2, w3, w4, w5, w6 };
      return verdictOf(validator.decideShort(policy(strict), text, tokenOut(mark)));
    },
  };
}
