"""Policy versions (P): which weights sampled each turn, and how stale the data is when the
trainer uses it (docs/checks.md, lesson “Log-probabilities must be captured at every turn”, “Token-level and sequence-level probability ratios”)."""

from __future__ import annotations

import numpy as np
import polars as pl

from ..contract import schema as S
from ..contract.registry import BY_UPDATE, NotRun, rule
from ..frames import native
from ..frames.views import BatchView
from .common import of_rows, token_list, where_first


def _histogram(s: pl.Series) -> dict[int, int]:
    """value -> count, sorted by value (JSON-friendly)."""
    vc = s.drop_nulls().value_counts().sort(s.name)
    return {int(k): int(v) for k, v in zip(vc[s.name].to_list(), vc["count"].to_list())}


def _fmt_hist(h: dict) -> str:
    return ", ".join(f"{k}: {v}" for k, v in h.items())


@rule("P501", "policy_version missing on a turn", "error", requires=("turns.policy_version",))
def version_missing(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn has no policy_version (null).

    Lesson “Log-probabilities must be captured at every turn”: with asynchronous or off-policy collection, the weights that sampled a
    turn are part of the behaviour policy's definition; without the version neither the
    policy lag (P503) nor a replay of the log-probs (L205) can be established, and the turn
    cannot be excluded when it is too stale. Record the weight version the engine held when
    it sampled each turn (not the version at episode start).
    """
    tr = b.turns
    if not len(tr) or not tr["policy_version"].null_count():
        return None
    nulls = tr["policy_version"].is_null().to_numpy()
    miss = pl.col("policy_version").is_null()
    per = (
        tr.filter(pl.Series(of_rows(b.turn_parent, b.turn_parent[nulls], b.n)))
        .group_by("_row", maintain_order=True)
        .agg(pl.col("trajectory_id").first(), pl.len().alias("T"), pl.col("_t").filter(miss).alias("tm"))
        .filter(pl.col("tm").list.len() > 0)
    )
    return per.select(
        "trajectory_id",
        pl.col("tm").list.first().alias("turn"),
        pl.format(
            "policy_version is null on {} of {} turn(s) (turns {})",
            pl.col("tm").list.len(),
            "T",
            pl.col("tm").list.head(10).cast(pl.List(pl.String)).list.join(", "),
        ).alias("message"),
    )


@rule("P502", "policy versions decrease within an episode", "error", requires=("turns.policy_version",))
def version_decreasing(b: BatchView, cfg) -> pl.DataFrame | None:
    """A turn's policy_version is lower than the version of the turn before it (the previous
    turn with a version) in the same episode.

    Lesson “Log-probabilities must be captured at every turn” and “Token-level and sequence-level probability ratios”: weights only move forward; within one episode later turns are
    sampled by the same or newer weights. A decrease means versions were taken from the
    wrong worker, turns were reordered, or an episode was stitched from several rollouts.
    Fix the version bookkeeping of the collector (record the engine's weight version at
    sampling time, in turn order).
    """
    tr = b.turns
    if not len(tr):
        return None
    # in numpy, the turns with a lower version than the previous turn with one (usually none)
    pv = tr["policy_version"]
    has = pv.is_not_null().to_numpy()
    parent, v = b.turn_parent[has], pv.drop_nulls().to_numpy()
    lower = np.flatnonzero((parent[1:] == parent[:-1]) & (v[1:] < v[:-1]))
    if not lower.size:
        return None
    tr = tr.filter(pl.Series(of_rows(b.turn_parent, parent[lower + 1], b.n)))
    # turns are contiguous per trajectory and in order: a sentinel at each turn 0 stops the forward
    # fill at the trajectory's start (a window over `_row` costs ten times more)
    start = pl.lit(np.iinfo(np.int64).min, pl.Int64)
    prev = pl.when(pl.col("_t") == 0).then(start).otherwise(pl.col("policy_version").shift(1)).forward_fill()
    bad = tr.with_columns(prev.alias("prev")).filter(pl.col("policy_version") < pl.col("prev"))
    return bad.select(
        "trajectory_id",
        pl.col("_t").alias("turn"),
        pl.format(
            "policy_version {} follows version {} of an earlier turn; expected non-decreasing versions",
            "policy_version",
            "prev",
        ).alias("message"),
    )


@rule(
    "P503",
    "policy lag above the bound in an update",
    "error",
    scope="log",
    requires=("updates", "updates.trainer_version", "updates.trajectory_ids", "pv_min"),
    optional=("pv_max", "updates.max_policy_lag", "updates.update_step"),
    config=("max_policy_lag",),
    partition=BY_UPDATE,
    merge=lambda parts, whys, findings: _merge_lag(parts, whys, findings),
)
def policy_lag(log, cfg) -> pl.DataFrame | None:
    """An update trains on a trajectory whose oldest turn was sampled more than the allowed
    number of versions ago (trainer_version − min policy_version > bound), or by weights newer
    than the trainer's (negative lag).

    Lesson “Token-level and sequence-level probability ratios”: importance ratios correct for a small distance between the behaviour and
    the current policy; beyond the staleness bound the trainer promised, clipping hides how
    off-policy the batch is. The bound is the update's max_policy_lag, else the configuration
    `max_policy_lag`; updates with neither are not checked for excess lag (the summary says
    so), but a negative lag is always reported: policy_version and trainer_version do not
    count the same weights. Drop or down-weight stale trajectories before the update, or
    raise the bound deliberately.
    """
    u = log.updates
    has_bound = "max_policy_lag" in u.columns
    bound = (pl.col("max_policy_lag") if has_bound else pl.lit(None, pl.Int64)).cast(pl.Int64)
    if cfg.max_policy_lag is not None:
        bound = bound.fill_null(pl.lit(int(cfg.max_policy_lag), pl.Int64))
    u = u.select("update_step", "trainer_version", "trajectory_ids", bound.alias("bound"))
    n_bounded = int(u["bound"].is_not_null().sum())
    stats = log.stats.setdefault("P503", {"updates": u.height, "bounded_updates": n_bounded})
    _note(stats)
    traj = (
        log.traj.select("trajectory_id", "file", "pv_min", "pv_max")
        .filter(pl.col("trajectory_id").is_not_null() & pl.col("pv_min").is_not_null())
        .unique("trajectory_id", keep="first")
    )
    used = (
        u.explode("trajectory_ids")
        .rename({"trajectory_ids": "trajectory_id"})
        .join(traj, on="trajectory_id", how="inner")
        .with_columns(
            (pl.col("trainer_version") - pl.col("pv_min")).alias("lag"),
            (pl.col("trainer_version") - pl.col("pv_max")).alias("lag_min"),
        )
    )
    stats["lag_histogram"] = {str(k): v for k, v in _histogram(used["lag"]).items()}
    if used.height:
        stats["max_lag"] = int(used["lag"].max())
    too_old = pl.col("bound").is_not_null() & (pl.col("lag") > pl.col("bound"))
    too_new = pl.col("lag_min") < 0
    bad = used.filter(too_old | too_new)
    if bad.is_empty():
        if not n_bounded:  # only the sign of the lag could be checked: the bound itself was not
            raise NotRun(
                "needs max_policy_lag (in the update records or the configuration); "
                "only negative lags were checked, none found"
            )
        return None
    return bad.select(
        "trajectory_id",
        "file",
        pl.when(too_new)
        .then(
            pl.format(
                "update {} starts from trainer_version {} but the trajectory was sampled by version {} (negative lag {}): "
                "the policy is newer than the trainer",
                "update_step",
                "trainer_version",
                "pv_max",
                "lag_min",
            )
        )
        .otherwise(
            pl.format(
                "update {} (trainer_version {}) uses a trajectory sampled by version {}: lag {} > bound {}",
                "update_step",
                "trainer_version",
                "pv_min",
                "lag",
                "bound",
            )
        )
        .alias("message"),
    )


def _note(stats: dict) -> None:
    n, bounded = stats["updates"], stats["bounded_updates"]
    if not bounded:
        stats["note"] = "no lag bound declared (neither max_policy_lag in updates nor in the configuration)"
    elif bounded < n:
        stats["note"] = f"{n - bounded} of {n} updates declare no lag bound"


def _merge_lag(parts: list, whys: list, findings):
    """P503 over partitions of the update records: counts and histograms add up; the check did
    not run when no partition could (no update declares a bound, and no negative lag)."""
    parts = [p for p in parts if p]
    stats: dict = {
        "updates": sum(p["updates"] for p in parts),
        "bounded_updates": sum(p["bounded_updates"] for p in parts),
    }
    _note(stats)
    stats["lag_histogram"] = _add([p.get("lag_histogram", {}) for p in parts])
    lags = [p["max_lag"] for p in parts if "max_lag" in p]
    if lags:
        stats["max_lag"] = max(lags)
    why = next((w for w in whys if w), None) if findings is None and all(whys) else None
    return stats, why, findings


@rule(
    "P504",
    "several policy versions inside one episode",
    "info",
    scope="log",
    requires=("pv_min", "pv_max"),
    optional=("n_versions",),
    partition=("trajectory_id",),
    merge=lambda parts, whys, findings: _merge_versions(parts, whys, findings),
)
def versions_per_episode(log, cfg) -> pl.DataFrame | None:
    """Statistics: episodes whose turns were sampled by more than one policy version, with the
    histogram of versions per episode and of the version span (max − min).

    Lesson “Log-probabilities must be captured at every turn” and “Token-level and sequence-level probability ratios”: in asynchronous collection the weights can change in the middle
    of an episode, so one trajectory mixes behaviour policies. That is legitimate when every
    turn carries its own version and log-probs (the ratio is per turn), but it matters for
    sequence-level ratios and for staleness accounting. Informational; the histograms are
    also in the JSON summary (statistics.P504).
    """
    t = log.traj.filter(pl.col("pv_min").is_not_null())
    if t.is_empty():
        return None
    t = t.with_columns((pl.col("pv_max") - pl.col("pv_min")).alias("span"))
    counts = _histogram(t["n_versions"]) if "n_versions" in t.columns else {}
    spans = _histogram(t["span"])
    multi = t.filter(pl.col("span") > 0)
    log.stats["P504"] = {
        "episodes": t.height,
        "multi_version_episodes": multi.height,
        "versions_per_episode": {str(k): v for k, v in counts.items()},
        "version_span": {str(k): v for k, v in spans.items()},
    }
    if multi.is_empty():
        return None
    widest = multi.sort("span", descending=True, maintain_order=True).row(0, named=True)
    if log.part:  # the partitions' widest episodes, for the merge to pick the log's
        log.stats["P504"]["_widest"] = widest
    return _widest(log.stats["P504"], widest)


def _widest(st: dict, widest: dict) -> pl.DataFrame:
    """P504's finding: the counts of the statistics `st`, and the widest episode."""
    return pl.DataFrame(
        {
            "trajectory_id": [widest["trajectory_id"]],
            "file": [widest["file"]],
            "message": [
                f"{st['multi_version_episodes']} of {st['episodes']} episodes were sampled by several policy versions; "
                f"versions per episode {{{_fmt_hist(st['versions_per_episode'])}}}; version span "
                f"{{{_fmt_hist(st['version_span'])}}}; widest here (versions {widest['pv_min']}..{widest['pv_max']})"
            ],
        }
    )


def _add(hists: list[dict[str, int]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for h in hists:
        for k, v in h.items():
            out[k] = out.get(k, 0) + v
    return {k: out[k] for k in sorted(out, key=int)}


def _merge_versions(parts: list, whys: list, findings):
    """P504 over partitions: the counts and histograms add up; the widest episode is the widest
    of the partitions' (the first in the log among equals)."""
    parts = [p for p in parts if p]
    if not parts:
        return None, None, None
    st = {
        "episodes": sum(p["episodes"] for p in parts),
        "multi_version_episodes": sum(p["multi_version_episodes"] for p in parts),
        "versions_per_episode": _add([p["versions_per_episode"] for p in parts]),
        "version_span": _add([p["version_span"] for p in parts]),
    }
    wide = [p["_widest"] for p in parts if "_widest" in p]
    if not wide:
        return st, None, None
    return st, None, _widest(st, min(wide, key=lambda w: (-w["span"], w["_ord"])))


@rule(
    "P505",
    "replayed expert routes do not cover the sequence once, or come from another version",
    "error",
    requires=("routed_experts_version", "token_source", "token_turn", "turns.policy_version"),
)
def routes_replayed(b: BatchView, cfg) -> pl.DataFrame | None:
    """Mixture-of-experts routing replay (contract 1.3 routed_experts_version): the routes the
    trainer replays do not cover the prompt and the response exactly once, or a turn's routes
    come from another version than the one that sampled it.

    Lesson “Log-probabilities must be captured at every turn” and “Token-level and
    sequence-level probability ratios”: a mixture-of-experts trainer that replays the engine's
    expert choices in its forward pass (R3) computes π_θ with the experts π_beh used; the ratio
    is then only right when each position is replayed once, with the routes of the weights that
    produced it. Resumed partial rollouts duplicated, then lost, the routes of the older weights
    (verl#6029, #6046; SkyRL#1908). Recomputed per trajectory: the array has one entry per token
    (more means a segment was appended twice, fewer that one was lost), none null before the last
    policy token (engines route every position but the last, and a trainer that keeps the last
    call's routes has none for tool output after it: no log-prob reads them), the routes
    at the position before each policy token (where its log-prob is read) come from its turn's
    policy_version, and every other token's (prompt, tool output) from the version of one of the
    episode's turns. Keep the routes of each engine call
    with the tokens it produced, and replace (never append) the routes of a resumed call's
    prefix.
    """
    lst = token_list(b, "routed_experts_version")
    t = b.tokens
    parts: list[pl.DataFrame] = []
    if lst.bad is not None:
        parts.append(
            lst.bad.with_columns(
                pl.concat_str([pl.col("message"), pl.lit(" (each position must be replayed exactly once)")])
            )
        )
    pv = b.turns["policy_version"].cast(pl.Float64).fill_null(float("nan")).to_numpy()
    # per row, the range of its turns' versions (turns are contiguous per row in `turns`)
    counts, start = b.turn_counts, b.turn_start
    lo = np.full(b.n, np.inf)
    hi = np.full(b.n, -np.inf)
    some = counts > 0
    if some.any():  # each row's turns run from its start to the next row's (rows without turns skipped)
        lo[some] = np.fmin.reduceat(pv, start[some])
        hi[some] = np.fmax.reduceat(pv, start[some])
    key = b.turn_key
    lost, wrong_turn, other = native.routes(
        t.n_tok, key, t.source, lst.stored, None if lst.complete else lst.present, lst.fits, pv, lo, hi
    )
    for where, what in (
        (lost, "no route of their own position recorded for {} token(s): a lost or misplaced segment; first at "),
        (
            wrong_turn,
            "{} policy token(s) whose log-prob is replayed through routes of another version than their "
            "turn's; first at ",
        ),
        (
            other,
            "{} prompt or tool token(s) replayed with routes of a version none of the episode's turns had; first at ",
        ),
    ):
        if not where.any():
            continue
        loc = b.locate(where)
        idx = t.starts[loc["_row"].to_numpy()] + loc["position"].to_numpy()
        turn_v = np.full(idx.size, np.nan)  # the version of the token's turn (policy tokens of a turn)
        of_turn = (t.source[idx] == S.POLICY) & (key[idx] >= 0)
        turn_v[of_turn] = pv[key[idx[of_turn]]]
        # a policy token's log-prob is replayed through the routes at the position before it
        v = lst.values[idx - 1 if where is wrong_turn else idx]
        loc = loc.with_columns(pl.Series("_v", v), pl.Series("_tv", turn_v))
        tail = pl.format(" (routes of version {}", _version_text("_v")) + pl.when(pl.col("_tv").is_not_nan()).then(
            pl.format(", turn sampled at {})", _version_text("_tv"))
        ).otherwise(pl.lit(")"))
        parts.append(
            loc.select(
                "trajectory_id",
                "turn",
                "position",
                pl.format(what, "n").add(where_first()).add(tail if where is not lost else pl.lit("")).alias("message"),
            )
        )
    kept = [d for d in parts if d.height]
    return pl.concat(kept, how="diagonal_relaxed") if kept else None


def _version_text(name: str) -> pl.Expr:
    """A version held as a float, printed as the integer it was (one past int64, 2^63 after rounding, as
    the float itself rather than a failed cast)."""
    col = pl.col(name)
    return col.cast(pl.Int64, strict=False).cast(pl.String).fill_null(col.cast(pl.String))
