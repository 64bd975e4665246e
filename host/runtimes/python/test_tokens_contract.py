"""The token contract (tests/contract/tokens.json) against the committed validator
component in wasmtime-py: the component keeps no marks, so this runner keeps them,
passes each resource's mark into the decide (the story's tokens decided in turn) and
keeps the mark an admit leaves."""

import sys

from conftest import CHECKOUT
import fencekeeper_component as fk

sys.path.insert(0, str(CHECKOUT / "tests" / "contract"))
import token_table  # noqa: E402

COMMITTED = CHECKOUT / "guest" / "artifacts" / "fencekeeper_validator.wasm"


def test_every_row_holds_in_the_component_in_wasmtime_py():
    validator = fk.Validator(COMMITTED)
    marks = {}

    def write(strict, resource, token):
        verdict = fk.admit(validator, strict, resource, token, marks.get((strict, resource)))
        if verdict.kind == "admit" and verdict.advanced:
            marks[(strict, resource)] = verdict.token
        return verdict.kind

    def mark(strict, key):
        token = marks.get((strict, key.encode()))
        return None if token is None else ".".join(str(p) for p in token)

    misses = token_table.run("component", write, mark)
    assert not misses, "\n".join(misses)
