"""The library's audit: `audit` and `audit_tables` give the verdict `rollout-audit check` gives on
the same request, through the same session (rollout_audit.session)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import (
    reporting,  # noqa: F401  (registers the report's output formats)
    session,
)
from .contract.config import Config
from .running.options import Options
from .running.report import Report

__all__ = ["audit", "audit_tables"]


def audit(
    source: Any,
    updates: Any = None,
    *,
    config: Config | None = None,
    config_file: str | os.PathLike | None = None,
    select: Sequence[str] | None = None,
    ignore: Sequence[str] | None = None,
    ray: str | bool | None = None,
    executor: Any = "threads",
    workers: int = 1,
    baseline: str | Path | None = None,
    framework: str | None = None,
    context: dict[str, Any] | None = None,
    replay: int | None = None,
) -> Report:
    """Audit a path (file or directory, local or `s3://`, `gs://`), a list of paths, a scanned
    `Log`, or in-memory tables. `executor` names where the checks run (`threads`, with `workers`
    batches at once; `ray`; or an executor object: see running.executors); `ray=True` (or a
    cluster address) is short for the `ray` executor. `framework`: the paths are that trainer's
    dump (as `check --from`), with `context` for what it does not record.

    The configuration of a path is found as `rollout-audit check` finds it: the nearest
    `pyproject.toml` with a `[tool.rollout-audit]` table at or above the (first) path.
    `config_file=` (as `--config`) or `config=` (a Config made in code) layer the user's settings
    over the keys that came with the log. In-memory tables use `config=` or the defaults. Its
    `tolerated_share` and its `baseline` (a relative path is read from the configuration file's
    directory; of a Config made in code, from the working directory) apply as in `check`;
    `baseline=` replaces the latter, as `check --baseline FILE` does.

    A training loop can call `audit(batch_table, update_table)` before the optimizer step.
    """
    opts = Options(select=select or (), ignore=ignore or (), ray=ray, executor=executor, workers=workers)
    request = session.Request(
        source=source,
        updates=updates,
        framework=framework,
        context=context or {},
        config_file=config_file,
        config=config,
        replay=replay,
        options=opts,
        baseline=baseline,
    )
    return session.run(request).report


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
