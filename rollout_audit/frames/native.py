"""The audit's native core and its pure-Python path, one function each, with identical results.

`_native` is the project's C extension (`_native.c`, compiled at install by hatch_build.py with the
machine's compiler); it works on a whole batch per call with the GIL released, so the read-ahead
thread decodes on the other core meanwhile. Without it (no compiler at install, or
`ROLLOUT_AUDIT_NO_NATIVE=1` when the process starts) the functions below use hashlib, and
`tests/test_native.py` keeps the two equal.
"""

from __future__ import annotations

import hashlib
import os
from types import ModuleType

import numpy as np

ACTIVE: ModuleType | None = None
if os.environ.get("ROLLOUT_AUDIT_NO_NATIVE") != "1":
    try:
        from . import _native as ACTIVE  # type: ignore[attr-defined, no-redef]
    except ImportError:  # not built: the pure-Python path below
        ACTIVE = None


def prefix_sha256(data: memoryview, lo: np.ndarray, hi: np.ndarray, first: np.ndarray) -> np.ndarray:
    """SHA-256 of consecutive prefixes, one 32-byte row per entry: a running hash starts anew
    where `first` is set, is fed data[lo:hi], and its digest so far is taken (on a copy)."""
    lo = np.ascontiguousarray(lo, np.int64)
    hi = np.ascontiguousarray(hi, np.int64)
    first = np.ascontiguousarray(first, np.bool_)
    if ACTIVE is not None:
        out = np.empty((lo.size, 32), np.uint8)
        ACTIVE.prefix_sha256(data, lo, hi, first.view(np.uint8), out)
        return out
    return prefix_sha256_python(data, lo, hi, first)


def prefix_sha256_python(data: memoryview, lo: np.ndarray, hi: np.ndarray, first: np.ndarray) -> np.ndarray:
    """`prefix_sha256` with hashlib: a Python call per prefix (the loop holds nothing else)."""
    new, digests = hashlib.sha256, list[bytes]()
    append = digests.append
    h = new()
    for f, a, z in zip(first.tolist(), lo.tolist(), hi.tolist()):
        if f:
            h = new()
        h.update(data[a:z])
        append(h.digest())
    return np.frombuffer(b"".join(digests), np.uint8).reshape(-1, 32)
