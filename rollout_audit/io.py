"""Finding, reading and writing rollout logs (Parquet files or directories of them)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
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
            except Exception as e:  # any footer error means the file is unusable
                out.broken.append((str(f), _one_line(e)))
    return out


def _one_line(e: BaseException) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0] if msg else ''}".strip()


def iter_batches(f: LogFile, columns: Sequence[str], batch_rows: int = 4096) -> Iterator[pa.Table]:
    """Row-group-bounded batches of the given columns (those present in the file)."""
    cols = [c for c in columns if c in f.schema.names]
    pf = pq.ParquetFile(f.path)
    for rg in range(f.num_row_groups):
        t = pf.read_row_group(rg, columns=cols)
        for off in range(0, max(t.num_rows, 1), batch_rows):
            part = t.slice(off, batch_rows)
            if part.num_rows:
                yield part


def read_table(f: LogFile, columns: Sequence[str] | None = None) -> pa.Table:
    cols = None if columns is None else [c for c in columns if c in f.schema.names]
    return pq.read_table(f.path, columns=cols)


# ---------------------------------------------------------------- writing


class RolloutWriter:
    """Write a valid rollout log file, row group by row group, published atomically.

    Each `write` checks the batch against the contract (required columns, types, list
    lengths, turn numbering, stop reasons) and raises ValueError naming the column and
    row of the first problem. The file only appears under its final name on `close`.

        with RolloutWriter("logs/step=3/part-0.parquet") as w:
            w.write(records)            # list of dicts, or a pyarrow Table/RecordBatch
    """

    def __init__(
        self, path: str | os.PathLike, kind: str = "trajectories", *, validate: bool = True, compression: str = "zstd"
    ) -> None:
        if kind not in ("trajectories", "updates"):
            raise ValueError(f"kind must be 'trajectories' or 'updates', not {kind!r}")
        self.path = Path(path)
        self.kind = kind
        self.validate = validate
        self.compression = compression
        self._tmp = self.path.with_name(f".{self.path.name}.{uuid.uuid4().hex[:8]}.tmp")
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self.rows_written = 0

    def __enter__(self) -> RolloutWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write(self, records: Iterable[Mapping] | pa.Table | pa.RecordBatch) -> None:
        """Validate and append one batch as one row group."""
        table = self._to_table(records)
        if self.validate:
            problems = contract_problems(table, self.kind)
            if problems:
                raise ValueError(
                    f"{self.path}: record refused: {problems[0]}"
                    + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                )
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._tmp, self._schema, compression=self.compression)
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.rows_written += table.num_rows

    def close(self) -> Path:
        """Finish the file and move it to its final name."""
        if self._writer is None:
            raise ValueError(f"{self.path}: nothing was written; refusing to publish an empty log")
        self._writer.close()
        self._writer = None
        os.replace(self._tmp, self.path)
        return self.path

    def abort(self) -> None:
        """Drop the temporary file; nothing is published."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._tmp.unlink(missing_ok=True)

    def _to_table(self, records) -> pa.Table:
        if isinstance(records, pa.RecordBatch):
            records = pa.Table.from_batches([records])
        if not isinstance(records, pa.Table):
            records = list(records)
            if not records:
                raise ValueError("write() got no records")
            if self._schema is None:
                self._schema = _schema_for_records(records, self.kind)
            try:
                records = pa.Table.from_pylist(records, schema=self._schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise ValueError(f"{self.path}: record refused: {_one_line(e)}") from None
        if self._schema is None:
            self._schema = _canonical_schema(records.schema, self.kind)
        try:
            return records.select(self._schema.names).cast(self._schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise ValueError(f"{self.path}: batch does not match the file's schema: {_one_line(e)}") from None


def _meta(kind: str) -> dict[bytes, bytes]:
    return {S.META_VERSION: S.SCHEMA_VERSION.encode(), S.META_KIND: kind.encode()}


def records_to_table(records: list[Mapping], kind: str = "trajectories") -> pa.Table:
    """Records (dicts with contract column names) as an Arrow table with contract types."""
    return pa.Table.from_pylist(list(records), schema=_schema_for_records(list(records), kind))


def _schema_for_records(records: list[Mapping], kind: str) -> pa.Schema:
    """Contract schema restricted to the columns (and turn fields) the producer supplies."""
    present = set().union(*(r.keys() for r in records))
    unknown = sorted(present - {c.name for c in S.columns(kind)})
    if unknown:
        raise ValueError(f"unknown column(s) {unknown} for {kind}; see `rollout-audit schema`")
    fields = []
    for c in S.columns(kind):
        if c.name not in present:
            continue
        if c.name == "turns":
            keys = set()
            for r in records:
                for t in r.get("turns") or ():
                    keys.update(t.keys())
            tf = [pa.field(tc.name, tc.arrow_type) for tc in S.columns("turn") if tc.name in keys]
            bad = sorted(keys - {tc.name for tc in S.columns("turn")})
            if bad:
                raise ValueError(f"unknown turn field(s) {bad}; see `rollout-audit schema`")
            fields.append(pa.field("turns", pa.list_(pa.struct(tf))))
        else:
            fields.append(pa.field(c.name, c.arrow_type))
    return pa.schema(fields, metadata=_meta(kind))


def _canonical_schema(found: pa.Schema, kind: str) -> pa.Schema:
    """Contract types for the columns of an Arrow table (unknown columns refused)."""
    spec = {c.name: c for c in S.columns(kind)}
    fields = []
    for f in found:
        if f.name not in spec:
            raise ValueError(f"unknown column {f.name!r} for {kind}; see `rollout-audit schema`")
        if f.name == "turns" and pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type):
            tspec = {c.name: c for c in S.columns("turn")}
            tf = [pa.field(x.name, tspec[x.name].arrow_type) for x in f.type.value_type if x.name in tspec]
            fields.append(pa.field("turns", pa.list_(pa.struct(tf))))
        else:
            fields.append(pa.field(f.name, spec[f.name].arrow_type))
    return pa.schema(fields, metadata=_meta(kind))


def contract_problems(table: pa.Table, kind: str) -> list[str]:
    """Structural problems of an in-memory batch, as messages (used by the writer)."""
    from .engine import audit_tables  # late import: the engine imports this module

    rep = audit_tables(
        table if kind == "trajectories" else None,
        table if kind == "updates" else None,
        select=["S", "T301", "T302"] if kind == "trajectories" else ["S"],
    )
    return [
        f"{r['code']} {r['message']}" + (f" (trajectory {r['trajectory_id']})" if r["trajectory_id"] else "")
        for r in rep.findings.filter(rep.findings["severity"] == "error").iter_rows(named=True)
    ]
