"""pandera schemas of the per-trajectory and per-turn frames the audit works on, built from the
value domains of `schemas/rollout_log_v1.json` (a column's `domain`).

They are importable so a pipeline can validate its own frames (`TrajectoryFrame.validate(df,
lazy=True)`); the audit validates each batch's per-trajectory frame with them (S001: values
outside the contract's domain). Always validate a collected DataFrame: pandera on a polars
LazyFrame checks the schema only and silently skips data checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandera.polars as pa
import polars as pl

from . import schema as S


def _finite_or_null(data: pa.PolarsData) -> pl.LazyFrame:
    c = pl.col(data.key)
    return data.lazyframe.select(c.is_null() | c.is_finite())


def _not_infinite(data: pa.PolarsData) -> pl.LazyFrame:
    c = pl.col(data.key)
    return data.lazyframe.select(c.is_null() | c.is_nan() | c.is_finite())


_CHECKS: dict[str, Callable[[Any], pa.Check]] = {
    "ge": pa.Check.ge,
    "gt": pa.Check.gt,
    "le": pa.Check.le,
    "eq": pa.Check.eq,
}


def _dtype(type_: str) -> type[pl.DataType]:
    if type_.startswith("float"):
        return pl.Float64
    if type_.startswith(("int", "uint")):
        return pl.Int64
    return pl.String


def frame_model(table: str, extra: dict[str, dict[str, Any]] | None = None) -> pa.DataFrameSchema:
    """The pandera schema of one table's values: every column with a value domain in
    `schemas/rollout_log_v1.json` (and the `extra` recomputed ones), nullable, coerced."""
    types = {c.name: c.type for c in S.columns(table)}
    doms = {**S.domains(table), **(extra or {})}
    cols = {}
    for name, bounds in doms.items():
        checks = [_CHECKS[k](v) for k, v in bounds.items() if k in _CHECKS]
        if bounds.get("finite"):
            checks.append(pa.Check(_finite_or_null, name="finite"))
        if bounds.get("not_infinite"):  # NaN is allowed here: another check warns about it
            checks.append(pa.Check(_not_infinite, name="not infinite"))
        cols[name] = pa.Column(
            _dtype(types.get(name, "int64")), checks=checks, nullable=True, coerce=True, required=False
        )
    return pa.DataFrameSchema(cols, strict=False, coerce=True, name=f"{table} values")


TrajectoryFrame = frame_model("trajectories", S.RECOMPUTED_DOMAINS)  # one row per trajectory
TurnFrame = frame_model("turn")  # one row per turn (the turn struct's fields)


def domain_problems(model: pa.DataFrameSchema, df: pl.DataFrame, limit: int = 200) -> pl.DataFrame:
    """Rows of `df` that break `model`, as (row index, column, check, failure value)."""
    import pandera.errors as pe

    cols = [c for c in model.columns if c in df.columns]
    if not cols:
        return pl.DataFrame(schema={"index": pl.Int64, "column": pl.String, "check": pl.String, "value": pl.String})
    try:
        model.validate(df.select(cols), lazy=True)
    except pe.SchemaErrors as e:
        fc = e.failure_cases
        fc = pl.DataFrame(fc) if not isinstance(fc, pl.DataFrame) else fc
        return fc.select(
            pl.col("index").cast(pl.Int64),
            pl.col("column").cast(pl.String),
            pl.col("check").cast(pl.String),
            pl.col("failure_case").cast(pl.String).alias("value"),
        ).head(limit)
    return pl.DataFrame(schema={"index": pl.Int64, "column": pl.String, "check": pl.String, "value": pl.String})
