"""The tokens replay scores: a stratified sample of trajectories read back from the log's files, flattened
to one row per policy token with its turn's policy version and decoding parameters (vectorised, Arrow)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..contract.schema import POLICY

TOKEN_COLUMNS = ("trajectory_id", "token_ids", "token_source", "behavior_logprobs", "token_turn", "turns")
TURN_PARAMS = ("policy_version", "temperature", "top_p", "top_k")
NUCLEUS = ("nucleus_ids", "nucleus_offsets")  # read when the log records them (contract 1.3): replay's support


def stratified_sample(traj: pl.DataFrame, n: int) -> pl.DataFrame:
    """Up to n (file, trajectory_id) rows, spread evenly over policy versions (first version of each
    trajectory); within a version the choice is a fixed hash order, so the sample is deterministic."""
    df = traj.select("file", "trajectory_id", pl.col("pv_min").alias("_v")).filter(
        pl.col("trajectory_id").is_not_null()
    )
    df = df.with_columns(pl.col("trajectory_id").hash(seed=13).alias("_h")).sort("_v", "_h")
    df = df.with_columns(pl.int_range(pl.len()).over("_v").alias("_rank"))
    return df.sort("_rank", "_v", "_h").head(n).select(pl.col("file").cast(pl.String), "trajectory_id")


def read_rows(path: str, ids: list[str] | None, columns: tuple[str, ...]) -> pa.Table:
    """The rows of one Parquet file with the given trajectory ids (all rows when ids is None), reading only
    the row groups that hold them and only the columns present."""
    pf = pq.ParquetFile(path)
    cols = [c for c in columns if c in pf.schema_arrow.names]
    if ids is None:
        return pf.read(columns=cols)
    wanted = pa.array(ids, pa.string())
    parts = []
    for rg in range(pf.num_row_groups):
        tid = pf.read_row_group(rg, columns=["trajectory_id"]).column(0)
        if pc.any(pc.is_in(tid, wanted)).as_py():
            t = pf.read_row_group(rg, columns=cols)
            parts.append(t.filter(pc.is_in(t.column("trajectory_id"), wanted)))
    return pa.concat_tables(parts) if parts else pf.schema_arrow.empty_table().select(cols)


def _turn_params(rows: pa.Table) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Offsets of each row's turns in the flattened turn list, and the flattened decoding fields."""
    turns = rows.column("turns").combine_chunks()
    flat = pc.list_flatten(turns)
    names = {f.name for f in flat.type}
    out: dict[str, np.ndarray] = {}
    defaults = {"policy_version": np.nan, "temperature": 1.0, "top_p": 1.0, "top_k": 0}
    for name in TURN_PARAMS:
        if name in names:
            col = pc.struct_field(flat, name)
            # unsafe: an integer past 2^53 is a value (S001 judges its domain), not a failed replay
            out[name] = pc.fill_null(pc.cast(col, pa.float64(), safe=False), defaults[name]).to_numpy(
                zero_copy_only=False
            )
        else:
            out[name] = np.full(len(flat), defaults[name], dtype=np.float64)
    offsets = pc.list_value_length(turns).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return np.concatenate([[0], np.cumsum(offsets)]), out


def token_frame(rows: pa.Table, second: str | None = None) -> pl.DataFrame:
    """One row per policy token with a recorded log-prob: trajectory row, position, turn, policy version,
    temperature, top_p, top_k, the recorded log-prob (and the `second` log-prob column when given)."""
    ids = rows.column("token_ids").combine_chunks()
    lengths = pc.list_value_length(ids).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    row = np.repeat(np.arange(rows.num_rows), lengths)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    position = np.arange(len(row), dtype=np.int64) - starts[row]

    def flat(name: str) -> np.ndarray | None:
        arr = pc.list_flatten(rows.column(name).combine_chunks())
        return pc.cast(arr, pa.float64()).to_numpy(zero_copy_only=False) if len(arr) == len(row) else None

    source, lp, turn = flat("token_source"), flat("behavior_logprobs"), flat("token_turn")
    if source is None or lp is None or turn is None:
        raise ValueError("token lists of unequal length (see S003): replay needs aligned token lists")
    turn_start, params = _turn_params(rows)
    n_turns = np.diff(turn_start)
    t = np.nan_to_num(turn, nan=-1).astype(np.int64)
    keep = (source == POLICY) & ~np.isnan(lp) & (t >= 0) & (t < n_turns[row]) & (position > 0)
    k = turn_start[row[keep]] + t[keep]
    frame = {
        "_row": row[keep],
        "position": position[keep],
        "turn": t[keep],
        "recorded": lp[keep],
        **{name: params[name][k] for name in TURN_PARAMS},
    }
    if second is not None:
        other = flat(second)
        if other is None:
            raise ValueError(f"column {second} is not aligned with token_ids")
        frame["second"] = other[keep]
    df = pl.DataFrame(frame).with_columns(pl.col("top_k").cast(pl.Int64))
    if all(c in rows.column_names for c in NUCLEUS):
        df = df.with_columns(_support(rows, lengths, keep))
    return df.filter(pl.col("policy_version").is_not_nan()).with_columns(pl.col("policy_version").cast(pl.Int64))


def _support(rows: pa.Table, lengths: np.ndarray, keep: np.ndarray) -> pl.Series:
    """Per kept token: the ids of the nucleus the engine recorded for it (empty where it recorded
    none, or where a row's record is malformed: L210 names those)."""
    from .nucleus import ragged, read_nucleus

    nuc = read_nucleus(rows.column("nucleus_offsets"), rows.column("nucleus_ids"), lengths, np.ones(len(lengths), bool))
    size = np.zeros(int(lengths.sum()), np.int64)
    begin = np.zeros(size.size, np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    token, _ = ragged(starts[nuc.good], lengths[nuc.good])
    size[token], begin[token] = nuc.length, nuc.start
    idx, _ = ragged(begin[keep], size[keep])
    offsets = np.concatenate([[0], np.cumsum(size[keep])]).astype(np.int32)
    arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(nuc.ids[idx], pa.int64()))
    return pl.Series("support", arr)
