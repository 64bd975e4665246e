"""The committed validator component, unchanged, in wasmtime-py: every conformance
vector passes, through both decides; the host's rules hold against the test guest's
faults and lies."""

import json

import pytest

from conftest import CHECKOUT, guest
import fencekeeper_component as fk

COMMITTED = CHECKOUT / "guest" / "artifacts" / "fencekeeper_validator.wasm"


@pytest.mark.parametrize("short", [True, False], ids=["decide-short", "decide"])
def test_the_committed_component_passes_every_conformance_vector(vectors, short):
    validator = fk.Validator(COMMITTED)
    results = fk.run_conformance(validator, vectors, short=short)
    assert len(results) == len(json.loads(vectors.read_text())["vectors"]) > 40
    assert [r for r in results if not r[1]] == []


def test_loading_runs_the_vectors_and_the_guest_describes_itself(vectors):
    validator = fk.Validator(COMMITTED, vectors=vectors)
    info = validator._call("describe")
    assert info.name == "fencekeeper-validator"


def faults():
    return fk.Validator(guest("test-guests/guest_faults.wasm"))


@pytest.mark.parametrize("fault", ["fault-trap", "fault-loop", "fault-grow"])
def test_fuel_and_memory_limits_stop_a_faulting_guest_and_the_next_call_gets_a_fresh_instance(fault):
    validator = faults()
    with pytest.raises(fk.GuestFault):
        fk.admit(validator, False, b"r", fault.encode(), None)
    assert fk.admit(validator, False, b"r", b"34", (33,)).kind == "admit"


@pytest.mark.parametrize(
    "token,mark",
    [
        ("64023.1.0.0", (64023, 9, 0, 0)),  # admits below the mark
        ("64023.2.0.0", (64023, 0, 0, 0)),  # raises the mark to the maximum
        ("64023.3.0.0", (64023, 9, 0, 0)),  # admits the mark it was given
        ("64023.5.0.0", None),              # a token of arity 0
        ("64023.6.0.0", None),              # its two decides disagree
    ],
)
def test_every_lie_of_the_test_guest_is_a_breach(token, mark):
    with pytest.raises(fk.Breach):
        fk.admit(faults(), False, b"r", token.encode(), mark)


def test_bounds_are_checked_before_the_guest_runs():
    validator = faults()
    # A loop token past the bound never reaches the guest: malformed, not a fault.
    assert fk.admit(validator, False, b"r", b"fault-loop" + b"0" * 128, None).kind == "malformed"
    assert fk.admit(validator, False, b"", b"1", None).kind == "malformed"
    assert fk.admit(validator, False, b"/\xff", b"1", None).kind == "malformed"


def test_a_guest_failing_a_vector_does_not_load(tmp_path, vectors):
    data = json.loads(vectors.read_text())
    data["vectors"][0]["expect"]["verdict"] = "stale"  # a vector no honest guest meets
    wrong = tmp_path / "vectors.json"
    wrong.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="fails the conformance vector"):
        fk.Validator(COMMITTED, vectors=wrong)
