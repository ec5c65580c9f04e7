"""Descriptive statistics of a log (`rollout-audit stats`): what is in it, before what is wrong."""

from __future__ import annotations

import polars as pl

from .log import Log
from .schema import SOURCE_NAMES


def log_stats(log: Log) -> dict:
    """Counts, trainable share, stop causes, rewards, groups and policy versions, as a dict."""
    lf = log.trajectories
    names = lf.collect_schema().names()
    out: dict = {}
    base = (
        lf.select(
            pl.len().alias("trajectories"),
            pl.col("token_ids").list.len().sum().alias("tokens"),
            pl.col("loss_mask").list.sum().sum().alias("trainable_tokens"),
            pl.col("turns").list.len().sum().alias("turns"),
            pl.col("reward").is_null().sum().alias("reward_null"),
            pl.col("reward").mean().alias("reward_mean"),
            pl.col("reward").std().alias("reward_std"),
        )
        .collect()
        .to_dicts()[0]
    )
    base["trainable_share"] = (base["trainable_tokens"] / base["tokens"]) if base["tokens"] else None
    out.update(base)
    src = lf.select(pl.col("token_source").explode()).group_by("token_source").len().sort("token_source").collect()
    out["tokens_by_source"] = {SOURCE_NAMES.get(s, str(s)): n for s, n in src.iter_rows()}
    out["stop_reasons"] = dict(lf.group_by("stop_reason").len().sort("len", descending=True).collect().iter_rows())
    if "verifier_success" in names:
        out["success_rate"] = lf.select(pl.col("verifier_success").mean()).collect().item()
    key = "group_id" if "group_id" in names else "task_id"
    g = (
        lf.filter(pl.col("reward").is_not_null())
        .group_by(key)
        .agg(pl.len().alias("n"), (pl.col("reward").max() == pl.col("reward").min()).alias("degenerate"))
        .collect()
    )
    out["groups"] = {
        "key": key,
        "count": g.height,
        "mean_size": g["n"].mean() if g.height else None,
        "degenerate_share": g["degenerate"].mean() if g.height else None,
    }
    pv = log.turns.group_by("policy_version").len().sort("policy_version").collect()
    out["turns_by_policy_version"] = {int(v): n for v, n in pv.iter_rows() if v is not None}
    ups = log.updates
    if ups is not None:
        u = (
            ups.select(
                pl.len().alias("updates"),
                pl.col("trajectory_ids").list.len().sum().alias("trajectory_uses"),
                pl.col("trajectory_ids").explode().n_unique().alias("distinct_trajectories_used"),
                pl.col("reduction").unique().alias("reductions"),
            )
            .collect()
            .to_dicts()[0]
        )
        out["updates"] = u
    return out


def render_stats(d: dict) -> str:
    lines = [
        f"trajectories {d['trajectories']}, turns {d['turns']}, tokens {d['tokens']}, "
        f"trainable {d['trainable_tokens']} ({(d['trainable_share'] or 0):.1%})"
    ]
    lines.append("tokens by source: " + ", ".join(f"{k} {v}" for k, v in d["tokens_by_source"].items()))
    lines.append("stop reasons: " + ", ".join(f"{k} {v}" for k, v in d["stop_reasons"].items()))
    rm = d["reward_mean"]
    lines.append(
        f"reward: mean {rm:.4g}, std {(d['reward_std'] or 0):.4g}, null {d['reward_null']}"
        if rm is not None
        else f"reward: all null ({d['reward_null']})"
    )
    if "success_rate" in d and d["success_rate"] is not None:
        lines.append(f"verifier success rate: {d['success_rate']:.3f}")
    g = d["groups"]
    if g["count"]:
        lines.append(
            f"groups ({g['key']}): {g['count']}, mean size {g['mean_size']:.2f}, "
            f"degenerate share {g['degenerate_share']:.3f}"
        )
    lines.append("turns by policy version: " + _versions(d["turns_by_policy_version"]))
    if "updates" in d:
        u = d["updates"]
        lines.append(
            f"updates: {u['updates']}, trajectory uses across epochs {u['trajectory_uses']} "
            f"({u['distinct_trajectories_used']} distinct), reductions {', '.join(map(str, u['reductions']))}"
        )
    return "\n".join(lines)


MAX_VERSION_BINS = 8


def _versions(by_version: dict[int, int]) -> str:
    """Turns per policy version, one entry per version up to MAX_VERSION_BINS, else in that many
    ranges of consecutive versions ('v0-9 812, v10-19 790, …')."""
    items = sorted(by_version.items())
    if len(items) <= MAX_VERSION_BINS:
        return ", ".join(f"v{k} {v}" for k, v in items)
    size = -(-len(items) // MAX_VERSION_BINS)
    bins = [items[i : i + size] for i in range(0, len(items), size)]
    return f"{len(items)} versions, v{items[0][0]}-{items[-1][0]}: " + ", ".join(
        f"v{b[0][0]}-{b[-1][0]} {sum(n for _, n in b)}" for b in bins
    )
