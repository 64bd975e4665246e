"""The fencekeeper module over libfencekeeper_capi: the guard's own stores, the
policy, bad input, threads."""

import threading
from pathlib import Path

import pytest

import fencekeeper

CHECKOUT = Path(__file__).resolve().parents[4]


def test_the_paused_holder_is_refused_and_the_outcome_says_why():
    with fencekeeper.Guard() as guard:
        assert guard.admit("orders/2026-11.csv", "33").advanced
        assert guard.admit("orders/2026-11.csv", "34").admitted
        late = guard.admit("orders/2026-11.csv", "33")
        assert (late.cls, late.admitted, late.http_status, late.grpc_status, late.mark) == ("stale", False, 409, 9, "34")
        assert late.reason.startswith('stale fencing token 33 for "orders/2026-11.csv"')
        assert guard.mark("orders/2026-11.csv") == "34"
        assert guard.mark("elsewhere") is None


def test_missing_malformed_and_strict_replays_are_refused_with_their_classes():
    with fencekeeper.Guard(strict=True) as guard:
        assert (guard.admit("r", None).cls, guard.admit("r", None).http_status) == ("missing", 428)
        for bad in ["-1", "3 4", "", "1.2.3.4.5", "0" * 200, b"3\xff4"]:
            outcome = guard.admit("r", bad)
            assert (outcome.cls, outcome.http_status, outcome.admitted) == ("malformed", 400, False), bad
        assert guard.admit(b"/\xff\xfe", "1").cls == "malformed", "a key that is not UTF-8"
        assert guard.admit("k" * 1025, "1").cls == "malformed"
        assert guard.admit("r", "7").advanced
        assert guard.admit("r", "7").cls == "replayed"
        assert guard.mark("r") == "7"


def test_a_file_store_remembers_across_guards_and_lists_and_audits(tmp_path):
    store = fencekeeper.FileStore(tmp_path / "marks.redb")
    with fencekeeper.Guard(store, audit=tmp_path / "audit.jsonl", host_name="py-engine") as guard:
        assert guard.admit("b", "2").advanced
        assert guard.admit("a", "1.5").advanced
    with fencekeeper.Guard(store) as guard:
        assert guard.admit("a", "1.4").cls == "stale"
        assert guard.marks() == [("a", "1.5"), ("b", "2")]
    lines = (tmp_path / "audit.jsonl").read_text().splitlines()
    assert len(lines) == 2 and '"host":"py-engine"' in lines[0] and '"new":"1.5"' in lines[1]


def test_a_store_or_guest_that_cannot_be_used_is_an_error_with_one_line(tmp_path):
    garbage = tmp_path / "garbage.redb"
    garbage.write_bytes(b"not a database")
    with pytest.raises(fencekeeper.Error) as e:
        fencekeeper.Guard(fencekeeper.FileStore(garbage))
    assert e.value.status == fencekeeper.ERR_STORE and "\n" not in str(e.value)
    junk = tmp_path / "junk.wasm"
    junk.write_bytes(b"\0asm junk")
    with pytest.raises(fencekeeper.Error) as e:
        fencekeeper.Guard(guest=junk)
    assert e.value.status == fencekeeper.ERR_LOAD
    with pytest.raises(ValueError):
        fencekeeper.Guard(mode="optimistic")


def test_a_guest_file_loads_after_passing_the_conformance_vectors():
    with fencekeeper.Guard(guest=CHECKOUT / "guest/artifacts/fencekeeper_validator.wasm") as guard:
        assert guard.admit("r", "1").admitted


def test_a_closed_guard_is_refused_not_a_crash():
    guard = fencekeeper.Guard()
    guard.close()
    with pytest.raises(fencekeeper.Error) as e:
        guard.admit("r", "1")
    assert e.value.status == fencekeeper.ERR_ARGUMENT
    guard.close()


def test_threads_share_a_guard_and_the_mark_ends_at_the_highest_token():
    guard = fencekeeper.Guard()
    errors = []

    def holder(first):
        for token in range(first, 400, 4):
            outcome = guard.admit("shared", str(token))
            if outcome.cls == "stale" and int(outcome.mark) <= token:
                errors.append(outcome.reason)
            elif outcome.cls not in ("admitted", "stale"):
                errors.append(outcome.reason)

    threads = [threading.Thread(target=holder, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert guard.mark("shared") == "399"
    guard.close()
