"""Helpers shared by check families: message fragments and index arithmetic."""

from __future__ import annotations

import math
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ..frames import native
from ..frames.views import BatchView
from ..reading.arrays import from_numpy, list_lengths, stored, to_numpy, validity

# token_source values other than policy, with the name used in messages (5: out of range)
NON_POLICY = ((0, "system"), (1, "user"), (3, "observation"), (4, "template"), (5, "invalid source"))


def source_breakdown(prefix: str) -> pl.Expr:
    """'observation 9, template 3' from the per-source count columns `{prefix}{s}`."""
    parts = [
        pl.when(pl.col(f"{prefix}{s}") > 0).then(pl.format(f"{name} {{}}", pl.col(f"{prefix}{s}")))
        for s, name in NON_POLICY
    ]
    return pl.concat_list(parts).list.drop_nulls().list.join(", ")


def where_first(turn: str = "turn") -> pl.Expr:
    """'position 40 (turn 2)' or 'position 3' for the first offending token."""
    return pl.format("position {}", "position") + pl.when(pl.col(turn).is_not_null()).then(
        pl.format(" (turn {})", turn)
    ).otherwise(pl.lit(""))


def ragged_index(starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenated ranges starts[i] .. starts[i]+lengths[i]-1: (indices, owner i of each)."""
    owner = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    offs = np.concatenate([[0], np.cumsum(lengths)])[:-1]
    return starts[owner] + np.arange(owner.size, dtype=np.int64) - offs[owner], owner


def stop_reason(b: Any) -> pl.Expr:
    """The batch's stop_reason, or a null one when the log has none (for a message that names it)."""
    return pl.col("stop_reason") if "stop_reason" in b.traj.columns else pl.lit(None, pl.String).alias("stop_reason")


def num(v: Any, digits: int = 6) -> Any:
    """A number for a person, the one way every message and output writes one: integers in full
    (no '.0'), other finite floats to `digits` significant figures, NaN and infinities by name
    (`NaN`, `inf`, `-inf`), a missing value as `n/a`; anything else as text (escaped where it is
    printed). On a polars expression, the same text per row (a String expression)."""
    if isinstance(v, pl.Expr):
        as_int = v.cast(pl.Int64, strict=False)
        return (
            pl.when(v.is_null())
            .then(pl.lit("n/a"))
            .when(v.is_nan())
            .then(pl.lit("NaN"))
            .when(v.is_infinite())
            .then(pl.when(v > 0).then(pl.lit("inf")).otherwise(pl.lit("-inf")))
            .when(as_int.cast(pl.Float64) == v)
            .then(as_int.cast(pl.String))
            .otherwise(v.round_sig_figs(digits).cast(pl.String))
        )
    if v is None:
        return "n/a"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if float(v).is_integer() and abs(v) < 2**63:
        return str(int(v))
    return f"{v:.{digits}g}"


def tolerance(expected: Any, cfg: Any, atol: float | None = None) -> Any:
    """The tolerance of every recomputed float: atol + rtol·|expected| (polars expressions and numpy
    arrays alike); `atol` replaces the configuration's (a check with a tolerance of its own)."""
    return (cfg.atol if atol is None else atol) + cfg.rtol * abs(expected)


def beyond(found: Any, expected: Any, cfg: Any, atol: float | None = None) -> Any:
    """True where |found − expected| exceeds `tolerance` (NaN counts as beyond)."""
    return ~(abs(found - expected) <= tolerance(expected, cfg, atol))


def may_differ(found: np.ndarray, expected: np.ndarray, cfg, scale: np.ndarray | None = None) -> np.ndarray:
    """Where |found − expected| may exceed atol + rtol·|expected|: the rows a check then compares
    exactly (in polars, where its messages are built). NaN (a null read as NaN) is included.
    Values computed in another order differ in the last bits: a margin of 1e-9 of `scale`
    (the magnitude of what the two sides were computed from; by default |found| + |expected|)
    keeps every row the exact comparison could flag."""
    if scale is None:
        scale = np.abs(found) + np.abs(expected)
    with np.errstate(invalid="ignore", over="ignore"):
        return ~(np.abs(found - expected) <= tolerance(expected, cfg) - 1e-9 * scale)


def of_rows(parent: np.ndarray, rows: np.ndarray, n: int) -> np.ndarray:
    """Per turn (`parent`: its batch row): True when it belongs to a row where `rows` holds
    (a bool per row, or the row indices), so that a check sees those trajectories whole."""
    hit = np.zeros(n, bool)
    hit[rows] = True
    return hit[parent]


class TokenList:
    """A per-token list column aligned with the batch's token arrays: `stored`, the values in the
    list's own type (an integer list as it is, without a float copy; read it only where `present`),
    `values` as floats (float32 or float64 as stored, an integer list as float64; NaN where null or
    where the row's list does not line up: upcast the indices you sum over; an integer list's made on
    first use), `present` per token (`complete`: on every token), `fits` per row (the list is there
    and as long as the row's tokens), `broken` per row (there, but of another length) and `bad`, a
    finding for each broken row."""

    def __init__(self, b: BatchView, name: str) -> None:
        t = b.tokens
        a = b.col(name)
        lens = list_lengths(a, -1)
        self.fits = b.ok & (lens >= 0) & (lens == t.n_tok)
        self.broken = b.ok & (lens >= 0) & (lens != t.n_tok)
        whole = bool(self.fits.all())  # the usual case: no take, and the values come out in token order
        flat = (a if whole else a.take(from_numpy(np.flatnonzero(self.fits)))).flatten()
        if pa.types.is_integer(flat.type):
            vals = stored(flat)  # a null's slot as Arrow left it: `present` says which to read
        else:
            if not (pa.types.is_float32(flat.type) or pa.types.is_float64(flat.type)):
                flat = flat.cast(pa.float64(), safe=False)
            vals = to_numpy(flat)  # NaN under a null
        valid = validity(flat)
        self.complete = whole and not flat.null_count  # a value on every token: `present` need not be read
        if whole:
            self.stored, self.present = vals, valid
        else:
            have = self.fits[t.row]
            self.stored = np.full(t.row.size, np.nan if vals.dtype.kind == "f" else 0, dtype=vals.dtype)
            self.stored[have] = vals
            self.present = np.zeros(t.row.size, bool)
            self.present[have] = valid
        off = np.flatnonzero(self.broken)
        self.bad: pl.DataFrame | None = None
        if not off.size:
            return
        self.bad = pl.DataFrame(
            {"trajectory_id": b.ids.gather(off), "_n": lens[off], "_k": t.n_tok[off].astype(np.int64)},
            schema={"trajectory_id": pl.String, "_n": pl.Int64, "_k": pl.Int64},
        ).select(
            "trajectory_id",
            pl.format(f"{name} has {{}} entries for {{}} tokens; it is not read", "_n", "_k").alias("message"),
        )

    @cached_property
    def values(self) -> np.ndarray:
        """The values as floats (`native.floats`: an integer list's cast on first use, past 2^53, a
        version no trainer reaches, to the nearest float as polars casts the turns' own)."""
        return native.floats(self.stored, None if self.complete else self.present)


def token_list(b: BatchView, name: str) -> TokenList:
    """`TokenList(b, name)`, made once per batch for the checks that read `name` over the same token
    lists (R411 and R413 read token_reward, R412 and R413 token_kl)."""
    return b.shared(f"{name} over {sorted(b.lists)}", (name,), lambda: TokenList(b, name))
