"""`rollout-audit diff A B`: what changed between two logs (two runs, or two steps of one log):
findings per code that appeared, disappeared or changed count, and the statistics that moved
beyond noise (a two-sided z score over trajectories, groups or update uses)."""

from __future__ import annotations

import math

import polars as pl

from ..reading.log import Log
from ..reporting.report import Report

Z_NOISE = 3.0  # |z| above this is a move, not sampling noise


def _moments(values: pl.Expr) -> list[pl.Expr]:
    return [values.count().alias("n"), values.mean().alias("mean"), values.std().alias("std")]


def profile(log: Log) -> dict[str, dict]:
    """Each statistic `diff` compares, as n (its sample size), mean and std: means of 0/1 values
    for shares. Keys: 'trainable share', 'stop <reason>', 'reward | <reason>', 'policy lag',
    'degenerate groups'."""
    lf = log.trajectories
    names = lf.collect_schema().names()
    out: dict[str, dict] = {}
    share = pl.col("loss_mask").list.sum() / pl.col("token_ids").list.len()
    out["trainable share"] = (
        lf.select(_moments(share.filter(pl.col("token_ids").list.len() > 0))).collect().to_dicts()[0]
    )
    stop = pl.col("stop_reason").cast(pl.String).fill_null("(null)")
    t = lf.select(stop.alias("stop"), pl.col("reward").cast(pl.Float64)).collect()
    for why in t["stop"].unique().sort():
        hit = (t["stop"] == why).cast(pl.Float64)
        out[f"stop {why}"] = {"n": t.height, "mean": hit.mean(), "std": hit.std()}
        r = t.filter(pl.col("stop") == why)["reward"].drop_nulls()
        if r.len():
            out[f"reward | {why}"] = {"n": r.len(), "mean": r.mean(), "std": r.std()}
    key = "group_id" if "group_id" in names else "task_id"
    g = (
        lf.filter(pl.col("reward").is_not_null())
        .group_by(key)
        .agg((pl.col("reward").max() == pl.col("reward").min()).cast(pl.Float64).alias("d"))
        .select(_moments(pl.col("d")))
        .collect()
    )
    out["degenerate groups"] = g.to_dicts()[0]
    if log.updates is not None:
        made = log.turns.group_by("trajectory_id").agg(pl.col("policy_version").min().alias("v"))
        uses = log.updates.select("trainer_version", pl.col("trajectory_ids").alias("trajectory_id")).explode(
            "trajectory_id"
        )
        lag = uses.join(made, on="trajectory_id").select(_moments(pl.col("trainer_version") - pl.col("v")))
        out["policy lag"] = lag.collect().to_dicts()[0]
    return {k: v for k, v in out.items() if v["n"]}


def _z(a: dict, b: dict) -> float | None:
    """Welch's z of the difference of two means (a share is the mean of 0/1 values); None when
    either side has no spread to measure noise by and the means are equal."""
    if a is None or b is None or a["mean"] is None or b["mean"] is None:
        return None
    var = (a["std"] or 0.0) ** 2 / a["n"] + (b["std"] or 0.0) ** 2 / b["n"]
    delta = b["mean"] - a["mean"]
    if var == 0:
        return 0.0 if delta == 0 else math.copysign(math.inf, delta)
    return delta / math.sqrt(var)


def _zero_stops(mine: dict[str, dict], other: dict[str, dict]) -> dict[str, dict]:
    """`mine` with a share of 0 for each stop cause only `other` has (over all of mine's trajectories)."""
    n = next((v["n"] for k, v in mine.items() if k.startswith("stop ")), 0)
    extra = {k: {"n": n, "mean": 0.0, "std": 0.0} for k in other if k.startswith("stop ") and k not in mine}
    return {**mine, **extra} if n else mine


def compare_stats(a: dict[str, dict], b: dict[str, dict], z_noise: float = Z_NOISE) -> list[dict]:
    """One row per statistic on either side: its value in A and in B, the z score, and `moved`."""
    a, b = _zero_stops(a, b), _zero_stops(b, a)
    rows = []
    for k in sorted(set(a) | set(b)):
        za = _z(a.get(k), b.get(k))  # type: ignore[arg-type]
        rows.append(
            {
                "stat": k,
                "a": a[k]["mean"] if k in a else None,
                "b": b[k]["mean"] if k in b else None,
                "n_a": a[k]["n"] if k in a else 0,
                "n_b": b[k]["n"] if k in b else 0,
                "z": None if za is None or math.isinf(za) else round(za, 2),
                "moved": za is None and (k in a) != (k in b) or (za is not None and abs(za) > z_noise),
            }
        )
    return rows


def compare_findings(a: Report, b: Report) -> dict[str, list[dict]]:
    """Per code: appeared (only in B), disappeared (only in A), changed (count differs)."""

    def counts(r: Report) -> pl.DataFrame:
        return r.findings.group_by("code").agg(pl.len().alias("n"), pl.col("severity").first())

    j = counts(a).join(counts(b), on="code", how="full", coalesce=True, suffix="_b").sort("code")
    out: dict[str, list[dict]] = {"appeared": [], "disappeared": [], "changed": []}
    for code, na, sa, nb, sb in j.select("code", "n", "severity", "n_b", "severity_b").iter_rows():
        row = {"code": code, "severity": sb or sa, "a": na or 0, "b": nb or 0}
        if na is None:
            out["appeared"].append(row)
        elif nb is None:
            out["disappeared"].append(row)
        elif na != nb:
            out["changed"].append(row)
    return out


def diff(a_path: list, b_path: list, rep_a: Report, rep_b: Report, z_noise: float = Z_NOISE) -> dict:
    """The whole comparison, as the JSON output gives it."""
    from ..reading.log import scan

    f = compare_findings(rep_a, rep_b)
    new_errors = sum(
        r["b"] - r["a"] for r in f["appeared"] + f["changed"] if r["severity"] == "error" and r["b"] > r["a"]
    )
    return {
        "a": [str(p) for p in a_path],
        "b": [str(p) for p in b_path],
        "findings": f,
        "new_errors": new_errors,
        "z_noise": z_noise,
        "stats": compare_stats(profile(scan(a_path)), profile(scan(b_path)), z_noise),
        "verdicts": {"a": rep_a.exit_code(), "b": rep_b.exit_code()},
    }


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def render_diff(d: dict, every: bool = False) -> str:
    """Text: the findings that changed, the statistics that moved (all with `every`), then a verdict line."""
    lines = [f"A: {', '.join(d['a'])}", f"B: {', '.join(d['b'])}"]
    f = d["findings"]
    for kind in ("appeared", "disappeared", "changed"):
        for r in f[kind]:
            lines.append(f"{kind:<11} {r['code']} [{r['severity']}] {r['a']} -> {r['b']}")
    moved = [s for s in d["stats"] if s["moved"] or every]
    for s in moved:
        z = "" if s["z"] is None else f" (z {s['z']:+.1f})"
        tag = "moved" if s["moved"] else "held"
        lines.append(f"{tag:<11} {s['stat']}: {_fmt(s['a'])} -> {_fmt(s['b'])}{z}")
    n_changed = sum(len(v) for v in f.values())
    n_moved = sum(s["moved"] for s in d["stats"])
    verdict = "FAIL" if d["new_errors"] else "ok"
    lines.append(
        f"{verdict}: {d['new_errors']} new error finding{'s' if d['new_errors'] != 1 else ''}; "
        f"{n_changed} code{'s' if n_changed != 1 else ''} changed; {n_moved} of {len(d['stats'])} statistics "
        f"moved beyond noise (|z| > {d['z_noise']:g})"
    )
    return "\n".join(lines)
