"""The token contract (tokens.json, beside this file) for the Python runners: the rows
as a host receives them and what a host must answer. The table's own rules are checked
once, by the Rust driver (harness/src/token_table.rs)."""

import json
from pathlib import Path

TABLE = json.loads((Path(__file__).resolve().parent / "tokens.json").read_text())


def text(value):
    """A resource or a token as the table writes it, as bytes (None: no token)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    if "hex" in value:
        return bytes.fromhex(value["hex"])
    return (value["repeat"] * value["times"] + value.get("then", "")).encode()


def cases():
    """(row, resource bytes, token bytes or None), in order."""
    for number, row in enumerate(TABLE["rows"], start=1):
        resource = text(row["resource"]) if "resource" in row else f"tokens/row-{number:02}".encode()
        yield row, resource, text(row.get("token"))


def expected(host, row):
    """(answer, mark) `host` must give for `row`: its rendering, or its exception."""
    for e in TABLE["exceptions"]:
        if e["host"] == host and e["row"] == row["name"]:
            answer = TABLE["renderings"][host][e["class"]] if "class" in e else e["rendering"]
            return answer, e.get("mark")
    return TABLE["renderings"][host][row["class"]], row.get("mark")


def key(resource):
    """The resource as a key a mark is kept for, or None (not UTF-8, empty, too long)."""
    try:
        k = resource.decode()
    except UnicodeDecodeError:
        return None
    return k if 0 < len(resource) <= 1024 else None


def run(host, write, mark):
    """Play every row: `write(strict, resource, token)` answers as the host renders it,
    `mark(strict, key)` reads a mark back. The rows not kept, one line each."""
    misses = []
    admitted = TABLE["renderings"][host]["admitted"]
    for row, resource, token in cases():
        strict = row.get("strict", False)
        for before in row.get("before", []):
            answer = write(strict, resource, before.encode())
            if answer != admitted:
                misses.append(f"{row['name']!r}: its story's token {before} was answered {answer!r}")
        answer = write(strict, resource, token)
        k = key(resource)
        got = (answer, mark(strict, k) if k is not None else None)
        if got != expected(host, row):
            misses.append(f"{row['name']!r}: expected {expected(host, row)}, got {got}")
    return misses
