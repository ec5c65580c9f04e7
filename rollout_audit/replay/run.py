"""Run a replayer over a stratified sample of a log: read the sampled trajectories back, score their policy
tokens version by version, return one row per token with the recorded and the replayed log-probs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..contract.errors import Unmet
from ..reading.read import MEMORY
from .base import NotConfigured, Replayer, ReplayRequest
from .frame import NUCLEUS, TOKEN_COLUMNS, read_rows, stratified_sample, token_frame


def sampled_rows(
    traj: pl.DataFrame, n: int | None, extra: tuple[str, ...] = (), memory: Mapping[str, pa.Table] | None = None
) -> pa.Table:
    """The token columns (and `extra`) of n trajectories stratified by policy version (all when n is None);
    `memory` holds the in-memory tables of the log by name, read instead of a file."""
    if "file" not in traj.columns or traj.is_empty():
        raise NotConfigured("no trajectories to replay")
    files = traj.select(pl.col("file").cast(pl.String)).unique(maintain_order=True)["file"].to_list()
    memory = memory or {}
    if any(f == MEMORY and f not in memory for f in files):
        raise NotConfigured("replay reads the log's files again: audit a path, not in-memory tables")
    picked = stratified_sample(traj, n) if n is not None else None
    parts = []
    for f in files:
        ids = None if picked is None else picked.filter(pl.col("file") == f)["trajectory_id"].to_list()
        if ids == []:
            continue
        t = (
            read_rows(f, ids, TOKEN_COLUMNS + NUCLEUS + extra)
            if f not in memory
            else _memory_rows(memory[f], ids, TOKEN_COLUMNS + NUCLEUS + extra)
        )
        parts.append(t.append_column("file", pa.array([f] * t.num_rows, pa.string())))
    if not parts:
        raise NotConfigured("no trajectories to replay")
    table = pa.concat_tables(parts, promote_options="permissive")
    missing = [c for c in TOKEN_COLUMNS + extra if c not in table.column_names]
    if missing:
        raise NotConfigured(f"replay needs column(s) {', '.join(missing)}")
    return table


def _request(rows: pa.Table, tokens: pl.DataFrame, version: int) -> tuple[ReplayRequest, np.ndarray]:
    """The request of one version: its trajectories (re-indexed) and tokens; returns the token indices."""
    sel = tokens.with_row_index("_i").filter(pl.col("policy_version") == version)
    used = np.unique(sel["_row"].to_numpy())
    sub = rows.take(pa.array(used))
    ids = sub.column("token_ids").combine_chunks()
    lengths = pc.list_value_length(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(ids).to_numpy(zero_copy_only=False).astype(np.int64)
    token_ids = np.split(flat, np.cumsum(lengths)[:-1]) if len(lengths) else []
    support: dict[str, np.ndarray] = {}
    if "support" in sel.columns:
        spans = sel["support"].to_arrow()
        support = {
            "support_ids": pc.list_flatten(spans).to_numpy(zero_copy_only=False).astype(np.int64),
            "support_offsets": np.concatenate(
                [[0], np.cumsum(pc.list_value_length(spans).to_numpy(zero_copy_only=False))]
            ).astype(np.int64),
        }
    req = ReplayRequest(
        version=version,
        token_ids=token_ids,
        traj=np.searchsorted(used, sel["_row"].to_numpy()),
        position=sel["position"].to_numpy(),
        turn=sel["turn"].to_numpy(),
        temperature=sel["temperature"].to_numpy(),
        top_p=sel["top_p"].to_numpy(),
        top_k=sel["top_k"].to_numpy(),
        rows=sub,
        **support,
    )
    return req, sel["_i"].to_numpy()


def replay_frame(
    traj: pl.DataFrame,
    n: int,
    replayer: Replayer,
    beyond: list[dict] | None = None,
    memory: Mapping[str, pa.Table] | None = None,
) -> pl.DataFrame:
    """Tokens of n sampled trajectories with `recorded`, `sampled` and `base` log-probs, and their ids
    (`memory`: the log's in-memory tables by name, as `sampled_rows` reads them).
    A trajectory holding a token id the checkpoint has no logit for is left out, and added to `beyond`
    (file, trajectory_id, position, policy_version, message) when given."""
    rows = sampled_rows(traj, n, memory=memory)
    tokens = token_frame(rows)
    sampled = np.full(tokens.height, np.nan)
    base = np.full(tokens.height, np.nan)
    out: set[int] = set()
    for version in sorted(tokens["policy_version"].unique().to_list()):
        req, idx = _request(rows, tokens, int(version))
        res = replayer.replay(req)
        sampled[idx], base[idx] = res.sampled, res.base
        used = np.unique(tokens["_row"].to_numpy()[idx])
        for i, position, token, vocab in res.beyond:
            row = int(used[i])
            out.add(row)
            if beyond is not None:
                beyond.append(
                    {
                        "file": rows.column("file")[row].as_py(),
                        "trajectory_id": rows.column("trajectory_id")[row].as_py(),
                        "position": position,
                        "policy_version": int(version),
                        "message": f"token id {token} at position {position} is past the {vocab} ids of policy "
                        f"version {version}'s checkpoint: the log's tokens are not this model's; not replayed",
                    }
                )
    frame = with_ids(tokens, rows).with_columns(pl.Series("sampled", sampled), pl.Series("base", base))
    return frame.filter(~pl.col("_row").is_in(sorted(out))) if out else frame


def neighbour_frame(
    traj: pl.DataFrame, n: int, replayer: Replayer, memory: Mapping[str, pa.Table] | None = None
) -> pl.DataFrame:
    """The tokens `replay_frame` scores (the same sample), each also scored under the policy
    versions before and after its own among the versions of the sample: `prev_version`,
    `sampled_prev`, `next_version`, `sampled_next` (NaN where that version has no checkpoint)."""
    rows = sampled_rows(traj, n, memory=memory)
    tokens = token_frame(rows)
    versions = sorted(int(v) for v in tokens["policy_version"].unique().to_list())
    out = {k: np.full(tokens.height, np.nan) for k in ("prev_version", "sampled_prev", "next_version", "sampled_next")}
    for j, version in enumerate(versions):
        req, idx = _request(rows, tokens, version)
        for side, k in (("prev", j - 1), ("next", j + 1)):
            if not 0 <= k < len(versions):
                continue
            try:
                res = replayer.replay(replace(req, version=versions[k]))
            except NotConfigured:  # no checkpoint for that neighbour: its column stays NaN
                continue
            out[f"{side}_version"][idx] = versions[k]
            out[f"sampled_{side}"][idx] = res.sampled
    return with_ids(tokens, rows).with_columns(pl.Series(k, v) for k, v in out.items())


def with_ids(tokens: pl.DataFrame, rows: pa.Table) -> pl.DataFrame:
    """Attach trajectory_id and file to a token frame (by its `_row`)."""
    ids = pl.DataFrame(
        {"trajectory_id": rows.column("trajectory_id").to_pylist(), "file": rows.column("file").to_pylist()}
    ).with_row_index("_row")
    return tokens.join(ids.with_columns(pl.col("_row").cast(pl.Int64)), on="_row", how="left")


def _memory_rows(table: pa.Table, ids: list[str] | None, columns: tuple[str, ...]) -> pa.Table:
    """The rows of an in-memory table with the given trajectory ids (all when None), columns present only."""
    t = table.select([c for c in columns if c in table.column_names])
    if ids is None:
        return t
    return t.filter(pc.is_in(table.column("trajectory_id"), pa.array(ids, pa.string())))


def second_frame(
    traj: pl.DataFrame, column: str, n: int | None, memory: Mapping[str, pa.Table] | None = None
) -> pl.DataFrame:
    """Tokens with `recorded` and the `second` log-prob column (of n sampled trajectories, or all).
    The column is one the user named: absent, not a list of numbers per token, or a row whose list
    is not as long as its token_ids is Unmet (exit 2), naming the column and the first such row."""
    try:
        rows = sampled_rows(traj, n, (column,), memory)
    except NotConfigured as e:
        # the user's own column absent is Unmet; a contract column the log does not record (TRL keeps
        # no behaviour log-probs) leaves the comparison not run, as every check's unmet need does
        if column in str(e).rpartition("column(s) ")[2].split(", "):
            raise Unmet(f"compare_logprobs = {column!r}: {e}") from None
        raise
    typ = rows.schema.field(column).type
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)) or not (
        pa.types.is_floating(typ.value_type) or pa.types.is_integer(typ.value_type) or pa.types.is_null(typ.value_type)
    ):
        raise Unmet(f"compare_logprobs = {column!r}: column {column} is {typ}, not a list of log-probs per token")
    lengths = [pc.list_value_length(rows.column(c).combine_chunks()).fill_null(-1) for c in ("token_ids", column)]
    off = np.flatnonzero(lengths[0].to_numpy(zero_copy_only=False) != lengths[1].to_numpy(zero_copy_only=False))
    if len(off):
        r = int(off[0])
        has = [lengths[k][r].as_py() for k in (0, 1)]
        said = [f"{c} {'is null' if n < 0 else f'has {n} entries'}" for c, n in zip(("token_ids", column), has)]
        raise Unmet(
            f"compare_logprobs = {column!r}: {rows.column('file')[r].as_py()}, trajectory "
            f"{rows.column('trajectory_id')[r].as_py()}: column {said[1]}, {said[0]} ({len(off)} row(s) not aligned)"
        )
    return with_ids(token_frame(rows, column), rows)


__all__: list[Any] = ["neighbour_frame", "replay_frame", "sampled_rows", "second_frame"]
