"""What every adapter shares: reading a dump (JSON Lines or Parquet), required-field access that
names what is missing, and turning a framework's placeholders into nulls."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

_MISSING = object()


class AdapterError(ValueError):
    """A framework's records lack what the adapter needs: one line naming the field and record."""


def need(record: Mapping[str, Any], field: str, where: str) -> Any:
    """`record[field]`, or AdapterError naming the field and the record (`where`)."""
    value = record.get(field, _MISSING) if isinstance(record, Mapping) else _MISSING
    if value is _MISSING:
        raise AdapterError(f"{where}: missing field {field!r}")
    return value


def nulls_where(values: Sequence[float] | None, keep: Sequence[Any]) -> list[float | None] | None:
    """`values` with None wherever `keep` is falsy: a framework's placeholder (0.0 on tokens the
    policy did not sample) is not a recorded log-prob. None stays None."""
    if values is None:
        return None
    if len(values) != len(keep):
        raise AdapterError(f"{len(values)} values against a mask of {len(keep)}")
    return [float(v) if k else None for v, k in zip(values, keep)]


def read_records(path: str | os.PathLike) -> Iterator[dict[str, Any]]:
    """Records from a dump file: JSON Lines (`.jsonl`, `.json` with one object per line) or Parquet."""
    p = Path(path)
    if p.suffix == ".parquet":
        for batch in pq.ParquetFile(p).iter_batches():
            yield from batch.to_pylist()
        return
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise AdapterError(f"{p.name}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(rec, dict):
                raise AdapterError(f"{p.name}:{n}: a record must be a JSON object, not {type(rec).__name__}")
            yield rec


def read_dump(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record of a dump file or of the dump files (`*.jsonl`, `*.parquet`) in a directory, in name order."""
    p = Path(path)
    files = sorted(x for x in p.iterdir() if x.suffix in (".jsonl", ".json", ".parquet")) if p.is_dir() else [p]
    if not files:
        raise AdapterError(f"{p}: no *.jsonl or *.parquet dump files")
    return [r for f in files for r in read_records(f)]
