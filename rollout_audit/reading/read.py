"""Reading a log for the audit: plan each file's columns against the contract, cast them to
the contract's types, and cut them into batches. One path for Parquet files and for
in-memory tables (an in-memory table is a `LogFile` holding its table)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from ..contract import schema as S
from .io import LogFile, iter_batches, one_line
from .sanitize import cap_tokens, drop_invalid, duplicate_columns, row_group_too_large

Problem = tuple[str, str]  # (column, what is wrong)


def memory_file(table: pa.Table, kind: str) -> LogFile:
    """An in-memory table as a log file named `<memory>`."""
    return LogFile("<memory>", kind, table.schema, table.num_rows, 1, table=table)


def _target(name: str, found: pa.DataType, table: str) -> tuple[pa.DataType | None, str | None]:
    """(target type, problem): the contract type to cast to, or why the column is unusable."""
    spec = {c.name: c for c in S.columns(table)}
    if name not in spec:
        return None, None  # unknown columns are ignored
    if name == "turns":
        if not (pa.types.is_list(found) or pa.types.is_large_list(found)) or not pa.types.is_struct(found.value_type):
            return None, f"expected list<struct>, found {found}"
        tspec = {c.name: c for c in S.columns("turn")}
        fields = [
            pa.field(f.name, tspec[f.name].arrow_type)
            for f in found.value_type
            if f.name in tspec and S.compatible(f.type, tspec[f.name].arrow_type)
        ]
        return pa.list_(pa.struct(fields)), None
    exp = spec[name].arrow_type
    if not S.compatible(found, exp):
        return None, f"expected {spec[name].type}, found {found}"
    return exp, None


def schema_plan(f: LogFile, table: str = "trajectories") -> tuple[dict[str, pa.DataType], list[Problem]]:
    """Columns to read with their target types, and the schema problems (S001) of the file."""
    targets: dict[str, pa.DataType] = {}
    problems: list[Problem] = []
    names = set(f.schema.names)
    problems += [(c, "column name occurs more than once; not audited") for c in duplicate_columns(f.schema)]
    declared = S.not_recorded(f.schema.metadata)  # the producer's framework does not record these
    for c in S.columns(table):
        if c.requirement == "R" and c.name not in names and c.name not in declared:
            problems.append((c.name, "required column missing"))
    duplicated = {c.split(".")[0] for c, _ in problems}
    for fld in (x for x in f.schema if x.name not in duplicated):
        tgt, prob = _target(fld.name, fld.type, table)
        if prob:
            problems.append((fld.name, prob))
        elif tgt is not None:
            targets[fld.name] = tgt
    if table == "trajectories" and "turns" in targets:
        have = {x.name for x in targets["turns"].value_type}
        found = {x.name: x.type for x in f.schema.field("turns").type.value_type}
        for tc in S.columns("turn"):
            if tc.name in found and tc.name not in have:
                problems.append((f"turns.{tc.name}", f"expected {tc.type}, found {found[tc.name]}"))
            elif tc.requirement == "R" and tc.name not in found and f"turns.{tc.name}" not in declared:
                problems.append((f"turns.{tc.name}", "required turn field missing"))
    return targets, problems


def cast(table: pa.Table, targets: dict[str, pa.DataType]) -> tuple[pa.Table, list[Problem]]:
    """Cast each column to its contract type; a column whose values do not fit is dropped."""
    cols, names, problems = [], [], []
    for name in table.column_names:
        tgt = targets[name]
        col = table.column(name)
        if col.type != tgt:
            try:
                col = col.cast(tgt)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                problems.append((name, f"values do not fit {tgt}: {str(e).splitlines()[0]}"))
                continue
        cols.append(col)
        names.append(name)
    return pa.Table.from_arrays(cols, names=names), problems


@dataclass
class Part:
    """A slice of one file's rows in contract types, with the file's problems (first part only)."""

    table: pa.Table
    file: str
    first_row: int
    problems: list[Problem]
    # several small files in one part: (file, first row in it, rows) of each, in order
    sources: list[tuple[str, int, int]] | None = None


def parts(
    files: Sequence[LogFile],
    columns: Sequence[str],
    batch_rows: int,
    broken: list[Problem],
    max_row_group_bytes: int = 2 * 2**30,
    max_tokens: int = 1_000_000,
) -> Iterator[Part]:
    """Batches of `columns` (those a file has) from every trajectory file, validated (strings
    and lists in full, before anything reaches polars), capped and cast to the contract. A file
    that fails while being read, or whose row groups are too large, goes to `broken`."""
    last: tuple[pa.Schema | None, tuple[dict[str, pa.DataType], list[Problem]]] = (None, ({}, []))
    for f in files:
        if too_large := row_group_too_large(f.largest_row_group, max_row_group_bytes):
            broken.append((f.path, too_large))
            continue
        if last[0] is None or not f.schema.equals(last[0]):  # consecutive files mostly share a schema
            last = (f.schema, schema_plan(f))
        targets, problems = last[1]
        cols = [c for c in columns if c in targets]
        first, offset = not f.row_groups or f.row_groups[0] == 0, f.first_row  # a share of a file: its rows
        try:
            for raw in iter_batches(f, cols, batch_rows):
                n_read = raw.num_rows
                have = set(raw.column_names)
                part, bad = drop_invalid(raw.select([c for c in cols if c in have]), offset)
                part, long = cap_tokens(part, max_tokens, offset)
                part, cast_problems = cast(part, targets)
                yield Part(part, f.path, offset, (problems if first else []) + bad + long + cast_problems)
                first = False
                offset += n_read
        except (OSError, pa.ArrowException) as e:
            broken.append((f.path, one_line(e)))
            continue
        if first:  # an empty file: still report its schema problems
            yield Part(pa.table({c: pa.array([], targets[c]) for c in cols}), f.path, 0, problems)


def read_updates(
    files: Sequence[LogFile], broken: list[Problem], max_row_group_bytes: int = 2 * 2**30
) -> pl.DataFrame | None:
    """Every update record, cast to the contract, with its `file`. A file with schema
    problems is left out; a column whose values do not fit is dropped; both go to `broken`."""
    frames = []
    for f in files:
        if too_large := row_group_too_large(f.largest_row_group, max_row_group_bytes):
            broken.append((f.path, too_large))
            continue
        targets, problems = schema_plan(f, "updates")
        if problems:
            broken.append((f.path, "update records: " + "; ".join(f"{c}: {p}" for c, p in problems)))
            continue
        try:
            pieces = list(iter_batches(f, list(targets), 1 << 30))
            t = pa.concat_tables(pieces) if pieces else pa.table({c: pa.array([], targets[c]) for c in targets})
            t, bad = drop_invalid(t)
            if bad:
                broken.append((f.path, "update records: " + "; ".join(f"{c}: {p}" for c, p in bad)))
                continue
            t, cast_problems = cast(t, targets)
        except (OSError, pa.ArrowException) as e:
            broken.append((f.path, one_line(e)))
            continue
        if cast_problems:
            broken.append((f.path, "update records: " + "; ".join(f"{c}: {p}" for c, p in cast_problems)))
        df = pl.from_arrow(t)
        assert isinstance(df, pl.DataFrame)
        frames.append(df.with_columns(pl.lit(f.path).alias("file")))
    if not frames:
        return None
    return pl.concat(frames, how="diagonal_relaxed")
