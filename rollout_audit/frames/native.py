"""The audit's native core and its pure-Python path, one function each, with identical results.

`_native` is the project's C extension (`_native.c`, compiled at install by hatch_build.py with the
machine's compiler); it works on a whole batch per call with the GIL released, so the read-ahead
thread decodes on the other core meanwhile. Without it (no compiler at install, or
`ROLLOUT_AUDIT_NO_NATIVE=1` when the process starts) the functions below use hashlib, and
`tests/test_native.py` keeps the two equal.
"""

from __future__ import annotations

import hashlib
import os
from types import ModuleType
from typing import Any, NamedTuple

import numpy as np

ACTIVE: ModuleType | None = None
if os.environ.get("ROLLOUT_AUDIT_NO_NATIVE") != "1":
    try:
        from . import _native as ACTIVE  # type: ignore[attr-defined, no-redef]
    except ImportError:  # not built: the pure-Python path below
        ACTIVE = None


def prefix_sha256(data: memoryview, lo: np.ndarray, hi: np.ndarray, first: np.ndarray) -> np.ndarray:
    """SHA-256 of consecutive prefixes, one 32-byte row per entry: a running hash starts anew
    where `first` is set, is fed data[lo:hi], and its digest so far is taken (on a copy)."""
    lo = np.ascontiguousarray(lo, np.int64)
    hi = np.ascontiguousarray(hi, np.int64)
    first = np.ascontiguousarray(first, np.bool_)
    if ACTIVE is not None:
        out = np.empty((lo.size, 32), np.uint8)
        ACTIVE.prefix_sha256(data, lo, hi, first.view(np.uint8), out)
        return out
    return prefix_sha256_python(data, lo, hi, first)


def prefix_sha256_python(data: memoryview, lo: np.ndarray, hi: np.ndarray, first: np.ndarray) -> np.ndarray:
    """`prefix_sha256` with hashlib: a Python call per prefix (the loop holds nothing else)."""
    new, digests = hashlib.sha256, list[bytes]()
    append = digests.append
    h = new()
    for f, a, z in zip(first.tolist(), lo.tolist(), hi.tolist()):
        if f:
            h = new()
        h.update(data[a:z])
        append(h.digest())
    return np.frombuffer(b"".join(digests), np.uint8).reshape(-1, 32)


N_SOURCE, N_LP = 6, 3  # token_source 0..4 and 5 for any other value; log-prob none, valid, invalid


def lp_states(lp: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per token (int8): 0 no log-prob recorded, 1 valid (finite, <= 0), 2 invalid (NaN, inf, > 0)."""
    state = ~np.isfinite(lp)
    state |= lp > 0
    state = state.view(np.int8) + np.int8(1)
    if not present.all():
        state *= present
    return state


def token_stats(
    n_tok: np.ndarray, source: np.ndarray, mask: np.ndarray, lp: np.ndarray, present: np.ndarray, weights: np.ndarray
) -> np.ndarray:
    """Per row (its `n_tok` consecutive tokens), k statistics of its tokens as an int64 array of
    shape (k, rows): statistic s counts the tokens whose category (source, any value past 4 as 5;
    trainable; log-prob state: the axes of `token_counts_numpy`, flattened) has weights[c, s] set
    (`weights`: bool, 36 x k)."""
    kernel = getattr(ACTIVE, "token_stats", None)  # a core built before `token_stats`: the numpy path
    if kernel is None:
        return token_stats_numpy(n_tok, source, mask, lp, present, weights)
    out = np.empty((weights.shape[1], n_tok.size), np.int64)
    kernel(
        np.ascontiguousarray(n_tok, np.int64),
        np.ascontiguousarray(source, np.uint8),
        np.ascontiguousarray(mask).view(np.uint8),
        np.ascontiguousarray(lp),
        np.ascontiguousarray(present).view(np.uint8),
        np.ascontiguousarray(weights, np.uint8),
        out,
    )
    return out


def token_stats_numpy(*arrays: np.ndarray) -> np.ndarray:
    """`token_stats` in numpy (the same arguments): the per-row counts of every category, then one
    integer product with the weights."""
    n_tok, source, mask, lp, present, weights = arrays
    folded = np.minimum(source, np.uint8(N_SOURCE - 1))  # any source past 4 counts as 5, as `Tokens` folds it
    counts = token_counts_numpy(n_tok, folded, mask, lp_states(lp, present)).reshape(n_tok.size, N_SOURCE * 2 * N_LP)
    return weights.T.astype(np.int64) @ counts.T


def token_counts_numpy(n_tok: np.ndarray, source: np.ndarray, mask: np.ndarray, lp_state: np.ndarray) -> np.ndarray:
    """Per row (its `n_tok` consecutive tokens), how many tokens of each category: an int64 array
    of shape (rows, source, trainable, log-prob state), `source` already folded into 0..5; one
    bincount over a combined category code."""
    n, per = n_tok.size, N_SOURCE * 2 * N_LP
    small = source * np.uint8(2 * N_LP)  # the token's category, 0..35
    small += mask.view(np.uint8) * np.uint8(N_LP)
    small += lp_state.view(np.uint8)
    # bincount wants intp: the row base is repeated in intp directly (no int32 -> intp cast)
    code = np.repeat(np.arange(0, n * per, per, dtype=np.intp), n_tok)
    code += small
    return np.bincount(code, minlength=n * per).reshape(n, N_SOURCE, 2, N_LP)


class TurnPass(NamedTuple):
    """What one pass over a batch's tokens gives per turn (`Tokens.turn_key`, `policy_by_turn`,
    `turn_values`): each token's turn key, the policy tokens of each turn grouped in token order
    (`grouped`, with `n_policy` and `start` per turn) and the per-turn counts, log-prob sums and first
    policy position."""

    key: np.ndarray  # per token: the index of its turn among the batch's turns, -1 if none
    grouped: np.ndarray  # the policy tokens that belong to a turn, grouped by turn key in token order
    n_policy: np.ndarray  # per turn: its policy tokens
    start: np.ndarray  # per turn: where its run begins in `index`
    n_trainable: np.ndarray  # per turn: its tokens in the loss (any source)
    n_lp_valid: np.ndarray  # per turn: its policy tokens with a valid log-prob
    lp_sum: np.ndarray  # per turn: the sum of those log-probs in float64, as np.add.reduceat sums the run
    first: np.ndarray  # per turn: the position in its row of its first policy token, -1 if none


def turn_pass(
    n_tok: np.ndarray,
    turn_start: np.ndarray,
    turn_count: np.ndarray,
    turn: np.ndarray,
    source: np.ndarray,
    mask: np.ndarray,
    lp: np.ndarray,
    present: np.ndarray,
) -> TurnPass:
    """The per-turn values of a batch's tokens (rows of `n_tok` consecutive tokens; row r owns the
    turns turn_start[r] .. turn_start[r] + turn_count[r] - 1): two native calls, or numpy."""
    n_turns = int(turn_count.sum())
    key_t = np.int32 if n_turns < 2**31 else np.int64
    if ACTIVE is None:
        return turn_pass_numpy(n_tok, turn_start, turn_count, turn, source, mask, lp, present, key_t=key_t)
    rows = [np.ascontiguousarray(a, np.int64) for a in (n_tok, turn_start, turn_count)]
    turn, source, lp = (np.ascontiguousarray(a) for a in (turn, source, lp))
    mask, present = (np.ascontiguousarray(a).view(np.uint8) for a in (mask, present))
    key = np.empty(turn.size, key_t)
    count, n_trainable = np.empty(n_turns, np.int64), np.empty(n_turns, np.int64)
    ACTIVE.turn_keys(*rows, turn, source, mask, key, count, n_trainable)
    index = np.empty(int(count.sum()), np.int64)
    start, n_valid, lp_sum, first = (np.empty(n_turns, t) for t in (np.int64, np.int64, np.float64, np.int64))
    ACTIVE.turn_sums(*rows, key, source, lp, present, count, index, start, n_valid, lp_sum, first)
    return TurnPass(key, index, count, start, n_trainable, n_valid, lp_sum, first)


def turn_pass_numpy(*arrays: np.ndarray, key_t: Any) -> TurnPass:
    """`turn_pass` in numpy (the same arrays): repeat, compare, stable grouping, bincount and
    reduceat passes."""
    n_tok, turn_start, turn_count, turn, source, mask, lp, present = arrays
    n_turns = int(turn_count.sum())
    key = np.repeat(turn_start.astype(key_t, copy=False), n_tok)
    key += turn
    # one unsigned comparison finds both turn < 0 and turn >= the row's turn count
    bad = turn.view(np.uint32) >= np.repeat(turn_count.astype(np.uint32), n_tok)
    if bad.any():
        key[bad] = -1
    index = np.flatnonzero((source == 2) & (key >= 0))
    kp = key[index]
    if kp.size > 1 and (np.diff(kp) < 0).any():  # token_turn not in turn order: group stably
        order = np.argsort(kp, kind="stable")
        index, kp = index[order], kp[order]
    # kp is sorted: each turn's run is found by binary search (no pass over the tokens)
    bounds = np.searchsorted(kp, np.arange(n_turns + 1, dtype=kp.dtype))
    count, start = np.diff(bounds), bounds[:-1]
    has = count > 0
    first = np.full(n_turns, -1, np.int64)
    head = index[start[has]]
    row_start = np.zeros(n_tok.size + 1, np.int64)
    np.cumsum(n_tok, out=row_start[1:])
    first[has] = head - row_start[np.searchsorted(row_start, head, side="right") - 1]
    valid = lp_states(lp[index], present[index]) == 1
    lpv = np.where(valid, lp[index], 0.0)  # summed in float64: turn sums are compared in float64
    km = key[mask]
    km = km[km >= 0]
    return TurnPass(
        key,
        index,
        count,
        start,
        np.bincount(km, minlength=n_turns),
        segment_sum(valid.view(np.uint8), start, has, np.int64),
        segment_sum(lpv, start, has, np.float64),
        first,
    )


def segment_sum(x: np.ndarray, start: np.ndarray, has: np.ndarray, dtype: Any) -> np.ndarray:
    """Sums of consecutive segments of `x` beginning at `start` (0 where a segment is empty)."""
    out = np.zeros(start.size, dtype)
    if has.any():
        out[has] = np.add.reduceat(x, start[has], dtype=dtype)
    return out


def to_go(v: np.ndarray, row: np.ndarray) -> np.ndarray:
    """Per element: the sum of v (float64) over it and every later element of the same row (`row`
    sorted): the running sum at its row's last element, less the running sum before it, plus it."""
    if ACTIVE is not None and v.size:
        out = np.empty(v.size, np.float64)
        ACTIVE.to_go(np.ascontiguousarray(v, np.float64), np.ascontiguousarray(row), out)
        return out
    return to_go_numpy(v, row)


def to_go_numpy(v: np.ndarray, row: np.ndarray) -> np.ndarray:
    """`to_go` in numpy: a cumulative sum, each row's last running sum repeated."""
    if not v.size:
        return v
    c = np.cumsum(v)
    last = np.flatnonzero(np.r_[row[1:] != row[:-1], True])  # each row's last element
    return np.repeat(c[last], np.diff(last, prepend=-1)) - c + v


def routes(
    n_tok: np.ndarray,
    key: np.ndarray,
    source: np.ndarray,
    v: np.ndarray,
    present: np.ndarray | None,
    fits: np.ndarray,
    pv: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """P505's per-token conditions over the routes `v` of a batch's tokens (as stored: int64 read
    only where `present`, or floats, NaN where none; each compared as its float64 value), as bool
    arrays: (lost) a token of a row whose list fits (`fits`) without a value (`present`; None: every
    token has one) before its row's last policy token (no log-prob reads the routes from there on);
    (wrong) a policy token of a turn (`key` >= 0), not its row's first, whose log-prob is read
    through the routes at the position before it, when those differ from its turn's version
    pv[key] (a turn without a version, or no value at that position, is not compared); (other) a
    token the policy did not sample whose value lies outside its row's [lo, hi]."""
    kernel = getattr(ACTIVE, "routes64", None) if v.dtype == np.int64 else None  # a core built before `routes64`
    if kernel is None:
        return routes_numpy(n_tok, key, source, floats(v, present), present, fits, pv, lo, hi)
    total = key.size
    lost, wrong, other = (np.empty(total, np.bool_) for _ in range(3))
    kernel(
        np.ascontiguousarray(n_tok, np.int64),
        np.ascontiguousarray(key),
        np.ascontiguousarray(source),
        np.ascontiguousarray(v),
        _flags(present),
        np.ascontiguousarray(fits).view(np.uint8),
        np.ascontiguousarray(pv, np.float64),
        np.ascontiguousarray(lo, np.float64),
        np.ascontiguousarray(hi, np.float64),
        lost.view(np.uint8),
        wrong.view(np.uint8),
        other.view(np.uint8),
    )
    return lost, wrong, other


def floats(v: np.ndarray, present: np.ndarray | None) -> np.ndarray:
    """A token list's values as floats, NaN where not present (`present` None: every one is): an
    integer array cast to float64 (past 2^53 to the nearest float), a float array as it is (NaN
    already where it has no value)."""
    if v.dtype.kind == "f":
        return v
    out = v.astype(np.float64)
    if present is not None:
        out[~present] = np.nan
    return out


def routes_numpy(*arrays: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`routes` in numpy (the same arguments, float routes): per-token gathers of the turns' and rows'
    versions."""
    n_tok, key, source, v, present, fits, pv, lo, hi = arrays
    row = np.repeat(np.arange(n_tok.size), n_tok)
    starts = np.zeros(n_tok.size + 1, np.int64)
    np.cumsum(n_tok, out=starts[1:])
    policy = source == 2
    lost = np.zeros(row.size, bool) if present is None else fits[row] & ~present
    if lost.any():  # no log-prob reads a route from the row's last policy token on
        at = np.arange(row.size)
        last = np.full(n_tok.size, -1)
        np.maximum.at(last, row[policy], at[policy])
        lost &= at < last[row]
    idx = np.flatnonzero(policy & (key >= 0))  # the policy tokens that belong to a turn
    idx = idx[idx > starts[row[idx]]]  # but a row's first (no position before it)
    turn_v = pv[key[idx]]
    bad = v[idx - 1] != turn_v  # NaN (no route, or a list that does not line up) compares unequal
    bad &= ~np.isnan(turn_v) if present is None else ~np.isnan(turn_v) & present[idx - 1]
    wrong = np.zeros(row.size, bool)
    wrong[idx[bad]] = True
    other = ~policy & ((v < lo[row]) | (v > hi[row]))
    return lost, wrong, other


def _flags(present: np.ndarray | None) -> np.ndarray:
    """A per-token present flag for the native core (empty: every token has a value)."""
    return np.zeros(0, np.uint8) if present is None else np.ascontiguousarray(present).view(np.uint8)


def terms(
    at: np.ndarray,
    rew: np.ndarray,
    rew_present: np.ndarray | None,
    kl: np.ndarray | None,
    kl_present: np.ndarray | None,
) -> np.ndarray:
    """R413's per-token terms at the token indices `at`: rew − kl in float64, a value not present
    counting 0 (`*_present` None: every token has one; `kl` None: no KL term)."""
    if ACTIVE is None:
        return terms_numpy(at, rew, rew_present, kl, kl_present)
    out = np.empty(at.size, np.float64)
    klv = np.zeros(0, np.float64) if kl is None else np.ascontiguousarray(kl)
    ACTIVE.terms(
        np.ascontiguousarray(at, np.int64), np.ascontiguousarray(rew), _flags(rew_present), klv, _flags(kl_present), out
    )
    return out


def terms_numpy(*arrays: Any) -> np.ndarray:
    """`terms` in numpy (the same arguments): a gather and a cast per list."""
    at, rew, rew_present, kl, kl_present = arrays

    def one(values: np.ndarray, present: np.ndarray | None) -> np.ndarray:
        v = values[at].astype(np.float64)
        if present is not None:
            v[~present[at]] = 0.0
        return v

    return one(rew, rew_present) if kl is None else one(rew, rew_present) - one(kl, kl_present)


def placement(
    n_tok: np.ndarray, source: np.ndarray, turn: np.ndarray, v: np.ndarray, present: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """R411's per-token condition: (wrong) a value placed (present and not 0; NaN is placed) on a
    token that is not the last policy token of its turn (the next policy token of its row has
    another token_turn, or there is none); and per row how many values are placed."""
    if ACTIVE is None:
        return placement_numpy(n_tok, source, turn, v, present)
    wrong, n_placed = np.empty(source.size, np.bool_), np.empty(n_tok.size, np.int64)
    ACTIVE.placement(
        np.ascontiguousarray(n_tok, np.int64),
        np.ascontiguousarray(source),
        np.ascontiguousarray(turn),
        np.ascontiguousarray(v),
        _flags(present),
        wrong.view(np.uint8),
        n_placed,
    )
    return wrong, n_placed


def placement_numpy(*arrays: Any) -> tuple[np.ndarray, np.ndarray]:
    """`placement` in numpy (the same arguments): the policy tokens' rows and turns compared with
    the next one's, a bincount of the placed tokens' rows."""
    n_tok, source, turn, v, present = arrays
    row = np.repeat(np.arange(n_tok.size), n_tok)
    p = np.flatnonzero(source == 2)
    last = np.zeros(row.size, bool)
    if p.size:
        rp, kp = row[p], turn[p]
        last[p] = np.r_[(rp[1:] != rp[:-1]) | (kp[1:] != kp[:-1]), True]
    placed = present & ~(v == 0)
    return placed & ~last, np.bincount(row[placed], minlength=n_tok.size)


ECHO_WRONG, UNKNOWN_STREAM, BAD_WEIGHT, WEIGHT_OFF, WEIGHT_DROPPED = 1, 2, 4, 8, 16  # the bits of `streams`


def streams(
    mask: np.ndarray,
    source: np.ndarray,
    stream: np.ndarray | None,
    stream_present: np.ndarray | None,
    weight: np.ndarray | None,
    weight_present: np.ndarray | None,
) -> tuple[np.ndarray, int]:
    """M110's per-token conditions in one pass, as bits per token (uint8) and their OR over the
    batch: ECHO_WRONG, a token in the loss in the echo stream (1) that is neither user (source 1)
    nor observation (3) text; UNKNOWN_STREAM, a token in the loss in a stream above 1 (a stream
    counts as its value truncated toward zero, 0 where not present); BAD_WEIGHT, a present weight
    that is negative, NaN or +inf; WEIGHT_OFF, a valid weight > 0 outside the loss; WEIGHT_DROPPED,
    a valid weight that is not > 0 in the loss. `stream`: the column's values per token as stored
    (uint8, the contract's type, read only where present; or floats), `weight` (float32 or float64);
    None when the column is absent; `*_present`: None when every token has a value."""
    # the kernel reads uint8 streams; a core built before `streams8`, or another type: the numpy path
    kernel = getattr(ACTIVE, "streams8", None) if stream is None or stream.dtype == np.uint8 else None
    if kernel is None:
        return streams_numpy(mask, source, stream, stream_present, weight, weight_present)
    out = np.empty(mask.size, np.uint8)
    seen = kernel(
        np.ascontiguousarray(mask).view(np.uint8),
        np.ascontiguousarray(source, np.uint8),
        np.zeros(0, np.uint8) if stream is None else np.ascontiguousarray(stream),
        _flags(stream_present),
        np.zeros(0, np.float64) if weight is None else np.ascontiguousarray(weight),
        _flags(weight_present),
        out,
    )
    return out, int(seen)


def streams_numpy(*arrays: Any) -> tuple[np.ndarray, int]:
    """`streams` in numpy (the same arguments)."""
    mask, source, stream, stream_present, weight, weight_present = arrays
    out = np.zeros(mask.size, np.uint8)
    if stream is not None:
        st = np.trunc(np.nan_to_num(stream, nan=0.0)) if stream.dtype.kind == "f" else stream
        if stream_present is not None:
            st = np.where(stream_present, st, 0.0)
        echo_wrong = mask & (st == 1) & (source != 1) & (source != 3)
        out |= echo_wrong.view(np.uint8) * np.uint8(ECHO_WRONG)
        out |= (mask & (st > 1)).view(np.uint8) * np.uint8(UNKNOWN_STREAM)
    if weight is not None:
        with np.errstate(invalid="ignore"):
            invalid = ~(weight >= 0) | (weight == np.inf)
        if weight_present is not None:
            invalid &= weight_present
        mismatch = (weight > 0) != mask
        mismatch &= ~invalid if weight_present is None else ~invalid & weight_present
        out |= invalid.view(np.uint8) * np.uint8(BAD_WEIGHT)
        out |= (mismatch & ~mask).view(np.uint8) * np.uint8(WEIGHT_OFF)
        out |= (mismatch & mask).view(np.uint8) * np.uint8(WEIGHT_DROPPED)
    return out, int(np.bitwise_or.reduce(out)) if out.size else 0


def outside(held: np.ndarray, length: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """L210's membership test (bool per token of `held`): the token records a nucleus (length > 0)
    and none of its `length` kept ids (the next ones in `ids`, back to back in token order)
    equals it."""
    kernel = getattr(ACTIVE, "outside", None)  # a core built before `outside`: the numpy path
    if kernel is None:
        return outside_numpy(held, length, ids)
    miss = np.empty(held.size, np.bool_)
    as_is = ids.dtype == np.int32 or ids.dtype == np.int64  # what the core reads; any other integer type widened
    kernel(
        np.ascontiguousarray(held, np.int32),
        np.ascontiguousarray(length, np.int64),
        np.ascontiguousarray(ids if as_is else ids.astype(np.int64)),
        miss.view(np.uint8),
    )
    return miss


def outside_numpy(held: np.ndarray, length: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`outside` in numpy: each token repeated over its span, compared, OR-reduced per span."""
    recorded = length > 0
    same = np.repeat(held, length) == ids
    spans = length[recorded]  # the non-empty spans, back to back in ids
    at = np.concatenate([[0], np.cumsum(spans)[:-1]]).astype(np.int64)
    hit = np.logical_or.reduceat(same, at) if same.size else np.zeros(0, bool)
    miss = np.zeros(held.size, bool)
    miss[recorded] = ~hit
    return miss


# S004's token_turn tags and M105/M107's recorded digests


class TurnTags(NamedTuple):
    """S004's per-row counts (`turn_tags`): tokens with token_turn -1 after a token of a turn (late) and
    tokens whose token_turn is neither -1 nor a turn of the row (wrong), each with the position in the
    row of its first (-1: none)."""

    late_n: np.ndarray
    late_first: np.ndarray
    wrong_n: np.ndarray
    wrong_first: np.ndarray


def turn_tags(n_tok: np.ndarray, turn: np.ndarray, key: np.ndarray) -> TurnTags:
    """S004's tags of the tokens of rows of `n_tok` consecutive tokens: late, token_turn (`turn`) -1
    after a token of the row whose token_turn is >= 0; wrong, a turn key (`key`) below 0 with a
    token_turn other than -1; counted per row, with the first position of each."""
    kernel = getattr(ACTIVE, "turn_tags", None)  # a core built before `turn_tags`: the numpy path
    if kernel is None:
        return turn_tags_numpy(n_tok, turn, key)
    out = [np.empty(n_tok.size, np.int64) for _ in range(4)]
    wide = key.dtype.itemsize == 8
    kernel(
        np.ascontiguousarray(n_tok, np.int64),
        np.ascontiguousarray(turn, np.int32),
        np.ascontiguousarray(key, np.int64 if wide else np.int32),
        *out,
    )
    return TurnTags(*out)


def turn_tags_numpy(n_tok: np.ndarray, turn: np.ndarray, key: np.ndarray) -> TurnTags:
    """`turn_tags` in numpy: a running maximum over (row, turn) keys that increase from row to row,
    then per-row counts (bincount) and first positions (the first of each row among the hits)."""
    n = n_tok.size
    row = np.repeat(np.arange(n, dtype=np.int64), n_tok)
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(n_tok, out=starts[1:])
    late = np.zeros(turn.size, bool)
    if turn.size:
        # turn + 2 >= 0 lies in [0, span) for every token that can name a turn or be -1; a value below
        # -2 gives a key below its row's, which never reads as a turn seen
        span = max(int(turn.max()), -2) + 3
        k = row * span + (turn.astype(np.int64) + 2)
        late = (turn == -1) & (np.maximum.accumulate(k) - row * span - 2 >= 0)
    wrong = (key < 0) & (turn != -1)

    def per_row(hit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        idx = np.flatnonzero(hit)
        first = np.full(n, -1, np.int64)
        rows, at = np.unique(row[idx], return_index=True)
        first[rows] = idx[at] - starts[rows]
        return np.bincount(row[idx], minlength=n).astype(np.int64), first

    return TurnTags(*per_row(late), *per_row(wrong))


def hex_differs(
    offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None, at: np.ndarray, digests: np.ndarray
) -> np.ndarray:
    """Per entry of `at` (indices into a string array: `offsets`, its n + 1 boundaries into the bytes
    `data`; `valid`, per string, None when every one is): whether string at[i] differs from the 64
    hex digits of digests[i] (32 bytes) read in any case (ASCII A-Z as a-z); a null, a string of
    another length or a character that is no hex digit differs."""
    kernel = getattr(ACTIVE, "hex_differs", None)  # a core built before `hex_differs`: the numpy path
    if kernel is None:
        return hex_differs_numpy(offsets, data, valid, at, digests)
    out = np.empty(at.size, np.bool_)
    wide = offsets.dtype.itemsize == 8
    kernel(
        np.ascontiguousarray(offsets, np.int64 if wide else np.int32),
        np.ascontiguousarray(data, np.uint8),
        np.zeros(0, np.uint8) if valid is None else np.ascontiguousarray(valid).view(np.uint8),
        np.ascontiguousarray(at, np.int64),
        np.ascontiguousarray(digests, np.uint8),
        out.view(np.uint8),
    )
    return out


def hex_differs_numpy(
    offsets: np.ndarray, data: np.ndarray, valid: np.ndarray | None, at: np.ndarray, digests: np.ndarray
) -> np.ndarray:
    """`hex_differs` in numpy: each 64-character string's digits parsed into 32 bytes (a character
    outside 0-9, a-f, A-F parses as no byte) and compared with the digest."""
    lo, hi = offsets[at].astype(np.int64), offsets[at + 1].astype(np.int64)
    differ = hi - lo != 64
    if valid is not None:
        differ |= ~valid[at]
    full = np.flatnonzero(~differ)
    chars = data[lo[full, None] + np.arange(64)].astype(np.int16)
    chars += ((chars >= ord("A")) & (chars <= ord("Z"))) * 32
    digit = np.where((chars >= ord("0")) & (chars <= ord("9")), chars - ord("0"), -256)
    digit = np.where((chars >= ord("a")) & (chars <= ord("f")), chars - ord("a") + 10, digit)
    parsed = digit[:, 0::2] * 16 + digit[:, 1::2]  # negative where a character is no hex digit
    differ[full] = (parsed != digests[full].astype(np.int16)).any(axis=1)
    return differ
