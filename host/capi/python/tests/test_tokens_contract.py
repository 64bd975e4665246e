"""The token contract (tests/contract/tokens.json) against the Python module, over the
C ABI: every row through Guard.admit, one guard per policy over a memory store."""

import sys
from pathlib import Path

import fencekeeper

sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "tests" / "contract"))
import token_table  # noqa: E402


def test_every_row_holds_in_the_python_module():
    guards = {False: fencekeeper.Guard(), True: fencekeeper.Guard(strict=True)}
    try:
        misses = token_table.run(
            "python",
            lambda strict, resource, token: guards[strict].admit(resource, token).cls,
            lambda strict, key: guards[strict].mark(key),
        )
    finally:
        for guard in guards.values():
            guard.close()
    assert len(token_table.TABLE["rows"]) >= 40
    assert not misses, "\n".join(misses)
