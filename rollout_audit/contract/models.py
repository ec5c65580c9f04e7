"""pandera (polars backend) models of the contract's tables, built from `schemas/rollout_log_v1.json`.

`TrajectoryFrame`, `TurnFrame` and `UpdateFrame` enforce the contract on a pipeline's frame:
required columns, types (other integer and float widths are coerced), nullability, unique
trajectory ids, value domains, known stop reasons and exactly one stop flag per episode.
`TrajectoryValues` and `TurnValues` hold the value domains alone: the audit validates each batch
with them (S001: values outside the contract's domain). The catalogue's recomputations, as pandera
checks, are in `rollout_audit.validation`. Always validate a collected DataFrame: pandera on a
polars LazyFrame checks the schema only and silently skips data checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pandera.polars as pa
import polars as pl
import pyarrow

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


TrajectoryValues = frame_model("trajectories", S.RECOMPUTED_DOMAINS)  # one row per trajectory
TurnValues = frame_model("turn")  # one row per turn (the turn struct's fields)

# required columns that may hold nulls, as the contract says of each
_NULLABLE_REQUIRED = {"reset_seed", "behavior_logprobs", "reward"}


def _type_check(expected: pyarrow.DataType, name: str) -> pa.Check:
    """The column holds the contract's values in some storage form the audit reads as `expected`
    (`schema.compatible`: other integer and float widths, large, view and dictionary layouts)."""

    def holds(data: pa.PolarsData) -> bool:
        dtype = data.lazyframe.collect_schema()[data.key]
        found = pl.Series([], dtype=dtype).to_arrow().type
        return S.compatible(found, expected)

    return pa.Check(holds, name=f"type {name}", error=f"expected {name}")


def _one_stop_cause(data: pa.PolarsData) -> pl.LazyFrame:
    flags = [pl.col(f).fill_null(False).cast(pl.Int8) for f in S.STOP_FLAGS]
    return data.lazyframe.select((pl.sum_horizontal(flags) == 1).alias("one stop cause"))


def contract_model(
    table: str, *, extra_stop_reasons: Mapping[str, str] | None = None, checks: list[pa.Check] | None = None
) -> pa.DataFrameSchema:
    """The pandera model of one contract table ("trajectories", "turn" or "updates"): every column
    of the contract with its type, required columns present and (unless the contract allows it)
    without nulls, trajectory ids unique, the value domains, and for trajectories a known
    `stop_reason` (with `extra_stop_reasons`, as the configuration's) and exactly one stop flag
    set. `checks`: more dataframe-level checks (the catalogue's, `rollout_audit.validation`)."""
    doms = {**S.domains(table), **(S.RECOMPUTED_DOMAINS if table == "trajectories" else {})}
    cols = {}
    for c in S.columns(table):
        bounds = doms.get(c.name, {})
        col_checks = [_CHECKS[k](v) for k, v in bounds.items() if k in _CHECKS]
        if bounds.get("finite"):
            col_checks.append(pa.Check(_finite_or_null, name="finite"))
        if bounds.get("not_infinite"):
            col_checks.append(pa.Check(_not_infinite, name="not infinite"))
        if c.name == "stop_reason":
            known = sorted({*S.stop_reasons(), *(extra_stop_reasons or {})})
            col_checks.append(pa.Check.isin(known, name="known stop_reason"))
        required = c.requirement == "R"
        col_checks.insert(0, _type_check(c.arrow_type, c.type))
        cols[c.name] = pa.Column(
            None,  # the type is checked by _type_check: other widths and storage forms of the values pass
            checks=col_checks,
            nullable=not required or c.name in _NULLABLE_REQUIRED,
            unique=c.name == "trajectory_id",
            required=required,
        )
    frame_checks = list(checks or [])
    if table == "trajectories":
        frame_checks.insert(0, pa.Check(_one_stop_cause, name="one stop cause"))
    return pa.DataFrameSchema(cols, checks=frame_checks, strict=False, name=f"rollout log {table}")


TrajectoryFrame = contract_model("trajectories")  # one row per trajectory
TurnFrame = contract_model("turn")  # one row per turn (the turn struct's fields)
UpdateFrame = contract_model("updates")  # one row per update record


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


__all__ = [
    "TrajectoryFrame",
    "TrajectoryValues",
    "TurnFrame",
    "TurnValues",
    "UpdateFrame",
    "contract_model",
    "domain_problems",
    "frame_model",
]
