"""Groups and difficulty (G): how much relative signal the log's groups can carry, per task
(lessons “When a rollout group contains no relative signal” and “Difficulty bands and dynamic task filtering”). Statistics: info findings, and tables in the JSON summary."""

from __future__ import annotations

import polars as pl

from ..contract.registry import rule
from .common import num

DEGENERATE_SHARE = 0.5  # G701 reports a task when at least this share of its groups is degenerate
MIN_DEGENERATE = 2  # ... and at least this many: one degenerate group is not evidence about a task
OUTSIDE_SHARE = 0.5  # G702 fires when more than this share of tasks lies outside the band


def p_info(p: pl.Expr, g: pl.Expr) -> pl.Expr:
    """P_info = 1 − p^G − (1−p)^G: the probability that a group of G holds a success and a failure."""
    return 1.0 - p.pow(g) - (1.0 - p).pow(g)


def _scored(log, cfg) -> pl.DataFrame:
    """Trajectories that carry a reward (the ones training compares), with `_success` and the
    group key `_g` (group_id, else task_id)."""
    t = log.traj.filter(pl.col("reward").is_not_null() & pl.col("task_id").is_not_null())
    if "infra_error" in t.columns:
        t = t.filter(~pl.col("infra_error").fill_null(False))
    win = pl.col("reward") > 0
    success = pl.coalesce(pl.col("verifier_success"), win) if "verifier_success" in t.columns else win
    group = pl.coalesce(pl.col("group_id"), pl.col("task_id")) if "group_id" in t.columns else pl.col("task_id")
    return t.select(
        "task_id", pl.col("reward").cast(pl.Float64), success.cast(pl.Float64).alias("_success"), group.alias("_g")
    )


def _task_order(row: dict) -> tuple:
    """The order of G701's per-task table (polars sorts null task ids first)."""
    return (row["task_id"] is not None, row["task_id"] or "")


def _groups(t: pl.DataFrame, cfg) -> pl.DataFrame:
    """Per (task, group) of the scored trajectories `t`: its size and whether it is degenerate
    (every reward equal within atol)."""
    return t.group_by("task_id", "_g").agg(
        pl.len().alias("size"), ((pl.col("reward").max() - pl.col("reward").min()) <= cfg.atol).alias("degenerate")
    )


def _per_task(log, cfg) -> pl.DataFrame:
    """Per task: trajectories, groups, median group size G, success estimate p, P_info,
    expected groups to one informative comparison, observed and expected degenerate shares."""
    t = _scored(log, cfg)
    groups = _groups(t, cfg)
    per = (
        t.group_by("task_id")
        .agg(pl.len().alias("trajectories"), pl.col("_success").mean().alias("p"))
        .join(
            groups.group_by("task_id").agg(
                pl.len().alias("groups"),
                pl.col("size").median().alias("group_size"),
                pl.col("degenerate").mean().alias("degenerate_share"),
            ),
            on="task_id",
        )
        .with_columns(p_info(pl.col("p"), pl.col("group_size")).alias("p_info"))
    )
    return (
        per.with_columns(
            pl.when(pl.col("p_info") > 0).then(1.0 / pl.col("p_info")).alias("expected_groups"),
            (1.0 - pl.col("p_info")).alias("expected_degenerate_share"),
        )
        .select(
            "task_id",
            "trajectories",
            "groups",
            "group_size",
            "p",
            "p_info",
            "expected_groups",
            "degenerate_share",
            "expected_degenerate_share",
        )
        .sort("task_id")
    )


@rule(
    "G701",
    "degenerate groups per task",
    "info",
    scope="log",
    requires=("task_id", "reward"),
    optional=("infra_error", "verifier_success", "group_id"),
    config=("atol",),
    partition=("task_id",),
    merge=lambda parts, whys, findings: (sorted((r for p in parts if p for r in p), key=_task_order), None, findings),
)
def degenerate_groups(log, cfg) -> pl.DataFrame | None:
    """Share of degenerate groups per task, with the success estimate p, the group size G,
    P_info = 1 − p^G − (1−p)^G and the expected number of groups 1/P_info to one informative
    comparison.

    Lesson “When a rollout group contains no relative signal”: with binary reward a group of G trajectories carries relative signal only
    when it holds both a success and a failure; with p = 0.01 and G = 8, P_info ≈ 0.0773 and
    about 12.94 groups are needed per informative one. A larger learning rate does not help:
    zero relative signal times any step is zero. p is the task's mean verifier_success (reward
    > 0 where that is absent), over the trajectories with a reward; a group is the
    trajectories sharing group_id (task_id when absent); a group is degenerate when all its
    rewards are equal; G is the median group size. The full per-task table is in the summary
    statistics (`G701`); a task is reported when at least half of its groups, and at least two,
    are degenerate (one degenerate group says little about a task).
    Levers: larger groups, tasks of intermediate difficulty, more diverse decoding, partial
    verifiable feedback, or filtering zero-variance tasks.
    """
    per = _per_task(log, cfg)
    log.stats["G701"] = per.to_dicts()
    n_deg = (pl.col("degenerate_share") * pl.col("groups")).round(0).cast(pl.Int64)
    bad = per.filter((pl.col("degenerate_share") >= DEGENERATE_SHARE) & (n_deg >= MIN_DEGENERATE))
    if bad.is_empty():
        return None
    exp = (
        pl.when(pl.col("expected_groups").is_not_null())
        .then(num(pl.col("expected_groups").round(2)))
        .otherwise(pl.lit("never (P_info = 0)"))
    )
    return bad.select(
        pl.format(
            "task {}: {} of {} groups degenerate ({}%); estimated p = {} over {} trajectories, G = {}: "
            "P_info = 1 − p^G − (1−p)^G = {}, expected groups to one informative comparison: {}",
            "task_id",
            n_deg,
            "groups",
            num((pl.col("degenerate_share") * 100).round(1)),
            num(pl.col("p").round(4)),
            "trajectories",
            num(pl.col("group_size")),
            num(pl.col("p_info").round(4)),
            exp,
        ).alias("message")
    )


@rule(
    "G702",
    "global success rate hides tasks outside the difficulty band",
    "info",
    scope="log",
    requires=("task_id", "reward"),
    optional=("infra_error", "verifier_success", "group_id"),
    config=("difficulty_band",),
    partition=("task_id",),
    merge=lambda parts, whys, findings: _merge_band(parts),
)
def difficulty_band(log, cfg) -> pl.DataFrame | None:
    """A global success rate inside the difficulty band hides a majority of tasks that are
    nearly always solved or nearly never solved.

    Lesson “Difficulty bands and dynamic task filtering”: degeneracy must be computed per prompt. A global mean success of 0.5 can be
    a mixture of tasks with p = 0.01 and p = 0.99, where almost every group is degenerate and
    group-relative learning gets no signal. With band = configuration difficulty_band
    (low, high), default (0.05, 0.95), this fires when more than half of the tasks have
    p < low or p > high while the global rate is within the band (p per task as in G701).
    The numbers are in the summary statistics (`G702`). Sample more from tasks where both
    outcomes remain plausible, keep some easy and hard ones to monitor, and report the
    sampled distribution next to the original one.
    """
    low, high = cfg.difficulty_band
    t = _scored(log, cfg)
    per = t.group_by("task_id").agg(pl.col("_success").mean().alias("p"))
    if not per.height:
        return None
    log.stats["G702"] = {
        "scored": t.height,
        "successes": float(t["_success"].sum()),
        "band": [low, high],
        "tasks": per.height,
        "tasks_below_band": int((per["p"] < low).sum()),
        "tasks_above_band": int((per["p"] > high).sum()),
    }
    return _band(log.stats["G702"])


def _band(st: dict) -> pl.DataFrame | None:
    """G702's statistics completed from the counts, and its finding when it fires."""
    (low, high), n_tasks = st["band"], st["tasks"]
    near0, near1 = st["tasks_below_band"], st["tasks_above_band"]
    rate = st["successes"] / st["scored"] if st["scored"] else 0.0
    share = (near0 + near1) / n_tasks
    fires = share > OUTSIDE_SHARE and low <= rate <= high
    st.update(global_success_rate=rate, share_outside_band=share, hidden_by_global_rate=fires)
    if not fires:
        return None
    return pl.DataFrame(
        {
            "message": [
                f"global success rate {rate:.3f} is inside the band [{low}, {high}], but {near0 + near1} of {n_tasks} tasks "
                f"({share:.0%}) are outside it: {near0} with p < {low} (nearly never solved), {near1} with p > {high} "
                f"(nearly always solved); their groups are almost all degenerate"
            ]
        }
    )


def _merge_band(parts: list) -> tuple:
    """G702 over partitions by task: the counts add up, then the rate and the finding follow."""
    st = _summed(parts, ("scored", "successes", "tasks", "tasks_below_band", "tasks_above_band"))
    return (st, None, _band(st)) if st else (None, None, None)


def _summed(parts: list, keys: tuple[str, ...]) -> dict | None:
    """The counts of the partitions that have any, added up, with their band; None when none has."""
    parts = [p for p in parts if p]
    if not parts:
        return None
    return {**{k: sum(p[k] for p in parts) for k in keys}, "band": parts[0]["band"]}


@rule(
    "G703",
    "every group is degenerate while the success rate is inside the band",
    "warning",
    scope="log",
    requires=("task_id", "reward"),
    optional=("infra_error", "verifier_success", "group_id"),
    config=("atol", "difficulty_band"),
    partition=("task_id",),
    merge=lambda parts, whys, findings: _merge_degenerate(parts),
)
def all_groups_degenerate(log, cfg) -> pl.DataFrame | None:
    """Every group of the log is degenerate (all its rewards equal), although the verdicts say the
    tasks are neither always solved nor never solved: the global success rate is inside the
    difficulty band.

    Lesson “When a rollout group contains no relative signal”: a group carries signal only when its
    rewards differ. With successes and failures in the batch, a run where no group holds two
    different rewards has lost the signal between the verifier and the reward (alibaba/ROLL#397:
    reward normalisation zeroed every reward, and with it every advantage), and the update
    learns nothing while the success rate looks healthy. G701 lists degenerate groups per task
    as information; this is the log-wide case, a warning. Groups and success as in G701 (p is
    verifier_success, reward > 0 where absent; band = configuration difficulty_band); it needs
    at least two groups of two or more members. Check the reward after every transformation
    (normalisation, clipping, shaping) against the verdict it was computed from.
    """
    t = _scored(log, cfg)
    sized = _groups(t, cfg).filter(pl.col("size") >= 2)
    log.stats["G703"] = {
        "groups": sized.height,
        "degenerate": int(sized["degenerate"].sum()),
        "scored": t.height,
        "successes": float(t["_success"].sum()),
        "band": list(cfg.difficulty_band),
    }
    return _degenerate(log.stats["G703"])


def _degenerate(st: dict) -> pl.DataFrame | None:
    """G703's finding from its counts (a partition's, or the whole log's)."""
    low, high = st["band"]
    if st["groups"] < 2 or st["degenerate"] < st["groups"] or not st["scored"]:
        return None
    rate = st["successes"] / st["scored"]
    if not low <= rate <= high:
        return None
    return pl.DataFrame(
        {
            "message": [
                f"all {st['groups']} groups of two or more trajectories are degenerate (every reward equal within "
                f"the group), but the success rate is {rate:.3f}, inside the band [{low}, {high}]: "
                f"{int(st['successes'])} successes in {st['scored']} scored trajectories; no group carries relative signal"
            ]
        }
    )


def _merge_degenerate(parts: list) -> tuple:
    """G703 over partitions by task (a group never spans two tasks): the counts add up, then the finding follows."""
    st = _summed(parts, ("groups", "degenerate", "scored", "successes"))
    return (st, None, _degenerate(st)) if st else (None, None, None)
