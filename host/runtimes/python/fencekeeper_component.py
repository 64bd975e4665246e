"""The committed validator component, hosted by wasmtime-py (PyPI `wasmtime`), with what
a host must add to be as safe as the Rust library (docs/embedding.md, "Hosting the
component elsewhere"): bounds on input before the guest runs, a fuel budget per call
and memory limits per instance, a fresh instance after any fault, the check of every
verdict against the mark passed in, and the conformance vectors at load.

This is a reference for a foreign host, not a second library: the decision is the
guest's, unchanged; what is here is the host's side of the contract in wit/.

    v = Validator("guest/artifacts/fencekeeper_validator.wasm")   # runs the vectors
    verdict = v.decide(strict=False, presented="34", mark=(33,))
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import wasmtime
from wasmtime import component as wc

Token = Tuple[int, ...]

MAX_KEY_BYTES = 1024
MAX_TOKEN_BYTES = 128
SHORT_TEXT_BYTES = 56
U64_MAX = (1 << 64) - 1
INTERFACE = "fencekeeper:validator/validator@0.3.0"

CANONICAL = re.compile(r"[0-9]+(\.[0-9]+){0,3}")


@dataclass(frozen=True)
class Verdict:
    """`kind` is admit, stale, replayed, malformed or missing; `token` the admitted or
    refused token, `mark` the mark a refusal reports."""

    kind: str
    token: Optional[Token] = None
    mark: Optional[Token] = None
    advanced: Optional[bool] = None
    reason: Optional[str] = None


class GuestFault(Exception):
    """The guest trapped, ran out of fuel or outgrew a limit: undecided, refused."""


class Breach(Exception):
    """The guest's verdict is provably wrong: refused, whatever the mode."""


@dataclass(frozen=True)
class Limits:
    fuel: int = 200_000
    memory_bytes: int = 16 << 20
    table_elements: int = 10_000
    instances: int = 4
    tables: int = 4
    memories: int = 1


def canonical(text: str) -> Optional[Token]:
    """The token a text in the canonical form says, or None if it is not in it."""
    if len(text) > MAX_TOKEN_BYTES or not CANONICAL.fullmatch(text):
        return None
    parts = tuple(int(p) for p in text.split("."))
    return parts if all(p <= U64_MAX for p in parts) else None


def precheck(resource: bytes, presented: Optional[bytes]) -> Optional[str]:
    """Rule 1, bounds before the guest runs: why the request is malformed, or None."""
    try:
        resource.decode("utf-8")
    except UnicodeDecodeError:
        return "resource key is not UTF-8"
    if not 1 <= len(resource) <= MAX_KEY_BYTES:
        return f"resource key is {len(resource)} bytes; it must be 1 to {MAX_KEY_BYTES}"
    if presented is not None and not 1 <= len(presented) <= MAX_TOKEN_BYTES:
        return f"fencing token is {len(presented)} bytes; it must be 1 to {MAX_TOKEN_BYTES}"
    return None


def verify(strict: bool, presented: Optional[str], read: Optional[Token], v: Verdict) -> None:
    """Rule 3, the check of a verdict against what the host knows (the mark it passed,
    the text it sent, the order of tokens); raises Breach."""
    text = canonical(presented) if presented is not None else None
    if v.kind == "missing":
        if presented is not None:
            raise Breach("it answered missing for a presented token")
        return
    if presented is None:
        raise Breach("it decided on a token that was never presented")
    if v.kind == "malformed":
        return
    if v.kind == "admit":
        token = v.token
        if text is not None and text != token:
            raise Breach(f"it read the token {presented} as {token}")
        if read is not None and len(token) != len(read):
            raise Breach(f"it admitted {token}, whose arity differs from the mark's")
        if read is not None and token < read:
            raise Breach(f"it admitted {token} below the mark")
        if read is not None and token == read and strict:
            raise Breach(f"it admitted {token}, equal to the mark, in strict mode")
        if v.advanced != (read is None or token > read):
            raise Breach(f"it admitted {token} with advanced = {v.advanced}")
        return
    if v.mark != read:
        raise Breach(f"it reported mark {v.mark}, but the mark is {read}")
    if v.kind == "stale":
        if text is not None and text != v.token:
            raise Breach(f"it read the token {presented} as {v.token}")
        if len(v.token) != len(v.mark) or not v.token < v.mark:
            raise Breach(f"it called {v.token} stale against mark {v.mark}")
        return
    if v.kind == "replayed":
        if text is not None and text != v.mark:
            raise Breach(f"it read the token {presented} as {v.mark}")
        if not strict:
            raise Breach("it refused a replay outside strict mode")
        return
    raise Breach(f"a verdict of unknown kind {v.kind}")


def _token_in(record) -> Token:
    arity = record.arity
    parts = (record.c0, record.c1, record.c2, record.c3)
    if not 1 <= arity <= 4 or any(parts[arity:]):
        raise Breach(f"a token of arity {arity} (or with components past it) is outside the contract")
    return parts[:arity]


def _token_out(token: Optional[Token]):
    if token is None:
        return None
    record = wc.Record()
    padded = tuple(token) + (0,) * (4 - len(token))
    record.arity, record.c0, record.c1, record.c2, record.c3 = len(token), *padded
    return record


def _policy(strict: bool):
    policy = wc.Record()
    policy.mode, policy.strict = "correctness", strict
    return policy


def _short_text(text: bytes):
    record = wc.Record()
    record.len = len(text)
    padded = text + b"\0" * (SHORT_TEXT_BYTES - len(text))
    for i in range(7):
        setattr(record, f"w{i}", int.from_bytes(padded[8 * i: 8 * i + 8], "little"))
    return record


def _verdict(answer, short: bool) -> Verdict:
    tag, payload = answer.tag, answer.payload
    if tag == "admit":
        return Verdict("admit", token=_token_in(payload.token), advanced=bool(payload.advanced))
    if tag in ("stale", "replayed"):
        return Verdict(tag, token=_token_in(payload.token), mark=_token_in(payload.mark))
    if tag == "malformed":
        # A guest's text is hostile too: capped, one line, no control characters.
        reason = None if short else "".join(c if c.isprintable() else f"\\u{{{ord(c):x}}}" for c in payload[:256])
        return Verdict("malformed", reason=reason)
    if tag == "missing" and not short:
        return Verdict("missing")
    raise Breach(f"an answer outside the contract: {tag}")


class Validator:
    """A guest component under limits; loading it runs the conformance vectors."""

    def __init__(self, path, limits: Limits = Limits(), vectors: Optional[Path] = None):
        config = wasmtime.Config()
        config.consume_fuel = True  # rule 2: bounded work per call
        self.engine = wasmtime.Engine(config)
        self.component = wc.Component.from_file(self.engine, str(path))
        self.limits = limits
        self.instance = None
        self._start()
        if vectors is not None:
            failed = [r for r in run_conformance(self, vectors) if not r[1]]
            if failed:
                name, _, got = failed[0]
                raise ValueError(f"{path} fails the conformance vector {name!r}: got {got}")

    def _start(self) -> None:
        store = wasmtime.Store(self.engine)
        # Rule 2: memory and tables per instance.
        store.set_limits(
            memory_size=self.limits.memory_bytes,
            table_elements=self.limits.table_elements,
            instances=self.limits.instances,
            tables=self.limits.tables,
            memories=self.limits.memories,
        )
        # An empty linker: a guest that imports anything fails here, so it has no
        # authority over anything but its own memory.
        instance = wc.Linker(self.engine).instantiate(store, self.component)
        interface = instance.get_export_index(store, INTERFACE)
        if interface is None:
            raise ValueError(f"the component does not export {INTERFACE}")
        funcs = {}
        for name in ("decide", "decide-short", "parse", "describe"):
            index = instance.get_export_index(store, name, interface)
            if index is None:
                raise ValueError(f"the component's {INTERFACE} has no {name}")
            funcs[name] = instance.get_func(store, index)
        self.store, self.funcs = store, funcs

    def _call(self, name: str, *args):
        self.store.set_fuel(self.limits.fuel)
        func = self.funcs[name]
        try:
            answer = func(self.store, *args)
            func.post_return(self.store)
            return answer
        except (wasmtime.Trap, wasmtime.WasmtimeError) as e:
            # Rule 2: an instance that faulted is never reused.
            self._start()
            raise GuestFault(str(e).splitlines()[0] if str(e) else type(e).__name__) from None

    def decide(self, strict: bool, presented: Optional[str], mark: Optional[Token], short: bool = True) -> Verdict:
        """The checked verdict for a presented text (rule 1 is the caller's: see
        `admit`). A short text goes through decide-short, and a malformed one again
        through decide for its reason; the two must agree."""
        raw = None if presented is None else presented.encode("utf-8")
        if short and raw is not None and len(raw) <= SHORT_TEXT_BYTES:
            verdict = _verdict(self._call("decide-short", _policy(strict), _short_text(raw), _token_out(mark)), True)
            if verdict.kind == "malformed":
                full = _verdict(self._call("decide", _policy(strict), presented, _token_out(mark)), False)
                if full.kind != "malformed":
                    raise Breach("decide-short called the token malformed and decide did not")
                verdict = full
        else:
            verdict = _verdict(self._call("decide", _policy(strict), presented, _token_out(mark)), False)
        verify(strict, presented, mark, verdict)
        return verdict


def admit(validator: Validator, strict: bool, resource: bytes, presented: Optional[bytes],
          mark: Optional[Token], short: bool = True) -> Verdict:
    """The decision a host makes on one request: bounds, then the checked verdict."""
    why = precheck(resource, presented)
    if why is not None:
        return Verdict("malformed", reason=why)
    text = None if presented is None else presented.decode("utf-8", "replace")
    return validator.decide(strict, text, mark, short)


def run_conformance(validator: Validator, vectors_path: Path, short: bool = True):
    """(name, passed, got) for every vector, decided as `admit` decides."""
    vectors = json.loads(Path(vectors_path).read_text())["vectors"]
    results = []
    for v in vectors:
        mark = canonical(v["mark"]) if v["mark"] is not None else None
        presented = None if v["presented"] is None else v["presented"].encode("utf-8")
        try:
            got = admit(validator, v["strict"], v["resource"].encode("utf-8"), presented, mark, short)
        except (GuestFault, Breach) as e:
            results.append((v["name"], False, f"error: {e}"))
            continue
        want = v["expect"]
        passed = got.kind == want["verdict"]
        carried = got.token if got.kind == "admit" else got.mark
        if "mark" in want and want["mark"] is not None:
            passed = passed and carried == canonical(want["mark"])
        if want.get("advanced") is not None:
            passed = passed and got.advanced == want["advanced"]
        results.append((v["name"], passed, f"{got.kind} {carried or ''}".strip()))
    return results
