"""The catalogue's recomputations as pandera checks, for a pipeline that validates its own frames.

    from rollout_audit.validation import trajectory_schema
    trajectory_schema(updates=updates_df).validate(trajectories_df, lazy=True)

raises `pandera.errors.SchemaErrors` whose failure cases hold the contract's failures
(`rollout_audit.contract.models.TrajectoryFrame`) and, per check code, the rows of the frame whose
trajectory `rollout-audit check` flags with that code. Each pandera check runs the catalogue's own
rule functions through the one audit (`session.run`), once per frame validated: there is no second
implementation. A finding that names no trajectory (an update record's, a file's) fails its check
for the frame as a whole. A check whose inputs the frame lacks is not run and does not fail.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandera.polars as pa
import polars as pl

from .contract.config import Config
from .contract.models import contract_model
from .running.options import Options

__all__ = ["audit_checks", "trajectory_schema"]


class _Audit:
    """The audit of the frame being validated, run once and shared by every code's check."""

    def __init__(self, updates: Any, config: Config | None, select: Sequence[str]) -> None:
        self.updates, self.config, self.select = updates, config, tuple(select)
        self._last: tuple[int, pl.DataFrame, pl.DataFrame] | None = None

    def findings(self, frame: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
        """(the frame's findings, the frame with a row index) for the frame `frame`."""
        if self._last is not None and self._last[0] == id(frame):
            return self._last[1], self._last[2]
        from .session import Request, run

        cfg = self.config if self.config is not None else Config().with_source("rollout_audit.validation")
        rep = run(
            Request(
                source=frame.to_arrow(),
                updates=self.updates,
                config=cfg,
                options=Options(select=self.select),
                use_baseline=False,
            )
        ).report
        found = rep.findings.select("code", "trajectory_id")
        self._last = (id(frame), found, frame)
        return found, frame


def audit_checks(updates: Any = None, *, config: Config | None = None, select: Sequence[str] = ()) -> list[pa.Check]:
    """One dataframe-level pandera check per code of the catalogue (or of `select`): a row fails the
    check of a code when the audit of the frame (with `updates`, under `config`) reports that code on
    the row's trajectory."""
    from .checks import all_rules

    rules = all_rules()
    codes = sorted(c for c in rules if not select or any(c.startswith(s) for s in select))
    audit = _Audit(updates, config, codes)
    frames: dict[int, pl.DataFrame] = {}

    def for_code(code: str) -> pa.Check:
        def holds(data: pa.PolarsData) -> Any:
            lf = data.lazyframe
            frame = frames.get(id(lf))
            if frame is None:
                frames.clear()
                frame = frames[id(lf)] = lf.collect()
            found, _ = audit.findings(frame)
            mine = found.filter(pl.col("code") == code)
            if mine.is_empty():
                return True
            placed = mine["trajectory_id"].drop_nulls()
            if placed.len() < mine.height or "trajectory_id" not in frame.columns:
                return False  # a finding on no trajectory: the frame fails as a whole
            return lf.select(~pl.col("trajectory_id").is_in(placed.implode()).alias(code))

        return pa.Check(holds, name=code, error=f"{code}: {rules[code].name}")

    return [for_code(c) for c in codes]


def trajectory_schema(
    updates: Any = None,
    *,
    config: Config | None = None,
    select: Sequence[str] = (),
    extra_stop_reasons: Mapping[str, str] | None = None,
) -> pa.DataFrameSchema:
    """`TrajectoryFrame` (the contract) with the catalogue's checks (`audit_checks`)."""
    extra = extra_stop_reasons if extra_stop_reasons is not None else (config.extra_stop_reasons if config else None)
    return contract_model(
        "trajectories",
        extra_stop_reasons=extra,
        checks=audit_checks(updates, config=config, select=select),
    )
