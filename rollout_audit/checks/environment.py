"""Environment contract (E): every episode says which environment, verifier and initial state
it ran against, and resetting to that state is reproducible (lesson “A training environment is stricter than a demo environment”)."""

from __future__ import annotations

import polars as pl

from ..contract.registry import rule
from ..contract.schema import VERSIONS

RESET_KEY = ("environment_id", "environment_version", "reset_seed", "initial_state_id")


def _blank(name: str) -> pl.Expr:
    """A missing value: null, or a string that is empty once stripped."""
    c = pl.col(name)
    return c.is_null() | (c.cast(pl.String).str.strip_chars() == "").fill_null(True)


def _with(t: pl.DataFrame, names, dtype=pl.String) -> pl.DataFrame:
    # full-length null columns: a broadcast literal inside a string `when` chain panics in polars
    return t.with_columns(pl.Series(c, [None] * t.height, dtype=dtype) for c in names if c not in t.columns)


@rule(
    "E801",
    "environment version, verifier version or reset seed missing",
    scope="log",
    requires=("trajectory_id",),
    optional=("environment_version", "verifier_version", "reset_seed", "initial_state_id"),
    nulls=(*VERSIONS, "reset_seed"),
    partition=("file",),
)
def identity_missing(log, cfg) -> pl.DataFrame | None:
    """An episode does not record its environment_version, its verifier_version, or how its
    initial state was chosen (reset_seed null while initial_state_id is null too).

    Lesson “A training environment is stricter than a demo environment”: a training environment must answer, on every episode, which task was
    instantiated and what state it started from, and record the image, data, rules, tools and
    verifier it ran with. Without them a reward cannot be reproduced, two runs cannot be
    compared, and a verifier change looks like learning. Empty or blank strings count as
    missing; S001 leaves the nulls of these columns to this check. The reset seed may be null
    only when initial_state_id is set.
    A column absent from the whole log gives one finding per file. Fix the collector to record
    the environment image/data version, the verifier version and the reset seed (or the
    initial-state id) of every episode.
    """
    t = log.traj
    absent = [c for c in (*VERSIONS, "reset_seed") if c not in t.columns]
    out = []
    if absent and "file" in t.columns:
        out.append(
            t.select("file")
            .unique(maintain_order=True)
            .with_columns(
                pl.lit(
                    f"column{'s' * (len(absent) > 1)} {', '.join(absent)} absent: no episode of this file records "
                    f"{'them' if len(absent) > 1 else 'it'}"
                ).alias("message")
            )
        )
    t = _with(t, ["initial_state_id"])
    parts = [pl.when(_blank(c)).then(pl.lit(f"{c} missing")) for c in VERSIONS if c in t.columns]
    if "reset_seed" in t.columns:
        parts.append(
            pl.when(pl.col("reset_seed").is_null() & _blank("initial_state_id")).then(
                pl.lit("reset_seed and initial_state_id both null: the initial state cannot be reproduced")
            )
        )
    if parts:
        msg = pl.concat_str(parts, separator="; ", ignore_nulls=True)
        bad = t.select("trajectory_id", "file", msg.alias("message")).filter(pl.col("message") != "")
        if bad.height:
            out.append(bad)
    return pl.concat(out, how="diagonal_relaxed") if out else None


@rule(
    "E802",
    "same reset key, different initial state",
    scope="log",
    requires=("trajectory_id", "initial_state_checksum", "environment_id", "environment_version", "reset_seed"),
    optional=("initial_state_id",),
    partition=RESET_KEY,
)
def reset_not_reproducible(log, cfg) -> pl.DataFrame | None:
    """Episodes with the same (environment_id, environment_version, reset_seed) record
    different initial_state_checksum values: reset is not reproducible or rollouts are not
    isolated.

    Lesson “A training environment is stricter than a demo environment”: reset must return to a known initial state, with environment randomness
    logged rather than lost, and one rollout must not alter another's initial state. When
    the same seed on the same environment version yields different states, a group's
    trajectories did not face the same task (group-relative advantages compare apples with
    oranges) and no episode can be replayed. The key also includes initial_state_id when it
    is recorded; episodes with neither a seed nor a state id (E801) or without a checksum are
    skipped. Every trajectory of an offending key is named, with the distinct checksums and
    their counts. Fix the reset to depend only on the seed (and state id), snapshot or rebuild
    state per rollout, and bump environment_version when the initial state legitimately changes.
    """
    t = _with(log.traj, ["initial_state_id"])
    t = t.filter(
        pl.col("initial_state_checksum").is_not_null()
        & (pl.col("reset_seed").is_not_null() | pl.col("initial_state_id").is_not_null())
    )
    key = pl.concat_str([pl.col(c).cast(pl.String).fill_null("\x00") for c in RESET_KEY], separator="\x1f")
    t = t.with_columns(key.alias("_key"))
    t = t.filter(pl.col("initial_state_checksum").n_unique().over("_key") > 1)
    if t.is_empty():
        return None
    counts = (
        t.group_by("_key", "initial_state_checksum")
        .len()
        .sort(["_key", "len", "initial_state_checksum"], descending=[False, True, False])
        .group_by("_key", maintain_order=True)
        .agg(
            pl.len().alias("_n_distinct"),
            pl.col("len").sum().alias("_n"),
            pl.format("{}: {}", "initial_state_checksum", "len").str.join(", ").alias("_counts"),
        )
    )
    t = t.join(counts, on="_key", how="left")
    where = pl.format(
        "environment {} version {}, reset_seed {}",
        pl.col("environment_id").fill_null("null"),
        pl.col("environment_version").fill_null("null"),
        pl.col("reset_seed").cast(pl.String).fill_null("null"),
    )
    sid = pl.col("initial_state_id")
    where = pl.concat_str(
        [where, pl.when(sid.is_not_null()).then(pl.format(", initial_state_id {}", sid))], ignore_nulls=True
    )
    return t.select(
        "trajectory_id",
        "file",
        pl.format(  # one chunk: polars panics on chunked strings here
            "{}: {} distinct initial_state_checksum over {} trajectories ({}); this one has {}",
            where,
            "_n_distinct",
            "_n",
            "_counts",
            "initial_state_checksum",
        ).alias("message"),
    )
