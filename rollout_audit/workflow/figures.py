"""Per-step audit figures for a trainer's logger (W&B, TensorBoard, JSON Lines): findings by
severity and family, trainable share, policy lag, and the replay gap when replay ran."""

from __future__ import annotations

import polars as pl

from ..contract.registry import FAMILIES
from ..reporting.report import Report

PREFIX = "audit/"


def trainable_share(trajectories: pl.DataFrame | pl.LazyFrame) -> float | None:
    """Loss-mask tokens over all tokens of the trajectories (None when there is no token, or the
    log lacks either column: S001 reports that)."""
    lf = trajectories.lazy()
    if not {"loss_mask", "token_ids"} <= set(lf.collect_schema().names()):
        return None
    row = lf.select(
        pl.col("loss_mask").list.sum().sum().alias("m"), pl.col("token_ids").list.len().sum().alias("n")
    ).collect()
    m, n = row["m"][0], row["n"][0]
    return float(m) / float(n) if n else None


def audit_figures(rep: Report, share: float | None = None, prefix: str = PREFIX) -> dict[str, float]:
    """Flat name -> number: `audit/errors`, `audit/errors/M` (each family), the same for warnings,
    `audit/exit_code`, `audit/trainable_share`, `audit/policy_lag_max` and `audit/policy_lag_mean`
    (P503), `audit/replay_gap_mean` and `audit/replay_gap_max` (L205, when replay ran)."""
    out: dict[str, float] = {f"{prefix}exit_code": float(rep.exit_code())}
    fam = rep.findings.select(pl.col("code").str.slice(0, 1).alias("f"), "severity")
    for sev in ("error", "warning"):
        mine = fam.filter(pl.col("severity") == sev)
        out[f"{prefix}{sev}s"] = float(mine.height)
        counts = dict(mine.group_by("f").len().iter_rows())
        for letter in FAMILIES:
            out[f"{prefix}{sev}s/{letter}"] = float(counts.get(letter, 0))
    if share is not None:
        out[f"{prefix}trainable_share"] = share
    stats = rep.summary.get("statistics", {})
    hist = stats.get("P503", {}).get("lag_histogram") or {}
    if hist:
        total = sum(hist.values())
        out[f"{prefix}policy_lag_mean"] = sum(int(k) * v for k, v in hist.items()) / total
        out[f"{prefix}policy_lag_max"] = float(max(int(k) for k in hist))
    replay = [r for r in stats.get("L205", []) or [] if r.get("mean") is not None]
    if replay:
        n = sum(r["n"] for r in replay)
        out[f"{prefix}replay_gap_mean"] = sum(r["mean"] * r["n"] for r in replay) / n
        out[f"{prefix}replay_gap_max"] = max(r["max"] for r in replay if r["max"] is not None)
    return out
