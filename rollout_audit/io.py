"""Finding, reading and writing rollout logs (Parquet files or directories of them)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from . import schema as S


class UsageError(Exception):
    """The input cannot be audited at all (exit code 2)."""


@dataclass
class LogFile:
    """One Parquet file of a log, with what its footer says."""

    path: str
    kind: str  # "trajectories" or "updates"
    schema: pa.Schema
    num_rows: int
    num_row_groups: int
    table: pa.Table | None = None  # an in-memory table audited like a file (path is its name)


@dataclass
class Discovery:
    """The files of a log, plus the ones that could not be opened (reported as S005)."""

    files: list[LogFile] = field(default_factory=list)
    broken: list[tuple[str, str]] = field(default_factory=list)  # (path, reason)

    def of_kind(self, kind: str) -> list[LogFile]:
        return [f for f in self.files if f.kind == kind]


def _parquet_paths(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    found = [p for p in path.rglob("*.parquet") if p.is_file() and not p.name.startswith((".", "_"))]
    return sorted(found)


def _kind_of(path: Path, pschema: pa.Schema) -> str:
    """`trajectories` or `updates` from the file's metadata, else from its folder and columns;
    `unknown` for a file without metadata that has fewer than half the required columns of
    either kind (some other Parquet file that happens to lie in the log's directory)."""
    meta = pschema.metadata or {}
    kind = meta.get(S.META_KIND)
    if kind in (b"trajectories", b"updates"):
        return kind.decode()
    names = set(pschema.names)
    share = {k: len(names & set(S.required(k))) / len(S.required(k)) for k in ("trajectories", "updates")}
    if "updates" in path.parts[:-1] or "update_step" in names:
        return "updates" if share["updates"] >= 0.5 or "updates" in path.parts[:-1] else "unknown"
    return "trajectories" if share["trajectories"] >= 0.5 else "unknown"


def discover(paths: Sequence[str | os.PathLike]) -> Discovery:
    """Find every Parquet file under `paths`; open each footer once.

    Raises UsageError for a path that does not exist or holds no Parquet file.
    """
    out = Discovery()
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise UsageError(f"{raw}: no such file or directory")
        files = _parquet_paths(p)
        if not files:
            raise UsageError(f"{raw}: no *.parquet files found")
        for f in files:
            try:
                pf = pq.ParquetFile(f)
                sch = pf.schema_arrow
                kind = _kind_of(f, sch)
                if kind == "unknown":
                    out.broken.append(
                        (
                            str(f),
                            "not a rollout log file: no rollout_log.kind metadata and too few "
                            "of the contract's required columns (see `rollout-audit schema`)",
                        )
                    )
                    continue
                out.files.append(LogFile(str(f), kind, sch, pf.metadata.num_rows, pf.metadata.num_row_groups))
            except Exception as e:  # noqa: BLE001 - any footer error means the file is unusable
                out.broken.append((str(f), one_line(e)))
    return out


def one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".strip()


def iter_batches(f: LogFile, columns: Sequence[str], batch_rows: int = 4096) -> Iterator[pa.Table]:
    """Row-group-bounded batches of the given columns (those present in the file)."""
    cols = [c for c in columns if c in f.schema.names]
    if f.table is not None:
        groups: Iterable[pa.Table] = [f.table.select(cols)]
    else:
        pf = pq.ParquetFile(f.path)
        groups = (pf.read_row_group(rg, columns=cols) for rg in range(f.num_row_groups))
    for t in groups:
        for off in range(0, max(t.num_rows, 1), batch_rows):
            part = t.slice(off, batch_rows)
            if part.num_rows:
                yield part


def read_table(f: LogFile, columns: Sequence[str] | None = None) -> pa.Table:
    cols = None if columns is None else [c for c in columns if c in f.schema.names]
    return pq.read_table(f.path, columns=cols)
