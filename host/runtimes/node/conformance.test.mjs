// The committed validator component in Node, unchanged: every conformance vector
// passes through jco's bindings and through the bare core module, by both decides;
// the host's check catches the test guest's lies either way.

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { admit, conformance, Breach } from './host.mjs';
import * as jco from './jco.mjs';
import * as core from './core_module.mjs';

const VECTORS = new URL('../../fencekeeper/conformance/vectors.json', import.meta.url);
const COUNT = JSON.parse(readFileSync(VECTORS, 'utf8')).vectors.length;
const coreOf = (name) => new URL(`./build/${name}/${name}.core.wasm`, import.meta.url);
const hosts = {
  jco: () => jco.load('fencekeeper_validator'),
  'core module': () => core.load(coreOf('fencekeeper_validator')),
};
const faults = {
  jco: () => jco.load('guest_faults'),
  'core module': () => core.load(coreOf('guest_faults')),
};
const bytes = (s) => new TextEncoder().encode(s);

for (const [host, load] of Object.entries(hosts)) {
  for (const short of [true, false]) {
    test(`${host}: every conformance vector passes through ${short ? 'decide-short' : 'decide'}`, async () => {
      const results = conformance(await load(), VECTORS, { short });
      assert.equal(results.length, COUNT);
      assert.ok(COUNT > 40);
      assert.deepEqual(results.filter((r) => !r.passed), []);
    });
  }

  test(`${host}: every lie of the test guest is a breach`, async () => {
    const guest = await faults[host]();
    const lies = [
      ['64023.1.0.0', [64023n, 9n, 0n, 0n]], // admits below the mark
      ['64023.2.0.0', [64023n, 0n, 0n, 0n]], // raises the mark to the maximum
      ['64023.3.0.0', [64023n, 9n, 0n, 0n]], // admits the mark it was given
      ['64023.5.0.0', null], // a token of arity 0
      ['64023.6.0.0', null], // its two decides disagree
    ];
    for (const [token, mark] of lies) {
      assert.throws(() => admit(guest, false, bytes('r'), bytes(token), mark), Breach, token);
    }
    assert.equal(admit(guest, false, bytes('r'), bytes('34'), [33n]).kind, 'admit');
  });

  test(`${host}: bounds are checked before the guest runs`, async () => {
    const guest = await faults[host]();
    // fault-loop would never return (V8 has no fuel): past the bound it is never sent.
    const looping = bytes('fault-loop' + '0'.repeat(128));
    assert.equal(admit(guest, false, bytes('r'), looping, null).kind, 'malformed');
    assert.equal(admit(guest, false, new Uint8Array([0x2f, 0xff]), bytes('1'), null).kind, 'malformed');
    assert.equal(admit(guest, false, new Uint8Array(), bytes('1'), null).kind, 'malformed');
  });
}

test('the bare core module is the committed component\'s own, byte for byte', () => {
  const component = readFileSync(new URL('../../../guest/artifacts/fencekeeper_validator.wasm', import.meta.url));
  const module = readFileSync(coreOf('fencekeeper_validator'));
  assert.ok(module.length > 10000);
  assert.ok(component.includes(module), 'jco wrote out a module the component does not hold');
});
