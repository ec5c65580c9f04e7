"""Mixture-of-experts routing replay (contract 1.3 `routed_experts_version`, `routed_experts_sha256`)
from a trainer's per-sample route array and the engine calls that built it.

A generator keeps one route array per sample (positions × layers × top-k expert ids) and updates
it after every engine call: it keeps a prefix of what it had and appends the rows the call
returned. slime keeps `existing[:routed_experts_start_len]` (slime/utils/types.py:376-394), SkyRL
at a956457 keeps nothing and takes the call's whole array (skyrl_gym_generator.py:1122-1126). The
hooks record, per call, the first position the engine routed, the rows it returned and the array's
length after the generator applied them, so the rows each call wrote follow from what happened, not
from what the generator's code is meant to do: after call t the array's last `rows` rows are call
t's, the rows before them are the kept prefix, each still from the call that wrote it, and rows
placed at another position than the one the engine computed them for replay no route of their own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .base import AdapterError, whole

INT32 = 2**31


def expert_array(value: Any, field: str, where: str) -> np.ndarray:
    """The route array as int32 (positions × layers × top-k), or AdapterError naming the field."""
    try:
        arr = np.asarray(value)
    except (ValueError, TypeError, OverflowError):
        raise AdapterError(f"{where}: {field} must be a positions × layers × top-k array of expert ids") from None
    if arr.ndim != 3 or arr.dtype.kind not in "iu" or (arr.size and arr.shape[1] * arr.shape[2] == 0):
        raise AdapterError(
            f"{where}: {field} must be a positions × layers × top-k array of integer expert ids, "
            f"got shape {arr.shape} of {arr.dtype}"
        )
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= INT32):
        raise AdapterError(f"{where}: {field}: expert ids must lie in 0 .. 2^31 - 1")
    return arr.astype("<i4")


def digest(arr: np.ndarray) -> str:
    """hex SHA-256 of the routes, row-major int32 little-endian (the contract's encoding)."""
    return hashlib.sha256(np.ascontiguousarray(arr, dtype="<i4").tobytes()).hexdigest()


def written_by(calls: Sequence[tuple[int | None, int, int, int]], where: str) -> list[int | None]:
    """The version of the call that wrote each row of the route array, from each call's (version,
    the position its rows were computed from, the rows the engine returned, the array's length after
    the generator applied them): the last `rows` rows are the call's, the rows before them the prefix
    it kept. Rows placed elsewhere than the positions they were computed for hold no route of their
    own position: None."""
    rows_of: list[int | None] = []
    for t, (version, start, rows, after) in enumerate(calls):
        placed = after - rows
        if rows < 0 or not 0 <= placed <= len(rows_of):
            raise AdapterError(
                f"{where} engine call {t}: the route array holds {after} rows after the call's {rows}, "
                f"but only {len(rows_of)} before it"
            )
        del rows_of[placed:]  # in place: a long list of calls costs the rows they write, not a copy each
        rows_of.extend([version if placed == start else None] * rows)
    return rows_of


def call_routes(
    calls: Sequence[Mapping[str, Any]],
    versions: Sequence[int | None],
    keys: tuple[str, str, str],
    where: str,
    limit: int,
) -> list[int | None] | None:
    """`written_by` over the hook's per-call fields `keys` (the first position the engine routed, the
    rows it returned, the array's rows after the call); None when a call lacks one. `limit`: the most
    rows a call may return (the sample's tokens and route rows): a count past it is an AdapterError
    naming the field before any row is built, so a dump claiming 10^12 rows costs nothing. The array
    after a call may be longer (a generator that appends each call's array to the last one holds more
    rows than positions: P505's case), by at most the call's rows (`written_by`); a start past the
    sample places the call's rows elsewhere than computed (P505 again), and builds nothing."""
    if not calls or any(c.get(k) is None for c in calls for k in keys):
        return None
    steps = []
    for t, (c, v) in enumerate(zip(calls, versions)):
        w = f"{where} engine call {t}"
        start, rows, after = (whole(c[k], k, w) for k in keys)
        if rows > limit:
            raise AdapterError(
                f"{w}: {keys[1]} {rows} is more than the {limit} positions of the sample's tokens and routes"
            )
        steps.append((v, start, rows, after))
    return written_by(steps, where)


def replayed(rows: list[int | None], n_rows: int, n_tokens: int, pad_to_tokens: bool, where: str) -> list[int | None]:
    """Per position of the array the trainer replays, the version of the call whose routes it holds
    (None where the trainer replays padding, not an engine's routes): the `n_rows` rows the sample
    keeps (a generator may cut its array to the response's end), then either one padding row
    (`pad_to_tokens` False: slime appends one for the last token) or padding up to `n_tokens`
    (SkyRL places the rows from the sequence's start and pads the rest)."""
    if n_rows > len(rows):
        raise AdapterError(f"{where}: the sample keeps {n_rows} route rows, its engine calls wrote {len(rows)}")
    out = rows[:n_rows]
    return out + [None] * (max(n_tokens - n_rows, 0) if pad_to_tokens else 1)


def rows_digest(value: Any, rows: int | None = None) -> str:
    """`digest` of a route array held by a trainer (numpy, or a torch tensor on any device), of its first
    `rows` rows when given: the engine's rows the trainer replays, without the zero rows it pads with."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    arr = np.asarray(value)
    return digest(arr if rows is None else arr[:rows])
