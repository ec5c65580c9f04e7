"""Writing rollout logs: `RolloutWriter` validates each batch against the contract (the
structural checks, run through the same `Runner` as the audit) and publishes atomically."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..contract import schema as S
from ..contract.config import Config
from ..contract.errors import InputError
from ..frames.batch import Batch
from ..reading.io import one_line
from ..reading.read import cast, memory_file, schema_plan
from ..reading.records import canonical_schema, schema_for_records
from ..running.runner import Runner, check_table

_VALIDATE = ("S", "T301", "T302")  # what a batch must pass before it is written


class RolloutWriter:
    """Write a valid rollout log file, row group by row group, published atomically.

    Each `write` checks the batch against the contract (required columns, types, list
    lengths, turn numbering, stop reasons) and raises ValueError naming the column and
    row of the first problem. The file only appears under its final name on `close`.
    `reward_components` declares how each reward component is paid ({"key_found": "first_visit"},
    file metadata `rollout_log.reward_components`), so that R408 runs without configuration.

        with RolloutWriter("logs/step=3/part-0.parquet") as w:
            w.write(records)            # list of dicts, or a pyarrow Table/RecordBatch
    """

    def __init__(
        self,
        path: str | os.PathLike,
        kind: str = "trajectories",
        *,
        validate: bool = True,
        compression: str = "zstd",
        tokenizer: Mapping | None = None,
        reward_components: Mapping[str, str] | None = None,
        config: Config | None = None,
    ) -> None:
        """`config`: the settings the batches are validated under, e.g. the producer's own stop
        reasons (`Config(extra_stop_reasons={"budget": "truncated"})`, or `load_config(FILE)`).
        `tokenizer`, when given, is declared in the file metadata `rollout_log.tokenizer` so that
        `rollout-audit show` can decode the ids: {"name": str, "vocabulary": [text of each id]}, either key optional."""
        if kind not in ("trajectories", "updates"):
            raise InputError(f"kind must be 'trajectories' or 'updates', not {kind!r}")
        # the writer's declarations, written into the file metadata (they win over ones a table carries)
        self._meta = {S.META_TOKENIZER: _tokenizer_meta(tokenizer)} if tokenizer is not None else {}
        bad = {k: v for k, v in (reward_components or {}).items() if v not in S.PAYMENTS}
        if bad:
            raise InputError(f"reward_components: {bad} not one of {', '.join(S.PAYMENTS)}")
        if reward_components:
            self._meta[S.META_REWARD_COMPONENTS] = json.dumps(dict(reward_components), sort_keys=True).encode()
        self.path = Path(path)
        self.kind = kind
        self.validate = validate
        self.config = config if config is not None else Config()
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

    def write(self, records: Iterable[Mapping] | pa.Table | pa.RecordBatch | Any) -> None:
        """Validate and append one batch as one row group: records (mappings), an Arrow table or
        batch, or a polars or pandas DataFrame (pandas: NaN is a missing value, as pandas reads it)."""
        table = self._to_table(records)
        if self.validate:
            problems = contract_problems(table, self.kind, self.config)
            if problems:
                raise InputError(
                    f"{self.path}: record refused: {problems[0]}"
                    + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else "")
                )
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            assert self._schema is not None  # set by _to_table
            schema = self._schema.with_metadata({**(self._schema.metadata or {}), **self._meta})
            self._writer = pq.ParquetWriter(self._tmp, schema, compression=self.compression)
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self.rows_written += table.num_rows

    def close(self) -> Path:
        """Finish the file and move it to its final name."""
        if self._writer is None:
            raise InputError(f"{self.path}: nothing was written; refusing to publish an empty log")
        self._writer.close()
        self._writer = None
        _fsync_path(self._tmp)  # the data is on disk before the name points at it
        os.replace(self._tmp, self.path)
        _fsync_path(self.path.parent, directory=True)  # and the rename itself survives a power loss
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
        elif hasattr(records, "to_arrow"):  # a polars DataFrame: its Arrow table, no copy
            records = records.to_arrow()
        elif hasattr(records, "to_dict") and hasattr(records, "columns"):
            # a pandas DataFrame: its rows as records, typed by the contract as records are (Arrow's
            # own pandas conversion infers a mapping as a struct and an empty column as floats)
            records = [_plain(r) for r in records.to_dict("records")]
        if not isinstance(records, pa.Table):
            records = list(records)
            if not records:
                raise InputError("write() got no records")
            if self._schema is None:
                self._schema = schema_for_records(records, self.kind)
            try:
                records = pa.Table.from_pylist(records, schema=self._schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as e:
                raise InputError(f"{self.path}: record refused: {one_line(e)}") from None
        if self._schema is None:
            self._schema = canonical_schema(records.schema, self.kind)
        try:
            return records.select(self._schema.names).cast(self._schema)
        except (KeyError, pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
            raise InputError(f"{self.path}: batch does not match the file's schema: {one_line(e)}") from None


def _tokenizer_meta(tokenizer: Mapping) -> bytes:
    """The `rollout_log.tokenizer` metadata value, checked: a name string and/or a list of token texts."""
    unknown = set(tokenizer) - {"name", "vocabulary"}
    name, vocab = tokenizer.get("name"), tokenizer.get("vocabulary")
    if unknown or (name is not None and not isinstance(name, str)):
        raise InputError(
            f"tokenizer must be {{'name': str, 'vocabulary': [str]}}; got keys {sorted(map(str, tokenizer))}"
        )
    if vocab is not None and not (isinstance(vocab, (list, tuple)) and all(isinstance(w, str) for w in vocab)):
        raise InputError("tokenizer['vocabulary'] must be a list of strings, the text of each token id")
    d = {k: (list(v) if k == "vocabulary" else v) for k, v in tokenizer.items() if v is not None}
    return json.dumps(d, ensure_ascii=False).encode()


def _fsync_path(path: Path, directory: bool = False) -> None:
    """fsync a file or a directory by path (directories: POSIX only; skipped where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    except OSError:
        if directory:  # e.g. Windows cannot open a directory; the rename is still atomic there
            return
        raise
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def contract_problems(table: pa.Table, kind: str, config: Config | None = None) -> list[str]:
    """Structural problems of an in-memory batch, as messages (the writer refuses on any)."""
    f = memory_file(table, kind)
    targets, problems = schema_plan(f, kind, config.waived() if config is not None else ())
    if kind == "updates":
        return [f"S001 {c}: {p}" for c, p in problems]
    data, cast_problems = cast(table.select([c for c in table.column_names if c in targets]), targets)
    runner = Runner(config if config is not None else Config(), select=_VALIDATE)
    check_table(runner, Batch(data, f.path, 0, problems + cast_problems, None))
    msgs = [f"{c.code} check crashed: {c.error}" for c in runner.crashes]
    found = runner.findings_frame().filter(runner.findings_frame()["severity"] == "error")
    return msgs + [
        f"{r['code']} {r['message']}" + (f" (trajectory {r['trajectory_id']})" if r["trajectory_id"] else "")
        for r in found.iter_rows(named=True)
    ]


def write_table(
    path: str | os.PathLike,
    table: pa.Table,
    kind: str,
    validate: bool = True,
    config: Config | None = None,
    **declared: Any,
) -> None:
    """`table` as the contract log file `path` (RolloutWriter), with the columns the contract does not
    define appended afterwards as they are: a trainer's second per-token log-prob column (verl's
    `old_log_probs`), which L207 and L211 read when the configuration names it (`compare_logprobs`).
    `config`: what the writer validates under (the trainer's own stop reasons); `declared`: the
    producer's declarations RolloutWriter writes into the file (`tokenizer`, `reward_components`)."""
    known = {c.name for c in S.columns(kind)}
    extra = [c for c in table.column_names if c not in known]
    if not extra:
        with RolloutWriter(path, kind=kind, validate=validate, config=config, **declared) as w:
            w.write(table)
        return
    # the writer's file is staged under a name readers skip (a `watch` never sees it without its extra
    # columns), the extras appended, and the whole renamed into place at once
    final = Path(path)
    stage = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.staged.tmp")
    done = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        with RolloutWriter(stage, kind=kind, validate=validate, config=config, **declared) as w:
            w.write(table.drop_columns(extra))
        written = pq.read_table(stage)
        meta = written.schema.metadata
        for name in extra:
            written = written.append_column(name, table.column(name))
        pq.write_table(written.replace_schema_metadata(meta), done)
        os.replace(done, final)
    finally:
        stage.unlink(missing_ok=True)
        done.unlink(missing_ok=True)


def _plain(v: Any) -> Any:
    """A pandas cell as Python values: numpy arrays (pandas' list cells) as lists, scalars as Python's,
    and a float NaN as a missing value, which is what pandas means by it (a None in a float column
    becomes NaN; `pd.isna` reads both as missing). A tuple stays one: pandas reads a map cell of a
    Parquet file as a list of (key, value) tuples, the form Arrow takes back as a map."""
    if isinstance(v, float) and v != v:
        return None
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, tuple):
        return tuple(_plain(x) for x in v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    tolist = getattr(v, "tolist", None)  # a numpy array or scalar
    return _plain(tolist()) if tolist is not None and not isinstance(v, (str, bytes)) else v
