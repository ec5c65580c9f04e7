"""The recorded nucleus (contract 1.3 nucleus_ids with nucleus_offsets): per token, the ids the engine
kept when it sampled it, read from the two Arrow list columns into flat numpy arrays (vectorised, no
loop per row or token). Replay renormalises over it; L210 checks each sampled token lies inside it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..reading.arrays import fill_null, from_numpy, list_lengths, to_numpy


@dataclass(frozen=True)
class Nucleus:
    """The nucleus record of some rows. `good` rows (per row) hold a well-formed record; their tokens,
    concatenated in row order, have `length` kept ids each, whose ids are `ids` (token order).
    `why` names what is wrong with each row (by index) that has a record but not a well-formed one."""

    good: np.ndarray
    length: np.ndarray
    ids: np.ndarray
    why: dict[int, str]

    @property
    def start(self) -> np.ndarray:
        """Per token of the good rows: where its kept ids begin in `ids`."""
        return np.concatenate([[0], np.cumsum(self.length)[:-1]]).astype(np.int64)


def ragged(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ranges starts[i] .. starts[i] + lengths[i] - 1: (indices, owner i of each)."""
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    begin = np.concatenate([[0], np.cumsum(lengths)])[:-1].astype(np.int64)
    return starts[owner] + np.arange(owner.size, dtype=np.int64) - begin[owner], owner


def _lengths(a: pa.Array) -> np.ndarray:
    return list_lengths(a, -1)


def _flat(a: pa.Array, rows: np.ndarray) -> np.ndarray:
    """The values of rows `rows`, flattened in row order, as stored (a null is -1, in int64)."""
    part = a.take(from_numpy(rows, pa.int64())) if rows.size != len(a) else a
    flat = pc.list_flatten(part)
    if flat.null_count:
        flat = fill_null(pc.cast(flat, pa.int64()), -1)
    return to_numpy(flat)


def read_nucleus(offsets: pa.Array, ids: pa.Array, n_tok: np.ndarray, ok: np.ndarray) -> Nucleus:
    """The nucleus record of rows whose token lists line up (`ok`, `n_tok` tokens each). A row's record
    is well formed when nucleus_offsets has n_tok + 1 entries, starts at 0, never decreases and ends at
    the length of nucleus_ids (null there: no ids); a null nucleus_offsets records nothing."""
    if isinstance(offsets, pa.ChunkedArray):
        offsets = offsets.combine_chunks()
    if isinstance(ids, pa.ChunkedArray):
        ids = ids.combine_chunks()
    n = len(n_tok)
    n_off = _lengths(offsets)
    n_ids = np.maximum(_lengths(ids), 0)
    have = ok & (n_off >= 0)
    why: dict[int, str] = {}
    shaped = np.flatnonzero(have & (n_off == n_tok + 1))
    for r in np.flatnonzero(have & (n_off != n_tok + 1)).tolist():
        why[r] = f"nucleus_offsets has {n_off[r]} entries for {n_tok[r]} tokens (want one more)"
    good = np.zeros(n, bool)
    if not shaped.size:
        return Nucleus(good, np.zeros(0, np.int64), np.zeros(0, np.int64), why)
    off = _flat(offsets, shaped)
    counts = n_off[shaped]
    first_at = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    # two non-negative int32 offsets differ by an int32; a negative one could overflow the difference
    step = np.diff(off if off.size and off.min() >= 0 else off.astype(np.int64))
    inner = np.ones(step.size, bool)
    inner[(first_at[1:] - 1)] = False  # the step from one row's last offset to the next row's first
    falls = np.flatnonzero(inner & (step < 0))
    drop = np.bincount(np.searchsorted(first_at, falls, side="right") - 1, minlength=shaped.size)
    first, last = off[first_at], off[first_at + counts - 1]
    valid = (first == 0) & (last == n_ids[shaped]) & (drop == 0)
    for k in np.flatnonzero(~valid).tolist():
        r = int(shaped[k])
        why[r] = (
            f"nucleus_offsets run from {first[k]} to {last[k]}{', decreasing somewhere' if drop[k] else ''}"
            f" over {n_ids[r]} nucleus_ids (want 0 to {n_ids[r]}, never decreasing)"
        )
    keep = shaped[valid]
    good[keep] = True
    if not keep.size:
        return Nucleus(good, np.zeros(0, np.int64), np.zeros(0, np.int64), why)
    length = step[inner]  # per token of the shaped rows, in row order
    if not valid.all():
        length = length[np.repeat(valid, counts - 1)]
    return Nucleus(good, length, _flat(ids, keep), why)
