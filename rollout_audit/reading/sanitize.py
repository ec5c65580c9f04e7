"""Validation at the read boundary: what a Parquet file may legally hold but the audit must
not pass on (strings that are not UTF-8 reach polars as undefined behaviour; a duplicated
column name makes every lookup by name ambiguous). Pure functions over Arrow objects."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from .arrays import fill_null, from_numpy, scalar
from .types import is_list_like


def duplicate_columns(schema: pa.Schema) -> list[str]:
    """Names that occur more than once among the columns, or among the fields of a struct
    (nested as `column.field`), in order of first occurrence."""
    out: list[str] = []
    _duplicates([(f.name, f.type) for f in schema], "", out)
    return out


def _duplicates(fields: list[tuple[str, pa.DataType]], prefix: str, out: list[str]) -> None:
    seen: set[str] = set()
    for name, typ in fields:
        if name in seen and prefix + name not in out:
            out.append(prefix + name)
        seen.add(name)
        inner = typ
        while pa.types.is_list(inner) or pa.types.is_large_list(inner) or pa.types.is_fixed_size_list(inner):
            inner = inner.value_type
        if pa.types.is_struct(inner):
            _duplicates(
                [(inner.field(i).name, inner.field(i).type) for i in range(inner.num_fields)], f"{prefix}{name}.", out
            )


def invalid_columns(table: pa.Table) -> list[tuple[str, int | None, str]]:
    """(column, first bad row, problem) for each column that fails Arrow's full validation
    (strings that are not valid UTF-8, also inside lists and structs; inconsistent offsets).
    The row is None when the bad value lies in a shared buffer outside the table's rows (a
    slice of a larger row group): the column is still refused, since polars gets the buffer."""
    try:
        table.validate(full=True)
        return []  # the common case: one call for the whole table
    except pa.ArrowException:
        pass  # some column is invalid: find which, and where, below
    out = []
    for name, col in zip(table.column_names, table.columns):
        row = 0
        for chunk in col.chunks:
            problem = _problem(chunk)
            if problem is not None:
                bad = _first_bad_row(chunk)
                out.append((name, None if bad is None else row + bad, problem))
                break
            row += len(chunk)
    return out


def _problem(arr: pa.Array) -> str | None:
    """Why `arr` fails full validation, or None when it is valid."""
    try:
        arr.validate(full=True)
    except (pa.ArrowInvalid, pa.ArrowException) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return "value is not valid UTF-8" if "utf8" in msg.lower().replace("-", "") else f"invalid data: {msg}"
    return None


def _first_bad_row(arr: pa.Array) -> int | None:
    """Index of the first row of `arr` whose own values fail validation (None: none does).
    Lists and structs are searched through the values their rows reference (a sliced list
    validates its whole child array); flat arrays by bisection (log2(n) validations)."""
    typ = arr.type
    if pa.types.is_list(typ) or pa.types.is_large_list(typ):
        values = arr.flatten()
        if _problem(values) is None:
            return None
        k = _first_bad_row(values)
        return None if k is None else int(pc.list_parent_indices(arr)[k].as_py())
    if pa.types.is_struct(typ):
        rows = [_first_bad_row(child) for child in arr.flatten() if _problem(child) is not None]
        return min((r for r in rows if r is not None), default=None)
    if _problem(arr) is None:
        return None
    lo, hi = 0, len(arr)  # invariant: arr[lo:hi] holds the first bad row
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _problem(arr.slice(lo, mid - lo)) is not None:
            hi = mid
        else:
            lo = mid
    return lo


def drop_invalid(table: pa.Table, first_row: int = 0) -> tuple[pa.Table, list[tuple[str, str]]]:
    """`table` without its invalid columns, and one (column, problem) per column dropped;
    rows are numbered from `first_row` (the table's position in its file)."""
    bad = invalid_columns(table)
    if not bad:
        return table, []
    problems = [(c, f"{_where(row, first_row, table.num_rows)}: {p}; column not audited") for c, row, p in bad]
    return table.drop_columns([c for c, _, _ in bad]), problems


def _where(row: int | None, first_row: int, n: int) -> str:
    if row is None:
        return f"a value stored alongside rows {first_row}-{first_row + n - 1} (in the same row group)"
    return f"row {first_row + row}"


def over_tokens(
    lengths: pa.Array, ids: pa.Array | None, limit: int, first_row: int = 0, also: str = ""
) -> tuple[pa.Array, list[tuple[str, str]]]:
    """(rows over, problems): which rows hold more than `limit` tokens, and one (column, problem)
    per such row (up to 20 named; the rest counted); `also` ends each problem."""
    over = fill_null(pc.greater(lengths, scalar(limit, lengths.type)), False)
    rows = pc.indices_nonzero(over).to_pylist()
    if not rows:
        return over, []
    named = ids.take(from_numpy(rows[:20], pa.int64())).to_pylist() if ids is not None else [None] * len(rows[:20])
    tail = f"above max_tokens_per_trajectory ({limit:,}); trajectory not audited{also}"
    problems = [
        (
            "token_ids",
            f"row {first_row + r}{'' if i is None else f' (trajectory {i})'}: {lengths[r].as_py():,} tokens, {tail}",
        )
        for r, i in zip(rows, named, strict=False)
    ]
    if len(rows) > 20:
        problems.append(("token_ids", f"{len(rows) - 20} more trajectories above max_tokens_per_trajectory"))
    return over, problems


def cap_tokens(table: pa.Table, limit: int, first_row: int = 0) -> tuple[pa.Table, list[tuple[str, str]]]:
    """`table` without the rows whose `token_ids` list is longer than `limit`, and one
    (column, problem) per row removed (up to 20 named; the rest counted)."""
    if "token_ids" not in table.column_names or table.num_rows == 0:
        return table, []
    col = table.column("token_ids")
    if not is_list_like(col.type):
        return table, []  # a wrong type is S001's finding (the column is not read)
    lengths = fill_null(pc.list_value_length(col), 0)
    if (pc.max(lengths).as_py() or 0) <= limit:
        return table, []  # the common case
    ids = table.column("trajectory_id") if "trajectory_id" in table.column_names else None
    over, problems = over_tokens(
        lengths.combine_chunks(), None if ids is None else ids.combine_chunks(), limit, first_row
    )
    return table.filter(pc.invert(over)), problems
