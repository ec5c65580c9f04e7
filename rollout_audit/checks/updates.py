"""Updates and reduction (U): what each optimizer update claims about its batch, recomputed
from the trajectories it names (DESIGN 3.4; lessons 11.2.2, 11.2.4, 11.4.1).

All checks work on one frame with a row per (update, batch member), built once per audit by
exploding `trajectory_ids` (and, aligned by index, `advantages`) and joining the
per-trajectory summary of the log. Group statistics are polars `over()` windows on it.
"""

from __future__ import annotations

import polars as pl

from ..registry import rule

REDUCTIONS = ("token", "turn", "trajectory", "constant")
ESTIMATORS = ("grpo", "grpo_no_std", "rloo", "reinforce")


def num(e: pl.Expr) -> pl.Expr:
    """A float rendered for a message: integers without '.0', others to 6 significant places."""
    as_int = e.cast(pl.Int64, strict=False)
    return (
        pl.when(e.is_null())
        .then(pl.lit("null"))
        .when(e.is_finite() & (as_int.cast(pl.Float64) == e))
        .then(as_int.cast(pl.String))
        .otherwise(e.round_sig_figs(6).cast(pl.String))
    )


def _step() -> pl.Expr:
    return pl.format("update {}", pl.col("update_step").cast(pl.String).fill_null("?"))


def _updates(log) -> pl.DataFrame:
    """The update records with a stable index `_u` and every optional column present."""
    u = log.updates.with_row_index("_u").with_columns(pl.col("_u").cast(pl.Int64))
    for name, dt in (("advantages", pl.List(pl.Float64)), ("advantage_estimator", pl.String), ("file", pl.String)):
        if name not in u.columns:
            u = u.with_columns(pl.lit(None, dtype=dt).alias(name))
    return u.with_columns(pl.col("trajectory_ids").fill_null(pl.lit([], dtype=pl.List(pl.String))))


def _traj(log) -> pl.DataFrame:
    """Per-trajectory inputs of the update checks, one row per trajectory_id."""
    t = log.traj
    want = {
        "task_id": pl.String,
        "group_id": pl.String,
        "reward": pl.Float64,
        "truncated": pl.Boolean,
        "infra_error": pl.Boolean,
        "stop_reason": pl.String,
        "n_trainable": pl.Int64,
        "n_tokens": pl.Int64,
        "n_policy": pl.Int64,
        "n_turns_trainable": pl.Int64,
        "ok": pl.Boolean,
    }
    if "trajectory_id" not in t.columns:
        return pl.DataFrame(schema={"trajectory_id": pl.String, **want})
    t = t.with_columns(pl.lit(None, dtype=dt).alias(c) for c, dt in want.items() if c not in t.columns)
    turns_ok = pl.col("ok").fill_null(False)
    if "n_turns" in t.columns:  # a trajectory without turns has no row in the per-turn summary
        turns_trainable = pl.col("n_turns_trainable").fill_null(pl.when(pl.col("n_turns") == 0).then(0))
    else:
        turns_trainable = pl.col("n_turns_trainable")
    return (
        t.filter(pl.col("trajectory_id").is_not_null())
        .unique("trajectory_id", keep="first", maintain_order=True)
        .select(
            "trajectory_id",
            *[pl.col(c).cast(dt) for c, dt in want.items() if c != "n_turns_trainable"],
            pl.when(turns_ok).then(turns_trainable.cast(pl.Int64)).alias("n_turns_trainable"),
        )
    )


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
        .select("_u", "update_step", "file", "reduction", "loss_denominator")
        .join(agg, on="_u", how="left")
        .with_columns(
            pl.col("B").fill_null(0),
            pl.col("all_known").fill_null(True),
            pl.col("turns_unknown").fill_null(False),
            *[pl.col(c).fill_null(0) for c in ("sum_trainable", "sum_turns", "sum_tokens", "sum_policy")],
        )
        .with_columns(pl.col("loss_denominator").cast(pl.Float64))
    )


def _differs(found: pl.Expr, expected: pl.Expr, cfg) -> pl.Expr:
    """True where found is not within tolerance of expected (NaN and null found count as different)."""
    return ~((found - expected).abs() <= cfg.atol + cfg.rtol * expected.abs()).fill_null(False)


# ------------------------------------------------------------------ U601, U602: denominators


@rule("U601", "loss_denominator differs from the recomputed one", scope="log", requires=("updates", "trajectory_id"))
def denominator(log, cfg) -> pl.DataFrame | None:
    """An update's loss_denominator differs from the one recomputed for its declared reduction.

    Lesson 11.2.4: the same token losses give different gradients depending on what they are
    averaged over, so the statistical unit must be stated and the denominator checked.
    Recomputed from the trajectories the update names: `token` -> Σ_i |I_i|, the trainable
    (loss_mask true) tokens of the batch; `turn` -> Σ_i T_i, the turns with at least one
    trainable token; `trajectory` -> B, the batch size; `constant` -> cannot be recomputed, so
    any positive finite value is accepted. A non-finite or null denominator, or an unknown
    reduction, is always a finding (an update over an empty batch recomputes to 0). Updates
    whose batch names a trajectory missing from the log (U605) or with malformed token lists
    (S003) are not recomputed for token and turn reductions. A token denominator that also
    counts tokens the policy did not sample raises U602 as well, which names the dilution
    factor: both are the same defect seen from two sides (wrong value, and in which
    direction). Fix the trainer to divide by the count of its declared reduction, or declare
    the reduction it actually uses.
    """
    u = _per_update(log)
    d = pl.col("loss_denominator")
    red = pl.col("reduction")
    expected = (
        pl.when(red == "token")
        .then(pl.col("sum_trainable").cast(pl.Float64))
        .when(red == "turn")
        .then(pl.col("sum_turns").cast(pl.Float64))
        .when(red == "trajectory")
        .then(pl.col("B").cast(pl.Float64))
    )
    recomputable = (
        pl.when(red == "trajectory")
        .then(True)
        .when(red == "turn")
        .then(pl.col("all_known") & ~pl.col("turns_unknown"))
        .otherwise(pl.col("all_known"))
    )
    what = (
        pl.when(red == "token")
        .then(pl.format("Σ trainable tokens over {} trajectories", "B"))
        .when(red == "turn")
        .then(pl.format("Σ turns with a trainable token over {} trajectories", "B"))
        .otherwise(pl.lit("the batch size"))
    )
    u = u.with_columns(expected.alias("_exp"), recomputable.alias("_rc"))
    counted = red.is_in(("token", "turn", "trajectory")).fill_null(False)
    not_finite = d.is_null() | ~d.is_finite().fill_null(False)
    bad_constant = (red == "constant").fill_null(False) & (not_finite | ~(d > 0).fill_null(False))
    unknown = red.is_null() | ~red.is_in(REDUCTIONS).fill_null(False)
    mismatch = counted & pl.col("_rc") & _differs(d, pl.col("_exp"), cfg)
    msg = (
        pl.when(unknown)
        .then(
            pl.format(
                "{}: reduction {} is not one of token, turn, trajectory, constant; the denominator cannot be checked",
                _step(),
                red.fill_null("null"),
            )
        )
        .when(bad_constant | (counted & not_finite))
        .then(pl.format("{} (reduction {}): loss_denominator {} is not a positive finite number", _step(), red, num(d)))
        .when(mismatch)
        .then(
            pl.format(
                "{} (reduction {}): loss_denominator {} recorded, expected {} = {}",
                _step(),
                red,
                num(d),
                num(pl.col("_exp")),
                what,
            )
        )
    )
    out = u.select("file", msg.alias("message")).filter(pl.col("message").is_not_null())
    return out if out.height else None


@rule(
    "U602",
    "loss_denominator counts tokens the policy did not sample",
    scope="log",
    requires=("updates", "trajectory_id"),
)
def diluted_denominator(log, cfg) -> pl.DataFrame | None:
    """A token-reduced update divides by more tokens than the policy sampled: the denominator
    counts observation, tool, template or prompt tokens.

    Lesson 11.2.2: the loss mask both removes gradients on tokens the policy did not choose and
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
    over = lambda e: ~(d <= e + cfg.atol + cfg.rtol * e.abs()).fill_null(True)
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


def _group_stats(m: pl.DataFrame) -> pl.DataFrame:
    """Window statistics of each (update, group) over members with a reward."""
    w = ["_u", "_g"]
    r = pl.col("reward")
    return m.with_columns(
        r.count().over(w).alias("_n"),
        r.is_null().sum().over(w).alias("_n_unknown"),
        r.mean().over(w).alias("_mean"),
        r.std(ddof=1).over(w).alias("_std"),
        r.sum().over(w).alias("_sum"),
        (r.max().over(w) - r.min().over(w)).alias("_range"),
    )


@rule(
    "U603",
    "advantages differ from the recomputed ones",
    scope="log",
    requires=("updates.advantages", "updates.advantage_estimator", "trajectory_id", "task_id", "reward"),
)
def advantages(log, cfg) -> pl.DataFrame | None:
    """An update's advantages differ from the ones recomputed for its declared estimator and groups.

    Lesson 11.4.1 and DESIGN 3.4: a group is the batch members that share a group_id
    (task_id when group_id is absent). Recomputed from the episode rewards of the log:
    `grpo` (R − mean_g) / (std_g + ε), std with Bessel's correction (ddof 1) and ε =
    configuration grpo_epsilon, 0 for a group of one; `grpo_no_std` R − mean_g; `rloo` R minus
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
                "{}: advantage_estimator {} is not one of grpo, grpo_no_std, rloo, reinforce; "
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
    m = _group_stats(members(log).filter(pl.col("_aligned") & pl.col("advantage_estimator").is_in(ESTIMATORS)))
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
        .when(est == "grpo_no_std")
        .then(r - mean)
        .when(est == "rloo")
        .then(r - (pl.col("_sum") - r) / (n - 1))
    )
    m = m.with_columns(expected.alias("_exp"))
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
                num(pl.col("_std")),
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
)
def degenerate_advantages(log, cfg) -> pl.DataFrame | None:
    """A group in which every reward is equal (no relative signal) carries non-zero advantages.

    Lesson 11.4.1: a group contains relative signal only when it holds both better and worse
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
        members(log).filter(pl.col("_aligned") & (pl.col("advantage_estimator").fill_null("") != "reinforce"))
    )
    bad = m.filter(
        (pl.col("_n_unknown") == 0)
        & pl.col("_in_log").all().over("_u")
        & (pl.col("_range") <= cfg.atol)
        & pl.col("adv").is_not_null()
        & ~(pl.col("adv").abs() <= cfg.atol).fill_null(False)
    )
    if bad.is_empty():
        return None
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


@rule("U605", "update names a trajectory not in the log", scope="log", requires=("updates",))
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
    return m.select(
        "file",
        "trajectory_id",
        pl.format(
            "{} names trajectory {} (batch position {}), which is not in the log",
            _step(),
            pl.col("trajectory_id").fill_null("null"),
            pl.col("_k"),
        ).alias("message"),
    )


@rule(
    "U606",
    "excluded trajectory used in an update",
    scope="log",
    requires=("updates", "trajectory_id", "reward", "truncated", "infra_error"),
)
def excluded_member(log, cfg) -> pl.DataFrame | None:
    """An update trains on a trajectory that must be excluded: its reward is null, it is an
    infra_error episode, or it was truncated by the collector under truncation = exclude.

    Lesson 11.1.4 and DESIGN 3.3: an episode cut by a collector limit or broken by the
    infrastructure is not evidence about the task; under `exclude` it has a null reward and
    appears in no update, and an infra_error episode never does. A trainer that fills the null
    reward with 0 turns the cut into a failure signal. T303 also reports infra_error episodes
    used in updates. Fix the trainer's batch filter to drop these episodes (and retry or
    bootstrap them as the truncation policy says).
    """
    m = members(log).filter(pl.col("_in_log"))
    infra = pl.col("infra_error").fill_null(False)
    trunc = pl.col("truncated").fill_null(False) & (cfg.truncation == "exclude")
    null_r = pl.col("reward").is_null()
    bad = m.filter(infra | trunc | null_r)
    if bad.is_empty():
        return None
    stop = pl.col("stop_reason").fill_null("null")
    why = (
        pl.when(infra)
        .then(pl.format("an infra_error episode (stop_reason {})", stop))
        .when(trunc)
        .then(pl.format("a collector-truncated episode (stop_reason {}) under truncation = exclude", stop))
        .otherwise(pl.lit("an episode with a null reward (excluded from training)"))
    )
    return bad.select("file", "trajectory_id", pl.format("{} uses {}", _step(), why).alias("message"))
