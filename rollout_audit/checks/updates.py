"""Updates and reduction (U): what each optimizer update claims about its batch, recomputed
from the trajectories it names (docs/contract.md, update records; lessons “Trainable-token masks and signal dilution”, “Trajectory-, turn-, and token-level reduction”, “When a rollout group contains no relative signal”).

All checks work on one frame with a row per (update, batch member), built once per audit by
exploding `trajectory_ids` (and, aligned by index, `advantages`) and joining the
per-trajectory summary of the log. Group statistics are polars `over()` windows on it.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from ..contract import schema as S
from ..contract.registry import BY_UPDATE, rule
from ..frames.batch import derived
from .common import beyond, num, tolerance

REDUCTIONS = ("token", "token_window", "turn", "trajectory", "seq_mean_token_sum", "seq_mean_token_mean", "constant")
PER_SEQUENCE = ("trajectory", "seq_mean_token_sum", "seq_mean_token_mean")  # D = s * B
ESTIMATORS = ("grpo", "grpo_no_std", "rloo", "reinforce", "grpo_population_std")
REDUCER_MODES = tuple(S.contract()["reducer_modes"])  # contract 1.4: what a loss reducer divides by
RATIO_ANCHORS = tuple(S.contract()["ratio_anchors"])
RATIO_CORRECTIONS = tuple(S.contract()["ratio_corrections"])
# What each check reads through the shared frames (`members`, `_per_update`, `_group_stats`):
# a frame is built from the inputs of the check that asks for it (absent ones are null), and
# cached per set of declared inputs, so checks that declare the same set share one build.
_MEMBERSHIP = ("trajectory_id", "updates.update_step", "updates.trajectory_ids")
DENOMINATOR_INPUTS = (
    *_MEMBERSHIP,
    "n_trainable",
    "n_tokens",
    "n_policy",
    "n_turns_trainable",
    "n_turns",
    "ok",
    "updates.reduction",
    "updates.loss_denominator",
    "updates.denominator_scale",
    "updates.window_trajectory_ids",
    "updates.window_tokens",
)
ADVANTAGE_INPUTS = (
    *_MEMBERSHIP,
    "task_id",
    "group_id",
    "reward",
    "updates.advantages",
    "updates.advantage_estimator",
    "updates.window_trajectory_ids",
    "split_continues",
    "split_from",
)
EXCLUSION_INPUTS = (
    *_MEMBERSHIP,
    "reward",
    "truncated",
    "infra_error",
    "stop_reason",
    "loss_excluded",
    "split_continues",
    "split_from",
)


@derived("n_turns_trainable", ("turns", "loss_mask", "token_turn"))
def turns_trainable(b, t) -> pl.Series | None:
    """Per trajectory: its turns holding at least one trainable token (the count a turn-level
    reduction divides by)."""
    if not {"loss_mask", "token_turn"} <= t.lists:
        return None
    rc = next((s for s in t.turn_values if s.name == "rc_n_trainable"), None)
    if rc is None:
        return None
    trainable = (rc > 0).fill_null(False).to_numpy()
    return pl.Series(np.bincount(b.turn_parent, weights=trainable, minlength=b.n).astype(np.int64))


def _trained_versions(b, t, how: str) -> pl.Series | None:
    """Per trajectory: the lowest (`how` "min") or highest ("max") policy_version of its turns that
    hold a trainable token (a turn whose tokens are all masked trains nothing, whatever sampled it)."""
    if not {"loss_mask", "token_turn"} <= t.lists:
        return None
    rc = next((s for s in t.turn_values if s.name == "rc_n_trainable"), None)
    tr = b.turn_struct
    if rc is None or "policy_version" not in tr.columns:
        return None
    pv = pl.DataFrame({"_row": b.turn_parent, "_pv": tr["policy_version"].cast(pl.Int64)}).filter(
        (rc > 0).fill_null(False)
    )
    agg = pv.group_by("_row").agg(getattr(pl.col("_pv"), how)())
    rows = pl.DataFrame({"_row": np.arange(b.n, dtype=np.int64)})
    return rows.join(agg, on="_row", how="left", maintain_order="left")["_pv"]


@derived("pv_trained_min", ("turns", "turns.policy_version", "loss_mask", "token_turn"))
def trained_version_min(b, t) -> pl.Series | None:
    """Per trajectory: the oldest policy version that sampled a trainable token."""
    return _trained_versions(b, t, "min")


@derived("pv_trained_max", ("turns", "turns.policy_version", "loss_mask", "token_turn"))
def trained_version_max(b, t) -> pl.Series | None:
    """Per trajectory: the newest policy version that sampled a trainable token."""
    return _trained_versions(b, t, "max")


# the update columns the update checks read, null where the log lacks one
UPDATE_READS = (
    ("update_step", pl.Int64),
    ("reduction", pl.String),
    ("loss_denominator", pl.Float64),
    ("advantages", pl.List(pl.Float64)),
    ("advantage_estimator", pl.String),
    ("file", pl.String),
    ("denominator_scale", pl.Float64),
    ("window_trajectory_ids", pl.List(pl.String)),
    ("window_tokens", pl.Float64),
    ("trainer_version", pl.Int64),  # absent only where the producer declared it not recorded (else S005)
    ("reducer_mode", pl.String),
    ("reducer_divisor", pl.Float64),
    ("ratio_anchor", pl.String),
    ("ratio_anchor_version", pl.Int64),
    ("ratio_correction", pl.String),
    ("ratio_clipping", pl.Boolean),
)


def _step() -> pl.Expr:
    return pl.format("update {}", pl.col("update_step").cast(pl.String).fill_null("?"))


def _updates(log) -> pl.DataFrame:
    """The update records with a stable index `_u` and every column the update checks read
    (null where the log lacks it or the asking check did not declare it). Built in one query and
    cached per view: the update checks each ask for it several times."""
    if "update_records" in log.cache:
        return log.cache["update_records"]
    u = log.updates
    missing = [pl.lit(None, dtype=dt).alias(name) for name, dt in UPDATE_READS if name not in u.columns]
    out = (
        u.lazy()
        .with_row_index("_u")
        .with_columns(pl.col("_u").cast(pl.Int64), *missing)
        .with_columns(pl.col("trajectory_ids").fill_null(pl.lit([], dtype=pl.List(pl.String))))
        .collect()
    )
    log.cache["update_records"] = out
    return out


def _traj(log) -> pl.DataFrame:
    """Per-trajectory inputs of the update checks, one row per trajectory_id. Built in one query
    and cached per view, as `_updates`."""
    if "update_trajectories" in log.cache:
        return log.cache["update_trajectories"]
    t = log.traj
    want = {
        "task_id": pl.String,
        "group_id": pl.String,
        "reward": pl.Float64,
        "truncated": pl.Boolean,
        "infra_error": pl.Boolean,
        "stop_reason": pl.String,
        "loss_excluded": pl.Boolean,
        "split_continues": pl.Boolean,
        "split_from": pl.String,
        "n_trainable": pl.Int64,
        "n_tokens": pl.Int64,
        "n_policy": pl.Int64,
        "n_turns_trainable": pl.Int64,
        "ok": pl.Boolean,
    }
    if "trajectory_id" not in t.columns:
        return pl.DataFrame(schema={"trajectory_id": pl.String, **want})
    has_turns = "n_turns" in t.columns
    t = t.lazy().with_columns(pl.lit(None, dtype=dt).alias(c) for c, dt in want.items() if c not in t.columns)
    turns_ok = pl.col("ok").fill_null(False)
    if has_turns:  # a trajectory without turns has no row in the per-turn summary
        turns_trainable = pl.col("n_turns_trainable").fill_null(pl.when(pl.col("n_turns") == 0).then(0))
    else:
        turns_trainable = pl.col("n_turns_trainable")
    t = t.with_columns(pl.col("split_from").cast(pl.String), pl.col("split_continues").cast(pl.Boolean))
    # a segment that does not end its split episode is trained with the episode's reward, which its
    # last segment carries (contract 1.2): read it there
    last = (
        t.filter(pl.col("split_from").is_not_null() & ~pl.col("split_continues").fill_null(False))
        .unique("split_from", keep="first")
        .select("split_from", pl.col("reward").cast(pl.Float64).alias("_episode_reward"))
    )
    t = t.join(last, on="split_from", how="left", maintain_order="left").with_columns(
        pl.when(pl.col("split_continues").fill_null(False))
        .then(pl.col("_episode_reward"))
        .otherwise(pl.col("reward").cast(pl.Float64))
        .alias("reward")
    )
    out = (
        t.filter(pl.col("trajectory_id").is_not_null())
        .unique("trajectory_id", keep="first", maintain_order=True)
        .select(
            "trajectory_id",
            *[pl.col(c).cast(dt) for c, dt in want.items() if c != "n_turns_trainable"],
            pl.when(turns_ok).then(turns_trainable.cast(pl.Int64)).alias("n_turns_trainable"),
        )
        .collect()
    )
    log.cache["update_trajectories"] = out
    return out


def members(log) -> pl.DataFrame:
    """One row per (update, batch member): `_u`, `_k` (index in the batch), the update's
    step/file/reduction/estimator, the recorded advantage `adv` and `_aligned` (the update's
    advantages list has one entry per trajectory id), `_in_log`, the member's
    summary columns and its group key `_g` (group_id, else task_id). Cached per LogView."""
    if "update_members" in log.cache:
        return log.cache["update_members"]
    u = _updates(log)
    head = ["_u", "update_step", "file", "reduction", "advantage_estimator"]
    aligned = (pl.col("advantages").list.len() == pl.col("trajectory_ids").list.len()).fill_null(False)
    ex = (
        u.select(
            *head,
            aligned.alias("_aligned"),
            pl.col("trajectory_ids").alias("trajectory_id"),
            pl.int_ranges(0, pl.col("trajectory_ids").list.len()).alias("_k"),
        )
        .explode("trajectory_id", "_k")
        .filter(pl.col("_k").is_not_null())
    )
    adv = (
        u.filter(pl.col("advantages").is_not_null())
        .select("_u", pl.col("advantages").alias("adv"), pl.int_ranges(0, pl.col("advantages").list.len()).alias("_k"))
        .explode("adv", "_k")
        .filter(pl.col("_k").is_not_null())
    )
    t = _traj(log).with_columns(pl.lit(True).alias("_in_log"))
    m = (
        ex.join(adv, on=["_u", "_k"], how="left")
        .join(t, on="trajectory_id", how="left")
        .with_columns(pl.col("_in_log").fill_null(False), pl.coalesce("group_id", "task_id").alias("_g"))
    )
    log.cache["update_members"] = m
    return m


def _per_update(log) -> pl.DataFrame:
    """Per update: batch size and the recomputed sums the denominators are made of."""
    m = members(log)
    known = pl.col("_in_log") & pl.col("ok").fill_null(False)
    agg = m.group_by("_u").agg(
        pl.len().alias("B"),
        known.all().alias("all_known"),
        pl.col("n_trainable").sum().alias("sum_trainable"),
        pl.col("n_turns_trainable").sum().alias("sum_turns"),
        pl.col("n_turns_trainable").is_null().any().alias("turns_unknown"),
        pl.col("n_tokens").sum().alias("sum_tokens"),
        pl.col("n_policy").sum().alias("sum_policy"),
    )
    return (
        _updates(log)
        .select("_u", "update_step", "file", "reduction", "loss_denominator", "denominator_scale", "window_tokens")
        .join(agg, on="_u", how="left")
        .join(_windows(log), on="_u", how="left")
        .with_columns(
            pl.col("B").fill_null(0),
            pl.col("all_known").fill_null(True),
            pl.col("turns_unknown").fill_null(False),
            *[pl.col(c).fill_null(0) for c in ("sum_trainable", "sum_turns", "sum_tokens", "sum_policy")],
        )
        .with_columns(
            pl.col("loss_denominator").cast(pl.Float64), pl.col("denominator_scale").fill_null(1.0).alias("_s")
        )
    )


def _windows(log) -> pl.DataFrame:
    """Per update naming a window (contract 1.1 `token_window`): its size and trainable-token
    sum recomputed from the log, and whether every window member is in the log and readable."""
    u = _updates(log).filter(pl.col("window_trajectory_ids").is_not_null())
    w = u.select("_u", pl.col("window_trajectory_ids").alias("trajectory_id")).explode("trajectory_id")
    t = _traj(log).select("trajectory_id", "n_trainable", pl.col("ok").fill_null(False).alias("_ok"))
    return (
        w.join(t, on="trajectory_id", how="left")
        .group_by("_u")
        .agg(
            pl.len().alias("W"),
            pl.col("_ok").fill_null(False).all().alias("w_known"),
            pl.col("n_trainable").sum().alias("w_trainable"),
        )
    )


def _sample(df: pl.DataFrame, limit: int = 200) -> list[dict]:
    """At most about `limit` evenly spaced rows, as dicts: the recorded-vs-recomputed points the report plots."""
    return df.gather_every(max(1, -(-df.height // limit))).to_dicts()


def merge_samples(parts: list, whys: list, findings):
    """The samples of the partitions of the update records as one: in update order (steps kept
    in their record order), thinned to about the same size as one audit's sample."""
    rows = pl.DataFrame([r for p in parts if p for r in p], infer_schema_length=None)
    if not rows.height:
        return [], None, findings
    rows = rows.sort("update_step", nulls_last=True, maintain_order=True)
    return _sample(rows), None, findings


def _differs(found: pl.Expr, expected: pl.Expr, cfg) -> pl.Expr:
    """True where found is not within tolerance of expected (NaN and null found count as different)."""
    return beyond(found, expected, cfg).fill_null(False)


# ------------------------------------------------------------------ U601, U602: denominators


@rule(
    "U601",
    "loss_denominator differs from the recomputed one",
    scope="log",
    requires=("updates", "trajectory_id", "updates.reduction", "updates.loss_denominator"),
    optional=DENOMINATOR_INPUTS,
    config=("atol", "rtol"),
    partition=BY_UPDATE,
    merge=merge_samples,
)
def denominator(log, cfg) -> pl.DataFrame | None:
    """An update's loss_denominator differs from the one recomputed for its declared reduction.

    Lesson “Trajectory-, turn-, and token-level reduction”: the same token losses give different gradients depending on what they are
    averaged over, so the statistical unit must be stated and the denominator checked.
    Recomputed from the trajectories the update names, times the declared denominator_scale s
    (1 when absent; contract 1.1, formulas in `schemas/`): `token` -> s·Σ_i |I_i|, the trainable
    (loss_mask true) tokens of the batch; `token_window` -> s·Σ_{i∈W} |I_i| over the
    window_trajectory_ids W (or s·window_tokens when the window is given as a count: TRL's
    dapo divides by the generation batch's tokens × GA / steps_per_generation); `turn` ->
    s·Σ_i T_i, the turns with at least one trainable token; `trajectory`, `seq_mean_token_sum`,
    `seq_mean_token_mean` -> s·B, the batch size; `constant` -> s·B when denominator_scale is
    recorded, else any positive finite value. A mismatch names recorded/expected. A non-finite
    or null denominator, or an unknown reduction, is always a finding (an update over an empty
    batch recomputes to 0). Updates whose batch (or window) names a trajectory missing from
    the log (U605) or with malformed token lists (S003) are not recomputed for token, window
    and turn reductions. A token denominator that also
    counts tokens the policy did not sample raises U602 as well, which names the dilution
    factor: both are the same defect seen from two sides (wrong value, and in which
    direction). A token or token_window denominator recorded as s·1 where the count is 0 is
    accepted: trainers clamp the count to at least 1 on a window with no trainable token (TRL
    `clamp(min=1.0)`), and the loss is 0 either way. Fix the trainer to divide by the count of
    its declared reduction, or declare the reduction it actually uses.
    """
    u = _per_update(log)
    d = pl.col("loss_denominator")
    red = pl.col("reduction")
    sc = pl.col("_s")
    window = pl.when(pl.col("W").is_not_null()).then(pl.col("w_trainable").cast(pl.Float64)).otherwise("window_tokens")
    base = (
        pl.when(red == "token")
        .then(pl.col("sum_trainable").cast(pl.Float64))
        .when(red == "token_window")
        .then(window)
        .when(red == "turn")
        .then(pl.col("sum_turns").cast(pl.Float64))
        .when(red.is_in(PER_SEQUENCE) | ((red == "constant") & pl.col("denominator_scale").is_not_null()))
        .then(pl.col("B").cast(pl.Float64))
    )
    recomputable = (
        pl.when(red.is_in(PER_SEQUENCE) | (red == "constant"))
        .then(True)
        .when(red == "turn")
        .then(pl.col("all_known") & ~pl.col("turns_unknown"))
        .when(red == "token_window")
        .then(
            pl.when(pl.col("W").is_not_null())
            .then(pl.col("w_known").fill_null(False))
            .otherwise(pl.col("window_tokens").is_not_null())
        )
        .otherwise(pl.col("all_known"))
    )
    what = (
        pl.when(red == "token")
        .then(pl.format("Σ trainable tokens over {} trajectories", "B"))
        .when(red == "token_window")
        .then(
            pl.when(pl.col("W").is_not_null())
            .then(pl.format("Σ trainable tokens over the {} trajectories of the window", "W"))
            .otherwise(pl.lit("the declared window_tokens"))
        )
        .when(red == "turn")
        .then(pl.format("Σ turns with a trainable token over {} trajectories", "B"))
        .otherwise(pl.lit("the batch size"))
    )
    what = pl.when(sc != 1.0).then(pl.format("{} × denominator_scale {}", what, num(sc))).otherwise(what)
    u = u.with_columns((base * sc).alias("_exp"), recomputable.alias("_rc"))
    log.stats["U601"] = _sample(
        u.filter(pl.col("_rc") & pl.col("_exp").is_not_null()).select(
            "update_step", "reduction", pl.col("loss_denominator").alias("recorded"), pl.col("_exp").alias("expected")
        )
    )
    counted = red.is_in(REDUCTIONS).fill_null(False) & pl.col("_exp").is_not_null()
    not_finite = d.is_null() | ~d.is_finite().fill_null(False)
    bad_constant = (red == "constant").fill_null(False) & (not_finite | ~(d > 0).fill_null(False))
    unknown = red.is_null() | ~red.is_in(REDUCTIONS).fill_null(False)
    no_window = (red == "token_window").fill_null(False) & pl.col("W").is_null() & pl.col("window_tokens").is_null()
    clamped = red.is_in(("token", "token_window")).fill_null(False) & (pl.col("_exp") == 0) & (d == sc)
    mismatch = counted & pl.col("_rc") & _differs(d, pl.col("_exp"), cfg) & ~clamped.fill_null(False)
    factor = pl.when(pl.col("_exp") > 0).then(
        pl.format(" (recorded/expected = {})", num((d / pl.col("_exp")).round(3)))
    )
    msg = (
        pl.when(unknown)
        .then(
            pl.format(
                "{}: reduction {} is not one of {}; the denominator cannot be checked",
                _step(),
                red.fill_null("null"),
                pl.lit(", ".join(REDUCTIONS)),
            )
        )
        .when(no_window)
        .then(
            pl.format(
                "{} (reduction token_window): neither window_trajectory_ids nor "
                "window_tokens is recorded; the denominator cannot be checked",
                _step(),
            )
        )
        .when(bad_constant | (counted & not_finite))
        .then(pl.format("{} (reduction {}): loss_denominator {} is not a positive finite number", _step(), red, num(d)))
        .when(mismatch)
        .then(
            pl.format(
                "{} (reduction {}): loss_denominator {} recorded, expected {} = {}{}",
                _step(),
                red,
                num(d),
                num(pl.col("_exp")),
                what,
                factor.fill_null(""),
            )
        )
    )
    out = u.select("file", msg.alias("message")).filter(pl.col("message").is_not_null())
    return out if out.height else None


@rule(
    "U602",
    "loss_denominator counts tokens the policy did not sample",
    scope="log",
    requires=("updates", "trajectory_id", "updates.reduction", "updates.loss_denominator"),
    optional=DENOMINATOR_INPUTS,
    config=("atol", "rtol"),
    partition=BY_UPDATE,
)
def diluted_denominator(log, cfg) -> pl.DataFrame | None:
    """A token-reduced update divides by more tokens than the policy sampled: the denominator
    counts observation, tool, template or prompt tokens.

    Lesson “Trainable-token masks and signal dilution”: the loss mask both removes gradients on tokens the policy did not choose and
    defines the normalisation. If the policy generated 40 tokens and the environment added 290,
    dividing by 330 instead of 40 scales each policy token's gradient down by 330/40 = 8.25,
    and not uniformly: verbose tool output shrinks the update of the episodes it appears in,
    although the policy does not control its length. Fires for reduction `token` when the
    recorded denominator exceeds both the recomputed trainable count Σ_i |I_i| and the count of
    policy-sampled tokens (so it must include tokens the policy did not sample); the finding
    names the dilution factor denominator / trainable and, when it matches, the count it
    equals (every token of the sequences). U601 fires on the same update (the value is wrong);
    this finding says how. Fix the trainer to normalise by the masked policy-token count.
    """
    u = _per_update(log).filter((pl.col("reduction") == "token") & pl.col("all_known") & (pl.col("B") > 0))
    d = pl.col("loss_denominator")
    tr = pl.col("sum_trainable").cast(pl.Float64)
    over = lambda e: ~(d <= e * pl.col("_s") + tolerance(e, cfg)).fill_null(True)
    bad = u.filter(d.is_finite().fill_null(False) & over(tr) & over(pl.col("sum_policy").cast(pl.Float64)))
    if bad.is_empty():
        return None
    all_tok = pl.col("sum_tokens").cast(pl.Float64)
    matches = ~_differs(d, all_tok, cfg)
    factor = pl.when(tr > 0).then(num((d / tr).round(2)))
    head = pl.format(
        "{}: loss_denominator {} exceeds the {} trainable tokens of the batch", _step(), num(d), pl.col("sum_trainable")
    )
    dil = (
        pl.when(tr > 0)
        .then(
            pl.format(
                "{}/{} = {}: each policy token's gradient is scaled down {}x",
                num(d),
                pl.col("sum_trainable"),
                factor,
                factor,
            )
        )
        .otherwise(pl.lit("the batch has no trainable token, so the whole denominator counts tokens outside the loss"))
    )
    tail = (
        pl.when(matches)
        .then(
            pl.format(
                "; it equals every token of the {} sequences, {} of them not sampled by the policy",
                "B",
                (pl.col("sum_tokens") - pl.col("sum_policy")),
            )
        )
        .otherwise(
            pl.format(
                "; it includes at least {} tokens the policy did not sample",
                num(d - pl.max_horizontal(tr, pl.col("sum_policy").cast(pl.Float64))),
            )
        )
    )
    return bad.select("file", pl.concat_str([head, pl.lit(": "), dil, tail]).alias("message"))


# ------------------------------------------------------------------ U603, U604: advantages


def _group_stats(log, m: pl.DataFrame) -> pl.DataFrame:
    """`m` with the statistics of each member's (update, group) over the members with a reward.

    The group is formed among the update's trajectories, or, when the update names a window
    (contract 1.1 window_trajectory_ids: TRL computes advantages over the generation batch and
    trains on it in several updates), among the window's trajectories."""
    u = _updates(log)
    pool = (
        u.select("_u", pl.coalesce("window_trajectory_ids", "trajectory_ids").alias("trajectory_id"))
        .explode("trajectory_id")
        .filter(pl.col("trajectory_id").is_not_null())
        .join(
            _traj(log).select(
                "trajectory_id", "reward", "split_continues", pl.coalesce("group_id", "task_id").alias("_g")
            ),
            on="trajectory_id",
            how="left",
        )
        .filter(~pl.col("split_continues").fill_null(False))  # a split episode is one member, its last segment
    )
    r = pl.col("reward")
    stats = pool.group_by("_u", "_g").agg(
        r.count().alias("_n"),
        r.is_null().sum().alias("_n_unknown"),
        r.mean().alias("_mean"),
        r.std(ddof=1).alias("_std"),
        r.std(ddof=0).alias("_std0"),
        r.sum().alias("_sum"),
        (r.max() - r.min()).alias("_range"),
    )
    return m.join(stats, on=["_u", "_g"], how="left", nulls_equal=True)


@rule(
    "U603",
    "advantages differ from the recomputed ones",
    scope="log",
    requires=("updates.advantages", "updates.advantage_estimator", "trajectory_id", "task_id", "reward"),
    optional=ADVANTAGE_INPUTS,
    config=("atol", "rtol", "grpo_epsilon"),
    partition=BY_UPDATE,
    merge=merge_samples,
)
def advantages(log, cfg) -> pl.DataFrame | None:
    """An update's advantages differ from the ones recomputed for its declared estimator and groups.

    Lesson “When a rollout group contains no relative signal” and docs/contract.md, update records: a group is the batch members that share a group_id
    (task_id when group_id is absent). Recomputed from the episode rewards of the log:
    `grpo` (R − mean_g) / (std_g + ε), std with Bessel's correction (ddof 1) and ε =
    configuration grpo_epsilon, 0 for a group of one; `grpo_population_std` the same with the
    population std (ddof 0, numpy's default: rLLM); `grpo_no_std` R − mean_g; `rloo` R minus
    the mean of the other members (0 for a group of one); `reinforce` R. Members without a
    reward make their group unknowable, since what the trainer used for them is not in the
    log: a group with an excluded member (U606) and an update naming a trajectory missing
    from the log (U605, its group is unknown too) are not recomputed. An advantage list whose
    length differs from trajectory_ids (its members are then not compared: the alignment is
    unknown), or an unknown estimator, is a finding on the update. A wrong advantage flips or
    scales the learning signal silently: fix the grouping key, the std convention, or the
    estimator name the trainer records.
    """
    u = _updates(log).filter(pl.col("advantages").is_not_null())
    est = pl.col("advantage_estimator")
    upd = u.select(
        "file",
        pl.when(est.is_null() | ~est.is_in(ESTIMATORS).fill_null(False))
        .then(
            pl.format(
                f"{{}}: advantage_estimator {{}} is not one of {', '.join(ESTIMATORS)}; "
                "advantages cannot be recomputed",
                _step(),
                est.fill_null("null"),
            )
        )
        .when(pl.col("advantages").list.len() != pl.col("trajectory_ids").list.len())
        .then(
            pl.format(
                "{}: {} advantages for {} trajectory_ids (they must be aligned)",
                _step(),
                pl.col("advantages").list.len(),
                pl.col("trajectory_ids").list.len(),
            )
        )
        .alias("message"),
    ).filter(pl.col("message").is_not_null())
    m = _group_stats(log, members(log).filter(pl.col("_aligned") & pl.col("advantage_estimator").is_in(ESTIMATORS)))
    r, n, mean = pl.col("reward"), pl.col("_n"), pl.col("_mean")
    expected = (
        pl.when((pl.col("_n_unknown") > 0) | ~pl.col("_in_log").all().over("_u"))
        .then(None)
        .when(est == "reinforce")
        .then(r)
        .when(n < 2)
        .then(0.0)
        .when(est == "grpo")
        .then((r - mean) / (pl.col("_std") + cfg.grpo_epsilon))
        .when(est == "grpo_population_std")
        .then((r - mean) / (pl.col("_std0") + cfg.grpo_epsilon))
        .when(est == "grpo_no_std")
        .then(r - mean)
        .when(est == "rloo")
        .then(r - (pl.col("_sum") - r) / (n - 1))
    )
    m = m.with_columns(expected.alias("_exp"))
    log.stats["U603"] = _sample(
        m.filter(pl.col("_exp").is_not_null()).select(
            "update_step", "trajectory_id", pl.col("adv").alias("recorded"), pl.col("_exp").alias("expected")
        )
    )
    bad = m.filter(pl.col("_exp").is_not_null() & _differs(pl.col("adv"), pl.col("_exp"), cfg))
    how = (
        pl.when(est == "reinforce")
        .then(pl.format("R = {}", num(r)))
        .when(n < 2)
        .then(pl.lit("a group of one has no baseline"))
        .otherwise(
            pl.format(
                "R = {}, group {}: {} members with a reward, mean {}, std {}",
                num(r),
                pl.col("_g"),
                n,
                num(mean),
                num(pl.when(est == "grpo_population_std").then(pl.col("_std0")).otherwise(pl.col("_std"))),
            )
        )
    )
    per = bad.select(
        "file",
        "trajectory_id",
        pl.format(
            "{} ({}): advantage {} recorded, expected {} ({})",
            _step(),
            est,
            num(pl.col("adv")),
            num(pl.col("_exp")),
            how,
        ).alias("message"),
    )
    out = pl.concat([upd, per], how="diagonal_relaxed")
    return out if out.height else None


@rule(
    "U604",
    "degenerate group carries non-zero advantages",
    scope="log",
    requires=("updates.advantages", "trajectory_id", "task_id", "reward"),
    optional=ADVANTAGE_INPUTS,
    config=("atol",),
    partition=BY_UPDATE,
)
def degenerate_advantages(log, cfg) -> pl.DataFrame | None:
    """A group in which every reward is equal (no relative signal) carries non-zero advantages.

    Lesson “When a rollout group contains no relative signal”: a group contains relative signal only when it holds both better and worse
    outcomes; when all G rewards are equal every group-relative advantage is exactly 0, and
    zero signal times any step size stays zero. A non-zero advantage there is manufactured
    (a baseline from another group, ε-dominated division, a reward shaped after the fact) and
    pushes the policy without evidence. Groups as in U603 (batch members sharing group_id, else
    task_id; groups U603 cannot recompute are skipped here too); "non-zero" means
    |A| > atol; updates declaring `reinforce` (no group
    baseline) are skipped. U603 also fires when the estimator is known; this check runs without
    one. Fix the grouping or the estimator, or drop zero-variance groups from the batch.
    """
    m = _group_stats(
        log, members(log).filter(pl.col("_aligned") & (pl.col("advantage_estimator").fill_null("") != "reinforce"))
    )
    bad = m.filter(
        (pl.col("_n_unknown") == 0)
        & pl.col("_in_log").all().over("_u")
        & (pl.col("_range") <= cfg.atol)
        & pl.col("adv").is_not_null()
        & ~(pl.col("adv").abs() <= cfg.atol).fill_null(False)
    )
    return bad.select(
        "file",
        "trajectory_id",
        pl.format(
            "{}: group {} is degenerate ({} members, every reward {}) but advantage {} is recorded, expected 0",
            _step(),
            pl.col("_g"),
            pl.col("_n"),
            num(pl.col("reward")),
            num(pl.col("adv")),
        ).alias("message"),
    )


# ------------------------------------------------------------------ U605, U606: batch membership


def _merge_lost(parts: list, whys: list, findings):
    """U605 over partitions of the update records: the folded findings (unreadable files) as one."""
    folded = [p for p in parts if p]
    if not folded or findings is None:
        return None, None, findings
    files = [p["update_file"] for p in folded if p["update_file"] is not None]
    merged = {k: v for k, v in folded[0].items() if k != "_ids"}
    merged |= {
        "missing_trajectory_ids": pl.concat([p["_ids"] for p in folded]).n_unique(),
        "updates": sum(p["updates"] for p in folded),  # each update is in one partition
        "update_file": min(files) if files else None,  # update files are read in path order
    }
    one = _lost_message(merged)
    rest = findings.filter(~pl.col("message").str.contains("(S005) likely holds them", literal=True))
    return merged, None, pl.concat([one, rest], how="diagonal_relaxed")


@rule(
    "U605",
    "update names a trajectory not in the log",
    scope="log",
    requires=("updates",),
    optional=_MEMBERSHIP,
    partition=BY_UPDATE,
    merge=_merge_lost,
)
def unknown_member(log, cfg) -> pl.DataFrame | None:
    """An update's trajectory_ids names a trajectory that is not in the log (or a null id).

    The audit can only vouch for what it read: a batch member that is missing was trained on
    without any of these checks (a shard lost or not yet written, ids rewritten between
    collector and trainer). Denominators (U601) and advantages (U603) that depend on it are
    not recomputed. Fix the export so that every trajectory an update uses is in the log, or
    audit the full log directory.
    """
    m = members(log).filter(~pl.col("_in_log"))
    if m.is_empty():
        return None
    each = m
    folded = None
    if log.broken:  # one cause, one finding: the unreadable files (S005) likely hold these trajectories
        each, lost = m.filter(pl.col("trajectory_id").is_null()), m.filter(pl.col("trajectory_id").is_not_null())
        folded = _lost_to_broken(lost, log) if lost.height else None
    per_member = each.select(
        "file",
        "trajectory_id",
        pl.format(
            "{} names trajectory {} (batch position {}), which is not in the log",
            _step(),
            pl.col("trajectory_id").fill_null("null"),
            pl.col("_k"),
        ).alias("message"),
    )
    return pl.concat([folded, per_member], how="diagonal_relaxed") if folded is not None else per_member


def _lost_to_broken(lost: pl.DataFrame, log) -> pl.DataFrame:
    """One U605 finding for every batch member missing from a log that has unreadable files
    (its counts are also kept in the statistics; a partition of the update records keeps the
    ids too, since one id may be named by updates of several partitions)."""
    ids, ups, broken = lost["trajectory_id"].n_unique(), lost["_u"].n_unique(), log.broken
    log.stats["U605"] = {
        "missing_trajectory_ids": ids,
        "updates": ups,
        "update_file": lost["file"][0],
        "unreadable_files": len(broken),
        "first_unreadable": broken[0][0],
    }
    if log.part:
        log.stats["U605"]["_ids"] = lost["trajectory_id"].unique()
    return _lost_message(log.stats["U605"])


def _lost_message(s: dict) -> pl.DataFrame:
    ids, ups, first = s["missing_trajectory_ids"], s["updates"], s["first_unreadable"]
    more = f" and {s['unreadable_files'] - 1} more" if s["unreadable_files"] > 1 else ""
    msg = (
        f"{ids} trajectory id{'s' * (ids != 1)} named by {ups} update{'s' * (ups != 1)} "
        f"{'are' if ids != 1 else 'is'} not in the log; the unreadable file {first}{more} (S005) "
        "likely holds them: repair or re-export it and audit again"
    )
    return pl.DataFrame(
        {"file": [s["update_file"]], "trajectory_id": [None], "message": [msg]},
        schema_overrides={"file": pl.String, "trajectory_id": pl.String},
    )


@rule(
    "U606",
    "excluded trajectory used in an update",
    scope="log",
    requires=("updates", "trajectory_id", "reward", "truncated", "infra_error"),
    optional=EXCLUSION_INPUTS,
    config=("truncation",),
    partition=BY_UPDATE,
)
def excluded_member(log, cfg) -> pl.DataFrame | None:
    """An update trains on a trajectory that must be excluded: its reward is null, it is an
    infra_error episode, or it was truncated by the collector under truncation = exclude.

    Lesson “Success, termination, truncation, and infrastructure failure” and docs/contract.md, stop causes: an episode cut by a collector limit or broken by the
    infrastructure is not evidence about the task; under `exclude` it has a null reward and
    appears in no update, and an infra_error episode never does. A trainer that fills the null
    reward with 0 turns the cut into a failure signal. T303 also reports infra_error episodes
    used in updates. Fix the trainer's batch filter to drop these episodes (and retry or
    bootstrap them as the truncation policy says). An episode excluded from the loss but kept
    in its group's statistics (loss_excluded, contract 1.2) may be named: nothing of it is
    trained (M109 checks). A segment that does not end its split episode (split_continues) is
    judged by the episode's outcome, on its last segment.
    """
    m = members(log).filter(pl.col("_in_log"))
    excluded, why = _excluded(cfg)
    bad = m.filter(excluded)
    if bad.is_empty():
        return None
    return bad.select("file", "trajectory_id", pl.format("{} uses {}", _step(), why).alias("message"))


def _excluded(cfg) -> tuple[pl.Expr, pl.Expr]:
    """Whether a trajectory must be excluded from training (null reward, infra_error, truncated
    under truncation = exclude), and why, for a message."""
    infra = pl.col("infra_error").fill_null(False)
    kept = ~pl.col("loss_excluded").fill_null(False)  # out of the loss, in the group statistics (1.2)
    trunc = pl.col("truncated").fill_null(False) & (cfg.truncation == "exclude") & kept
    stop = pl.col("stop_reason").fill_null("null")
    why = (
        pl.when(infra)
        .then(pl.format("an infra_error episode (stop_reason {})", stop))
        .when(trunc)
        .then(pl.format("a collector-truncated episode (stop_reason {}) under truncation = exclude", stop))
        .otherwise(pl.lit("an episode with a null reward (excluded from training)"))
    )
    return infra | trunc | pl.col("reward").is_null(), why


# ------------------------------------------------------------------ U607, U608: what the loss and the statistics were built from


def _named(log, column: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The update records' list `column` exploded: one row per entry with `_u`, `_k`,
    update_step, file, trajectory_id (the entry itself, or for `numerator_tokens` the id at the
    same index of trajectory_ids) and `_v` (the entry); and the records whose `numerator_tokens`
    is not aligned with trajectory_ids (not exploded)."""
    u = log.updates.with_row_index("_u").with_columns(pl.col("_u").cast(pl.Int64))
    if "file" not in u.columns:
        u = u.with_columns(pl.lit(None, dtype=pl.String).alias("file"))
    u = u.filter(pl.col(column).is_not_null())
    if column == "numerator_tokens":
        ids = pl.col("trajectory_ids").fill_null(pl.lit([], dtype=pl.List(pl.String)))
        aligned = pl.col(column).list.len() == ids.list.len()
        lists = [ids.alias("trajectory_id"), pl.col(column).alias("_v")]
    else:
        aligned = pl.lit(True)
        lists = [pl.col(column).alias("trajectory_id")]
    ex = u.select(
        "_u",
        "update_step",
        "file",
        aligned.alias("_aligned"),
        *lists,
        pl.int_ranges(0, pl.col(column).list.len()).alias("_k"),
    )
    exploded = (
        ex.filter(pl.col("_aligned"))
        .explode([c for c in ("trajectory_id", "_v", "_k") if c in ex.columns])
        .filter(pl.col("_k").is_not_null())
    )
    return exploded, ex.filter(~pl.col("_aligned"))


@rule(
    "U607",
    "the loss numerator sums tokens other than the trainable ones",
    scope="log",
    requires=("updates.numerator_tokens", "updates.trajectory_ids", "trajectory_id", "n_trainable", "ok"),
    optional=("updates.update_step",),
    partition=BY_UPDATE,
)
def numerator_tokens(log, cfg) -> pl.DataFrame | None:
    """A trajectory's numerator_tokens (how many of its tokens entered the update's summed loss)
    differs from its trainable count |I_i|, the loss_mask-true tokens.

    Lesson “Trainable-token masks and signal dilution”: L = −(1/Σ_k m_k) Σ_k m_k Â log π(z_k),
    the mask m in the numerator (no gradient on tokens the policy did not choose) and in the
    denominator (the normalisation). U601 and U602 check the denominator; this check reads the
    numerator. A token-mean loss that divides by the masked
    count but sums every token's loss (alibaba/ROLL#444: the mask applied to the denominator
    only) trains on prompt, tool and padding tokens with a weight the denominator hides: the
    finding names both counts and the tokens outside the mask that entered. A numerator list
    whose length differs from trajectory_ids is a finding on the update (its members cannot be
    matched). Trajectories missing from the log (U605) or with malformed token lists (S003)
    are not compared. Fix the loss to multiply every per-token loss by the mask before summing
    (`(loss * mask).sum()`), not only to count the mask.
    """
    members, bad_len = _named(log, "numerator_tokens")
    t = _traj(log).select("trajectory_id", "n_trainable", "ok")
    m = members.join(t, on="trajectory_id", how="inner").filter(pl.col("ok").fill_null(False))
    diff = m.filter(pl.col("_v").is_null() | (pl.col("_v") != pl.col("n_trainable")))
    extra = pl.col("_v") - pl.col("n_trainable")
    how = (
        pl.when(pl.col("_v").is_null())
        .then(pl.lit("the count is null"))
        .when(extra > 0)
        .then(pl.format("{} token(s) outside the loss mask entered the summed loss", extra))
        .otherwise(pl.format("{} trainable token(s) are missing from the summed loss", -extra))
    )
    per = diff.select(
        "file",
        "trajectory_id",
        pl.format(
            "{}: numerator_tokens {} recorded, expected {} (the trainable tokens): {}",
            _step(),
            pl.col("_v").cast(pl.String).fill_null("null"),
            "n_trainable",
            how,
        ).alias("message"),
    )
    upd = bad_len.select(
        "file",
        pl.format(
            "{}: {} numerator_tokens for {} trajectory_ids (they must be aligned)",
            _step(),
            pl.col("_v").list.len(),
            pl.col("trajectory_id").list.len(),
        ).alias("message"),
    )
    out = pl.concat([upd, per], how="diagonal_relaxed")
    return out if out.height else None


@rule(
    "U608",
    "excluded trajectory entered the group statistics",
    scope="log",
    requires=("updates.stat_trajectory_ids", "trajectory_id", "reward"),
    optional=("updates.update_step", "truncated", "infra_error", "stop_reason", "loss_excluded"),
    config=("truncation",),
    partition=BY_UPDATE,
)
def excluded_in_statistics(log, cfg) -> pl.DataFrame | None:
    """An update's stat_trajectory_ids (the trajectories whose rewards formed the group mean and
    std of its advantages) names a trajectory that must be excluded: a null reward, an
    infra_error episode, or a collector-truncated one under truncation = exclude (the flags are
    read when the log has them: a framework that records no stop cause is checked on rewards).

    Lessons “Success, termination, truncation, and infrastructure failure” and “When a rollout
    group contains no relative signal”: an excluded episode is evidence about nothing, so it
    belongs neither in the loss (U606) nor in the baseline its group is compared against. A
    trainer that drops rejected responses from the batch but computes the GRPO mean and std
    before the rejection (verl-project/verl#6452) shifts every surviving member's advantage by
    a reward that was never earned, usually the 0 the filter wrote. A trajectory counted in the
    statistics but not trained (a masked but valid episode) is allowed; a trajectory named
    there that is missing from the log is U605's concern. Fix the trainer to apply the
    rejection before the group statistics (or record the statistics it really used).
    """
    members, _ = _named(log, "stat_trajectory_ids")
    t = _traj(log).select("trajectory_id", "reward", "truncated", "infra_error", "stop_reason", "loss_excluded")
    m = members.join(t, on="trajectory_id", how="inner")
    excluded, why = _excluded(cfg)
    bad = m.filter(excluded)
    if bad.is_empty():
        return None
    return bad.select(
        "file",
        "trajectory_id",
        pl.format("{} counts {} in its group statistics (stat_trajectory_ids)", _step(), why).alias("message"),
    )


# ------------------------------------------------------------------ U609, U610: what the loss function did (contract 1.4)


@rule(
    "U609",
    "the loss reducer's divisor differs from the tokens or samples it divides",
    "error",
    scope="log",
    requires=("updates", "trajectory_id", "updates.reducer_mode", "updates.reducer_divisor", "n_trainable", "ok"),
    optional=_MEMBERSHIP,
    config=("atol", "rtol"),
    preview=True,
)
def reducer_divisor(log, cfg) -> pl.DataFrame | None:
    """The divisor the loss function's reducer applied (reducer_divisor) differs from the trainable
    tokens, or the samples, it divides under its stated reducer_mode.

    Lesson “Trajectory-, turn-, and token-level reduction”: a per-token mean is only a mean when it
    divides by the tokens it summed. The divisor is computed inside the trainer's loss, after every
    hook a converter sees (slime and miles `loss.py` count `max(|I_i|, 1)` per sample, Megatron sums
    it over micro-batches and ranks), so loss_denominator, which a converter fills from its own
    counts, cannot show it (U601 reads that). Recomputed from the trajectories the records name:
    `token_mean_step` -> Σ |I_i| over every record of the optimizer step (the same update_step),
    `token_mean` -> Σ |I_i| over the record, `seq_mean_step` -> the step's sequences, `seq_mean` ->
    the record's (every sequence named, trained or not). A divisor of 1 where the count is 0 is
    accepted (trainers clamp an empty batch's count to 1). A surplus equal to the number of
    sequences without a trainable token is named: a reducer that clamps each sample's count to at
    least 1 before summing adds one token per removed sample (radixark/miles#2796), scaling every
    gradient of the step by T / (T + M). A non-positive or non-finite divisor, an unknown mode,
    and records of one step that disagree on a step-wide divisor are findings too. Steps whose
    records name a trajectory missing from the log (U605) or malformed (S003) are not recomputed.
    Fix the reducer to count the trainable tokens (or sequences) of what it sums, once.
    """
    u = _updates(log).select("_u", "update_step", "file", "reducer_mode", "reducer_divisor")
    m = members(log)
    known = pl.col("_in_log") & pl.col("ok").fill_null(False)
    per = m.group_by("_u").agg(
        pl.len().alias("B"),
        known.all().alias("known"),
        pl.col("n_trainable").sum().alias("T"),
        (pl.col("n_trainable") == 0).sum().alias("E"),
        pl.col("trajectory_id").filter(pl.col("n_trainable") == 0).first().alias("_empty"),
    )
    u = u.join(per, on="_u", how="left").with_columns(
        pl.col("B").fill_null(0), pl.col("known").fill_null(True), pl.col("T").fill_null(0), pl.col("E").fill_null(0)
    )
    mode = pl.col("reducer_mode")
    step_wide = mode.str.ends_with("_step").fill_null(False)
    # a step-wide divisor spans every record of the step; a record without a step is a step alone
    u = u.with_columns(pl.coalesce(pl.col("update_step"), -1 - pl.col("_u")).alias("_step"))
    over = lambda e: pl.when(step_wide).then(e.sum().over("_step")).otherwise(e)
    u = u.with_columns(
        over(pl.col("T")).alias("_T"),
        over(pl.col("B")).alias("_B"),
        over(pl.col("E")).alias("_E"),
        pl.when(step_wide)
        .then(pl.col("_empty").drop_nulls().first().over("_step"))
        .otherwise("_empty")
        .alias("_first"),
        pl.when(step_wide).then(pl.len().over("_step")).otherwise(1).alias("_R"),
        pl.when(step_wide).then(pl.col("known").all().over("_step")).otherwise(pl.col("known")).alias("_known"),
        pl.when(step_wide).then(pl.col("reducer_divisor").n_unique().over("_step")).otherwise(1).alias("_values"),
    )
    tokens = mode.str.starts_with("token_").fill_null(False)
    d = pl.col("reducer_divisor")
    expected = pl.when(tokens).then(pl.col("_T")).otherwise(pl.col("_B")).cast(pl.Float64)
    u = u.with_columns(expected.alias("_exp"))
    unknown = mode.is_null() | ~mode.is_in(REDUCER_MODES).fill_null(False)
    bad_value = d.is_null() | ~d.is_finite().fill_null(False) | ~(d > 0).fill_null(False)
    clamped = (pl.col("_exp") == 0) & (d == 1.0)
    mismatch = pl.col("_known") & _differs(d, pl.col("_exp"), cfg) & ~clamped.fill_null(False)
    what = (
        pl.when(tokens)
        .then(pl.lit("Σ trainable tokens over the "))
        .otherwise(pl.lit("the "))
        .add(pl.format("{} trajectories of ", "_B"))
        .add(pl.when(step_wide).then(pl.format("the step's {} record(s)", "_R")).otherwise(pl.lit("the record")))
    )
    surplus = d - pl.col("_exp")
    floored = tokens & (pl.col("_E") > 0) & ~_differs(surplus, pl.col("_E").cast(pl.Float64), cfg)
    cause = (
        pl.when(floored)
        .then(
            pl.format(
                "; the surplus {} is the step's {} trajectory(ies) without a trainable token (first: {}): the "
                "reducer counts each removed sample as one token (a per-sample max(|I_i|, 1)), scaling every "
                "gradient by {}",
                num(surplus),
                "_E",
                "_first",
                num((pl.col("_exp") / d).round(4)),
            )
        )
        .when(pl.col("_exp") > 0)
        .then(pl.format(" (recorded/expected = {})", num((d / pl.col("_exp")).round(3))))
        .otherwise(pl.lit(""))
    )
    head = pl.format("{} (reducer_mode {})", _step(), mode)
    msg = (
        pl.when(unknown)
        .then(
            pl.format(
                "{}: reducer_mode {} is not one of {}; the divisor cannot be checked",
                _step(),
                mode.fill_null("null"),
                pl.lit(", ".join(REDUCER_MODES)),
            )
        )
        .when(bad_value)
        .then(pl.format("{}: reducer_divisor {} is not a positive finite number", head, num(d)))
        .when(pl.col("_values") > 1)
        .then(
            pl.format(
                "{}: the step's {} records hold {} different reducer_divisor values; a step-wide divisor is one",
                head,
                "_R",
                "_values",
            )
        )
        .when(mismatch)
        .then(
            pl.format(
                "{}: reducer_divisor {} recorded, expected {} = {}",
                head,
                num(d),
                num(pl.col("_exp")),
                what,
            ).add(cause)
        )
    )
    out = (
        u.with_columns(msg.alias("message"), pl.when(mismatch & floored).then("_first").alias("trajectory_id"))
        .filter(pl.col("message").is_not_null())
        .unique(["_step", "message"], keep="first", maintain_order=True)  # a step-wide divisor: one finding
        .select("file", "trajectory_id", "message")
    )
    return out if out.height else None


@rule(
    "U610",
    "the importance ratio is anchored to weights that did not sample the batch, uncorrected",
    "error",
    scope="log",
    requires=(
        "updates",
        "trajectory_id",
        "updates.ratio_anchor",
        "updates.ratio_correction",
        "pv_trained_min",
        "pv_trained_max",
    ),
    optional=(
        *_MEMBERSHIP,
        "updates.ratio_anchor_version",
        "updates.trainer_version",
        "updates.ratio_clipping",
    ),
)
def ratio_anchor(log, cfg) -> pl.DataFrame | None:
    """An update's importance ratio is anchored on a recomputation (ratio_anchor current or
    proximal) by weights at another policy version than the one that sampled a trajectory of its
    batch, and no behaviour-to-anchor correction is applied (ratio_correction none).

    Lesson “Token-level and sequence-level probability ratios”: PPO's ratio π_θ/π_old corrects for the policy
    that generated the data only when π_old is that policy. An asynchronous trainer that recomputes
    π_old with the current weights (radixark/miles#1829: `--use-rollout-logprobs` off, no TIS, no
    retained old actor; NovaSky-AI/SkyRL#1315: fully async with old log-probs recomputed, one step
    per batch, so the ratio is exactly 1 and clipping never acts) trains on stale samples as if
    they were on-policy: the ratio and its clip see none of the lag. The staleness is the one the
    log records: each trajectory's turns' policy_version against the anchor's version
    (ratio_anchor_version, or for current the update's trainer_version). Where neither is recorded,
    a recomputation is by one set of weights, so a batch sampled at several versions has its
    trajectories below the newest version anchored to weights that did not sample them (a current
    anchor is never older than the newest behaviour version); a batch sampled at one version then
    shows nothing (the lag is not recorded). An anchor on the behaviour log-probs, a truncated or
    masked importance correction, and trajectories without a recorded version are not judged; an
    unknown anchor or correction value is a finding. Fix: anchor the ratio on the behaviour
    log-probs, apply a truncated importance-sampling correction against them, or recompute with
    the weights the engines sampled with.
    """
    u = _updates(log).select(
        "_u",
        "update_step",
        "file",
        "ratio_anchor",
        "ratio_anchor_version",
        "ratio_correction",
        "ratio_clipping",
        "trainer_version",
    )
    anchor, corr = pl.col("ratio_anchor"), pl.col("ratio_correction")
    unknown = (
        pl.when(~anchor.is_in(RATIO_ANCHORS).fill_null(True))
        .then(pl.format("ratio_anchor {} is not one of {}", anchor, pl.lit(", ".join(RATIO_ANCHORS))))
        .when(~corr.is_in(RATIO_CORRECTIONS).fill_null(True))
        .then(pl.format("ratio_correction {} is not one of {}", corr, pl.lit(", ".join(RATIO_CORRECTIONS))))
    )
    bad = u.filter(unknown.is_not_null()).select("file", pl.format("{}: {}", _step(), unknown).alias("message"))
    judged = u.filter(anchor.is_in(("current", "proximal")).fill_null(False) & (corr == "none").fill_null(False))
    judged = judged.with_columns(
        pl.coalesce("ratio_anchor_version", pl.when(anchor == "current").then(pl.col("trainer_version"))).alias("_a")
    )
    versions = log.traj.select(
        "trajectory_id",
        pl.col("pv_trained_min").cast(pl.Int64).alias("pv_min"),
        pl.col("pv_trained_max").cast(pl.Int64).alias("pv_max"),
    )
    m = (
        members(log)
        .select("_u", "trajectory_id", "_in_log")
        .join(judged, on="_u", how="inner")
        .join(versions.unique("trajectory_id", keep="first"), on="trajectory_id", how="left")
        # the weights of one optimizer step are never older than the newest version it trains
        .with_columns(pl.coalesce("update_step", -1 - pl.col("_u")).alias("_step"))
        .with_columns(pl.col("pv_max").max().over("_step").alias("_newest"))
    )
    known = pl.col("_a").is_not_null()
    stale = (
        pl.when(known)
        .then((pl.col("pv_min") != pl.col("_a")) | (pl.col("pv_max") != pl.col("_a")))
        .otherwise(pl.col("pv_min") < pl.col("_newest"))
        .fill_null(False)
    )
    clip = (
        pl.when(pl.col("ratio_clipping").is_null())
        .then(pl.lit("clipping not recorded"))
        .when(pl.col("ratio_clipping"))
        .then(pl.lit("clipping on"))
        .otherwise(pl.lit("clipping off"))
    )
    sampled = (
        pl.when(pl.col("pv_min") == pl.col("pv_max"))
        .then(pl.format("version {}", "pv_min"))
        .otherwise(pl.format("versions {} to {}", "pv_min", "pv_max"))
    )
    at = (
        pl.when(known)
        .then(pl.format("the weights at version {}", "_a"))
        .otherwise(
            pl.format(
                "one set of weights (version not recorded) while the batch was sampled up to version {}", "_newest"
            )
        )
    )
    lag = pl.when(known & (pl.col("_a") > pl.col("pv_min"))).then(
        pl.format(", {} version(s) behind the anchor", num(pl.col("_a").cast(pl.Float64) - pl.col("pv_min")))
    )
    msg = pl.format(
        "{}: the ratio is anchored on a recomputation by {} (ratio_anchor {}, {}) with no behaviour correction, "
        "but the trajectory was sampled at {}{}: its ratio and clip see none of that lag",
        _step(),
        at,
        pl.col("ratio_anchor"),
        clip,
        sampled,
        lag.fill_null(""),
    )
    found = m.filter(pl.col("_in_log") & stale).select("file", "trajectory_id", msg.alias("message"))
    out = pl.concat([bad, found], how="diagonal_relaxed")
    return out if out.height else None
