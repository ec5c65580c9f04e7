"""A trainer's dump as a contract log: convert its records with the framework's adapter, and audit
them as a log of files (what `check --from` and `convert` run), so that everything a path audit can
do works on a dump too (replay reads the files again) and every finding names the dump record its
trajectory came from (`dump.jsonl:17`), not a temporary file."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa

from ..checks.environment import VERSIONS
from ..contract.errors import AdapterError
from . import load
from .base import META_ORIGINS, META_POLICY, read_dump

IDENTITY = (*VERSIONS, "reset_seed")  # what E801 asks for: each one a context key of every adapter

if TYPE_CHECKING:
    from ..contract.config import Config
    from ..reporting.report import Report


@dataclass(frozen=True)
class Converted:
    """Contract tables converted from dump files, and the dump record of each trajectory row."""

    trajectories: pa.Table
    updates: pa.Table | None
    origins: list[str | None]  # per trajectory row: "FILE:LINE" of the record it was built from
    sources: tuple[str, ...]  # the dump paths, as given
    policy: str | None = None  # the trainer policy the adapter assumed (from the trainer's configuration)
    settings: Mapping[str, Any] = field(default_factory=dict)  # the audit settings that policy implies

    def configured(self, cfg: Config) -> Config:
        """`cfg` with the settings of the trainer's policy, for every key the configuration does not set."""
        update = {k: v for k, v in self.settings.items() if k not in cfg.model_fields_set}
        return cfg.model_copy(update=update) if update else cfg

    def tables(self) -> tuple[pa.Table, pa.Table | None]:
        """The tables without the origins (what a contract log file holds)."""
        return _plain(self.trajectories), None if self.updates is None else _plain(self.updates)


def _plain(table: pa.Table) -> pa.Table:
    meta = {k: v for k, v in (table.schema.metadata or {}).items() if k not in (META_ORIGINS, META_POLICY)}
    return table.replace_schema_metadata(meta)


def convert(framework: str, paths: Sequence[str | os.PathLike], context: Mapping[str, Any]) -> Converted:
    """The dump files at `paths` as contract tables, through the adapter of `framework`."""
    adapter = load(framework)
    records = [r for p in paths for r in read_dump(p)]
    try:
        trajectories = adapter.to_contract(records, **context)
        upd = getattr(adapter, "updates", None)
        updates = upd(records, **context) if upd else None
    except AdapterError as e:  # a message that names no dump file names the one(s) converted
        if any(str(p) in str(e) for p in paths):
            raise
        raise AdapterError(f"{', '.join(str(p) for p in paths)}: {e}") from None
    raw = (trajectories.schema.metadata or {}).get(META_ORIGINS)
    origins = json.loads(raw) if raw else [None] * trajectories.num_rows
    policy = json.loads((trajectories.schema.metadata or {}).get(META_POLICY) or b"{}")
    sources = tuple(str(p) for p in paths)
    return Converted(trajectories, updates, origins, sources, policy.get("said"), policy.get("settings", {}))


@contextmanager
def as_log(conv: Converted) -> Iterator[str]:
    """The converted tables written as a contract log in a private temporary directory, removed on
    exit whatever happens; yields its path."""
    from ..writer import RolloutWriter

    root = Path(tempfile.mkdtemp(prefix="rollout-audit-from-"))
    try:
        for kind, table in zip(("trajectories", "updates"), conv.tables()):
            if table is not None and table.num_rows:
                (root / kind).mkdir()
                with RolloutWriter(root / kind / "part-0000.parquet", kind=kind, validate=False) as w:
                    w.write(table)
        yield str(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def relabel(rep: Report, conv: Converted, root: str) -> Report:
    """`rep` of the log `as_log` wrote, with each finding naming the dump record of its trajectory
    (or the dump files, for a finding on no trajectory) instead of the temporary files."""
    dump = ", ".join(conv.sources)
    ids = conv.trajectories.column("trajectory_id").to_pylist() if conv.trajectories.num_rows else []
    where = pl.DataFrame(
        {"trajectory_id": [None if i is None else str(i) for i in ids], "_origin": conv.origins},
        schema={"trajectory_id": pl.String, "_origin": pl.String},
    ).unique("trajectory_id", keep="first")
    f = rep.findings
    inside = pl.col("file").str.starts_with(root)
    named = (
        f.join(where, on="trajectory_id", how="left", nulls_equal=False)
        if f.height
        else f.with_columns(pl.lit(None, pl.String).alias("_origin"))
    )
    rep.findings = _context_hint(
        named.with_columns(
            pl.when(inside).then(pl.coalesce("_origin", pl.lit(dump))).otherwise(pl.col("file")).alias("file")
        ).drop("_origin")
    )

    def text(s: Any) -> Any:
        return s.replace(root, dump) if isinstance(s, str) else s

    rep.not_run = {k: text(v) for k, v in rep.not_run.items()}
    rep.partial = {k: text(v) for k, v in rep.partial.items()}
    rep.unfulfilled = {k: text(v) for k, v in rep.unfulfilled.items()}
    rep.crashes = [{k: text(v) for k, v in c.items()} for c in rep.crashes]
    if rep.unusable is not None:
        rep.unusable = text(rep.unusable)
    if conv.policy:
        rep.summary["trainer_policy"] = conv.policy
        rep.summary["trainer_policy_settings"] = dict(conv.settings)
    return rep


def _context_hint(findings: pl.DataFrame) -> pl.DataFrame:
    """E801 on a dump names the `--context KEY=VALUE` that supplies each identity it found missing:
    a trainer's dump seldom records them, and the context is how the audit is told."""
    if findings.is_empty():
        return findings
    said = [
        pl.when(pl.col("message").str.contains(key, literal=True)).then(pl.lit(f"--context {key}=..."))
        for key in IDENTITY
    ]
    hint = pl.concat_str(said, separator=" ", ignore_nulls=True)
    return findings.with_columns(
        pl.when((pl.col("code") == "E801") & (hint != ""))
        .then(pl.concat_str([pl.col("message"), pl.lit("; pass "), hint]))
        .otherwise(pl.col("message"))
        .alias("message")
    )


__all__ = ["Converted", "as_log", "convert", "relabel"]
