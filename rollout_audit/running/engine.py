"""The audit engine: derive a reading plan from what the selected checks declare, hand the
audit to an executor (which reads through `reading.batches` and runs the checks through the
runner), and gather everything into a Report. The engine holds no knowledge of any particular
check, and none of any particular executor."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import polars as pl
import pyarrow as pa

from ..contract.config import Config, find_config
from ..reading.batches import why_unusable
from ..reading.io import Discovery, discover
from ..reading.read import memory_file, read_updates
from . import distributed  # noqa: F401  (registers the `ray` executor)
from .executors import Work, executor
from .memory import tune_allocator
from .options import Options
from .report import Report, build_report
from .runner import Runner, plan


def run_audit(disc: Discovery, cfg: Config | None = None, options: Options | None = None, **fields: Any) -> Report:
    """Audit the files of `disc` (Parquet files, or in-memory tables held by `LogFile`s) as
    `options` say (keyword `fields` of Options replace its values; see Options)."""
    cfg = cfg or Config()
    opts = replace(options, **fields) if options is not None else Options(**fields)
    run = executor(opts.executor_name, **opts.executor_options)
    if opts.tune:
        tune_allocator()
    runner = Runner(cfg, opts.select, opts.ignore, rules=opts.rules)
    for f in disc.files:
        runner.declare(f.schema.metadata)
    broken = list(disc.broken)
    updates = read_updates(disc.of_kind("updates"), broken, cfg.max_row_group_bytes)
    work = Work(
        disc,
        runner,
        plan(runner),
        cfg,
        opts.batch_rows,
        broken,
        updates,
        tune=opts.tune,
        select=opts.select or None,
        ignore=opts.ignore or None,
        rules=opts.rules,
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


def audit_tables(
    trajectories: Any = None,
    updates: Any = None,
    *,
    config: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> Report:
    """Audit in-memory tables (pyarrow Tables, polars DataFrames, or lists of dicts)."""
    return run_audit(memory_discovery(trajectories, updates), config, select=select, ignore=ignore)


def audit(
    source: Any,
    updates: Any = None,
    *,
    config: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    ray: str | bool | None = None,
    executor: Any = "threads",
    workers: int = 1,
) -> Report:
    """Audit a path (file or directory, local or `s3://`, `gs://`), a list of paths, a scanned
    `Log`, or in-memory tables. `executor` names where the checks run (`threads`, with `workers`
    batches at once; `ray`; or an executor object: see running.executors); `ray=True` (or a
    cluster address) is short for the `ray` executor.

    The configuration of a path is found as `rollout-audit check` finds it: the nearest
    `pyproject.toml` with a `[tool.rollout-audit]` table at or above the (first) path. `config=`
    replaces it. In-memory tables use `config=` or the defaults.

    A training loop can call `audit(batch_table, update_table)` before the optimizer step.
    """
    from ..reading.log import Log

    opts = Options(select=tuple(select or ()), ignore=tuple(ignore or ()), ray=ray, executor=executor, workers=workers)
    if isinstance(source, Log):
        return run_audit(source.discovery, config, opts)
    if isinstance(source, (str, os.PathLike)) or (
        isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source)
    ):
        paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if config is None:
            config = find_config(None, start=os.fspath(paths[0]))[0]
        return run_audit(discover(paths), config, opts)
    return run_audit(memory_discovery(source, updates), config, opts)
