"""pandera models of the per-trajectory and per-turn frames the audit works on.

They are importable so a pipeline can validate its own frames (`TrajectoryFrame.validate(df,
lazy=True)`); the audit validates each batch's per-trajectory frame with them (S001: values
outside the contract's domain). Always validate a collected DataFrame: pandera on a polars
LazyFrame checks the schema only and silently skips data checks.
"""

from __future__ import annotations

import pandera.polars as pa
import polars as pl


def _finite_or_null(data: pa.PolarsData) -> pl.LazyFrame:
    c = pl.col(data.key)
    return data.lazyframe.select(c.is_null() | c.is_finite())


class TrajectoryFrame(pa.DataFrameModel):
    """One row per trajectory: the scalar columns of the contract plus recomputed counts."""

    trajectory_id: str | None = pa.Field(nullable=False)
    reward: float | None = pa.Field(nullable=True)
    gamma: float | None = pa.Field(nullable=True, gt=0.0, le=1.0)
    discounted_return: float | None = pa.Field(nullable=True)
    final_value: float | None = pa.Field(nullable=True)
    wall_clock_s: float | None = pa.Field(nullable=True, ge=0.0)
    num_trainable_tokens: int | None = pa.Field(nullable=True, ge=0)
    n_tokens: int | None = pa.Field(nullable=True, ge=0)
    n_src_invalid: int | None = pa.Field(nullable=True, eq=0)

    @pa.check("reward", "discounted_return", "final_value", "gamma", name="finite")
    def finite(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return _finite_or_null(data)

    class Config:
        strict = False
        coerce = True


class TurnFrame(pa.DataFrameModel):
    """One row per turn: the turn struct's fields plus recomputed per-turn values."""

    trajectory_id: str | None = pa.Field(nullable=True)
    turn_id: int | None = pa.Field(nullable=True, ge=0)
    policy_version: int | None = pa.Field(nullable=True, ge=0)
    temperature: float | None = pa.Field(nullable=True, ge=0.0)
    top_p: float | None = pa.Field(nullable=True, gt=0.0, le=1.0)
    num_policy_tokens: int | None = pa.Field(nullable=True, ge=0)
    context_length: int | None = pa.Field(nullable=True, ge=0)
    logprob: float | None = pa.Field(nullable=True)
    reward: float | None = pa.Field(nullable=True)
    shaping: float | None = pa.Field(nullable=True)
    value: float | None = pa.Field(nullable=True)
    td_residual: float | None = pa.Field(nullable=True)
    potential_before: float | None = pa.Field(nullable=True)
    potential_after: float | None = pa.Field(nullable=True)

    @pa.check(
        "reward", "shaping", "value", "td_residual", "logprob", "potential_before", "potential_after", name="finite"
    )
    def finite(cls, data: pa.PolarsData) -> pl.LazyFrame:
        return _finite_or_null(data)

    @pa.check("temperature", name="not infinite")
    def not_infinite(cls, data: pa.PolarsData) -> pl.LazyFrame:
        """An infinite temperature samples uniformly: no engine logs it (NaN is left to its own warning)."""
        c = pl.col(data.key)
        return data.lazyframe.select(c.is_null() | c.is_nan() | c.is_finite())

    class Config:
        strict = False
        coerce = True


def domain_problems(model: type[pa.DataFrameModel], df: pl.DataFrame, limit: int = 200) -> pl.DataFrame:
    """Rows of `df` that break `model`, as (row index, column, check, failure value)."""
    import pandera.errors as pe

    cols = [c for c in model.to_schema().columns if c in df.columns]
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
