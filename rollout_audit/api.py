"""The library's audit: `audit` and `audit_tables` give the verdict `rollout-audit check` gives on
the same log under the same configuration. The checks run (running.engine.run_audit), then the
configuration's tolerated rates (`tolerated_share`) and its baseline (`baseline`) settle the
report, as on the command line (workflow.policy.settle)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import reporting  # noqa: F401  (registers the report's output formats)
from .contract.config import Config, find_config
from .reading import storage
from .reading.io import Discovery, discover
from .reading.log import Log
from .running.engine import memory_discovery, run_audit
from .running.options import Options
from .running.report import Report
from .workflow.policy import settle, trajectory_ids

__all__ = ["audit", "audit_tables"]


def _paths(source: Any) -> list | None:
    """`source` as a list of paths, or None when it is not a path or a list of paths."""
    if isinstance(source, (str, os.PathLike)):
        return [source]
    if isinstance(source, (list, tuple)) and source and all(isinstance(s, (str, os.PathLike)) for s in source):
        return list(source)
    return None


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
    baseline: str | Path | None = None,
) -> Report:
    """Audit a path (file or directory, local or `s3://`, `gs://`), a list of paths, a scanned
    `Log`, or in-memory tables. `executor` names where the checks run (`threads`, with `workers`
    batches at once; `ray`; or an executor object: see running.executors); `ray=True` (or a
    cluster address) is short for the `ray` executor.

    The configuration of a path is found as `rollout-audit check` finds it: the nearest
    `pyproject.toml` with a `[tool.rollout-audit]` table at or above the (first) path. `config=`
    replaces it. In-memory tables use `config=` or the defaults. Its `tolerated_share` and its
    `baseline` (a relative path is read from the configuration file's directory; of a Config made
    in code, from the working directory) apply as in `check`; `baseline=` replaces the latter,
    as `check --baseline FILE` does.

    A training loop can call `audit(batch_table, update_table)` before the optimizer step.
    """
    opts = Options(select=select or (), ignore=ignore or (), ray=ray, executor=executor, workers=workers)
    config_file = None
    paths = _paths(source)
    disc: Discovery
    if isinstance(source, Log):
        disc = source.discovery
    elif paths is not None:
        if config is None:
            config, config_file = find_config(None, start=os.fspath(paths[0]))
        storage.set_timeouts(config.storage_connect_timeout, config.storage_request_timeout)
        disc = discover(paths)
    else:
        disc = memory_discovery(source, updates)
    cfg = config or Config().with_source("defaults")
    return settle(run_audit(disc, cfg, opts), cfg, config_file, lambda: trajectory_ids(disc), baseline)


def audit_tables(
    trajectories: Any = None,
    updates: Any = None,
    *,
    config: Config | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
) -> Report:
    """Audit in-memory tables (pyarrow Tables, polars DataFrames, or lists of dicts) under `config`
    (or the defaults), its tolerated rates and baseline included."""
    return audit(trajectories, updates, config=config, select=select, ignore=ignore)
