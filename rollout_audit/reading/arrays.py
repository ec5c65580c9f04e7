"""Arrow to numpy and back, and Arrow values from Python ones, without pyarrow's pandas bridge.

pyarrow imports pandas (when it is installed; about 0.4 s of CPU) the first time it converts
between Arrow and numpy or Python values: `Array.to_numpy` and `np.asarray(array)` go through its
pandas conversion, and `pa.array`, `pa.scalar` and a compute function given a Python value (as
`pc.fill_null(a, 0)` or `pc.greater(a, 1)`) first ask its pandas shim whether the value is a
pandas object. The audit never holds a pandas object, so these helpers build the same arrays from
the buffers: fixed-width numbers and booleans, which are what the audit converts. Anything else
(strings, lists, timestamps, a boolean with nulls) goes through pyarrow, as before.
`tests/test_cold_start.py` holds a plain `check` to loading no pandas."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_NUMPY = {
    pa.int8(): np.int8,
    pa.int16(): np.int16,
    pa.int32(): np.int32,
    pa.int64(): np.int64,
    pa.uint8(): np.uint8,
    pa.uint16(): np.uint16,
    pa.uint32(): np.uint32,
    pa.uint64(): np.uint64,
    pa.float16(): np.float16,
    pa.float32(): np.float32,
    pa.float64(): np.float64,
}


def bits(buf: pa.Buffer | None, offset: int, n: int) -> np.ndarray:
    """An Arrow bitmap as one bool per slot (unpacked in one call; no buffer means all set)."""
    if buf is None:
        return np.ones(n, bool)
    first, end = offset // 8, (offset + n + 7) // 8
    unpacked = np.unpackbits(np.frombuffer(buf, np.uint8, end - first, first), bitorder="little")
    return unpacked[offset % 8 : offset % 8 + n].view(bool)


def validity(a: pa.Array) -> np.ndarray:
    """Per slot: not null."""
    return bits(a.buffers()[0] if a.null_count else None, a.offset, len(a))


def as_bools(a: pa.Array) -> np.ndarray:
    """A boolean array as numpy, null read as False."""
    values = bits(a.buffers()[1], a.offset, len(a))
    return values & validity(a) if a.null_count else values


def _chunk(a: pa.Array) -> np.ndarray:
    t, n = a.type, len(a)
    if t == pa.bool_():
        if a.null_count:
            return a.to_numpy(zero_copy_only=False)  # an object array of True/False/None, as pyarrow gives
        return bits(a.buffers()[1], a.offset, n) if n else np.zeros(0, np.bool_)
    dtype = np.dtype(_NUMPY[t])
    if n == 0:
        return np.zeros(0, dtype)
    vals = np.frombuffer(a.buffers()[1], dtype, count=n, offset=a.offset * dtype.itemsize)
    if not a.null_count:
        vals.flags.writeable = False  # a view of Arrow's immutable buffer, as pyarrow gives it
        return vals
    # pyarrow's conversion: NaN under a null, an integer column widened to float64
    out = vals.astype(dtype if dtype.kind == "f" else np.float64)
    out[~validity(a)] = np.nan
    return out


def stored(a: pa.Array) -> np.ndarray:
    """The values of an array of fixed-width numbers as numpy without a copy, in its own type; a
    null's slot holds whatever Arrow left there (read only where `validity` holds)."""
    dtype = np.dtype(_NUMPY[a.type])
    if not len(a):
        return np.zeros(0, dtype)
    return np.frombuffer(a.buffers()[1], dtype, len(a), a.offset * dtype.itemsize)


def to_numpy(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """`a.to_numpy(zero_copy_only=False)`: a read-only view of the values when `a` is one chunk of
    numbers without nulls, else a copy (NaN under a null; an integer column with nulls as float64)."""
    if isinstance(a, pa.ChunkedArray):
        if a.type not in _NUMPY and a.type != pa.bool_():
            return a.to_numpy()
        if a.num_chunks == 1:
            return _chunk(a.chunk(0))
        parts = [_chunk(c) for c in a.chunks]
        return np.concatenate(parts) if parts else _chunk(pa.nulls(0, a.type))
    if a.type not in _NUMPY and a.type != pa.bool_():
        return a.to_numpy(zero_copy_only=False)
    return _chunk(a)


def from_numpy(x: Any, type: pa.DataType | None = None) -> pa.Array:
    """`pa.array(x, type)` for a 1-d numpy array (or anything `np.asarray` takes) of numbers or
    bools, without nulls: the type from the dtype unless `type` is given, then `x` cast to it."""
    x = np.asarray(x)
    if type is None:
        type = pa.bool_() if x.dtype == np.bool_ else pa.from_numpy_dtype(x.dtype)
    if type == pa.bool_():
        packed = np.packbits(np.ascontiguousarray(x, np.bool_), bitorder="little")
        return pa.Array.from_buffers(type, len(x), [None, pa.py_buffer(packed)])
    if type not in _NUMPY:
        return pa.array(x, type)
    vals = np.ascontiguousarray(x, _NUMPY[type])
    if vals.dtype != x.dtype and not np.can_cast(x.dtype, vals.dtype) and not np.array_equal(vals, x, equal_nan=True):
        raise pa.ArrowInvalid(f"values of {x.dtype} do not fit {type}")  # as pa.array(x, type) refuses them
    return pa.Array.from_buffers(type, len(vals), [None, pa.py_buffer(vals)])


def scalar(value: Any, type: pa.DataType) -> pa.Scalar:
    """`pa.scalar(value, type)` for a number or a bool (a string: `strings([value])[0]`)."""
    return from_numpy(np.array([value]), type)[0]


def strings(values: Iterable[str]) -> pa.Array:
    """`pa.array(values, pa.string())` for Python strings without nulls."""
    encoded = [v.encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.Array.from_buffers(
        pa.string(), len(encoded), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
    )


def fill_null(a: pa.Array | pa.ChunkedArray, value: Any) -> pa.Array | pa.ChunkedArray:
    """`pc.fill_null(a, value)` for a number or a bool `value` of `a`'s type."""
    return pc.fill_null(a, scalar(value, a.type)) if a.null_count else a


def list_lengths(a: pa.Array | pa.ChunkedArray, null: int) -> np.ndarray:
    """The length of each list of `a` as int64, `null` for a null list."""
    n = pc.list_value_length(a)
    return to_numpy(fill_null(n, null)).astype(np.int64)
