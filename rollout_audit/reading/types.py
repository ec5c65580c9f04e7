"""Storage forms that hold the contract's values in another layout: list views (what polars and
Arrow's newer writers produce) are rebuilt as plain lists before any cast, since Arrow's own cast
from a list view does not rebuild the offsets. Dictionary-encoded strings, large and view strings,
large lists and other numeric widths are cast directly (`contract.schema.compatible` accepts them)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .arrays import from_numpy, list_lengths

_LISTS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_list_view, pa.types.is_large_list_view)


def is_list_like(t: pa.DataType) -> bool:
    """A variable-length list in any of Arrow's layouts."""
    return any(f(t) for f in _LISTS)


def has_view(t: pa.DataType) -> bool:
    """Whether a list view occurs anywhere in `t`."""
    if pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return True
    if is_list_like(t) or pa.types.is_fixed_size_list(t):
        return has_view(t.value_type)
    if pa.types.is_struct(t):
        return any(has_view(f.type) for f in t)
    return False


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list_view(t) or pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain_type(t.value_type)))
    if pa.types.is_large_list_view(t) or pa.types.is_large_list(t):
        return pa.large_list(pa.field(t.value_field.name, _plain_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain_type(f.type), f.nullable) for f in t])
    return t


def _plain_array(arr: pa.Array) -> pa.Array:
    t = arr.type
    if not has_view(t):
        return arr
    if is_list_like(t):
        values = _plain_array(pc.list_flatten(arr))  # each row's values in row order, views resolved
        lengths = list_lengths(arr, 0)
        large = pa.types.is_large_list(t) or pa.types.is_large_list_view(t)
        offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
        mask = arr.is_null() if arr.null_count else None
        if large:
            return pa.LargeListArray.from_arrays(from_numpy(offsets, pa.int64()), values, mask=mask)
        return pa.ListArray.from_arrays(from_numpy(offsets, pa.int32()), values, mask=mask)
    if pa.types.is_struct(t):
        children = [_plain_array(arr.field(i)) for i in range(t.num_fields)]
        fields = [pa.field(f.name, c.type, f.nullable) for f, c in zip(t, children)]
        mask = arr.is_null() if arr.null_count else None
        return pa.StructArray.from_arrays(children, fields=fields, mask=mask)
    return arr


def plain(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """`col` with every list view rebuilt as a list of the same values (unchanged when it has none)."""
    if not has_view(col.type):
        return col
    return pa.chunked_array([_plain_array(c) for c in col.chunks], _plain_type(col.type))
