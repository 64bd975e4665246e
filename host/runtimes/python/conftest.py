"""The host under test is this folder's module; the guests are the checkout's
(guest/artifacts, or FENCEKEEPER_GUEST_DIR when the suite rebuilt them elsewhere)."""

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
CHECKOUT = HERE.parents[2]
sys.path.insert(0, str(HERE))


def guest(name: str) -> Path:
    return Path(os.environ.get("FENCEKEEPER_GUEST_DIR", CHECKOUT / "guest" / "artifacts")) / name


@pytest.fixture
def vectors() -> Path:
    return CHECKOUT / "host" / "fencekeeper" / "conformance" / "vectors.json"
