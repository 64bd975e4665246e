"""A storage engine in Python that keeps its fencing marks in its own SQLite
transaction, through Guard.admit_in and the C ABI's callback table: the mark, the row
it fenced and the audit line commit or roll back together."""

import multiprocessing
import sqlite3

import pytest

import fencekeeper


class Txn:
    """The marks as an open SQLite write transaction sees them (a MarkStore)."""

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def get(self, resource: bytes):
        row = self.db.execute("SELECT record FROM marks WHERE resource = ?", (resource,)).fetchone()
        return None if row is None else row[0]

    def compare_and_swap(self, resource: bytes, expected, value: bytes) -> bool:
        # The transaction holds SQLite's write lock: compare and write is atomic.
        if expected is None:
            cur = self.db.execute("INSERT OR IGNORE INTO marks (resource, record) VALUES (?, ?)", (resource, value))
        else:
            cur = self.db.execute(
                "UPDATE marks SET record = ? WHERE resource = ? AND record = ?", (value, resource, expected)
            )
        return cur.rowcount == 1

    def audit(self, line: str) -> None:
        self.db.execute("INSERT INTO audit (line) VALUES (?)", (line,))


class Engine:
    def __init__(self, path):
        self.db = sqlite3.connect(path, isolation_level=None, timeout=60)
        self.db.executescript(
            """
            CREATE TABLE IF NOT EXISTS rows (key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS marks (resource BLOB PRIMARY KEY, record BLOB NOT NULL);
            CREATE TABLE IF NOT EXISTS audit (id INTEGER PRIMARY KEY, line TEXT NOT NULL);
            CREATE TABLE IF NOT EXISTS history (id INTEGER PRIMARY KEY, key TEXT, token INTEGER);
            """
        )

    def write(self, guard: fencekeeper.Guard, key: str, value: str, token: str) -> fencekeeper.Outcome:
        """A fenced write: admitted and applied in one transaction, or refused."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            outcome = guard.admit_in(Txn(self.db), key, token, name="sqlite marks table")
            if not outcome.admitted:
                self.db.execute("ROLLBACK")
                return outcome
            if len(value) > 64:
                raise ValueError(f"value for {key!r} too large")
            self.db.execute("INSERT OR REPLACE INTO rows (key, value) VALUES (?, ?)", (key, value))
            self.db.execute("INSERT INTO history (key, token) VALUES (?, ?)", (key, int(token)))
            self.db.execute("COMMIT")
            return outcome
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    def row(self, key):
        found = self.db.execute("SELECT value FROM rows WHERE key = ?", (key,)).fetchone()
        return found and found[0]

    def mark(self, key):
        return fencekeeper.mark_in(Txn(self.db), key)


def test_a_stale_write_is_refused_and_marks_commit_with_the_rows_and_their_audit(tmp_path):
    engine, guard = Engine(tmp_path / "engine.db"), fencekeeper.Guard()
    assert engine.write(guard, "invoice/7", "draft by A", "33").advanced
    assert engine.write(guard, "invoice/7", "final by B", "34").advanced
    late = engine.write(guard, "invoice/7", "late draft by A", "33")
    assert (late.cls, late.mark) == ("stale", "34")
    assert engine.row("invoice/7") == "final by B"
    assert engine.mark("invoice/7") == "34"
    record = engine.db.execute("SELECT record FROM marks").fetchone()[0]
    assert record.startswith(b"fk2 34 "), record
    lines = [r[0] for r in engine.db.execute("SELECT line FROM audit ORDER BY id")]
    assert len(lines) == 2 and '"old":"33"' in lines[1] and '"store":"sqlite marks table"' in lines[1]
    assert guard.mark("invoice/7") is None, "the guard's own store is not touched"


def test_an_admitted_write_that_fails_later_rolls_its_mark_back(tmp_path):
    engine, guard = Engine(tmp_path / "engine.db"), fencekeeper.Guard()
    engine.write(guard, "invoice/7", "final by B", "34")
    with pytest.raises(ValueError):
        engine.write(guard, "invoice/7", "x" * 100, "35")
    assert engine.mark("invoice/7") == "34"
    assert engine.db.execute("SELECT COUNT(*) FROM audit").fetchone()[0] == 1


def test_a_damaged_record_is_undecided_and_never_a_lower_mark(tmp_path):
    engine = Engine(tmp_path / "engine.db")
    guard, efficient = fencekeeper.Guard(), fencekeeper.Guard(mode="efficiency")
    engine.write(guard, "r", "v", "50")
    engine.db.execute("UPDATE marks SET record = CAST(replace(CAST(record AS TEXT), 'fk2 50', 'fk2 40') AS BLOB)")
    refused = engine.write(guard, "r", "w", "45")
    assert (refused.cls, refused.http_status, refused.admitted) == ("undecided", 503, False)
    assert "damaged" in refused.reason
    with pytest.raises(fencekeeper.Error) as e:
        engine.mark("r")
    assert e.value.status == fencekeeper.ERR_STORE
    passed = engine.write(efficient, "r", "w", "45")
    assert passed.admitted and passed.failed_open, "efficiency mode passes a store failure, counted"


def test_an_exception_in_a_callback_is_a_store_failure_not_an_unwind(tmp_path):
    class Broken(Txn):
        def get(self, resource):
            raise OSError("the disk is gone")

    engine, guard = Engine(tmp_path / "engine.db"), fencekeeper.Guard()
    outcome = guard.admit_in(Broken(engine.db), "r", "1")
    assert outcome.cls == "undecided" and "OSError: the disk is gone" in outcome.reason


def _holder(path, first, step, count):
    engine, guard = Engine(path), fencekeeper.Guard()
    for token in range(first, first + step * count, step):
        outcome = engine.write(guard, "shared", f"by {first}", str(token))
        if outcome.cls not in ("admitted", "stale"):
            raise AssertionError(outcome.reason)
    guard.close()


def test_processes_writing_through_one_database_never_commit_a_stale_write(tmp_path):
    path = tmp_path / "engine.db"
    Engine(path)
    holders, count = 4, 60
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_holder, args=(path, i + 1, holders, count)) for i in range(holders)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * holders
    engine = Engine(path)
    committed = [t for (t,) in engine.db.execute("SELECT token FROM history ORDER BY id")]
    assert committed == sorted(set(committed)), "every committed write carried a higher token than the last"
    assert engine.mark("shared") == str(holders * count)
