"""The audit engine: derive a reading plan from what the selected checks declare, hand the
audit to an executor (which reads through `reading.batches` and runs the checks through the
runner), and gather everything into a Report. The engine holds no knowledge of any particular
check, and none of any particular executor."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import polars as pl
import pyarrow as pa

from ..contract.config import Config
from ..reading.batches import why_unusable
from ..reading.io import Discovery
from ..reading.read import believed, memory_file, read_updates
from . import distributed  # noqa: F401  (registers the `ray` executor)
from .executors import Work, executor
from .memory import tune_allocator
from .options import Options
from .report import Report, build_report
from .runner import Runner, plan


def run_audit(disc: Discovery, cfg: Config | None = None, options: Options | None = None, **fields: Any) -> Report:
    """Audit the files of `disc` (Parquet files, or in-memory tables held by `LogFile`s) as
    `options` say (keyword `fields` of Options replace its values; see Options)."""
    cfg = cfg or Config().with_source("defaults")
    opts = replace(options, **fields) if options is not None else Options(**fields)
    run = executor(opts.executor_name, **opts.executor_options)
    if opts.tune:
        tune_allocator()
    runner = Runner(cfg, opts.select, opts.ignore, rules=opts.rules)
    for f in disc.files:
        runner.declare(f.schema.metadata, believed(f, cfg.waived()))
    broken = list(disc.broken)
    # an executor that reads the update records in its own tasks (`reads_updates`) gets None
    reads = getattr(run, "reads_updates", False)
    updates = None if reads else read_updates(disc.of_kind("updates"), broken, cfg.max_row_group_bytes, cfg.waived())
    work = Work(
        disc,
        runner,
        plan(runner),
        cfg,
        opts.batch_rows,
        broken,
        updates,
        tune=opts.tune,
        select=tuple(opts.select) or None,
        ignore=tuple(opts.ignore) or None,
        rules=opts.rules,
        pipeline=opts.pipeline and (os.cpu_count() or 1) > 1,
    )
    done = run.run(work)
    usable = None if done.rows else why_unusable(disc, broken)
    return build_report(runner, rows=done.rows, tokens=done.tokens, stats=done.stats, cfg=cfg, unusable=usable)


def _to_arrow(x: Any, kind: str = "trajectories") -> pa.Table | None:
    if x is None or isinstance(x, pa.Table):
        return x
    if isinstance(x, pa.RecordBatch):
        return pa.Table.from_batches([x])
    if isinstance(x, pl.DataFrame):
        return x.to_arrow()
    if isinstance(x, pl.LazyFrame):
        return x.collect().to_arrow()
    if isinstance(x, list):
        from ..reading.records import records_to_table

        return records_to_table(x, kind)
    raise TypeError(f"cannot audit an object of type {type(x).__name__}")


def memory_discovery(trajectories: Any = None, updates: Any = None) -> Discovery:
    """In-memory tables (pyarrow, polars, or lists of dicts) as the files of a log."""
    disc = Discovery()
    for x, kind in ((trajectories, "trajectories"), (updates, "updates")):
        t = _to_arrow(x, kind)
        if t is not None:
            disc.files.append(memory_file(t, kind))
    return disc
