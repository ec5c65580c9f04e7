"""One slice of trajectory rows, with the flattened token arrays and the per-trajectory and
per-turn values recomputed from them (vectorised, computed once on first use).

Token arrays are built per set of token lists: a row takes part when the lists a check reads
are present, non-null and of one length, so a missing `behavior_logprobs` does not hide the
rows from a mask check. `SUMMARY_INPUTS` names every derived value and the inputs it is
computed from: checks declare these names like columns. A value only one check family reads
is computed in that family's module and registered with `derived`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from ..contract import schema as S
from ..reading.arrays import as_bools, fill_null, from_numpy, list_lengths, scalar, stored, to_numpy, validity
from . import native

TOKEN_LISTS = S.TOKEN_LISTS
_NSRC, _NLP = native.N_SOURCE, native.N_LP  # token_source 0..4 and 5 otherwise; log-prob null, valid, invalid
_SRC = (0, 1, 3, 4, 5)
segment_sum = native.segment_sum  # per-row sums of the checks' per-turn values (R4xx)

# per-trajectory counts (`Tokens.stats`) and the token lists each is computed from
STAT_INPUTS: dict[str, tuple[str, ...]] = {
    "n_tokens": ("token_source",),
    "n_trainable": ("loss_mask",),
    "n_policy": ("token_source",),
    **{f"n_trainable_src{s}": ("loss_mask", "token_source") for s in _SRC},
    "n_policy_unmasked": ("loss_mask", "token_source"),
    "n_trainable_bad_lp": ("loss_mask", "behavior_logprobs"),
    "n_lp_nonpolicy": ("behavior_logprobs", "token_source"),
    **{f"n_lp_src{s}": ("behavior_logprobs", "token_source") for s in _SRC},
    "n_src_invalid": ("token_source",),
}
# each token category of `native.token_stats` (source 0..5, trainable, log-prob state: none, valid,
# invalid; flattened), as its source, trainable flag and state; and the categories each count adds up
_CS, _CT, _CL = np.indices((_NSRC, 2, _NLP)).reshape(3, -1)
_STAT_CATEGORIES: dict[str, np.ndarray] = {
    "n_tokens": _CS >= 0,
    "n_trainable": _CT == 1,
    "n_policy": _CS == S.POLICY,
    **{f"n_trainable_src{s}": (_CT == 1) & (_CS == s) for s in _SRC},
    "n_policy_unmasked": (_CS == S.POLICY) & (_CT == 0),
    "n_trainable_bad_lp": (_CT == 1) & (_CL != 1),
    "n_lp_nonpolicy": (_CS != S.POLICY) & (_CL > 0),
    **{f"n_lp_src{s}": (_CS == s) & (_CL > 0) for s in _SRC},
    "n_src_invalid": _CS == 5,
}
_STAT_WEIGHTS = np.stack(list(_STAT_CATEGORIES.values()), axis=1)
# per-turn values recomputed from the tokens of each turn (`Tokens.turn_values`)
TURN_INPUTS: dict[str, tuple[str, ...]] = {
    "rc_n_policy": ("token_source", "token_turn"),
    "rc_first_policy_pos": ("token_source", "token_turn"),
    "rc_n_trainable": ("loss_mask", "token_turn"),
    "rc_n_lp_valid": ("behavior_logprobs", "token_source", "token_turn"),
    "rc_lp_sum": ("behavior_logprobs", "token_source", "token_turn"),
}
# what the per-trajectory summary of the log (for log checks) can hold beyond trajectory columns
SUMMARY_INPUTS: dict[str, tuple[str, ...]] = {
    **STAT_INPUTS,
    "ok": (),  # the row's token counts are known (its lists line up)
    "n_turns": ("turns",),
    "pv_min": ("turns.policy_version",),
    "pv_max": ("turns.policy_version",),
    "n_versions": ("turns.policy_version",),
}
# derived per-trajectory values registered by a check family: name -> function of (batch, its
# tokens) giving one value per row (null where unknown), or None when the batch lacks the inputs
DERIVED: dict[str, Callable[[Batch, Tokens], pl.Series | None]] = {}


def derived(
    name: str, inputs: tuple[str, ...]
) -> Callable[[Callable[..., pl.Series | None]], Callable[..., pl.Series | None]]:
    """Register a per-trajectory value of the log summary computed from `inputs` (trajectory
    columns, `turns.field` or token lists): log checks then declare `name` like a column."""

    def deco(func: Callable[..., pl.Series | None]) -> Callable[..., pl.Series | None]:
        if name in SUMMARY_INPUTS:
            raise ValueError(f"summary value {name} registered twice")
        SUMMARY_INPUTS[name] = inputs
        DERIVED[name] = func
        return func

    return deco


def contract_names(names: Sequence[str]) -> list[str]:
    """`names` with each recomputed value replaced by the contract fields it is computed from
    (`pv_min` -> `turns.policy_version`), so that users read the contract's names only."""
    derived = {**SUMMARY_INPUTS, **TURN_INPUTS}
    return list(dict.fromkeys(x for n in names for x in derived.get(n, (n,))))


def _np(a: pa.Array, fill: Any = None) -> np.ndarray:
    return to_numpy(a if fill is None else fill_null(a, fill))


def _floats(a: pa.Array) -> np.ndarray:
    """A float array's values as numpy without a copy; values under a null are undefined."""
    if not len(a):
        return np.zeros(0, np.float32)
    if not (pa.types.is_float32(a.type) or pa.types.is_float64(a.type)):
        return to_numpy(pc.fill_null(a.cast(pa.float64()), scalar(np.nan, pa.float64())))
    return stored(a)


def _sources(a: pa.Array) -> np.ndarray:
    """token_source as uint8 codes, with 5 for null or any value out of range."""
    src = _np(a, 255)
    if (src > 4).any():
        src = np.where(src > 4, 5, src)
    return src.astype(np.uint8, copy=False)


def hex_matrix(d: np.ndarray) -> np.ndarray:
    """Rows of 32-byte digests as rows of 64 lowercase hex digits (ASCII), in vectorised arithmetic."""
    nibbles = np.stack([d >> 4, d & 15], axis=-1).reshape(-1, 64)
    return nibbles + np.uint8(48) + (nibbles > 9).view(np.uint8) * np.uint8(39)  # 0-9, a-f


def hex_digests(d: np.ndarray) -> pl.Series:
    """Rows of 32-byte digests as 64-digit lowercase hex strings, without a Python call per row."""
    k = d.shape[0]
    offsets = np.arange(0, 64 * (k + 1), 64, dtype=np.int32)
    data = pa.py_buffer(hex_matrix(d))
    return pl.Series("_hex", pa.Array.from_buffers(pa.string(), k, [None, pa.py_buffer(offsets), data]))


def list_inputs(names: set[str] | frozenset[str]) -> frozenset[str]:
    """Token lists needed to compute the derived values (`SUMMARY_INPUTS`) in `names`."""
    out: set[str] = set()
    for n in names:
        out.update(q for q in SUMMARY_INPUTS.get(n, ()) if q in TOKEN_LISTS)
    return frozenset(out)


class Tokens:
    """Flattened token arrays of the rows of a batch whose lists `lists` line up (`ok`).

    One entry per token; lists outside `lists` are neutral fillers that views never expose.
    """

    def __init__(self, batch: Batch, lists: frozenset[str], ok: np.ndarray) -> None:
        self.batch = batch
        self.lists = lists
        self.ok = ok
        n = batch.n
        lens = batch.lengths
        ref = next((lens[c] for c in TOKEN_LISTS if c in lists), np.zeros(n, np.int64))
        n_tok = np.where(ok, ref, 0)
        starts = np.zeros(n + 1, np.int64)
        np.cumsum(n_tok, out=starts[1:])
        keep = np.flatnonzero(ok)
        whole = len(keep) == n
        total = int(starts[-1])
        idx_t = np.int32 if total < 2**31 and n < 2**31 else np.int64

        def flat(name: str) -> pa.Array:
            a = batch.col(name)
            if not whole:
                a = a.take(from_numpy(keep))
            return a.flatten()

        self.n_tok = n_tok
        self.row = np.repeat(np.arange(n, dtype=idx_t), n_tok)
        self.starts = starts[:-1]
        self.source = np.zeros(total, np.uint8) if "token_source" not in lists else _sources(flat("token_source"))
        self.mask = np.zeros(total, bool) if "loss_mask" not in lists else as_bools(flat("loss_mask"))
        if "behavior_logprobs" in lists:
            # float32 is the contract type; every use compares or sums in float64. The values under
            # a null are undefined: every use goes through `lp_present` or `lp_state`
            lp_arr = flat("behavior_logprobs")
            self.lp, self.lp_present = _floats(lp_arr), validity(lp_arr)
        else:
            self.lp, self.lp_present = np.full(total, np.nan, np.float32), np.zeros(total, bool)
        if "token_turn" in lists:
            self.turn = _np(flat("token_turn"), -2).astype(np.int32, copy=False)
        else:
            self.turn = np.full(total, -2, np.int32)
        self.ids: np.ndarray | None = None
        if "token_ids" in lists:
            self.ids = _np(flat("token_ids"), -1).astype(np.int32, copy=False)

    @cached_property
    def pos(self) -> np.ndarray:
        """Per token: its position in its trajectory (built on first use: most checks never ask)."""
        idx_t = self.row.dtype
        return np.arange(self.row.size, dtype=idx_t) - np.repeat(self.starts.astype(idx_t), self.n_tok)

    @cached_property
    def policy(self) -> np.ndarray:
        return self.source == S.POLICY

    @cached_property
    def policy_index(self) -> np.ndarray:
        """Indices of the policy tokens, in token order."""
        return np.flatnonzero(self.policy)

    @cached_property
    def ids_le_bytes(self) -> memoryview:
        """token_ids as one buffer of little-endian int32 (4 bytes per token, aligned with the
        arrays): the bytes context_sha256 is computed over."""
        if self.ids is None:
            return memoryview(b"")
        return np.ascontiguousarray(self.ids, dtype="<i4").data.cast("B")

    def prefix_digests(self, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        """SHA-256 of token_ids[:c] of row r for each pair (sorted by (r, c)), one 32-byte row each.

        Digests are kept for the batch: M105 (engine context) and M107 (template render) ask for
        mostly the same prefixes. Only the pairs not
        hashed before are hashed, found by a sorted-key search."""
        key = r.astype(np.int64) * (1 << 32) + c.astype(np.int64)
        known, got = self.__dict__.get("_digest_cache", (np.empty(0, np.int64), np.empty((0, 32), np.uint8)))
        at = np.searchsorted(known, key)
        hit = at < known.size
        hit[hit] = known[at[hit]] == key[hit]
        miss = np.flatnonzero(~hit)
        if not miss.size:
            return got[at]
        out = np.empty((key.size, 32), np.uint8)
        out[hit] = got[at[hit]]
        out[miss] = fresh = self._digests(r[miss], c[miss])
        keys = np.concatenate([known, key[miss]])
        order = np.argsort(keys, kind="stable")
        self.__dict__["_digest_cache"] = (keys[order], np.concatenate([got, fresh])[order])
        return out

    def _digests(self, r: np.ndarray, c: np.ndarray) -> np.ndarray:
        """One running hash per trajectory, fed segment by segment; the digest at each boundary
        is taken on a copy of the state (all pairs in one call of the native core)."""
        hi = (self.starts[r] + c) * 4
        first = np.ones(r.size, bool)
        first[1:] = r[1:] != r[:-1]
        lo = np.empty_like(hi)
        lo[1:] = hi[:-1]
        lo[first] = self.starts[r[first]] * 4
        return native.prefix_sha256(self.ids_le_bytes, lo, hi, first)

    def first_position(self, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, first token position) for each row where `where` holds somewhere."""
        idx = np.flatnonzero(where)
        rows, first = np.unique(self.row[idx], return_index=True)
        return rows, self.pos[idx[first]]

    def locate(self, where: np.ndarray, with_turn: bool = True) -> pl.DataFrame:
        """One row per trajectory where the per-token condition `where` holds somewhere:
        `_row`, trajectory_id, `n` (how many tokens), `position` and `turn` of the first one
        (turn null when that token carries -1 or another out-of-range value)."""
        rows, pos = self.first_position(where)
        n = np.bincount(self.row[where], minlength=self.batch.n)[rows]
        turn = self.turn[self.starts[rows] + pos].astype(np.int64) if rows.size else np.zeros(0, np.int64)
        if not with_turn:
            turn[:] = -1
        return pl.DataFrame(
            {
                "_row": rows.astype(np.int64),
                "trajectory_id": self.batch.ids.gather(rows),
                "n": n.astype(np.int64),
                "position": pos.astype(np.int64),
                "turn": pl.Series(turn.astype(np.int64)).set(pl.Series(turn < 0), None),
            }
        )

    @cached_property
    def lp_state(self) -> np.ndarray:
        """Per token (int8): 0 no log-prob recorded, 1 valid (finite, <= 0), 2 invalid (NaN, inf, > 0)."""
        return native.lp_states(self.lp, self.lp_present)

    @cached_property
    def stats(self) -> pl.DataFrame:
        """Per-trajectory token counts (`STAT_INPUTS`), from the per-row counts of each token
        category (`native.token_stats`); null on rows whose lists do not line up."""
        cols = native.token_stats(self.n_tok, self.source, self.mask, self.lp, self.lp_present, _STAT_WEIGHTS)
        df = pl.DataFrame({name: cols[i] for i, name in enumerate(_STAT_CATEGORIES)})
        if not self.ok.all():  # counts of rows whose lists do not line up are unknown
            df = df.with_columns(pl.when(pl.Series(self.ok)).then(pl.all()))
        return df

    @cached_property
    def turn_pass(self) -> native.TurnPass:
        """Turn keys, the policy tokens grouped by turn and the per-turn counts and sums, in one
        pass over the tokens (`native.turn_pass`)."""
        b = self.batch
        return native.turn_pass(
            self.n_tok, b.turn_start, b.turn_counts, self.turn, self.source, self.mask, self.lp, self.lp_present
        )

    @property
    def turn_key(self) -> np.ndarray:
        """Per token: index of its turn in `turns` (flattened over the batch), -1 if none."""
        return self.turn_pass.key

    @property
    def policy_by_turn(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(index, count, start): indices of the policy tokens that belong to a turn, grouped
        by turn key in position order; per turn key, how many and where its first one sits."""
        tp = self.turn_pass
        return tp.grouped, tp.n_policy, tp.start

    @cached_property
    def turn_values(self) -> list[pl.Series]:
        """The `TURN_INPUTS` values per turn (flattened over the batch), null on turns of rows
        whose lists do not line up."""
        n_turns = int(self.batch.turn_counts.sum())
        if not self.ok.any() or not n_turns:
            return []
        tp = self.turn_pass
        cols = {
            "rc_n_policy": tp.n_policy,
            "rc_n_trainable": tp.n_trainable,
            "rc_n_lp_valid": tp.n_lp_valid,
            "rc_lp_sum": tp.lp_sum,
        }
        nulls = ~self.ok[self.batch.turn_parent]
        rc = [pl.Series(k, v) for k, v in cols.items()]
        if nulls.any():
            ns = pl.Series(nulls)
            rc = [c.set(ns, None) for c in rc]
        first_null = nulls | (tp.n_policy == 0)
        rc.append(
            pl.Series("rc_first_policy_pos", tp.first).set(pl.Series(first_null), None)
            if first_null.any()
            else pl.Series("rc_first_policy_pos", tp.first)
        )
        return rc


class Batch:
    """A slice of trajectory rows from one source, as read (contract types already applied)."""

    def __init__(
        self,
        table: pa.Table,
        file: str,
        first_row: int,
        schema_problems: list[tuple[str, str]] | None = None,
        turn_frame_fields: frozenset[str] | None = None,
        sources: list[tuple[str, int, int]] | None = None,
    ) -> None:
        self.table = table
        self.file = file
        self.first_row = first_row
        # several small files in one batch: (file, first row in it, rows) of each, in order
        self.sources = sources if sources and len(sources) > 1 else None
        self.n = table.num_rows
        self.columns = frozenset(table.column_names)
        tt = table.schema.field("turns").type if "turns" in self.columns else None
        self.turn_fields = frozenset(f.name for f in tt.value_type) if tt is not None else frozenset()
        self.schema_problems = schema_problems or []  # (column, problem), reported once per file
        # turn fields converted into the `turns` frame (None: all); the rest stay in Arrow
        self.turn_frame_fields = turn_frame_fields
        self._cols: dict[str, pa.Array] = {}
        self._tokens: dict[frozenset[str], Tokens] = {}
        self._ok: dict[frozenset[str], np.ndarray] = {}

    def has(self, req: str) -> bool:
        if req.startswith("turns."):
            return req[6:] in self.turn_fields
        return req in self.columns

    @property
    def token_lists(self) -> frozenset[str]:
        return frozenset(c for c in TOKEN_LISTS if c in self.columns)

    def col(self, name: str) -> pa.Array:
        """One column as a single Arrow array (chunks combined once, then cached)."""
        a = self._cols.get(name)
        if a is None:
            c = self.table.column(name)
            a = c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
            self._cols[name] = a
        return a

    @cached_property
    def row_file(self) -> pl.Series:
        """The file of each row (a batch of several files), as a categorical."""
        files = pl.Series("file", [f for f, _, _ in self.sources or [(self.file, 0, self.n)]], dtype=pl.Categorical)
        counts = np.array([k for _, _, k in self.sources or [(self.file, 0, self.n)]])
        return files.gather(np.repeat(np.arange(len(counts)), counts))

    @cached_property
    def row_in_file(self) -> np.ndarray:
        """The row of each row in its own file."""
        if self.sources is None:
            return np.arange(self.first_row, self.first_row + self.n, dtype=np.int64)
        starts = np.array([r for _, r, _ in self.sources], dtype=np.int64)
        counts = np.array([k for _, _, k in self.sources], dtype=np.int64)
        within = np.arange(self.n, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
        return np.repeat(starts, counts) + within

    def attribute(self, findings: pl.DataFrame) -> pl.DataFrame:
        """Fill the `file` of a several-file batch's findings from their trajectory id (ids are
        unique within such a batch: the engine only merges files whose ids do not collide)."""
        if self.sources is None:
            return findings
        where = pl.DataFrame([self.ids, self.row_file.cast(pl.String).alias("_file")])
        return (
            findings.join(where, on="trajectory_id", how="left", maintain_order="left")
            .with_columns(pl.coalesce("_file", "file").alias("file"))
            .drop("_file")
        )

    @property
    def where(self) -> str:
        """The file(s) this batch's rows come from, for messages."""
        if self.sources is None:
            return self.file
        return f"{self.sources[0][0]} and {len(self.sources) - 1} other files"

    def release(self) -> None:
        """Drop the data and every cached value (the engine calls this once the batch is done)."""
        self._cols.clear()
        self._tokens.clear()
        self._ok.clear()
        self.__dict__.clear()

    @cached_property
    def ids(self) -> pl.Series:
        if "trajectory_id" in self.columns:
            return pl.Series("trajectory_id", self.col("trajectory_id").cast(pa.large_string()))
        return pl.Series("trajectory_id", [None] * self.n, dtype=pl.String)

    @cached_property
    def scalars(self) -> pl.DataFrame:
        """The scalar columns of each trajectory, with `_row` and trajectory_id."""
        names = [c for c in self.table.column_names if not pa.types.is_list(self.table.schema.field(c).type)]
        names = [c for c in names if c != "trajectory_id"]
        df = pl.DataFrame([self.ids, pl.Series("_row", np.arange(self.n, dtype=np.int64))])
        if names:
            sc = pl.from_arrow(self.table.select(names))
            df = pl.concat([sc.to_frame() if isinstance(sc, pl.Series) else sc, df], how="horizontal")
        return df

    @cached_property
    def lengths(self) -> dict[str, np.ndarray]:
        """Length of each token list per row (-1 where the list is null)."""
        return {c: list_lengths(self.col(c), -1) for c in TOKEN_LISTS if c in self.columns}

    def rows_ok(self, lists: frozenset[str]) -> np.ndarray:
        """Rows whose lists `lists` are all non-null and of one length (computed once per set)."""
        if lists in self._ok:
            return self._ok[lists]
        ok = np.ones(self.n, dtype=bool)
        lens = [self.lengths[c] for c in TOKEN_LISTS if c in lists]
        for ln in lens:
            ok &= ln >= 0
            ok &= ln == lens[0]
        self._ok[lists] = ok
        return ok

    def tokens(self, lists: frozenset[str]) -> Tokens:
        """Token arrays for the lists `lists` (those present): shared with the arrays of all
        lists when the same rows line up, which is the usual case."""
        lists = lists & self.token_lists
        if lists in self._tokens:
            return self._tokens[lists]
        full = self.token_lists
        ok = self.rows_ok(lists)
        if lists != full and np.array_equal(ok, self.rows_ok(full)):
            t = self.tokens(full)
        else:
            t = Tokens(self, lists, ok)
        self._tokens[lists] = t
        return t

    @cached_property
    def turn_counts(self) -> np.ndarray:
        if "turns" not in self.columns:
            return np.zeros(self.n, np.int64)
        return list_lengths(self.col("turns"), 0)

    @cached_property
    def turn_start(self) -> np.ndarray:
        """Per row: the index of its first turn in the turns flattened over the batch."""
        T = self.turn_counts
        base = np.zeros(self.n, np.int64)
        np.cumsum(T[:-1], out=base[1:])
        return base

    @cached_property
    def turn_parent(self) -> np.ndarray:
        """Per turn (flattened over the batch): its batch row."""
        return np.repeat(np.arange(self.n, dtype=np.int64), self.turn_counts)

    @cached_property
    def turn_struct(self) -> pl.DataFrame:
        """One row per turn: `_row`, `_t` (index in the list), trajectory_id and the struct's
        fields (those in `turn_frame_fields`)."""
        if "turns" not in self.columns:
            return pl.DataFrame()
        lst = self.col("turns")
        structs = lst.flatten()
        want = [
            f.name for f in lst.type.value_type if self.turn_frame_fields is None or f.name in self.turn_frame_fields
        ]
        if len(structs):
            tbl = pa.Table.from_struct_array(structs).select(want)
        else:
            tbl = pa.table({f.name: pa.nulls(0, f.type) for f in lst.type.value_type if f.name in want})
        T = self.turn_counts
        parent = self.turn_parent
        local = np.arange(int(T.sum()), dtype=np.int64) - np.repeat(self.turn_start, T)
        # `_row` is sorted by construction: flagged, group_by("_row") takes polars' sorted path
        df = pl.DataFrame([pl.Series("_row", parent).set_sorted(), pl.Series("_t", local), self.ids.gather(parent)])
        if want:
            fields = pl.from_arrow(tbl)
            df = pl.concat([fields.to_frame() if isinstance(fields, pl.Series) else fields, df], how="horizontal")
        return df

    def summary(self, columns: frozenset[str]) -> pl.DataFrame:
        """The per-trajectory frame log checks see: the trajectory columns and derived values
        (`SUMMARY_INPUTS`) in `columns`, with `_row` (row in the file) and `file`."""
        need = list_inputs(columns)
        t = self.tokens(need)
        # counts are known only where every list they are computed from is present and lines up
        known = t.ok if need <= self.token_lists else np.zeros(self.n, bool)
        stats = (
            t.stats if known is t.ok else t.stats.with_columns(pl.lit(None, pl.Int64).alias(c) for c in t.stats.columns)
        )
        base = pl.concat([self.scalars, stats], how="horizontal")
        df = base.select([c for c in base.columns if c in columns or c == "_row"]).with_columns(
            self.row_file if self.sources else pl.lit(self.file, dtype=pl.Categorical).alias("file"),
            pl.Series("ok", known),
            pl.Series("n_turns", self.turn_counts),
        )
        tr = self.turn_struct
        agg = []
        if {"pv_min", "pv_max", "n_versions"} & columns and "policy_version" in tr.columns:
            pv = pl.col("policy_version")
            agg += [
                pv.min().alias("pv_min"),
                pv.max().alias("pv_max"),
                pv.drop_nulls().n_unique().cast(pl.Int64).alias("n_versions"),
            ]
        if agg and len(tr):
            df = df.join(tr.group_by("_row").agg(agg), on="_row", how="left", maintain_order="left")
        for name, func in DERIVED.items():
            if name in columns and (value := func(self, t)) is not None:
                df = df.with_columns(value.alias(name))
        df = df.with_columns(pl.Series("_row", self.row_in_file))
        absent = [c for c in columns if c in SUMMARY_INPUTS and c not in df.columns]  # e.g. a batch without turns
        df = df.with_columns(pl.lit(None, pl.Int64).alias(c) for c in absent)
        # string columns other than the id repeat across the log (tasks, groups, environments):
        # as categoricals the summary of a 333k-trajectory log is ~100 MB smaller
        df = df.with_columns(
            pl.col(c).cast(pl.Categorical) for c, t in df.schema.items() if t == pl.String and c != "trajectory_id"
        )
        return df.select([c for c in df.columns if c in columns or c in ("_row", "file", "trajectory_id")])
