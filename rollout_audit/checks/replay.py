"""Replay (L205-L207, L209, L211): the recorded behaviour log-probs against a recomputation under the checkpoint of
the logged policy version and the logged decoding parameters (lessons “Log-probabilities must be captured at every turn” and “Token-level and sequence-level probability ratios”). Off unless
`replay` (`check --replay N`) and a replayer are configured; L207 and L211 also run on a second log-prob column."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import polars as pl

from ..contract.registry import NotRun, Unmet, rule
from ..replay import NotConfigured, load_replayer, replay_frame
from ..replay.run import neighbour_frame, second_frame
from .common import num, tolerance

if TYPE_CHECKING:
    from ..frames.views import LogCheckView as LogView

_TOKEN_REQS = ("pv_min",)  # the sample is stratified by each trajectory's first policy version
# the replayed rows are read back from the log's files: the token lists and turn fields replay scores
_READS = (
    "trajectory_id",
    "token_ids",
    "token_source",
    "behavior_logprobs",
    "token_turn",
    "turns.policy_version",
    "turns.temperature",
    "turns.top_p",
    "turns.top_k",
    "nucleus_ids",
    "nucleus_offsets",
)
_REPLAY_CONFIG = (
    "replay",
    "replayer",
    "replay_checkpoints",
    "replay_endpoints",
    "replay_batch_size",
    "replay_connect_timeout",
    "replay_timeout",
    "replay_max_response_bytes",
    "replay_max_bytes",
)


def _replayed(log: LogView, cfg) -> pl.DataFrame:
    """The replayed token frame, computed once per audit and shared by L205-L207. NotRun when replay
    is off; Unmet (the audit is incomplete) when replay was asked for and could not run."""
    if "replay" not in log.cache and cfg.replay <= 0:
        log.cache["replay"] = NotRun(
            "replay is off: run with --replay N and a replayer named in your own configuration (--config FILE, or "
            'your project\'s pyproject.toml): replay_checkpoints = "ckpt/step-{version}" (a Hugging Face checkpoint '
            'per policy version), replay_endpoints = {"0" = "http://host:8000/v1"}, or replayer = "module:factory"'
        )
    what = f"replay of {cfg.replay} trajectories was asked for and"
    beyond = log.cache.setdefault("replay_beyond", [])
    make = lambda: replay_frame(log.traj, int(cfg.replay), load_replayer(cfg), beyond, log.memory)
    return _cached(log, "replay", make, what)


def _cached(log: LogView, key: str, make, what: str) -> pl.DataFrame:
    """`make()` once per audit under `key`; a replay that cannot run or fails is kept as Unmet (the
    audit is incomplete, the reason begins with `what`) and raised to every check that asks."""
    if key not in log.cache:
        try:
            log.cache[key] = make()
        except (NotConfigured, ValueError) as e:
            log.cache[key] = Unmet(f"{what} did not run: {e}")
        except Exception as e:  # noqa: BLE001 - a replayer failing on this log (e.g. ids beyond its vocabulary)
            first = str(e).splitlines()[0] if str(e) else ""
            log.cache[key] = Unmet(f"{what} failed: {type(e).__name__}: {first}")
    out = log.cache[key]
    if isinstance(out, NotRun):
        raise type(out)(str(out))
    return out


def _located(bad: pl.DataFrame, message: pl.Expr) -> pl.DataFrame | None:
    """One finding per offending policy version, located at its first offending token."""
    return bad.sort("policy_version").select("file", "trajectory_id", "turn", "position", message.alias("message"))


def _over(d: pl.Expr, cfg) -> pl.Expr:
    return d > tolerance(pl.col("recorded"), cfg, cfg.replay_atol)


@rule(
    "L205",
    "recorded behaviour log-probs differ from replay under the logged version",
    "error",
    requires=_TOKEN_REQS,
    scope="log",
    optional=_READS,
    config=_REPLAY_CONFIG + ("replay_atol", "rtol", "replay_max_share"),
)
def replay_mismatch(log: LogView, cfg) -> pl.DataFrame | None:
    """Replaying the logged tokens under the checkpoint of their policy version, with each turn's logged
    temperature / top-p / top-k (and the producer's action mask), gives log-probs that differ from the
    recorded ones: per version, more than `replay_max_share` of the tokens differ by more than
    `replay_atol` + rtol·|recorded|.

    Lesson “Log-probabilities must be captured at every turn”: the importance ratio π_θ/π_beh is only right if π_beh is the distribution the token
    was actually drawn from. Replay is the strongest evidence: a version mismatch (the log says v but v−1
    sampled), ignored top-p, the base softmax instead of the tempered one, or a stale checkpoint mapping
    all show up here. The message gives mean and max |Δ|, the k3 estimate of KL(π_beh ‖ π_replay) and the
    share of tokens over tolerance. Fix the producer (or the checkpoint mapping), not the tolerance.
    """
    df = _replayed(log, cfg).with_columns((pl.col("sampled") - pl.col("recorded")).alias("d"))
    finite = pl.col("d").is_finite()
    df = df.with_columns(
        pl.col("d").abs().alias("ad"),
        (_over(pl.col("d").abs(), cfg) | ~finite).alias("over"),
        pl.when(finite).then((pl.col("d").exp() - 1) - pl.col("d")).alias("k3"),
    )
    per = df.group_by("policy_version").agg(
        pl.len().alias("n"),
        pl.col("ad").filter(finite).mean().alias("mean"),
        pl.col("ad").filter(finite).max().alias("max"),
        (~finite).sum().alias("impossible"),
        pl.col("k3").mean().alias("kl"),
        pl.col("over").mean().alias("share"),
        pl.col("trajectory_id").filter(pl.col("over")).first(),
        pl.col("turn").filter(pl.col("over")).first(),
        pl.col("position").filter(pl.col("over")).first(),
        pl.col("file").filter(pl.col("over")).first(),
    )
    log.stats["L205"] = per.drop("trajectory_id", "turn", "position", "file").sort("policy_version").to_dicts()
    log.stats["replayed_trajectories"] = df["trajectory_id"].n_unique()
    found = _located(
        per.filter(pl.col("share") > cfg.replay_max_share),
        pl.format(
            "policy version {}: {} replayed token(s), {}% over tolerance; mean |Δ| {}, max |Δ| {}, k3 KL {} "
            "(finite ones); {} token(s) impossible under one side",
            "policy_version",
            "n",
            (pl.col("share") * 100).round(2),
            pl.col("mean").round_sig_figs(3),
            pl.col("max").round_sig_figs(3),
            pl.col("kl").round_sig_figs(3),
            "impossible",
        ),
    )
    beyond = log.cache.get("replay_beyond") or []
    if not beyond:
        return found
    # a sampled trajectory with an id the checkpoint has no logit for: named at that id, not replayed
    named = pl.DataFrame(beyond).select("file", "trajectory_id", "position", "message")
    return named if found is None else pl.concat([found, named], how="diagonal_relaxed")


@rule(
    "L206",
    "recorded log-probs are the base softmax, not the sampled distribution",
    "error",
    requires=_TOKEN_REQS,
    scope="log",
    optional=_READS,
    config=_REPLAY_CONFIG + ("replay_atol", "rtol"),
)
def base_softmax(log: LogView, cfg) -> pl.DataFrame | None:
    """The recorded log-probs match the model's base softmax (temperature 1, no top-p/top-k, no mask)
    rather than the distribution the tokens were sampled from.

    Lesson “Token-level and sequence-level probability ratios”: engines return raw log-probs unless told otherwise (vLLM V1 needs
    `--logprobs-mode processed_logprobs`); a trainer that divides log-probs by T is wrong too. Decision
    rule, per policy version, on the tokens where the two distributions differ by more than
    2·replay_atol (elsewhere they cannot be told apart): the check fires when most of those tokens
    match the base softmax within tolerance and are closer to it than to the sampled distribution.
    Near temperature 1 and top-p 1 every token may be indistinguishable: the check then says it cannot
    decide (not run) instead of passing. Record the processed log-probs of the sampler.
    """
    df = _replayed(log, cfg).with_columns(
        (pl.col("recorded") - pl.col("base")).abs().alias("db"),
        (pl.col("recorded") - pl.col("sampled")).abs().alias("ds"),
        ((pl.col("sampled") - pl.col("base")).abs() > 2 * cfg.replay_atol).alias("distinct"),
    )
    per = (
        df.filter(pl.col("distinct"))
        .group_by("policy_version")
        .agg(
            pl.len().alias("n"),
            _over(pl.col("db"), cfg).not_().mean().alias("match_base"),
            (pl.col("db") < pl.col("ds")).mean().alias("closer"),
            pl.col("trajectory_id").first(),
            pl.col("turn").first(),
            pl.col("position").first(),
            pl.col("file").first(),
        )
    )
    undecided = sorted(set(df["policy_version"].unique().to_list()) - set(per["policy_version"].to_list()))
    log.stats["L206"] = {"undecided_versions": undecided}
    if per.is_empty():
        raise NotRun(
            f"cannot decide: sampled and base distributions agree within 2·replay_atol on all "
            f"{df.height} replayed tokens (temperature ≈ 1, top-p ≈ 1)"
        )
    return _located(
        per.filter((pl.col("match_base") > 0.5) & (pl.col("closer") > 0.5)),
        pl.format(
            "policy version {}: {}% of the {} tokens where the sampled and base distributions differ match the "
            "base softmax (closer to it on {}%)",
            "policy_version",
            (pl.col("match_base") * 100).round(1),
            "n",
            (pl.col("closer") * 100).round(1),
        ),
    )


def _other(log: LogView, cfg) -> tuple[pl.DataFrame, str]:
    """The second log-prob per token: a configured column, else replay."""
    if cfg.compare_logprobs:
        key = "second:" + cfg.compare_logprobs
        if key not in log.cache:
            try:
                n = int(cfg.replay) if cfg.replay > 0 else None
                frame = second_frame(log.traj, cfg.compare_logprobs, n, log.memory)
                log.cache[key] = frame.rename({"second": "other"})
            except (NotConfigured, ValueError) as e:
                log.cache[key] = str(e)
        if isinstance(log.cache[key], str):
            raise NotRun(log.cache[key])
        return log.cache[key], cfg.compare_logprobs
    try:
        return _replayed(log, cfg).rename({"sampled": "other"}), "replay"
    except Unmet:
        raise
    except NotRun as e:
        raise NotRun(f"{e}; or name a second per-token log-prob column in compare_logprobs") from None


@rule(
    "L207",
    "extreme per-turn sequence ratio against a second log-prob",
    "warning",
    requires=_TOKEN_REQS,
    scope="log",
    optional=_READS,
    config=_REPLAY_CONFIG + ("compare_logprobs", "max_turn_log_ratio"),
)
def extreme_ratio(log: LogView, cfg) -> pl.DataFrame | None:
    """A turn's sequence ratio exp(Σ_k log π_other(y_k) − log π_beh(y_k)) lies outside
    [1/R, R] with ln R = `max_turn_log_ratio`, where π_other is a second log-prob column of the log
    (`compare_logprobs`, e.g. a trainer's recomputation such as TRL's old_per_token_logps) or replay.

    Lessons “Log-probabilities must be captured at every turn” and “Token-level and sequence-level probability ratios”: on data sampled by the current weights every ratio is 1; a turn whose
    ratio is far from 1 is dominated by clipping (PPO) or explodes (unclipped IS), whichever side is
    wrong. One finding per trajectory, at its most extreme turn.
    """
    df, name = _other(log, cfg)
    per_turn = df.group_by("file", "trajectory_id", "turn").agg(
        (pl.col("other") - pl.col("recorded")).sum().alias("lr"), pl.col("position").min(), pl.len().alias("k")
    )
    bad = per_turn.filter(pl.col("lr").abs() > cfg.max_turn_log_ratio)
    if bad.is_empty():
        return None
    bad = (
        # the most extreme turn; among equal ones (NaN ratios, which polars orders above every
        # number, or equal sums) the first: the example is the same in every run and thread order
        bad.sort(pl.col("lr").abs(), "turn", descending=[True, False], maintain_order=True)
        .group_by("file", "trajectory_id", maintain_order=True)
        .agg(pl.all().first(), pl.len().alias("n_turns"))
    )
    bound = math.exp(cfg.max_turn_log_ratio)
    return bad.sort("file", "trajectory_id").select(
        "file",
        "trajectory_id",
        "turn",
        "position",
        pl.format(
            "{} turn(s) with a sequence ratio π_{}/π_beh outside [{}, {}]; the most extreme: turn {} "
            "({} token(s)), ratio {} (log {})",
            "n_turns",
            pl.lit(name),
            pl.lit(round(1 / bound, 3)),
            pl.lit(round(bound, 3)),
            "turn",
            "k",
            pl.col("lr").exp().round_sig_figs(4),
            pl.col("lr").round_sig_figs(4),
        ).alias("message"),
    )


# The fewest turns of one decoding setting the bias test judges: below it a standard error over turns
# says nothing (the interval's quantile is t with 7 degrees of freedom at this bound)
MIN_BIAS_TURNS = 8
BIAS_LEVEL = 0.999  # the two-sided confidence of the interval the bias must lie beyond
# Student's t at BIAS_LEVEL below 10 degrees of freedom, where the expansion of `t_quantile` is off by
# more than 0.1% (computed by integrating t's density)
_T_SMALL = {7: 5.4079, 8: 5.0413, 9: 4.7809}


def t_quantile(df: int) -> float:
    """Student's t quantile at (1 + BIAS_LEVEL) / 2 with `df` degrees of freedom (df >= 7): the
    table below 10, else the Cornish-Fisher expansion around the normal quantile (four terms:
    within 0.1% of the exact value from 10 degrees of freedom on)."""
    if df in _T_SMALL:
        return _T_SMALL[df]
    if df < 7:
        raise ValueError(f"t_quantile needs at least 7 degrees of freedom, got {df}")
    from statistics import NormalDist  # with fractions and decimal: only a replay's bias needs it

    z = NormalDist().inv_cdf((1 + BIAS_LEVEL) / 2)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(g / df ** (k + 1) for k, g in enumerate(terms))


@rule(
    "L211",
    "consistent signed bias between the behaviour log-probs and a second log-prob",
    "warning",
    requires=_TOKEN_REQS,
    scope="log",
    optional=_READS,
    config=_REPLAY_CONFIG + ("compare_logprobs", "min_logprob_bias"),
)
def consistent_bias(log: LogView, cfg) -> pl.DataFrame | None:
    """Over the turns of one decoding setting (temperature, top_p), the mean per-token difference
    log π_other(y_k) − log π_beh(y_k) and its whole 99.9% interval lie beyond ±`min_logprob_bias`,
    where π_other is the second log-prob column L207 reads (`compare_logprobs`: a trainer's
    recomputation) or replay.

    Lessons “Log-probabilities must be captured at every turn” and “Token-level and sequence-level
    probability ratios”: a sampler at top-p 0.9-0.95 returns log-probs renormalised over its nucleus,
    each token's raised by −log(mass); a trainer that recomputes them over the full vocabulary scores
    every token lower by log(mass), and the importance ratio of every turn leans the same way
    (PrimeIntellect-ai/prime-rl#2600: −0.19 to −0.60 per turn). No single turn is extreme: L207's
    outlier test at ln 2 never fires, while the whole batch trains with a biased ratio. The statistic,
    per decoding setting over its n ≥ 8 turns: the token-weighted mean bias m = Σ_t S_t / Σ_t k_t
    (S_t the turn's summed difference, k_t its tokens), its standard error over turns
    se = √(n/(n−1) · Σ_t (S_t − k_t·m)²) / Σ_t k_t (tokens of a turn are not independent, turns are
    the units), and the interval m ± t_{n−1}·se at 99.9%. It fires when the whole interval lies
    beyond ±`min_logprob_bias` (0.01 nats a token: a nucleus of mass 0.99 on one side only): float32
    noise (≈10⁻⁷) and bf16 engines (zero-mean rounding, and the −KL(π_beh ‖ π_other) a sampled token
    carries, ≈10⁻³ a token) stay below it. The finding names the setting, m with its interval, the
    share of turns on the bias's side (a sign test's count) and the nucleus mass exp(−|m|) that
    would explain it (on the behaviour side when m < 0, on the second column's when m > 0), once per
    trajectory of that setting whose own mean bias has the batch's sign, at its most biased turn.
    Settings with fewer than 8 turns are not judged; a log with none is not run. Measured false
    positives: none on the compliant fixtures that record a second column (verifiers'
    `compliant_v1_trainer_logprobs`, a bf16 trainer; verl's `trainer_compliant`; on the others it is
    not run without replay); none in 600 synthetic compliant logs of 128 trajectories, 200 each with
    float32 noise, bf16 rounding of the second column, and a bf16 engine against a bf16 trainer,
    whose 99.9% intervals never reached past ±0.0055 (`python benchmarks/bias_fpr.py --runs 200`,
    which also catches the top-p fault in 200 of 200). Fix the side that is not the sampler's:
    record the processed log-probs and recompute them over the same nucleus (or sample without
    top-p), or correct the ratio with the recorded nucleus.
    """
    df, name = _other(log, cfg)
    d = pl.col("other") - pl.col("recorded")
    per_turn = (
        df.filter(d.is_finite())
        .group_by("file", "trajectory_id", "turn")
        .agg(
            d.sum().alias("s"),
            pl.len().alias("k"),
            pl.col("position").min(),
            pl.col("temperature").first(),
            pl.col("top_p").first(),
        )
    )
    setting = ["temperature", "top_p"]
    per = (
        per_turn.group_by(setting)
        .agg(pl.len().alias("n"), pl.col("k").sum().alias("tokens"), pl.col("s").sum().alias("total"))
        .with_columns((pl.col("total") / pl.col("tokens")).alias("m"))
    )
    judged = per.filter(pl.col("n") >= MIN_BIAS_TURNS)
    if judged.is_empty():
        raise NotRun(
            f"needs at least {MIN_BIAS_TURNS} turns of one decoding setting with both log-probs; the most in one "
            f"setting: {max(per['n'].to_list(), default=0)}"
        )
    spread = (
        per_turn.join(judged.select(*setting, "m"), on=setting)
        .group_by(setting)
        .agg(((pl.col("s") - pl.col("k") * pl.col("m")) ** 2).sum().alias("ss"))
    )
    judged = judged.join(spread, on=setting)
    judged = judged.with_columns(  # one quantile per decoding setting: a handful
        ((pl.col("n") / (pl.col("n") - 1) * pl.col("ss")).sqrt() / pl.col("tokens")).alias("se"),
        pl.Series("q", [t_quantile(n - 1) for n in judged["n"].to_list()], pl.Float64),
    )
    judged = judged.with_columns(
        (pl.col("m") - pl.col("q") * pl.col("se")).alias("lo"), (pl.col("m") + pl.col("q") * pl.col("se")).alias("hi")
    )
    log.stats["L211"] = judged.select(*setting, "n", "tokens", "m", "lo", "hi").sort(setting).to_dicts()
    delta = cfg.min_logprob_bias
    biased = judged.filter((pl.col("lo") > delta) | (pl.col("hi") < -delta))
    if biased.is_empty():
        return None
    side = pl.col("s").sign() == pl.col("m").sign()
    turns = per_turn.join(biased.select(*setting, "m", "lo", "hi", "n", "tokens"), on=setting)
    turns = turns.with_columns(side.alias("_side"))
    share = turns.group_by(setting).agg(pl.col("_side").mean().alias("share"))
    per_traj = (
        turns.sort((pl.col("s") * pl.col("m").sign()), "turn", descending=[True, False], maintain_order=True)
        .group_by("file", "trajectory_id", *setting, maintain_order=True)
        .agg(
            pl.all().first(),
            (pl.col("s").sum() / pl.col("k").sum()).alias("own"),
            pl.len().alias("own_turns"),
        )
        .filter(pl.col("own").sign() == pl.col("m").sign())
        .join(share, on=setting)
    )
    if per_traj.is_empty():
        return None
    low = pl.col("m") < 0
    mass = (-pl.col("m").abs()).exp()
    where = pl.when(low).then(pl.lit("the behaviour log-probs")).otherwise(pl.lit(f"π_{name}"))
    other = pl.when(low).then(pl.lit(f"π_{name}")).otherwise(pl.lit("the behaviour log-probs"))
    return per_traj.sort("file", "trajectory_id", *setting).select(
        "file",
        "trajectory_id",
        "turn",
        "position",
        pl.format(
            "turns sampled at temperature {}, top_p {}: mean per-token log π_{} − log π_beh {} "
            "(99.9% interval [{}, {}]) over {} turns, {} tokens, {}% of the turns on its side; renormalising "
            "{} over a nucleus of mass {} (interval [{}, {}]) that {} is not would explain it. This trajectory: "
            "mean {} over its {} turn(s); the most biased: turn {} ({} token(s), sum {})",
            num(pl.col("temperature")),
            num(pl.col("top_p")),
            pl.lit(name),
            num(pl.col("m"), 3),
            num(pl.col("lo"), 3),
            num(pl.col("hi"), 3),
            "n",
            "tokens",
            num(pl.col("share") * 100, 3),
            where,
            num(mass, 3),
            num((-pl.max_horizontal(pl.col("lo").abs(), pl.col("hi").abs())).exp(), 3),
            num((-pl.min_horizontal(pl.col("lo").abs(), pl.col("hi").abs())).exp(), 3),
            other,
            num(pl.col("own"), 3),
            "own_turns",
            "turn",
            "k",
            num(pl.col("s"), 3),
        ).alias("message"),
    )


def _neighbours(log: LogView, cfg) -> pl.DataFrame:
    """The replayed tokens also scored under the neighbouring policy versions (once per audit)."""
    _replayed(log, cfg)  # the same sample; raises NotRun / Unmet as L205 does
    make = lambda: neighbour_frame(log.traj, int(cfg.replay), load_replayer(cfg), log.memory)
    return _cached(log, "neighbours", make, "replay under the neighbouring versions")


@rule(
    "L209",
    "a neighbouring policy version explains a turn's tokens, the logged one does not",
    "error",
    requires=_TOKEN_REQS,
    scope="log",
    optional=_READS,
    config=_REPLAY_CONFIG + ("replay_atol", "rtol", "replay_max_share"),
)
def neighbour_version(log: LogView, cfg) -> pl.DataFrame | None:
    """A replayed turn's recorded log-probs are reproduced by the checkpoint of a neighbouring
    policy version (the one before or after the logged version among the versions of the
    replayed sample: the weights the engine was given before and after) and
    not by the logged version's: within the turn, at most `replay_max_share` of the tokens differ
    by more than `replay_atol` + rtol·|recorded| under the neighbour, more under the logged one.

    Lesson “Log-probabilities must be captured at every turn”: the importance ratio needs the
    distribution the token was drawn from, and the staleness bound needs the version that drew
    it. A version stamped when the generation completes rather than when it was dispatched
    (rllm-org/rllm#622: a weight sync during the request) leaves a record that is consistent
    with itself: only replay can tell which weights sampled the tokens. L205 says the logged
    version does not reproduce the log-probs; this check says which version does, naming the
    logged and the explaining version and the gap between their mean |Δ| (one finding per
    trajectory, at its first such turn, with the number of such turns). A turn the logged
    version reproduces never fires, whatever its neighbours do. Each replayed trajectory is
    scored twice more (a version without a checkpoint is skipped). Fix the producer to stamp
    the version when the request is dispatched (and to split or drop a generation that spans
    a weight update).
    """
    df = _neighbours(log, cfg)
    logged = _replayed(log, cfg).select("file", "trajectory_id", "position", "sampled")
    df = df.join(logged, on=["file", "trajectory_id", "position"], how="inner")
    rec = pl.col("recorded")

    def over(col: str) -> pl.Expr:
        d = (pl.col(col) - rec).abs()
        return (~(d <= tolerance(rec, cfg, cfg.replay_atol))).fill_null(True)

    per = df.group_by("file", "trajectory_id", "turn").agg(
        pl.col("policy_version").first(),
        pl.col("position").min(),
        pl.len().alias("n"),
        *[
            e
            for side in ("sampled", "sampled_prev", "sampled_next")
            for e in (over(side).mean().alias(f"{side}_share"), (pl.col(side) - rec).abs().mean().alias(f"{side}_d"))
        ],
        pl.col("prev_version").first(),
        pl.col("next_version").first(),
    )
    explains = lambda side: (pl.col(f"{side}_share") <= cfg.replay_max_share) & pl.col(f"{side}_d").is_finite()
    side = pl.when(explains("sampled_prev")).then(pl.lit("prev")).when(explains("sampled_next")).then(pl.lit("next"))
    per = per.with_columns(side.alias("_side")).filter(
        (pl.col("sampled_share") > cfg.replay_max_share) & pl.col("_side").is_not_null()
    )
    if per.is_empty():
        return None
    prev = pl.col("_side") == "prev"
    per = per.with_columns(
        pl.when(prev).then(pl.col("prev_version")).otherwise(pl.col("next_version")).cast(pl.Int64).alias("_v"),
        pl.when(prev).then(pl.col("sampled_prev_d")).otherwise(pl.col("sampled_next_d")).alias("_d"),
    )
    first = (
        per.sort("file", "trajectory_id", "turn")
        .group_by("file", "trajectory_id", maintain_order=True)
        .agg(pl.all().first(), pl.len().alias("n_turns"))
    )
    return first.select(
        "file",
        "trajectory_id",
        "turn",
        "position",
        pl.format(
            "{} turn(s) whose log-probs policy version {} reproduces and the logged version {} does not; "
            "the first: turn {} ({} token(s)), mean |Δ| {} under version {}, {} under version {} (gap {})",
            "n_turns",
            "_v",
            "policy_version",
            "turn",
            "n",
            pl.col("_d").round_sig_figs(3),
            "_v",
            pl.col("sampled_d").round_sig_figs(3),
            "policy_version",
            (pl.col("sampled_d") - pl.col("_d")).round_sig_figs(3),
        ).alias("message"),
    )


def replay_summary(stats: dict) -> dict | None:
    """What the audit replayed, from L205's statistics: trajectories, tokens and policy versions
    recomputed, and the largest and mean |replayed - recorded| log-prob; None when nothing was."""
    per = stats.get("L205") or []
    if not per:
        return None
    tokens = sum(int(v["n"]) for v in per)
    gaps = [v["max"] for v in per if v["max"] is not None]
    means = [(v["mean"], v["n"]) for v in per if v["mean"] is not None]
    return {
        "trajectories": stats.get("replayed_trajectories"),
        "tokens": tokens,
        "versions": [v["policy_version"] for v in per],
        "largest_gap": max(gaps) if gaps else None,
        "mean_gap": sum(m * n for m, n in means) / sum(n for _, n in means) if means else None,
        "share_over_tolerance": sum(v["share"] * v["n"] for v in per if v["share"] is not None) / tokens,
    }


def replay_line(summary: dict) -> str:
    """`replay_summary` as one line of text."""
    versions = ", ".join(map(str, summary["versions"]))
    gap = summary["largest_gap"]
    n = summary["trajectories"]
    return (
        f"replayed: {'' if n is None else f'{n} trajectories, '}{summary['tokens']} tokens of policy version"
        f"{'s' if len(summary['versions']) != 1 else ''} {versions}; largest |replayed - recorded| log-prob "
        f"{'n/a' if gap is None else f'{gap:.2g}'}, {summary['share_over_tolerance']:.1%} of tokens over tolerance"
    )
