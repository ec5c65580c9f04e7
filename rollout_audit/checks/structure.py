"""Structure (S): the log can be read as the contract describes (docs/contract.md)."""

from __future__ import annotations

import numpy as np
import polars as pl

from ..contract import schema as S
from ..contract.registry import RULES, rule
from ..frames import native
from ..frames.batch import TOKEN_LISTS, as_bools
from ..frames.views import BatchView
from ..reading.arrays import scalar, to_numpy, validity

# a null reward is the contract's mark of an excluded episode (docs/contract.md, stop causes)
_NULL_ALLOWED = ("reward",)


def _null_reported_elsewhere() -> set[str]:
    """Required columns whose nulls S001 leaves to a check that declares them (`nulls=`)."""
    return {*_NULL_ALLOWED, *(c for r in RULES.values() for c in r.nulls)}


# S001 reads every required column (nulls) and every column and turn field with a value domain
# (`domain` in schemas/rollout_log_v1.json)
REQUIRED_AND_DOMAIN = tuple(
    dict.fromkeys((*S.required("trajectories"), *S.domains("trajectories"), *(f"turns.{f}" for f in S.domains("turn"))))
)
REQUIRED_AND_DOMAIN = (*REQUIRED_AND_DOMAIN, "split_continues")
# the episode's outcome: null on a segment of a split episode that does not end it (contract 1.2)
_OUTCOME = frozenset({"terminated", "truncated", "infra_error", "stop_reason"})


def declared_vocabulary(cfg, meta, configured: frozenset[str]) -> dict:
    """S001's `vocabulary_size` from a file's declared tokenizer (`rollout_log.tokenizer`, its
    vocabulary's length): the largest any file declares, unless the user's configuration sets it."""
    vocab = S.meta_object(meta, S.META_TOKENIZER).get("vocabulary")
    if "vocabulary_size" in configured or not isinstance(vocab, list) or not vocab:
        return {}
    return {"vocabulary_size": len(vocab)} if len(vocab) > (cfg.vocabulary_size or 0) else {}


@rule(
    "S001",
    "column missing, of the wrong type, or out of its domain",
    optional=REQUIRED_AND_DOMAIN,
    config=("vocabulary_size",),
    declare=declared_vocabulary,
)
def required_columns(b: BatchView, cfg) -> pl.DataFrame | None:
    """A required column (or turn field) is missing, has the wrong type, holds nulls, or
    holds values outside its domain (NaN or infinite rewards, values and potentials; gamma
    outside (0, 1]; token_source outside 0..4; negative counts, times or token ids).

    Every check reads columns by the contract of `schemas/rollout_log_v1.json`
    (`rollout-audit schema`); a missing or mistyped column means the checks that need it
    cannot run (they are listed as not run). Integer and float widths are accepted and cast;
    a float where an integer is expected (token_ids as floats) is not. A segment that does not
    end its split episode (split_continues, contract 1.2) carries no outcome: its null stop flags
    and stop_reason are expected. Fix the producer so
    that it writes the contract's types, e.g. with `rollout_audit.RolloutWriter`.
    """
    rows = [{"message": f"{c}: {p}"} for c, p in b.schema_problems]
    elsewhere = _null_reported_elsewhere()
    continues = as_bools(b.col("split_continues")) if "split_continues" in b.columns else None
    for name in S.required("trajectories"):
        if name in b.columns and name not in elsewhere:
            nulls = b.col(name).null_count
            if nulls:
                mask = ~validity(b.col(name))
                if continues is not None and name in _OUTCOME:
                    mask &= ~continues
                ids = b.ids.filter(pl.Series(mask))
                rows += [{"trajectory_id": i, "message": f"{name}: required value is null"} for i in ids.head(50)]
    out = [pl.DataFrame(rows, schema={"trajectory_id": pl.String, "message": pl.String})] if rows else []
    out += _domain(b)
    out += _token_ids_out_of_range(b, cfg.vocabulary_size)
    return pl.concat(out, how="diagonal_relaxed") if out else None


def _token_ids_out_of_range(b: BatchView, vocabulary: int | None) -> list[pl.DataFrame]:
    """Rows whose token_ids hold a negative id (no tokenizer has one) or, when the tokenizer's size
    is known (`vocabulary_size`), an id at or past it: one finding per row and kind, at the first."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if "token_ids" not in b.columns:
        return []
    col = b.col("token_ids")
    col = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_list(col.type) or pa.types.is_large_list(col.type)) or not pa.types.is_integer(
        col.type.value_type
    ):
        return []  # a list of another type is a schema problem, reported above
    flat = pc.list_flatten(col)
    extremes = pc.min_max(flat)  # one pass: most batches hold no id to report
    low, high = extremes["min"].as_py(), extremes["max"].as_py()
    if low is None or (low >= 0 and (vocabulary is None or high < vocabulary)):
        return []
    out = []
    for what, bad in (
        ("negative token id(s)", pc.less(flat, scalar(0, flat.type))),
        (f"token id(s) at or past the tokenizer's {vocabulary} ids (vocabulary_size)", None),
    ):
        if bad is None:
            if vocabulary is None:
                continue
            bad = pc.greater_equal(pc.cast(flat, pa.int64()), scalar(vocabulary, pa.int64()))
        hit = as_bools(bad)
        if not hit.any():
            continue
        parent = to_numpy(pc.list_parent_indices(col))
        starts = to_numpy(col.offsets)[:-1] - col.offsets[0].as_py()
        rows, first = np.unique(parent[hit], return_index=True)
        at = np.flatnonzero(hit)[first]
        n = np.bincount(parent[hit], minlength=len(col))[rows]
        vals = to_numpy(flat)[at]
        out.append(
            pl.DataFrame(
                {
                    "trajectory_id": b.ids.gather(rows),
                    "position": (at - starts[rows]).astype(np.int64),
                    "message": [f"token_ids: {k} {what} (first: {int(v)})" for k, v in zip(n, vals)],
                }
            )
        )
    return out


# The value domains of the pandera schemas (`rollout_audit.contract.models`: TrajectoryValues,
# TurnValues), as one polars predicate per column. A value outside them makes the batch "suspect"
# and only then is pandera run, for the exact failure cases; on a clean batch S001 costs a few
# numpy comparisons per column instead of a pandera pass. Both read the same domains, so the
# test flags exactly what pandera would (pandera has the last word on the message).
def _predicates(domains: dict[str, dict]) -> dict[str, tuple]:
    """Per column: (lower bound, lower inclusive, upper bound, finite, not infinite)."""
    out = {}
    for name, d in domains.items():
        lo = d.get("ge", d.get("gt", d.get("eq")))
        out[name] = (lo, "gt" not in d, d.get("le", d.get("eq")), bool(d.get("finite")), bool(d.get("not_infinite")))
    return out


_TRAJ_DOMAIN = _predicates({**S.domains("trajectories"), **S.RECOMPUTED_DOMAINS})
_TURN_DOMAIN = _predicates(S.domains("turn"))


def _suspect(df: pl.DataFrame, domain: dict) -> bool:
    """True when some value of `df` may lie outside `domain` (or a column's type is unexpected)."""
    schema = df.schema
    for name, (lo, lo_incl, hi, finite, not_infinite) in domain.items():
        dt = schema.get(name)
        if dt is None or dt == pl.Null:
            continue
        if not dt.is_numeric() or dt.is_decimal():
            return True  # let pandera coerce and judge
        s = df.get_column(name)
        v = s.drop_nulls().to_numpy() if s.null_count() else s.to_numpy()
        # NaN is outside every domain, infinity outside a finite or not-infinite one
        if dt.is_float() and (np.isnan(v).any() or ((finite or not_infinite) and np.isinf(v).any())):
            return True
        if lo is not None and ((v < lo) if lo_incl else (v <= lo)).any():
            return True
        if hi is not None and (v > hi).any():
            return True
    return False


def _domain(b: BatchView) -> list[pl.DataFrame]:
    """Value-domain problems of the per-trajectory and per-turn frames (pandera models, run
    on a frame only when a fast polars pass finds a value that may be outside its domain)."""
    out = []
    traj = b.traj
    if _suspect(traj, _TRAJ_DOMAIN):
        from ..contract.models import TrajectoryValues, domain_problems  # pandera: imported when needed

        bad = domain_problems(TrajectoryValues, traj.drop("trajectory_id"))
        bad = bad.with_columns(
            pl.when(pl.col("column") == "n_src_invalid")
            .then(pl.lit("token_source"))
            .otherwise("column")
            .alias("column"),
            pl.when(pl.col("column") == "n_src_invalid")
            .then(pl.format("{} values outside 0..4", "value"))
            .otherwise("value")
            .alias("value"),
        )
        if bad.height:
            out.append(
                bad.with_columns(b.ids.gather(bad["index"])).select(
                    "trajectory_id", pl.format("{}: value {} fails {}", "column", "value", "check").alias("message")
                )
            )
    tr = b.turns
    if tr.height and _suspect(tr, _TURN_DOMAIN):
        from ..contract.models import TurnValues, domain_problems

        cols = [c for c in tr.columns if not c.startswith(("rc_", "_"))]
        bad = domain_problems(TurnValues, tr.select(cols))
        if bad.height:
            out.append(
                bad.join(
                    tr.select(pl.int_range(pl.len()).alias("index"), "trajectory_id", pl.col("_t").alias("turn")),
                    on="index",
                ).select(
                    "trajectory_id",
                    "turn",
                    pl.format("turns.{}: value {} fails {}", "column", "value", "check").alias("message"),
                )
            )
    return out


@rule("S002", "duplicate trajectory_id", scope="log", requires=("trajectory_id",), partition=("trajectory_id",))
def duplicate_ids(log, cfg) -> pl.DataFrame | None:
    """The same trajectory_id appears on more than one row.

    Updates name their batch by trajectory_id, so a duplicate makes the batch ambiguous and
    usually means a shard was written twice or ids are not globally unique. Make ids unique
    across the whole log (e.g. prefix with the collector run and worker).
    """
    t = log.traj.filter(pl.col("trajectory_id").is_not_null())
    dup = (
        t.group_by("trajectory_id")
        .agg(pl.len().alias("n"), pl.col("file").cast(pl.String).unique().sort().alias("files"), pl.col("file").first())
        .filter(pl.col("n") > 1)
    )
    return dup.select(
        "trajectory_id",
        "file",
        pl.format("trajectory_id appears {} times (in {})", "n", pl.col("files").list.join(", ")).alias("message"),
    )


@rule(
    "S003",
    "token lists of different lengths",
    requires=("token_source",),
    optional=("token_ids", "loss_mask", "behavior_logprobs", "token_turn"),
)
def token_list_lengths(b: BatchView, cfg) -> pl.DataFrame | None:
    """The token lists of a row (token_ids, token_source, loss_mask, behavior_logprobs,
    token_turn) are null or differ in length.

    Every per-token check aligns these lists position by position; when lengths differ the
    alignment is unknown, so the row is left out of all token-level checks. Usually one
    list was built from a different tokenization than the others: write all of them from
    the same token sequence.
    """
    lens = b.lengths  # absent columns are S001's business; compare the lists that exist
    present = [c for c in TOKEN_LISTS if c in lens]
    if not present:
        return None
    first = lens[present[0]]
    consistent = np.logical_and.reduce([(lens[c] >= 0) & (lens[c] == first) for c in present])
    bad = np.flatnonzero(~consistent)
    if not len(bad):
        return None
    msgs = []
    for r in bad:
        parts = [f"{c} {'null' if lens[c][r] < 0 else lens[c][r]}" for c in present]
        msgs.append("token lists differ or are null: " + ", ".join(parts))
    return pl.DataFrame({"trajectory_id": b.ids.gather(bad), "message": msgs})


@rule(
    "S004",
    "turns misnumbered or token_turn out of range",
    requires=("turns", "token_turn"),
    optional=("turns.turn_id",),
)
def turn_numbering(b: BatchView, cfg) -> pl.DataFrame | None:
    """Turns are not numbered 0..T-1 in order, or a token's token_turn names a turn that
    does not exist (anything other than -1 or 0..T-1), or is -1 (before the first agent turn)
    after a token of a turn.

    Per-turn log-probs, policy versions and rewards are joined to tokens by turn number;
    a gap or a stray number silently attaches a token to the wrong turn (or to none).
    Number turns by their position in `turns` and tag every token with that number.
    """
    out = []
    tr = b.turns
    if len(tr) and "turn_id" in tr.columns and not (tr["turn_id"].to_numpy() == tr["_t"].to_numpy()).all():
        bad = tr.filter(pl.col("turn_id").is_null() | (pl.col("turn_id").cast(pl.Int64) != pl.col("_t")))
        if bad.height:
            out.append(
                bad.select(
                    "trajectory_id",
                    pl.col("_t").alias("turn"),
                    pl.format(
                        "turn at index {} has turn_id {}", "_t", pl.col("turn_id").cast(pl.String).fill_null("null")
                    ).alias("message"),
                )
            )
    if b.ok.any():
        t = b.tokens
        T = b.turn_counts
        # per row: tokens with token_turn -1 after a token of a turn, and tokens that name no turn
        # (token_turn neither -1 nor 0..T-1; the key of S004's cases), each with its first position
        tags = native.turn_tags(t.n_tok, t.turn, b.turn_key)
        rows = np.flatnonzero(tags.late_n)
        if rows.size:
            out.append(
                pl.DataFrame(
                    {
                        "trajectory_id": b.ids.gather(rows),
                        "position": tags.late_first[rows],
                        "message": [
                            f"{k} token(s) with token_turn -1 after a token of a turn" for k in tags.late_n[rows]
                        ],
                    }
                )
            )
        rows = np.flatnonzero(tags.wrong_n)
        if rows.size:
            pos = tags.wrong_first[rows]
            first_val = t.turn[t.starts[rows] + pos]
            out.append(
                pl.DataFrame(
                    {
                        "trajectory_id": b.ids.gather(rows),
                        "position": pos,
                        "message": [
                            f"{k} token(s) name a turn that does not exist (first: token_turn {v}, "
                            f"the trajectory has {T[r]} turns)"
                            for k, v, r in zip(tags.wrong_n[rows], first_val, rows)
                        ],
                    }
                )
            )
    return pl.concat(out, how="diagonal_relaxed") if out else None


@rule("S005", "unreadable or corrupt file", scope="log")
def unreadable_files(log, cfg) -> pl.DataFrame | None:
    """A file could not be read as Parquet (truncated, corrupt, not Parquet, unreadable).

    The rest of the log is still audited, but the rollouts in this file are not: training on
    the directory would either crash or silently skip them. Re-export the file, or remove it
    from the training input if it is known to be garbage.
    """
    if not log.broken:
        return None
    return pl.DataFrame({"file": [p for p, _ in log.broken], "message": [w for _, w in log.broken]})
