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


N_SOURCE, N_LP = 6, 3  # token_source 0..4 and 5 for any other value; log-prob none, valid, invalid


def lp_states(lp: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per token (int8): 0 no log-prob recorded, 1 valid (finite, <= 0), 2 invalid (NaN, inf, > 0)."""
    state = ~np.isfinite(lp)
    state |= lp > 0
    state = state.view(np.int8) + np.int8(1)
    if not present.all():
        state *= present
    return state


def token_counts(
    n_tok: np.ndarray, source: np.ndarray, mask: np.ndarray, lp: np.ndarray, present: np.ndarray
) -> np.ndarray:
    """Per row (its `n_tok` consecutive tokens), how many tokens of each category: an int64 array
    of shape (rows, source, trainable, log-prob state), `source` already folded into 0..5."""
    n = n_tok.size
    if ACTIVE is not None:
        out = np.empty((n, N_SOURCE, 2, N_LP), np.int64)
        ACTIVE.token_counts(np.ascontiguousarray(n_tok, np.int64), source, mask, lp, present, out)
        return out
    return token_counts_numpy(n_tok, source, mask, lp_states(lp, present))


def token_counts_numpy(n_tok: np.ndarray, source: np.ndarray, mask: np.ndarray, lp_state: np.ndarray) -> np.ndarray:
    """`token_counts` in numpy: one bincount over a combined category code."""
    n, per = n_tok.size, N_SOURCE * 2 * N_LP
    small = source * np.uint8(2 * N_LP)  # the token's category, 0..35
    small += mask.view(np.uint8) * np.uint8(N_LP)
    small += lp_state.view(np.uint8)
    # bincount wants intp: the row base is repeated in intp directly (no int32 -> intp cast)
    code = np.repeat(np.arange(0, n * per, per, dtype=np.intp), n_tok)
    code += small
    return np.bincount(code, minlength=n * per).reshape(n, N_SOURCE, 2, N_LP)
