"""Log-probabilities (L): the behaviour log-probs every importance ratio is built on
(docs/checks.md, lesson “Log-probabilities must be captured at every turn”, “Token-level and sequence-level probability ratios”). Replay checks (L205-L207) need a replayer
and live with it; L208 is the placeholder convention of contract 1.1."""

from __future__ import annotations

import numpy as np
import polars as pl

from ..contract.registry import NotRun, rule
from ..frames import native
from ..frames.views import BatchView
from ..replay.nucleus import read_nucleus
from .common import beyond, ragged_index, source_breakdown, tolerance, where_first


@rule(
    "L201",
    "loss-mask token with a missing or invalid behaviour log-prob",
    "error",
    requires=("loss_mask", "behavior_logprobs", "token_source"),
    optional=("token_turn",),
)
def invalid_logprob(b: BatchView, cfg) -> pl.DataFrame | None:
    """A policy-sampled token with loss_mask true has a missing (null), NaN, infinite or
    positive behaviour log-prob.

    Lesson “Log-probabilities must be captured at every turn”: the policy-gradient ratio π_θ(y_k | h) / π_beh(y_k | h) needs the
    log-probability of every trained token under the distribution it was actually sampled
    from, captured at sampling time on every turn. A log-prob is a finite number ≤ 0; a null
    or NaN turns into a NaN loss or, worse, a silently zeroed ratio after clamping. Record
    the engine's log-probs for every sampled token (e.g. vLLM `logprobs=0`, SGLang
    `return_logprob`), and never put a token without one into the loss. Tokens the policy
    did not sample have no behaviour log-prob by definition: in the loss they are reported
    by M101, not here.
    """
    if not b.ok.any() or not b.any_count("n_trainable_bad_lp"):  # counts every source: a superset
        return None
    t = b.tokens
    st = b.lp_state
    bad = t.mask & t.policy & (st != 1)  # non-policy tokens in the loss are M101's
    if not bad.any():
        return None
    idx = np.flatnonzero(bad)
    lp, row, present = t.lp[idx], t.row[idx], t.lp_present[idx]  # lp is undefined where not present
    kinds = {
        "missing": ~present,
        "NaN": present & np.isnan(lp),
        "infinite": present & np.isinf(lp),
        "positive": present & np.isfinite(lp) & (lp > 0),
    }
    loc = b.locate(bad)
    rows = loc["_row"].to_numpy()
    loc = loc.with_columns(pl.Series(k, np.bincount(row[v], minlength=b.n)[rows]) for k, v in kinds.items())
    parts = pl.concat_list([pl.when(pl.col(k) > 0).then(pl.format(f"{k} {{}}", k)) for k in kinds])
    return loc.select(
        "trajectory_id",
        "turn",
        "position",
        pl.format(
            "{} loss-mask token(s) without a valid behaviour log-prob ({}); expected a finite value <= 0; first at ",
            "n",
            parts.list.drop_nulls().list.join(", "),
        )
        .add(where_first())
        .alias("message"),
    )


@rule(
    "L202",
    "turn logprob differs from the sum of its token log-probs",
    "error",
    requires=("turns.logprob", "behavior_logprobs", "token_source", "token_turn"),
    config=("logprob_atol", "rtol"),
)
def turn_logprob_sum(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn's recorded logprob differs from the sum of the behaviour log-probs of its policy
    tokens: |logprob − Σ_k log π_beh(y_k)| > logprob_atol + rtol·|Σ|.

    Lesson “Log-probabilities must be captured at every turn”: log π_beh(a_t | h_t) of a turn is the sum of the log-probs of the tokens
    sampled in it. A turn logprob that disagrees with its tokens was computed on another
    tokenization, another span (the template tokens, a truncated action) or recomputed
    afterwards rather than captured at sampling time. Only turns whose policy tokens all have
    valid log-probs are compared (L201 reports the others); a null turn logprob is not
    compared. Token log-probs are float32, so the sum is compared with `logprob_atol`.
    """
    tr = b.turns
    if not len(tr) or "rc_lp_sum" not in tr.columns:
        return None
    d = (pl.col("logprob") - pl.col("rc_lp_sum")).abs()
    tol = tolerance(pl.col("rc_lp_sum"), cfg, cfg.logprob_atol)
    bad = tr.filter(
        pl.col("rc_n_policy").is_not_null()
        & (pl.col("rc_n_lp_valid") == pl.col("rc_n_policy"))
        & pl.col("logprob").is_not_null()
        & ~(d <= tol).fill_null(False)
    )
    return bad.select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.col("rc_first_policy_pos").alias("position"),
        pl.format(
            "turn logprob is {}, but its {} policy token log-probs sum to {} (|diff| {})",
            pl.col("logprob").round_sig_figs(8),
            "rc_n_policy",
            pl.col("rc_lp_sum").round_sig_figs(8),
            d.round_sig_figs(3),
        ).alias("message"),
    )


@rule(
    "L203",
    "behaviour log-prob on a token the policy did not sample",
    "error",
    requires=("behavior_logprobs", "token_source"),
    optional=("token_turn",),
)
def logprob_on_non_policy(b: BatchView, cfg) -> pl.DataFrame | None:
    """A token the policy did not sample (system, user, observation, template) carries a
    behaviour log-prob.

    Lesson “Who generated each token” and “Log-probabilities must be captured at every turn”: only sampled tokens have a behaviour probability; the
    environment's reply and the template were not drawn from π_beh. A log-prob there means
    the log-probs were taken from a teacher-forced pass over the whole sequence (a different
    quantity from the sampling distribution), or the provenance tags are shifted. Write
    null for every token whose token_source is not 2.
    """
    if not b.ok.any() or not b.any_count("n_lp_nonpolicy"):
        return None
    t = b.tokens
    bad = t.lp_present & ~t.policy
    if not bad.any():
        return None
    loc = b.locate(bad).join(b.traj.select("_row", pl.col("^n_lp_src.*$")), on="_row")
    return loc.select(
        "trajectory_id",
        "turn",
        "position",
        pl.format(
            "behaviour log-prob recorded on {} non-policy token(s) ({}); expected null; first at ",
            "n",
            source_breakdown("n_lp_src"),
        )
        .add(where_first())
        .alias("message"),
    )


@rule("L204", "decoding parameters missing for a turn", "warning", requires=("turns.temperature", "turns.top_p"))
def decoding_params(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn has no temperature or no top_p recorded (null or NaN).

    Lesson “Log-probabilities must be captured at every turn” and “Token-level and sequence-level probability ratios”: the behaviour distribution is the model's softmax *after*
    temperature, top-p and action masks. Without the decoding parameters of each turn the
    recorded log-probs cannot be reproduced (replay, L205/L206) and a trainer that recomputes
    them at temperature 1 silently changes the importance ratio. Record the sampling
    parameters the engine actually used, per turn.
    """
    tr = b.turns
    if not len(tr):
        return None
    miss_t = pl.col("temperature").is_null() | pl.col("temperature").is_nan()
    miss_p = pl.col("top_p").is_null() | pl.col("top_p").is_nan()
    bad = tr.filter(miss_t | miss_p)
    if bad.is_empty():
        return None
    per = bad.group_by("_row", maintain_order=True).agg(
        pl.col("trajectory_id").first(),
        pl.col("_t").first().alias("turn"),
        pl.col("_t").filter(miss_t).alias("tt"),
        pl.col("_t").filter(miss_p).alias("tp"),
    )
    per = per.join(tr.group_by("_row").agg(pl.len().alias("T")), on="_row")

    def part(name: str, col: str) -> pl.Expr:
        return pl.when(pl.col(col).list.len() > 0).then(
            pl.format(
                f"{name} missing on {{}} of {{}} turn(s) (turns {{}})",
                pl.col(col).list.len(),
                "T",
                pl.col(col).list.head(10).cast(pl.List(pl.String)).list.join(", "),
            )
        )

    return per.select(
        "trajectory_id",
        "turn",
        pl.concat_str([part("temperature", "tt"), part("top_p", "tp")], separator="; ", ignore_nulls=True).alias(
            "message"
        ),
    )


@rule(
    "L212",
    "turn sampled at another temperature than the trainer recorded for its sampler",
    "error",
    requires=("turns.temperature",),
    config=("trainer_temperature", "atol", "rtol"),
)
def temperature_against_trainer(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn's recorded temperature (the one its engine call ran with) differs from the temperature
    the trainer states its sampler used and recomputes log-probs at (`trainer_temperature`).

    Lesson “Token-level and sequence-level probability ratios”: the behaviour log-probs are those of
    the softmax at the sampling temperature; a trainer that recomputes the old and new log-probs at
    another one builds every importance ratio between two different distributions, with no error
    anywhere. It happens when a layer between the agent and the engine rewrites the sampling
    parameters: agent-lightning's proxy replaces every request's temperature with its own
    `default_proxy.train.temperature` while its verl trainer records and recomputes at
    `actor_rollout_ref.rollout.temperature`. Set the two to the same value, or record and recompute
    at the one the engine ran with. Turns with no recorded temperature are L204's and not compared.
    """
    if cfg.trainer_temperature is None:
        raise NotRun("needs trainer_temperature (the temperature the trainer recomputes log-probs at)")
    tr = b.turns
    if not len(tr):
        return None
    expected = float(cfg.trainer_temperature)
    temp = pl.col("temperature").cast(pl.Float64)
    off = (temp.is_not_null() & ~temp.is_nan() & beyond(temp, expected, cfg)).fill_null(False)
    bad = tr.filter(off)
    if bad.is_empty():
        return None
    per = bad.group_by("_row", maintain_order=True).agg(
        pl.col("trajectory_id").first(),
        pl.col("_t").first().alias("turn"),
        pl.col("temperature").first().cast(pl.Float64).round(6).alias("found"),
        pl.len().alias("n"),
    )
    per = per.join(tr.group_by("_row").agg(pl.len().alias("T")), on="_row")
    return per.select(
        "trajectory_id",
        "turn",
        pl.format(
            "sampled at temperature {} on {} of {} turn(s), the trainer recomputes at trainer_temperature = {}",
            "found",
            "n",
            "T",
            pl.lit(round(expected, 6)),
        ).alias("message"),
    )


# Without provenance, the fewest trainable tokens of a turn, every one exactly 0.0, that L208 reports
PLACEHOLDER_TURN = 8


@rule(
    "L208",
    "placeholder 0.0 log-prob on a trainable policy token sampled at temperature > 0",
    "warning",
    requires=("loss_mask", "behavior_logprobs", "token_turn", "turns.temperature", "turns.top_p"),
    optional=("token_source",),
)
def placeholder_logprob(b: BatchView, cfg) -> pl.DataFrame | None:
    """A trainable policy token carries a behaviour log-prob of exactly 0.0 in a turn sampled
    at temperature > 0 with top_p = 1 (contract 1.1, the placeholder convention).

    Several frameworks (TRL, verl, SkyRL, slime, OpenRLHF) write 0.0 where a token has no
    log-prob; the contract writes null there. A 0.0 left on a trained token claims probability
    1, and the importance ratio becomes π_θ / 1: an appended EOS with a placeholder, or a span
    whose log-probs were never captured, trains with a ratio that is not a ratio. Sampling at
    temperature > 0 over the full vocabulary (top_p = 1) gives probability exactly 1 only when
    float32 rounds it there (p > 1 − 6·10⁻⁸), hence a warning. A nucleus (top_p < 1) can hold a
    single token, whose renormalised log-prob is genuinely 0.0: those turns never fire, nor do
    greedy turns (temperature 0) or turns with unknown decoding parameters (L204).

    Without provenance (no `token_source`: a SkyRL or slime dump without the hook's engine calls)
    the placeholder is still visible on what the loss mask trains, but a single 0.0 is not: a
    confident sampled token, or an EOS the engine appended, reads the same. Only the span whose
    log-probs were never captured is reported then: a turn whose trainable tokens with a log-prob
    are all exactly 0.0, at least 8 of them. Each would need p > 1 − 6·10⁻⁸ under sampling at
    temperature > 0 over the full vocabulary, every token of a turn of eight or more: a genuine
    near-certain token sits among sampled tokens whose log-probs are below 0, while a span the
    engine's log-probs never reached is 0.0 from its first token to its last. Shorter turns and a lone 0.0 (the appended EOS) need the
    engine's calls: with them, M101 reports a token the engine never sampled. Fix the adapter to
    write null where the framework wrote a placeholder, and keep such tokens out of the loss.
    """
    if not b.ok.any():
        return None
    t = b.tokens
    zero = t.lp == 0.0  # rare: the other conditions are read only when some log-prob is 0.0
    if not zero.any():
        return None
    provenance = b.has("token_source")
    zero &= t.mask & t.lp_present
    if provenance:
        zero &= t.policy
    if not zero.any():
        return None
    tr = b.turns
    sampled = ((pl.col("temperature") > 0) & (pl.col("top_p") >= 1.0)).fill_null(False)
    eligible = tr.select(sampled.alias("s"))["s"].to_numpy() if len(tr) else np.zeros(0, bool)
    key = b.turn_key
    zero &= key >= 0
    zero[zero] = eligible[key[zero]]
    if not provenance and zero.any():  # only a whole turn of placeholders: see the docstring
        trained = t.mask & t.lp_present & (key >= 0)
        n_trained = np.bincount(key[trained], minlength=len(tr))
        n_zero = np.bincount(key[zero], minlength=len(tr))
        whole = (n_zero == n_trained) & (n_zero >= PLACEHOLDER_TURN)
        zero[zero] = whole[key[zero]]
    if not zero.any():
        return None
    loc = b.locate(zero)
    what = (
        "trainable policy token(s) with behaviour log-prob exactly 0.0 sampled at temperature > 0, top_p 1 "
        "(a placeholder, not a probability); first at "
        if provenance
        else f"trainable token(s) with behaviour log-prob exactly 0.0, every one of a turn of {PLACEHOLDER_TURN} or "
        "more sampled at temperature > 0, top_p 1 (log-probs never captured; no provenance recorded); first at "
    )
    return loc.select(
        "trajectory_id",
        "turn",
        "position",
        pl.format("{} " + what, "n").add(where_first()).alias("message"),
    )


@rule(
    "L210",
    "sampled token outside the nucleus the engine recorded for it",
    "error",
    requires=("token_ids", "nucleus_ids", "nucleus_offsets"),
    optional=("token_turn",),
)
def outside_nucleus(b: BatchView, cfg) -> pl.DataFrame | None:
    """A token whose nucleus the engine recorded (contract 1.3 nucleus_ids, nucleus_offsets: slime's
    rollout_top_p_token_ids with their offsets) is not among its own recorded ids.

    Lesson “Token-level and sequence-level probability ratios”: with top-p (or top-k) the behaviour
    distribution is the model's softmax renormalised over the nucleus, and a trainer that replays
    the sampler (slime masks the training logits to the recorded ids before its log-softmax) scores
    each token over its own recorded support. A sampled token is always inside the support it was
    drawn from, so a token outside it means the record and the tokens are misaligned: the spans
    shifted by a position (the logits row that predicts token p is row p − 1), a resumed call's
    spans appended without rebasing, the ids of another sample. The trainer then gives that token a
    probability of zero under its own replayed distribution (an infinite or clamped ratio), and
    replay renormalises over the wrong support. Tokens with an empty span (prompt, tool output, a
    turn sampled without a cut-off) record nothing and are not judged; a record whose offsets do
    not fit the tokens (not one more than the tokens, not from 0 to the number of ids, decreasing)
    is named and not read. Align the nucleus with the token it was sampled for, in the same order
    as the log-probs.
    """
    if not b.ok.any():
        return None
    t = b.tokens
    nuc = read_nucleus(b.col("nucleus_offsets"), b.col("nucleus_ids"), t.n_tok, b.ok)
    parts: list[pl.DataFrame] = []
    broken = sorted(nuc.why)
    if broken:
        parts.append(
            pl.DataFrame(
                {
                    "trajectory_id": b.ids.gather(broken),
                    "message": [f"{nuc.why[r]}; the nucleus is not read" for r in broken],
                },
                schema={"trajectory_id": pl.String, "message": pl.String},
            )
        )
    rows = np.flatnonzero(nuc.good)
    if rows.size:
        whole = bool(np.array_equal(nuc.good, b.ok))  # every row's record read: the tokens in their order
        token = None if whole else ragged_index(t.starts[rows], t.n_tok[rows])[0]
        held = t.ids if token is None else t.ids[token]
        # per token with a span: none of its kept ids equals it (one pass over the kept ids)
        miss = native.outside(held, nuc.length, nuc.ids)
        if token is None:
            bad = miss
        else:
            bad = np.zeros(t.ids.size, bool)
            bad[token] = miss
        if bad.any():
            size = np.zeros(t.ids.size, np.int64)
            size[slice(None) if token is None else token] = nuc.length
            loc = b.locate(bad)
            first = t.starts[loc["_row"].to_numpy()] + loc["position"].to_numpy()
            loc = loc.with_columns(pl.Series("_id", t.ids[first].astype(np.int64)), pl.Series("_k", size[first]))
            parts.append(
                loc.select(
                    "trajectory_id",
                    "turn",
                    "position",
                    pl.format(
                        "{} sampled token(s) outside the nucleus the engine recorded for them; first at ",
                        "n",
                    )
                    .add(where_first())
                    .add(pl.format(": id {} is not among its {} recorded id(s)", "_id", "_k"))
                    .alias("message"),
                )
            )
    return pl.concat(parts, how="diagonal_relaxed") if parts else None
