"""Descriptive statistics of a log (`rollout-audit stats`): what is in it, before what is wrong."""

from __future__ import annotations

import polars as pl

from ..contract.schema import SOURCE_NAMES
from ..reading.log import Log
from .report import num, printable


def log_stats(log: Log) -> dict:
    """Counts, trainable share, stop causes, rewards, groups and policy versions, as a dict."""
    lf = log.trajectories
    names = lf.collect_schema().names()
    if "reward" not in names:  # no episode was rewarded (a producer leaves the column out)
        lf = lf.with_columns(pl.lit(None, pl.Float64).alias("reward"))
    out: dict = {}
    # a split episode's outcome is on its last segment: the others are not counted as episodes
    ends = ~pl.col("split_continues").fill_null(False) if "split_continues" in names else pl.lit(True)
    base = (
        lf.select(
            pl.len().alias("trajectories"),
            pl.col("token_ids").list.len().sum().alias("tokens"),
            pl.col("loss_mask").list.sum().sum().alias("trainable_tokens"),
            pl.col("turns").list.len().sum().alias("turns"),
            pl.col("reward").filter(ends).is_null().sum().alias("reward_null"),
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
    episodes = lf.filter(ends)
    out["stop_reasons"] = dict(
        episodes.group_by("stop_reason").len().sort("len", descending=True).collect().iter_rows()
    )
    if "split_from" in names:
        out["split_episodes"] = lf.select(pl.col("split_from").drop_nulls().n_unique()).collect().item()
    if "verifier_success" in names:
        out["success_rate"] = episodes.select(pl.col("verifier_success").mean()).collect().item()
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
                pl.col("reduction").drop_nulls().unique().sort().implode().alias("reductions"),
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
    lines.append("tokens by source: " + ", ".join(f"{printable(k)} {v}" for k, v in d["tokens_by_source"].items()))
    lines.append("stop reasons: " + ", ".join(f"{printable(k)} {v}" for k, v in d["stop_reasons"].items()))
    if d.get("split_episodes"):
        lines.append(f"split episodes: {d['split_episodes']} (each counted once, by its last segment)")
    rm = d["reward_mean"]
    lines.append(
        f"reward: mean {num(rm)}, std {num(d['reward_std'] or 0)}, null {d['reward_null']}"
        if rm is not None
        else f"reward: all null ({d['reward_null']})"
    )
    if "success_rate" in d and d["success_rate"] is not None:
        lines.append(f"verifier success rate: {num(d['success_rate'])}")
    g = d["groups"]
    if g["count"]:
        lines.append(
            f"groups ({printable(g['key'])}): {g['count']}, mean size {num(g['mean_size'])}, "
            f"degenerate share {num(g['degenerate_share'])}"
        )
    lines.append("turns by policy version: " + _versions(d["turns_by_policy_version"]))
    if "updates" in d:
        u = d["updates"]
        lines.append(
            f"updates: {u['updates']}, trajectory uses across epochs {u['trajectory_uses']} "
            f"({u['distinct_trajectories_used']} distinct), reductions {', '.join(map(printable, u['reductions']))}"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------ distributions for the HTML report

_QUANTILES = {"q05": 0.05, "q25": 0.25, "q50": 0.5, "q75": 0.75, "q95": 0.95}


def distributions(log: Log, max_rows: int = 12) -> dict:
    """The bounded summaries the report plots: per token source, per task, stop causes per policy
    version (at most `max_rows` rows each: tasks beyond it are pooled, versions are binned)."""
    return {
        "by_source": by_source(log),
        "tasks": task_outcomes(log, max_rows),
        "stops_by_version": stops_by_version(log, max_rows),
    }


def by_source(log: Log) -> list[dict]:
    """Per token source: tokens, trainable tokens, and the behaviour log-prob quantiles (those
    recorded, positive ones counted: a log-prob above 0 is no probability)."""
    names = log.trajectories.collect_schema().names()
    if "token_source" not in names:
        return []
    lists = [c for c in ("token_source", "loss_mask", "behavior_logprobs") if c in names]
    same = pl.all_horizontal([pl.col(c).list.len() == pl.col("token_source").list.len() for c in lists])
    toks = log.trajectories.select(lists).filter(same).explode(lists)  # only the lists it needs (not log.tokens)
    lp = pl.col("behavior_logprobs").cast(pl.Float64) if "behavior_logprobs" in names else pl.lit(None, pl.Float64)
    mask = pl.col("loss_mask").cast(pl.Int64) if "loss_mask" in names else pl.lit(0)
    x = pl.col("_lp")  # finite recorded log-probs; nulls are skipped by every aggregate below
    agg = (
        toks.with_columns(pl.when(lp.is_finite()).then(lp).alias("_lp"), (lp > 0).alias("_pos"), mask.alias("_m"))
        .group_by("token_source")
        .agg(
            pl.len().alias("tokens"),
            pl.col("_m").sum().alias("trainable"),
            x.count().alias("n"),
            x.min().alias("min"),
            x.max().alias("max"),
            pl.col("_pos").sum().alias("positive"),
            *[x.quantile(q, "nearest").alias(k) for k, q in _QUANTILES.items()],
        )
    )
    rows = agg.sort("token_source").collect().to_dicts()
    for r in rows:
        r["source"] = SOURCE_NAMES.get(r["token_source"], f"source {r['token_source']}")
    return rows


def task_outcomes(log: Log, max_rows: int) -> list[dict]:
    """Per task: episodes, verifier success rate, and the mean reward of successes and of failures
    (an inverted verifier pays failures more). The busiest tasks first; the rest pooled in one row."""
    lf = log.trajectories
    if "verifier_success" not in lf.collect_schema().names():
        return []
    ok = pl.col("verifier_success")
    t = lf.select(pl.col("task_id").cast(pl.String).fill_null("(null)"), ok, pl.col("reward").cast(pl.Float64))
    busiest = (
        t.group_by("task_id").len().sort(["len", "task_id"], descending=[True, False]).head(max_rows - 1)
    ).select("task_id", pl.lit(True).alias("_top"))
    per = (
        t.join(busiest, on="task_id", how="left")
        .with_columns(pl.when(pl.col("_top")).then(pl.col("task_id")).otherwise(pl.lit("(other tasks)")).alias("task"))
        .group_by("task")
        .agg(
            pl.len().alias("episodes"),
            ok.mean().alias("success_rate"),
            pl.col("reward").filter(ok).mean().alias("reward_success"),
            pl.col("reward").filter(~ok).mean().alias("reward_failure"),
            pl.col("task_id").n_unique().alias("tasks"),
        )
        .sort(pl.col("task") == "(other tasks)", pl.col("episodes"), pl.col("task"), descending=[False, True, False])
    )
    return per.collect().to_dicts()


def stops_by_version(log: Log, max_rows: int) -> list[dict]:
    """Stop causes per policy version of each episode's last turn; versions binned into at most
    `max_rows` equal ranges when there are more."""
    pv = pl.col("turns").list.eval(pl.element().struct.field("policy_version")).list.max()
    t = log.trajectories.select(pv.alias("v"), pl.col("stop_reason").cast(pl.String).fill_null("(null)")).collect()
    t = t.filter(pl.col("v").is_not_null())
    if t.is_empty():
        return []
    lo, hi = int(t["v"].min()), int(t["v"].max())  # type: ignore[arg-type]
    width = max(1, -(-(hi - lo + 1) // max_rows))
    start = (pl.col("v") - lo) // width * width + lo
    t = t.with_columns(start.alias("b0"), (start + width - 1).clip(upper_bound=hi).alias("b1"))
    counts = t.group_by("b0", "b1", "stop_reason").len().sort("b0")
    out: dict[tuple[int, int], dict[str, int]] = {}
    for b0, b1, why, n in counts.iter_rows():
        out.setdefault((b0, b1), {})[why] = n
    return [{"versions": f"v{a}" if a == b else f"v{a}–v{b}", "stops": d} for (a, b), d in out.items()]


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
