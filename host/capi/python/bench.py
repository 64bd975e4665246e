"""One admit through libfencekeeper_capi from Python: through the fencekeeper module
(Guard.admit, an Outcome dataclass per call), and through ctypes alone (the same C
call with its arguments prepared once: the floor of a ctypes call). Run by
scripts/bench-capi.sh beside the C and Rust callers (BENCHMARKS.md, "Admit through the
C ABI"). Prints `PATH SCENARIO MEDIAN_NS` lines: the median over rounds of the
thread's CPU time per admit."""

import ctypes
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import fencekeeper  # noqa: E402

ROUNDS, PER_ROUND = 15, 20_000
RESOURCE = b"orders/2026.csv"


def median(round_):
    times = []
    for r in range(ROUNDS):
        start = time.thread_time_ns()
        round_(r)
        times.append((time.thread_time_ns() - start) / PER_ROUND)
    return statistics.median(times)


for scenario, advancing in [("repeating", False), ("advancing", True)]:
    tokens = [[(str(1_000_000 + r * PER_ROUND + i) if advancing else "34").encode() for i in range(PER_ROUND)]
              for r in range(ROUNDS)]
    guard = fencekeeper.Guard()
    guard.admit(RESOURCE, b"34")

    def module(r):
        admit = guard.admit
        for t in tokens[r]:
            admit(RESOURCE, t)

    print(f"python-module {scenario} {median(module):.1f}", flush=True)
    guard.close()

    guard = fencekeeper.Guard()
    guard.admit(RESOURCE, b"34")
    raw, handle, call = fencekeeper._Outcome(), guard._handle, fencekeeper._lib.fencekeeper_admit
    out = ctypes.byref(raw)

    def bare(r):
        for t in tokens[r]:
            call(handle, RESOURCE, len(RESOURCE), t, len(t), out)

    print(f"python-ctypes {scenario} {median(bare):.1f}", flush=True)
    assert raw.admitted
    guard.close()
