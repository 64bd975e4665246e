"""The module under test is the checkout's (host/capi/python), over the library this
checkout built (target/release, or FENCEKEEPER_CAPI_LIB)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
