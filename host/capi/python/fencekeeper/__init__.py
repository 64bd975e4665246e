"""Fencekeeper for Python: fencing for storage engines, through libfencekeeper_capi.

A thin ctypes layer over the C ABI (host/capi/include/fencekeeper_capi.h): the
decisions, the checks of every verdict and the stores are the library's; this module
converts values and turns the C statuses into exceptions.

    import fencekeeper
    guard = fencekeeper.Guard(store=fencekeeper.FileStore("marks.redb"))
    outcome = guard.admit("orders/2026-11.csv", "34")
    if not outcome.admitted:
        print(outcome.reason)

The library is found through FENCEKEEPER_CAPI_LIB (a path to the .so), else beside
this file (lib/, where the release's wheel puts it), else in the checkout's
target/release. A Guard may be used from several threads at once.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Protocol, Union

ABI_VERSION = 1
TOKEN_CAP = 84
REASON_CAP = 4096
RECORD_CAP = 96
WHY_CAP = 256

OK = 0
ERR_ARGUMENT = 1
ERR_LOAD = 2
ERR_STORE = 3
ERR_AUDIT = 4
ERR_PANIC = 5

MODE_CORRECTNESS = 0
MODE_EFFICIENCY = 1

STORE_KIND_MEMORY = 0
STORE_KIND_FILE = 1
STORE_KIND_ETCD = 2

STORE_FOUND = 1
STORE_ABSENT = 2
STORE_SWAPPED = 3
STORE_CONFLICT = 4
STORE_WRITTEN = 5
STORE_FAILED = 6

CLASSES = ("admitted", "stale", "replayed", "malformed", "missing", "undecided", "unverified")


class Error(Exception):
    """A call into the library failed: `status` is the FENCEKEEPER_ERR_* value."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


class AuditError(Error):
    """The admit advanced the mark, but its audit line was not written; `outcome` is
    what it decided."""

    def __init__(self, message: str, outcome: "Outcome"):
        super().__init__(ERR_AUDIT, message)
        self.outcome = outcome


class _Options(ctypes.Structure):
    _fields_ = [
        ("guest_path", ctypes.c_char_p),
        ("mode", ctypes.c_int32),
        ("strict", ctypes.c_uint8),
        ("store", ctypes.c_int32),
        ("store_path", ctypes.c_char_p),
        ("etcd_endpoint", ctypes.c_char_p),
        ("etcd_prefix", ctypes.c_char_p),
        ("etcd_timeout_ms", ctypes.c_uint32),
        ("etcd_ca", ctypes.c_char_p),
        ("etcd_cert", ctypes.c_char_p),
        ("etcd_key", ctypes.c_char_p),
        ("etcd_user", ctypes.c_char_p),
        ("etcd_password", ctypes.c_char_p),
        ("audit_path", ctypes.c_char_p),
        ("host_name", ctypes.c_char_p),
    ]


class _Outcome(ctypes.Structure):
    _fields_ = [
        ("class_", ctypes.c_int32),
        ("http_status", ctypes.c_uint16),
        ("grpc_status", ctypes.c_uint16),
        ("admitted", ctypes.c_bool),
        ("advanced", ctypes.c_bool),
        ("failed_open", ctypes.c_bool),
        ("breach", ctypes.c_bool),
        ("reason_truncated", ctypes.c_bool),
        ("mark_len", ctypes.c_size_t),
        ("mark", ctypes.c_char * TOKEN_CAP),
        ("reason_len", ctypes.c_size_t),
        ("reason", ctypes.c_char * REASON_CAP),
    ]


_MARK, _REASON = _Outcome.mark.offset, _Outcome.reason.offset
_u8p = ctypes.POINTER(ctypes.c_uint8)
_GET = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, _u8p, ctypes.c_size_t, _u8p, ctypes.POINTER(ctypes.c_size_t),
    ctypes.c_void_p, ctypes.c_size_t,
)
_SWAP = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, _u8p, ctypes.c_size_t, _u8p, ctypes.c_size_t, _u8p, ctypes.c_size_t,
    ctypes.c_void_p, ctypes.c_size_t,
)
_AUDIT = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)
_VISIT = ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_void_p, _u8p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t)


class _MarkStore(ctypes.Structure):
    _fields_ = [
        ("ctx", ctypes.c_void_p),
        ("get", _GET),
        ("compare_and_swap", _SWAP),
        ("audit", _AUDIT),
        ("name", ctypes.c_char_p),
    ]


def _library_path() -> str:
    explicit = os.environ.get("FENCEKEEPER_CAPI_LIB")
    if explicit:
        return explicit
    bundled = Path(__file__).resolve().parent / "lib" / "libfencekeeper_capi.so"
    if bundled.is_file():
        return str(bundled)
    checkout = Path(__file__).resolve().parents[4]
    return str(checkout / "target" / "release" / "libfencekeeper_capi.so")


def _load() -> ctypes.CDLL:
    lib = ctypes.CDLL(_library_path())
    lib.fencekeeper_abi_version.restype = ctypes.c_uint32
    lib.fencekeeper_last_error.restype = ctypes.c_char_p
    lib.fencekeeper_guard_open.argtypes = [ctypes.POINTER(_Options), ctypes.POINTER(ctypes.c_void_p)]
    lib.fencekeeper_guard_close.argtypes = [ctypes.c_void_p]
    lib.fencekeeper_guard_close.restype = None
    request = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t, ctypes.POINTER(_Outcome)]
    lib.fencekeeper_admit.argtypes = [ctypes.c_void_p] + request
    lib.fencekeeper_admit_in.argtypes = [ctypes.c_void_p, ctypes.POINTER(_MarkStore)] + request
    mark = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.POINTER(ctypes.c_bool)]
    lib.fencekeeper_mark.argtypes = [ctypes.c_void_p] + mark
    lib.fencekeeper_mark_in.argtypes = [ctypes.POINTER(_MarkStore)] + mark
    lib.fencekeeper_marks.argtypes = [ctypes.c_void_p, _VISIT, ctypes.c_void_p]
    for f in ("fencekeeper_guard_open", "fencekeeper_admit", "fencekeeper_admit_in", "fencekeeper_mark",
              "fencekeeper_mark_in", "fencekeeper_marks"):
        getattr(lib, f).restype = ctypes.c_int32
    version = lib.fencekeeper_abi_version()
    if version != ABI_VERSION:
        raise ImportError(f"{_library_path()} implements ABI {version}, this module ABI {ABI_VERSION}")
    return lib


_lib = _load()
_outcomes = threading.local()


def _last_error() -> str:
    return (_lib.fencekeeper_last_error() or b"").decode("utf-8", "replace")


def _check(status: int) -> None:
    if status != OK:
        raise Error(status, _last_error())


class Outcome(NamedTuple):
    """What an admit decided. `cls` is one of CLASSES; `mark` the admitted token (the
    mark now) when admitted, the current mark when stale or replayed, else None.
    (A named tuple: made once per admit, it is several times cheaper than a dataclass.)"""

    cls: str
    admitted: bool
    advanced: bool
    failed_open: bool
    breach: bool
    http_status: int
    grpc_status: int
    mark: Optional[str]
    reason: str


def _outcome_of(raw: _Outcome) -> Outcome:
    at = ctypes.addressof(raw)
    return Outcome(
        CLASSES[raw.class_] if 0 <= raw.class_ < len(CLASSES) else f"class {raw.class_}",
        raw.admitted,
        raw.advanced,
        raw.failed_open,
        raw.breach,
        raw.http_status,
        raw.grpc_status,
        ctypes.string_at(at + _MARK, raw.mark_len).decode() if raw.mark_len else None,
        ctypes.string_at(at + _REASON, raw.reason_len).decode("utf-8", "replace"),
    )


@dataclass(frozen=True)
class MemoryStore:
    """Marks in memory, for the guard's lifetime."""


@dataclass(frozen=True)
class FileStore:
    """Marks in a durable file (each advance fsync'd before the admit returns)."""

    path: Union[str, os.PathLike]


@dataclass(frozen=True)
class EtcdStore:
    """Marks in etcd, shared with the gateway and the Envoy filter (same prefix)."""

    endpoint: str
    prefix: Optional[str] = None
    timeout_ms: int = 0
    ca: Optional[Union[str, os.PathLike]] = None
    cert: Optional[Union[str, os.PathLike]] = None
    key: Optional[Union[str, os.PathLike]] = None
    user: Optional[str] = None
    password: Optional[str] = None


class MarkStore(Protocol):
    """Your own storage, for Guard.admit_in: values are opaque bytes (the mark's checked
    record, at most RECORD_CAP bytes) to keep per resource key (bytes)."""

    def get(self, resource: bytes) -> Optional[bytes]: ...

    def compare_and_swap(self, resource: bytes, expected: Optional[bytes], value: bytes) -> bool: ...


def _enc(text: Union[None, str, os.PathLike]) -> Optional[bytes]:
    return None if text is None else os.fsencode(text)


def _bytes(value: Union[str, bytes]) -> bytes:
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _why(buffer: int, cap: int, error: BaseException) -> None:
    text = f"{type(error).__name__}: {error}".encode("utf-8", "replace")[: cap - 1]
    ctypes.memmove(buffer, text + b"\0", len(text) + 1)


class _Table:
    """A Python MarkStore as the C callback table; callbacks never raise into C."""

    def __init__(self, store: MarkStore, name: str):
        self.store = store
        self.error: Optional[BaseException] = None
        audit = getattr(store, "audit", None)
        self._get = _GET(self._on_get)
        self._swap = _SWAP(self._on_swap)
        self._audit = _AUDIT(self._on_audit) if audit is not None else _AUDIT()
        self._name = name.encode("utf-8")
        self.table = _MarkStore(None, self._get, self._swap, self._audit, self._name)

    def _on_get(self, _ctx, resource, resource_len, value, value_len, why, why_cap):
        try:
            found = self.store.get(ctypes.string_at(resource, resource_len))
            if found is None:
                return STORE_ABSENT
            found = bytes(found)
            if len(found) > value_len[0]:
                raise ValueError(f"a stored value of {len(found)} bytes; a mark's is at most {RECORD_CAP}")
            ctypes.memmove(value, found, len(found))
            value_len[0] = len(found)
            return STORE_FOUND
        except BaseException as e:  # noqa: BLE001 - nothing may unwind into C
            self.error = e
            _why(why, why_cap, e)
            return STORE_FAILED

    def _on_swap(self, _ctx, resource, resource_len, expected, expected_len, value, value_len, why, why_cap):
        try:
            old = ctypes.string_at(expected, expected_len) if expected else None
            swapped = self.store.compare_and_swap(
                ctypes.string_at(resource, resource_len), old, ctypes.string_at(value, value_len)
            )
            return STORE_SWAPPED if swapped else STORE_CONFLICT
        except BaseException as e:  # noqa: BLE001
            self.error = e
            _why(why, why_cap, e)
            return STORE_FAILED

    def _on_audit(self, _ctx, line, line_len, why, why_cap):
        try:
            self.store.audit(ctypes.string_at(line, line_len).decode("utf-8"))
            return STORE_WRITTEN
        except BaseException as e:  # noqa: BLE001
            self.error = e
            _why(why, why_cap, e)
            return STORE_FAILED


class Guard:
    """A validator, a policy and a mark store. Close it (or use it as a context
    manager) to free it; no other call may run on it while it closes."""

    def __init__(
        self,
        store: Union[MemoryStore, FileStore, EtcdStore] = MemoryStore(),
        *,
        mode: str = "correctness",
        strict: bool = False,
        guest: Union[None, str, os.PathLike] = None,
        audit: Union[None, str, os.PathLike] = None,
        host_name: Optional[str] = None,
    ):
        self._handle: Optional[ctypes.c_void_p] = None
        modes = {"correctness": MODE_CORRECTNESS, "efficiency": MODE_EFFICIENCY}
        if mode not in modes:
            raise ValueError(f"mode must be one of {sorted(modes)}, not {mode!r}")
        options = _Options()
        options.mode = modes[mode]
        options.strict = 1 if strict else 0
        options.guest_path = _enc(guest)
        options.audit_path = _enc(audit)
        options.host_name = _enc(host_name)
        if isinstance(store, FileStore):
            options.store, options.store_path = STORE_KIND_FILE, _enc(store.path)
        elif isinstance(store, EtcdStore):
            options.store = STORE_KIND_ETCD
            options.etcd_endpoint, options.etcd_prefix = _enc(store.endpoint), _enc(store.prefix)
            options.etcd_timeout_ms = store.timeout_ms
            options.etcd_ca, options.etcd_cert, options.etcd_key = _enc(store.ca), _enc(store.cert), _enc(store.key)
            options.etcd_user, options.etcd_password = _enc(store.user), _enc(store.password)
        elif not isinstance(store, MemoryStore):
            raise TypeError(f"store must be MemoryStore, FileStore or EtcdStore, not {type(store).__name__}")
        handle = ctypes.c_void_p()
        _check(_lib.fencekeeper_guard_open(ctypes.byref(options), ctypes.byref(handle)))
        self._handle = handle

    def admit(self, resource: Union[str, bytes], token: Union[None, str, bytes]) -> Outcome:
        """Decide on a write of `resource` carrying `token` (None: it carried none) and
        advance the mark in the guard's store when admitted above it."""
        return self._admit(_lib.fencekeeper_admit, (self._open(),), resource, token)

    def admit_in(self, store: MarkStore, resource: Union[str, bytes], token: Union[None, str, bytes],
                 name: str = "the engine's store") -> Outcome:
        """`admit` against your own store (its get / compare_and_swap, and audit if it
        has one), inside whatever transaction it has open. An exception in a callback
        is a store failure (undecided), raised nowhere."""
        table = _Table(store, name)
        return self._admit(_lib.fencekeeper_admit_in, (self._open(), ctypes.byref(table.table)), resource, token)

    def mark(self, resource: Union[str, bytes]) -> Optional[str]:
        """The resource's mark in the guard's store (None: it has none)."""
        return _read_mark(lambda *args: _lib.fencekeeper_mark(self._open(), *args), resource)

    def marks(self) -> list[tuple[str, str]]:
        """Every (resource, mark) of the guard's store, sorted by resource."""
        found: list[tuple[str, str]] = []

        def visit(_ctx, resource, resource_len, mark, _mark_len):
            found.append((ctypes.string_at(resource, resource_len).decode("utf-8"), mark.decode()))
            return 0

        _check(_lib.fencekeeper_marks(self._open(), _VISIT(visit), None))
        return found

    def close(self) -> None:
        if self._handle is not None:
            _lib.fencekeeper_guard_close(self._handle)
            self._handle = None

    def __enter__(self) -> "Guard":
        return self

    def __exit__(self, *_exc) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()

    def _open(self) -> ctypes.c_void_p:
        if self._handle is None:
            raise Error(ERR_ARGUMENT, "the guard is closed")
        return self._handle

    def _admit(self, call: Callable[..., int], head: tuple, resource, token) -> Outcome:
        key = resource if type(resource) is bytes else _bytes(resource)
        presented = token if token is None or type(token) is bytes else _bytes(token)
        # One outcome buffer per thread, reused: the struct is 4 KiB.
        raw = getattr(_outcomes, "raw", None)
        if raw is None:
            raw = _outcomes.raw = _Outcome()
        status = call(*head, key, len(key), presented, 0 if presented is None else len(presented), ctypes.byref(raw))
        if status == ERR_AUDIT:
            raise AuditError(_last_error(), _outcome_of(raw))
        _check(status)
        return _outcome_of(raw)


def mark_in(store: MarkStore, resource: Union[str, bytes], name: str = "the engine's store") -> Optional[str]:
    """The mark your own store keeps for `resource`, checked as the guard checks it."""
    table = _Table(store, name)
    return _read_mark(lambda *args: _lib.fencekeeper_mark_in(ctypes.byref(table.table), *args), resource)


def _read_mark(call: Callable[..., int], resource) -> Optional[str]:
    key = _bytes(resource)
    buffer = ctypes.create_string_buffer(TOKEN_CAP)
    found = ctypes.c_bool()
    _check(call(key, len(key), buffer, ctypes.byref(found)))
    return buffer.value.decode() if found.value else None
