"""Termination (T): why the episode stopped, and what that allows (docs/contract.md, stop causes; lesson “Success, termination, truncation, and infrastructure failure”)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow.compute as pc

from ..contract import schema as S
from ..contract.registry import NotRun, rule
from ..frames.batch import as_bools, validity
from ..frames.views import BatchView
from ..reading.arrays import from_numpy, strings
from .common import num, stop_reason, tolerance

LAUNDERED = ("length", "abort")  # engine finish reasons that mean "cut off", not "done"


def _flag_text() -> pl.Expr:
    """`terminated=true, truncated=false, infra_error=null` for a message."""
    return pl.concat_str(
        [pl.format(f"{f}={{}}", pl.col(f).cast(pl.String).str.to_lowercase().fill_null("null")) for f in S.STOP_FLAGS],
        separator=", ",
    )


def _n_true() -> pl.Expr:
    return pl.sum_horizontal([pl.col(f).fill_null(False).cast(pl.Int8) for f in S.STOP_FLAGS])


def _flags(b: BatchView) -> np.ndarray:
    """The stop flags as numpy, one row per flag of `S.STOP_FLAGS` (a null flag is not set)."""
    return np.stack([as_bools(b.col(f)) for f in S.STOP_FLAGS])


@rule(
    "T301",
    "not exactly one of terminated / truncated / infra_error",
    requires=S.STOP_FLAGS,
    optional=("split_continues",),
)
def one_flag(b: BatchView, cfg) -> pl.DataFrame | None:
    """Exactly one of `terminated`, `truncated` and `infra_error` must be true (a null
    flag counts as not set); none on a segment that does not end its split episode
    (split_continues, contract 1.2: the episode's last segment carries its outcome, once).

    Lesson “Success, termination, truncation, and infrastructure failure” separates the stop causes because each one is trained on differently: a
    terminated episode is a task outcome, a collector-truncated one is not (it is excluded,
    bootstrapped or penalized by policy), and an infrastructure failure is no outcome at all.
    With no flag or several flags set, the trainer picks one by accident of code order.
    Set exactly one flag per episode, from the same place that sets stop_reason.
    """
    ends = ~as_bools(b.col("split_continues")) if "split_continues" in b.columns else np.ones(b.n, bool)
    maybe = _flags(b).sum(axis=0) != ends
    if not maybe.any():
        return None
    t = b.traj.filter(pl.Series(maybe))
    cont = pl.col("split_continues").fill_null(False) if "split_continues" in t.columns else pl.lit(False)
    bad = t.filter(_n_true() != pl.when(cont).then(0).otherwise(1))
    return bad.rechunk().select(
        "trajectory_id",
        pl.when(cont)
        .then(
            pl.format(
                "{} of terminated/truncated/infra_error are true on a segment that does not end its split episode "
                "(split_continues), expected none: the last segment carries the outcome ({})",
                _n_true(),
                _flag_text(),
            )
        )
        .otherwise(
            pl.format(
                "{} of terminated/truncated/infra_error are true, expected exactly 1 ({})", _n_true(), _flag_text()
            )
        )
        .alias("message"),
    )


@rule(
    "T302",
    "stop_reason inconsistent with the flag",
    requires=(*S.STOP_FLAGS, "stop_reason"),
    config=("extra_stop_reasons",),
)
def stop_reason_flag(b: BatchView, cfg) -> pl.DataFrame | None:
    """stop_reason is unknown, or names a cause of another flag than the one that is true.

    The contract maps each stop reason to one flag (docs/contract.md, stop causes): terminated — success,
    failure, task_budget (a limit that is part of the task is a genuine terminal failure);
    truncated — max_turns, max_tokens, timeout (limits of the collector); infra_error —
    env_error, tool_error, engine_error. Projects add their own reasons with
    `extra_stop_reasons = {reason = "flag"}` in configuration. Lesson “Success, termination, truncation, and infrastructure failure”: a collector
    limit recorded as a task failure teaches the policy that being cut off is failing.
    Consistency is checked only when exactly one flag is true (T301 reports the others);
    a null stop_reason is reported by S001. Fix the collector so both come from one place,
    or declare the project's reason in configuration.
    """
    table = {**S.stop_reasons(), **cfg.extra_stop_reasons}
    # the rows with a reason that does not belong to a flag that is set (usually none)
    reason = b.col("stop_reason")
    maybe = validity(reason)
    for f, on in zip(S.STOP_FLAGS, _flags(b)):
        if reasons := [k for k, v in table.items() if v == f]:
            maybe &= ~(on & as_bools(pc.is_in(reason, value_set=strings(reasons))))
    if not maybe.any():
        return None
    known = pl.DataFrame({"stop_reason": list(table), "_expected_flag": list(table.values())})
    t = (
        b.traj.filter(pl.Series(maybe))
        .select("trajectory_id", "stop_reason", *S.STOP_FLAGS)
        .join(known, on="stop_reason", how="left")
    )
    true_flag = pl.coalesce([pl.when(pl.col(f).fill_null(False)).then(pl.lit(f)) for f in S.STOP_FLAGS])
    unknown = pl.col("stop_reason").is_not_null() & pl.col("_expected_flag").is_null()
    wrong = (_n_true() == 1) & pl.col("_expected_flag").is_not_null() & (pl.col("_expected_flag") != true_flag)
    bad = t.filter(unknown | wrong)
    if bad.is_empty():
        return None
    names = ", ".join(sorted(table))
    msg = (
        pl.when(unknown)
        .then(
            pl.format(
                f"unknown stop_reason '{{}}' (known: {names}; add it to extra_stop_reasons with the flag it sets, "
                'e.g. extra_stop_reasons = {{"{}" = "{}"}})',
                "stop_reason",
                "stop_reason",
                pl.coalesce(true_flag, pl.lit("terminated")),
            )
        )
        .otherwise(
            pl.format(
                "stop_reason '{}' belongs to {}, but {} is the flag set", "stop_reason", "_expected_flag", true_flag
            )
        )
    )
    return bad.rechunk().select("trajectory_id", msg.alias("message"))


@rule(
    "T303",
    "infra_error episode carries a reward or is used in an update",
    scope="log",
    requires=("trajectory_id", "infra_error", "reward"),
    optional=("updates.trajectory_ids", "updates.update_step"),
    partition=("trajectory_id",),
)
def infra_error_scored(log, cfg) -> pl.DataFrame | None:
    """An episode with infra_error = true has a non-null reward, or an update trains on it.

    Lesson “Success, termination, truncation, and infrastructure failure”: when the environment or the engine failed, the record must carry an
    infrastructure status rather than masquerade as a task failure. A reward (usually 0) on
    such an episode tells the policy that the failure was its own; training on it, with or
    without a reward, pushes probability away from actions that did nothing wrong. The
    contract (docs/contract.md, stop causes): an infra_error episode always has a null reward and appears in no
    update. Without update records only the reward is checked. Fix the collector to write a
    null reward and the trainer to drop infra_error episodes from its batches (retry them).
    """
    t = log.traj.filter(pl.col("infra_error").fill_null(False)).select("trajectory_id", "file", "reward")
    if t.is_empty():
        return None
    used = None
    if log.updates is not None and "trajectory_ids" in log.updates.columns:
        u = log.updates
        step = pl.col("update_step") if "update_step" in u.columns else pl.int_range(pl.len())
        used = (
            u.select(step.cast(pl.String).alias("_step"), pl.col("trajectory_ids").alias("trajectory_id"))
            .explode("trajectory_id")
            .join(t.select("trajectory_id").unique(), on="trajectory_id", how="semi")
            .group_by("trajectory_id")
            .agg(pl.col("_step").unique().sort().alias("_steps"))
        )
    if used is not None:
        t = t.join(used, on="trajectory_id", how="left")
    else:
        t = t.with_columns(pl.lit(None, dtype=pl.List(pl.String)).alias("_steps"))
    has_r = pl.col("reward").is_not_null()
    in_upd = pl.col("_steps").is_not_null()
    bad = t.filter(has_r | in_upd)
    if bad.is_empty():
        return None
    r_part = pl.when(has_r).then(pl.format("carries reward {} (expected null)", num(pl.col("reward"))))
    u_part = pl.when(in_upd).then(pl.format("is used in update(s) {}", pl.col("_steps").list.join(", ")))
    msg = pl.concat_str([r_part, u_part], separator=" and ", ignore_nulls=True)
    return bad.rechunk().select("trajectory_id", "file", pl.format("infra_error episode {}", msg).alias("message"))


@rule(
    "T304",
    "truncated episode rewarded against the truncation policy",
    requires=("truncated", "reward"),
    optional=("stop_reason", "final_value", "loss_excluded"),
    config=("truncation",),
)
def truncated_reward(b: BatchView, cfg) -> pl.DataFrame | None:
    """A collector-truncated episode (truncated = true) has a reward that the configured
    truncation policy does not allow.

    Lesson “Success, termination, truncation, and infrastructure failure”: when a limit of the collector (not of the task) cuts an episode, a zero
    reward confounds task difficulty with bad behaviour. Configuration `truncation` states the
    project's policy (docs/contract.md, stop causes): `exclude` (default) — the reward is null (U606 checks that
    no update uses the episode); `bootstrap` — a reward is allowed only with the critic's
    final_value V(h_T) to bootstrap from; `penalize` — a numeric reward is a deliberate
    choice and accepted. Under `exclude`, an episode the trainer excludes from the loss but keeps
    in its group's statistics (loss_excluded, contract 1.2: TRL's mask_truncated_completions)
    may keep its reward: it trains nothing of it (M109 checks). Fix the collector to write the
    reward the policy prescribes, or state the policy you actually use in configuration.
    """
    if cfg.truncation == "penalize":
        return None
    # in numpy, the rows the filters below keep (usually none)
    maybe = as_bools(b.col("truncated")) & validity(b.col("reward"))
    if cfg.truncation == "exclude" and "loss_excluded" in b.columns:
        maybe &= ~as_bools(b.col("loss_excluded"))
    if cfg.truncation == "bootstrap" and "final_value" in b.columns:
        maybe &= ~validity(b.col("final_value"))
    if not maybe.any():
        return None
    t = b.traj.filter(pl.Series(maybe))
    t = t.filter(pl.col("truncated").fill_null(False) & pl.col("reward").is_not_null())
    if cfg.truncation == "exclude" and "loss_excluded" in t.columns:
        t = t.filter(~pl.col("loss_excluded").fill_null(False))
    if "stop_reason" not in t.columns:
        t = t.with_columns(pl.lit(None, dtype=pl.String).alias("stop_reason"))
    if cfg.truncation == "bootstrap":
        if "final_value" in t.columns:
            t = t.filter(pl.col("final_value").is_null())
        msg = pl.format(
            "truncated episode (stop_reason {}) has reward {} but no final_value to bootstrap from "
            "(truncation policy 'bootstrap')",
            pl.col("stop_reason").fill_null("null"),
            num(pl.col("reward")),
        )
    else:
        msg = pl.format(
            "truncated episode (stop_reason {}) has reward {}, expected null (truncation policy 'exclude')",
            pl.col("stop_reason").fill_null("null"),
            num(pl.col("reward")),
        )
    return t.rechunk().select("trajectory_id", msg.alias("message"))


@rule(
    "T305",
    "truncation laundered as termination",
    requires=("terminated", "turns.finish_reason"),
    optional=("stop_reason",),
)
def laundered_truncation(b: BatchView, cfg) -> pl.DataFrame | None:
    """The last turn's finish_reason is `length` or `abort`, but the episode is recorded as
    terminated.

    Lesson “Success, termination, truncation, and infrastructure failure”: an episode cut off by the engine (token limit reached, request aborted)
    did not reach a terminal state of the task; recording it as terminated turns a collector
    limit into a task outcome and usually into a zero reward (a truncated episode scored as
    a failure). Record it as truncated (stop_reason max_tokens or timeout) or infra_error,
    and apply the truncation policy.
    """
    tr = b.turns
    if tr.is_empty():
        return None
    # in numpy, the last turns of terminated episodes that end in a laundered finish_reason
    T = b.turn_counts
    end = b.turn_start + T - 1
    end = end[(T > 0) & as_bools(b.col("terminated"))]
    reasons = pc.struct_field(b.col("turns").flatten(), "finish_reason").take(from_numpy(end))
    is_last = np.zeros(len(tr), bool)
    is_last[end[as_bools(pc.is_in(reasons, value_set=strings(LAUNDERED)))]] = True
    if not is_last.any():
        return None
    last = tr.filter(pl.Series(is_last) & pl.col("finish_reason").is_in(list(LAUNDERED)))
    if last.is_empty():
        return None
    reason = stop_reason(b)
    term = b.traj.filter(pl.col("terminated").fill_null(False)).select("_row", reason)
    bad = last.join(term, on="_row", how="inner")
    return bad.rechunk().select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.format(
            "last turn ended with finish_reason '{}' but the episode is recorded as terminated "
            "(stop_reason {}); expected truncated or infra_error",
            "finish_reason",
            pl.col("stop_reason").fill_null("null"),
        ).alias("message"),
    )


@rule(
    "T306",
    "episode filled the response budget but is recorded as terminated",
    "warning",
    requires=("terminated", "token_turn"),
    optional=("stop_reason",),
    config=("max_response_tokens",),
)
def budget_filled_not_truncated(b: BatchView, cfg) -> pl.DataFrame | None:
    """The episode's tokens from the first agent turn on (token_turn >= 0) number at least
    `max_response_tokens`, the trainer's response budget, yet the episode is recorded as terminated.

    Lesson “Success, termination, truncation, and infrastructure failure”: a multi-turn collector
    that stops when the response budget is used up has cut the episode; when it records no
    truncation (OpenRLHF's multi-turn agent never sets it; a custom generate function that breaks
    out of its loop keeps the last call's status), the cut is scored as a task outcome, usually a
    failure. Record it as truncated (stop_reason max_tokens) and apply the truncation policy. An
    episode that ended exactly at the budget on its own also fires: hence a warning. Runs only
    when `max_response_tokens` is configured.
    """
    limit = cfg.max_response_tokens
    if limit is None:
        raise NotRun(
            "max_response_tokens is not configured (the trainer's response budget, e.g. slime's "
            "--rollout-max-response-len)"
        )
    t = b.tokens
    n = np.bincount(t.row[t.turn >= 0], minlength=b.n)
    reason = stop_reason(b)
    full = b.traj.select("trajectory_id", "_row", "terminated", reason).with_columns(
        pl.Series("n_resp", n[b.traj["_row"].to_numpy()])
    )
    bad = full.filter(pl.col("terminated").fill_null(False) & (pl.col("n_resp") >= limit))
    return bad.select(
        "trajectory_id",
        pl.format(
            "{} tokens from the first agent turn on reach the response budget max_response_tokens = {}, "
            "but the episode is recorded as terminated (stop_reason {}); expected truncated (max_tokens)",
            "n_resp",
            pl.lit(limit),
            pl.col("stop_reason").fill_null("null"),
        ).alias("message"),
    )


_UNBOUNDED = (
    "needs truncation_penalty in the configuration, or a failure (terminated, stop_reason failure) "
    "of the truncated episodes' tasks to bound their reward"
)


def _unbounded(st: dict) -> bool:
    """No rewarded truncated episode could be bounded (and there is one)."""
    return bool(st["truncated_rewarded"]) and st["unbounded"] == st["truncated_rewarded"]


def _merge_penalty(parts: list, whys: list, findings):
    """T307 over partitions by task: the counts add up; it did not run when none could be bounded."""
    parts = [p for p in parts if p]
    if not parts:
        return None, None, findings
    st = {k: sum(p[k] for p in parts) for k in ("truncated_rewarded", "unbounded")}
    return st, _UNBOUNDED if _unbounded(st) else None, findings


@rule(
    "T307",
    "truncated episode paid more than the truncation penalty",
    scope="log",
    requires=("trajectory_id", "task_id", "truncated", "terminated", "reward", "stop_reason"),
    config=("truncation", "truncation_penalty", "atol"),
    partition=("task_id",),
    merge=lambda parts, whys, findings: _merge_penalty(parts, whys, findings),
)
def truncation_penalty(log, cfg) -> pl.DataFrame | None:
    """Under truncation = "penalize", a collector-truncated episode's reward exceeds the penalty:
    the configured `truncation_penalty`, or, when none is configured, the failure reward of its
    task (the largest reward among the task's terminated episodes with stop_reason failure).

    Lesson “Success, termination, truncation, and infrastructure failure”: a collector limit is
    not a task outcome; the `penalize` policy deliberately pays it like a failure (or worse) so
    that the policy learns to finish within the limit. An episode cut at the generation limit
    whose environment still paid the success reward (SkyRL at max_generate_length: the reward
    is computed on the partial transcript) teaches the opposite: running into the limit is as
    good as solving the task. Under the other policies T304 bounds the reward and this check
    has nothing to compare. Without a configured penalty, episodes of a task with no recorded
    failure cannot be bounded and are counted in the statistics, not passed. Fix the trainer to
    overwrite a truncated episode's reward with the penalty (SkyRL: zero_reward_on_non_stop),
    or configure the penalty you actually pay.
    """
    if cfg.truncation != "penalize":
        return None
    t = log.traj
    r = pl.col("reward").cast(pl.Float64)
    failure = pl.col("terminated").fill_null(False) & (pl.col("stop_reason") == "failure") & r.is_not_null()
    fail = t.filter(failure).group_by("task_id").agg(r.max().alias("_fail"))
    cut = t.filter(pl.col("truncated").fill_null(False) & r.is_not_null()).join(fail, on="task_id", how="left")
    if cfg.truncation_penalty is not None:
        cut = cut.with_columns(
            pl.lit(float(cfg.truncation_penalty)).alias("_bound"),
            pl.lit("the configured truncation_penalty").alias("_what"),
        )
    else:
        cut = cut.with_columns(
            pl.col("_fail").alias("_bound"), pl.format("the failure reward of task {}", "task_id").alias("_what")
        )
    log.stats["T307"] = {"truncated_rewarded": cut.height, "unbounded": int(cut["_bound"].is_null().sum())}
    if _unbounded(log.stats["T307"]):
        raise NotRun(_UNBOUNDED)
    bad = cut.filter(pl.col("_bound").is_not_null() & ~(r <= pl.col("_bound") + cfg.atol).fill_null(True))
    if bad.is_empty():
        return None
    return bad.select(
        "trajectory_id",
        "file",
        pl.format(
            "truncated episode (stop_reason {}) has reward {} under truncation = penalize; expected at most {}, {}",
            pl.col("stop_reason").fill_null("null"),
            num(r),
            num(pl.col("_bound")),
            "_what",
        ).alias("message"),
    )


@rule(
    "T308",
    "truncated episode paid more than its turns under bootstrap",
    requires=("truncated", "reward"),
    optional=("turns.reward", "stop_reason"),
    config=("truncation", "atol", "rtol"),
)
def bootstrap_paid_outcome(b: BatchView, cfg) -> pl.DataFrame | None:
    """Under truncation = "bootstrap", a collector-truncated episode's reward exceeds the sum of
    the rewards its turns were paid (turns.reward).

    Lesson “Success, termination, truncation, and infrastructure failure”: under `bootstrap` the
    return of an episode the collector cut is completed by the critic's value of the state it was
    cut at, final_value V(h_T) (T304 requires it): G = Σ r_t + γ^k·V(h_T). The episode earned what
    its transitions were paid and reached no outcome, so none is paid: the critic's value already
    stands for everything after the cut. A reward above the turns' sum is an outcome paid at the
    cut (an environment that scores the partial transcript like a finished one: SkyRL at
    max_generate_length), counted twice with V(h_T), and it teaches that running into the limit
    is as good as solving the task. Compared within atol + rtol·|sum|; episodes with a null
    reward, or with a turn whose reward is null, are not compared; not run under `bootstrap`
    without turns.reward. Under the other policies T304 and T307 bound the reward. Fix the
    trainer to pay a truncated episode only its transitions' rewards (SkyRL:
    zero_reward_on_non_stop), or state the policy you actually use.
    """
    if cfg.truncation != "bootstrap":
        return None
    tr = b.turns
    if "reward" not in tr.columns:
        raise NotRun(
            "turns.reward absent: under truncation = bootstrap a truncated episode's reward is bounded by its turns'"
        )
    # in numpy, the rewarded truncated rows (usually few): only their turns are summed
    maybe = as_bools(b.col("truncated")) & validity(b.col("reward"))
    if not maybe.any():
        return None
    rows = pl.Series("_row", np.flatnonzero(maybe), dtype=tr.schema["_row"])
    paid = (
        tr.filter(pl.col("_row").is_in(rows.implode()))
        .group_by("_row")
        .agg(pl.col("reward").cast(pl.Float64).sum().alias("_paid"), pl.col("reward").null_count().alias("_nulls"))
        .filter(pl.col("_nulls") == 0)
    )
    reason = stop_reason(b)
    t = b.traj.select("trajectory_id", "_row", pl.col("reward").cast(pl.Float64), reason).join(paid, on="_row")
    bad = t.filter(~(pl.col("reward") <= pl.col("_paid") + tolerance(pl.col("_paid"), cfg)))
    return bad.rechunk().select(
        "trajectory_id",
        pl.format(
            "truncated episode (stop_reason {}) has reward {}, more than its turns were paid ({}) under truncation "
            "= bootstrap: the critic's final_value stands for what follows the cut, so no outcome is paid at it",
            pl.col("stop_reason").fill_null("null"),
            num(pl.col("reward")),
            num(pl.col("_paid")),
        ).alias("message"),
    )


@rule(
    "T309",
    "turn the engine stopped on a stop token does not end on one",
    "warning",
    requires=("token_ids", "token_source", "token_turn", "turns.finish_reason"),
    config=("stop_token_ids",),
    preview=True,
)
def stop_token_dropped(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn the inference engine ended with finish_reason `stop` ends, in the trainer's
    sequence, on a policy token (token_source 2, that token_turn, the last in position order)
    that is not one of `stop_token_ids`, the ids the user's engine stops on.

    Lesson “Success, termination, truncation, and infrastructure failure”: an episode ends well
    only if the policy learns to end it, and it learns that from the stop token it sampled: the
    trainer must hold that token, trainable, at the end of the turn. A `stop` turn that ends on
    another token lost its stop token between the engine and the trainer (a response cut one
    token short, a decode with skip_special_tokens re-encoded, an EOS stripped as padding), so
    the policy is never trained to stop and its responses grow to the budget; or the engine
    stopped on an id the user did not mean it to (a generation_config EOS list longer than the
    tokenizer's) or on a stop string, which leaves no stop token in the output. The setting is
    the user's alone (the engine's stop list is not in the log): not run without it. Turns with
    no policy token, or whose row's token lists do not line up, are not compared. Keep the
    sampled stop token in the trainer's sequence, or list every id your engine stops on (its
    EOS included).
    """
    if not cfg.stop_token_ids:
        raise NotRun("needs stop_token_ids (the token ids your inference engine stops on)")
    tr = b.turns
    if not len(tr):
        return None
    reasons = pc.struct_field(b.col("turns").flatten(), "finish_reason")
    t = b.tokens
    index, n_p, p_start = b.policy_by_turn
    k = np.flatnonzero(as_bools(pc.is_in(reasons, value_set=strings(["stop"]))) & (n_p > 0) & b.ok[b.turn_parent])
    last = index[p_start[k] + n_p[k] - 1]
    off = ~np.isin(t.ids[last], np.asarray(cfg.stop_token_ids, np.int64))
    if not off.any():
        return None
    k, last = k[off], last[off]
    found = pl.DataFrame({"_k": k, "position": t.pos[last].astype(np.int64), "_id": t.ids[last].astype(np.int64)})
    return found.join(
        tr.with_row_index("_k").select(pl.col("_k").cast(pl.Int64), "trajectory_id", "_t"), on="_k"
    ).select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        "position",
        pl.format(
            "the engine stopped this turn on a stop token (finish_reason stop), but its last policy token is id {}, "
            "not one of stop_token_ids {}",
            "_id",
            pl.lit(str(list(cfg.stop_token_ids))),
        ).alias("message"),
    )
