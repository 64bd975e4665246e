// The package's front (`import { validator, admit } from 'fencekeeper-component'`):
// the committed validator component, hosted by V8 through jco's transpiled bindings,
// behind the host's side of the contract (host.mjs: bounds, the check of every
// verdict, the conformance vectors). What V8 cannot bound (fuel; memory below what the
// module declares) is in docs/embedding.md, "Hosting the component elsewhere".
//
//   const guest = await validator();
//   const verdict = admit(guest, false, utf8('orders/2026-11.csv'), utf8('34'), canonical('33'));
//   // { kind: 'admit', token: [34n], advanced: true }

import { load } from './jco.mjs';

export { admit, canonical, conformance, precheck, verify, Breach, MAX_KEY_BYTES, MAX_TOKEN_BYTES } from './host.mjs';

/** The bundled validator as a guest for `admit` (build/fencekeeper_validator, made by
 * `npm run transpile` from guest/artifacts/fencekeeper_validator.wasm). */
export function validator() {
  return load('fencekeeper_validator');
}
