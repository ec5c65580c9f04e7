"""`rollout_audit.reading.arrays` gives what pyarrow's own conversions give (values, dtype, nulls,
slices, chunks, whether the result is a read-only view), for every type it converts itself."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollout_audit.reading import arrays as A

NUMERIC = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
    pa.float16(),
    pa.float32(),
    pa.float64(),
]


def _values(t: pa.DataType, nulls: bool) -> list:
    if t == pa.bool_():
        vals: list = [True, False, False, True, True, False, True, True, False, True, False]
    elif t == pa.float16():
        vals = [np.float16(x) for x in (0.5, -1.0, 2.0, 0.25, 3.0, -0.5, 1.5, 7.0, 0.0, 1.0, -2.0)]
    else:
        vals = [0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89]
    if nulls:
        vals[1] = vals[9] = None
    return vals


def _same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype
    assert got.shape == want.shape
    assert got.flags.writeable == want.flags.writeable or not want.size  # a view of Arrow's buffer is read-only
    if want.dtype == object:
        assert got.tolist() == want.tolist()
    else:
        np.testing.assert_array_equal(got, want)  # NaN equals NaN here


@pytest.mark.parametrize("t", [*NUMERIC, pa.bool_()], ids=str)
@pytest.mark.parametrize("nulls", [False, True], ids=["no-nulls", "nulls"])
def test_to_numpy_is_pyarrows_conversion(t, nulls):
    a = pa.array(_values(t, nulls), t)
    for part in (a, a.slice(3), a.slice(3, 5), a.slice(11), pa.nulls(0, t)):
        _same(A.to_numpy(part), part.to_numpy(zero_copy_only=False))
    for chunked in (pa.chunked_array([a]), pa.chunked_array([a.slice(0, 4), a.slice(5)]), pa.chunked_array([], t)):
        _same(A.to_numpy(chunked), chunked.to_numpy())


def test_to_numpy_leaves_other_types_to_pyarrow():
    s = pa.array(["a", None, "b"])
    assert A.to_numpy(s).tolist() == s.to_numpy(zero_copy_only=False).tolist()


@pytest.mark.parametrize("t", [*NUMERIC, pa.bool_()], ids=str)
def test_from_numpy_and_scalar_are_pyarrows(t):
    vals = [v for v in _values(t, False)]
    x = np.array(vals, dtype=np.bool_ if t == pa.bool_() else t.to_pandas_dtype())
    for part in (x, x[2:7], x[::2]):
        got = A.from_numpy(part, t)
        assert got.type == t and got.equals(pa.array(part, t))
    assert A.from_numpy(x).equals(pa.array(x))  # the type from the dtype
    assert A.scalar(vals[3], t).equals(pa.scalar(vals[3], t))


def test_from_numpy_refuses_a_value_that_does_not_fit_as_pyarrow_does():
    with pytest.raises(pa.ArrowInvalid):
        pa.array(np.array([300]), pa.int8())
    with pytest.raises(pa.ArrowInvalid):
        A.from_numpy(np.array([300]), pa.int8())
    with pytest.raises(pa.ArrowInvalid):
        A.scalar(-1, pa.uint32())
    assert A.from_numpy(np.array([1, 2]), pa.int8()).equals(pa.array([1, 2], pa.int8()))


def test_fill_null_list_lengths_and_strings():
    a = pa.array([3, None, 5], pa.int32())
    assert A.fill_null(a, -1).equals(pc.fill_null(a, -1))
    assert A.fill_null(pa.chunked_array([a, a]), 0).equals(pc.fill_null(pa.chunked_array([a, a]), 0))
    lists = pa.array([[1, 2], None, [], [4]], pa.large_list(pa.int64()))
    got = A.list_lengths(lists, -1)
    assert got.dtype == np.int64 and got.tolist() == [2, -1, 0, 1]
    words = ["stop", "", "längd", "tool_calls"]
    assert A.strings(words).equals(pa.array(words, pa.string()))
    assert A.strings([]).equals(pa.array([], pa.string()))


def test_bitmaps_from_any_offset():
    a = pa.array([True, None, False, True, None, True, True, False, True, None], pa.bool_())
    for k in range(len(a)):
        part = a.slice(k)
        assert A.validity(part).tolist() == [v is not None for v in part.to_pylist()]
        assert A.as_bools(part).tolist() == [bool(v) for v in part.to_pylist()]
