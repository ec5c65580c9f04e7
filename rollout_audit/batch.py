"""One slice of trajectory rows, with the flattened token arrays and the per-trajectory and
per-turn aggregates every check shares (computed once, vectorised, on first use)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc

from . import schema as S

TOKEN_LISTS = ("token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn")
_NSRC = 6  # token_source 0..4, and 5 for any out-of-range value
_NLP = 3  # 0 null, 1 valid (finite, <= 0), 2 invalid (NaN, inf, > 0)


def _np(a: pa.Array, fill=None) -> np.ndarray:
    if fill is not None and a.null_count:
        a = a.fill_null(fill)
    return a.to_numpy(zero_copy_only=False)


@dataclass
class Tokens:
    """Flattened token arrays of the well-formed rows of a batch (numpy, one entry per token)."""

    row: np.ndarray  # int32 batch row of each token
    pos: np.ndarray  # int32 position inside its trajectory
    source: np.ndarray  # uint8; 5 stands for an out-of-range value
    mask: np.ndarray  # bool
    lp: np.ndarray  # float32 as recorded (the contract type), NaN where null
    lp_present: np.ndarray  # bool: a value (possibly NaN) was recorded
    turn: np.ndarray  # int32, the token_turn value (-2 where null)
    starts: np.ndarray  # per batch row: offset of its first token in these arrays
    ids: np.ndarray | None  # int32 token ids (the contract type), when token_ids was read

    @cached_property
    def policy(self) -> np.ndarray:
        return self.source == S.POLICY


class Batch:
    """A slice of trajectory rows from one file, as read (contract types already applied)."""

    def __init__(
        self,
        table: pa.Table,
        file: str,
        first_row: int,
        turn_fields: tuple[str, ...],
        schema_problems: list[tuple[str, str]] | None = None,
        turn_frame_fields: frozenset[str] | None = None,
    ) -> None:
        self.table = table
        self.file = file
        self.first_row = first_row
        self.n = table.num_rows
        self.columns = frozenset(table.column_names)
        self.turn_fields = frozenset(turn_fields)
        self.schema_problems = schema_problems or []  # (column, problem), reported once per file
        # turn fields converted into the `turns` frame (None: all); the rest stay in Arrow
        self.turn_frame_fields = turn_frame_fields
        self._cols: dict[str, pa.Array] = {}

    def has(self, req: str) -> bool:
        if req.startswith("turns."):
            return "turns" in self.columns and req[6:] in self.turn_fields
        return req in self.columns

    def col(self, name: str) -> pa.Array:
        """One column as a single Arrow array (chunks combined once, then cached)."""
        a = self._cols.get(name)
        if a is None:
            c = self.table.column(name)
            a = c.chunk(0) if c.num_chunks == 1 else c.combine_chunks()
            self._cols[name] = a
        return a

    def release(self) -> None:
        """Drop the data and every cached aggregate (the engine calls this once the batch is done)."""
        self._cols.clear()
        self.__dict__.clear()

    # ---------------------------------------------------------------- identity

    @cached_property
    def ids(self) -> pl.Series:
        if "trajectory_id" in self.columns:
            return pl.Series("trajectory_id", self.col("trajectory_id").cast(pa.large_string()))
        return pl.Series("trajectory_id", [None] * self.n, dtype=pl.String)

    @cached_property
    def traj(self) -> pl.DataFrame:
        """Scalar columns of each trajectory plus `_row` and the token aggregates `n_*`."""
        scalars = [
            c
            for c in self.table.column_names
            if not pa.types.is_list(self.table.schema.field(c).type) and c != "trajectory_id"
        ]
        df = pl.from_arrow(self.table.select(scalars)) if scalars else pl.DataFrame()
        if isinstance(df, pl.Series):
            df = df.to_frame()
        df = df.with_columns(self.ids, pl.Series("_row", np.arange(self.n, dtype=np.int64)))
        return pl.concat([df, self.stats], how="horizontal")

    # ---------------------------------------------------------------- token lists

    @cached_property
    def lengths(self) -> dict[str, np.ndarray]:
        """Length of each token list per row (-1 where the list is null)."""
        out = {}
        for c in TOKEN_LISTS:
            if c in self.columns:
                out[c] = _np(pc.list_value_length(self.col(c)), -1).astype(np.int64)
        return out

    @cached_property
    def ok(self) -> np.ndarray:
        """Rows whose token lists are all present, non-null and of one length."""
        ok = np.ones(self.n, dtype=bool)
        lens = list(self.lengths.values())
        for c in TOKEN_LISTS:
            if c not in self.lengths and c != "token_ids":
                ok[:] = False
        for ln in lens:
            ok &= ln >= 0
            ok &= ln == lens[0]
        return ok

    @cached_property
    def tokens(self) -> Tokens:
        n_tok = np.where(self.ok, self.lengths["token_source"], 0) if self.ok.any() else np.zeros(self.n, np.int64)
        starts = np.zeros(self.n + 1, np.int64)
        np.cumsum(n_tok, out=starts[1:])
        keep = np.flatnonzero(self.ok)
        whole = len(keep) == self.n
        total = int(starts[-1])
        idx_t = np.int32 if total < 2**31 and self.n < 2**31 else np.int64

        def flat(name: str) -> pa.Array:
            a = self.col(name)
            if not whole:
                a = a.take(pa.array(keep))
            return a.flatten()

        row = np.repeat(np.arange(self.n, dtype=idx_t), n_tok)
        pos = np.arange(total, dtype=idx_t)
        pos -= np.repeat(starts[:-1].astype(idx_t), n_tok)
        src = _np(flat("token_source"), 255)
        if (src > 4).any():
            src = np.where(src > 4, 5, src)
        src = src.astype(np.uint8, copy=False)
        lp_arr = flat("behavior_logprobs")
        # float arrays convert with NaN where null; float32 is the contract type and every use
        # (validity, comparisons, sums in float64) gives the same result as a float64 copy
        lp = lp_arr.to_numpy(zero_copy_only=False) if len(lp_arr) else np.zeros(0, np.float32)
        if lp.dtype != np.float32 and lp.dtype != np.float64:
            lp = lp.astype(np.float64)
        present = _np(lp_arr.is_valid()) if lp_arr.null_count else np.ones(len(lp_arr), bool)
        ids = _np(flat("token_ids"), -1).astype(np.int32, copy=False) if "token_ids" in self.columns else None
        return Tokens(
            row=row,
            pos=pos,
            source=src,
            mask=_np(flat("loss_mask"), False).astype(bool, copy=False),
            lp=lp,
            lp_present=present,
            turn=_np(flat("token_turn"), -2).astype(np.int32, copy=False),
            starts=starts[:-1],
            ids=ids,
        )

    @cached_property
    def ids_le_bytes(self) -> memoryview:
        """token_ids of the well-formed rows as one byte buffer of little-endian int32 (4 bytes
        per token, aligned with `tokens`): the bytes context_sha256 is computed over."""
        ids = self.tokens.ids
        if ids is None:
            return memoryview(b"")
        return memoryview(np.ascontiguousarray(ids, dtype="<i4")).cast("B")

    def first_position(self, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, first token position) for each row where `where` holds somewhere."""
        idx = np.flatnonzero(where)
        rows, first = np.unique(self.tokens.row[idx], return_index=True)
        return rows, self.tokens.pos[idx[first]]

    def locate(self, where: np.ndarray) -> pl.DataFrame:
        """One row per trajectory where the per-token condition `where` holds somewhere:
        `_row`, trajectory_id, `n` (how many tokens), `position` and `turn` of the first one
        (turn null when that token carries -1 or another out-of-range value)."""
        t = self.tokens
        rows, pos = self.first_position(where)
        n = np.bincount(t.row[where], minlength=self.n)[rows]
        turn = t.turn[t.starts[rows] + pos].astype(np.int64) if rows.size else np.zeros(0, np.int64)
        return pl.DataFrame(
            {
                "_row": rows.astype(np.int64),
                "trajectory_id": self.ids.gather(rows),
                "n": n.astype(np.int64),
                "position": pos.astype(np.int64),
                "turn": pl.Series(turn.astype(np.int64)).set(pl.Series(turn < 0), None),
            }
        )

    @cached_property
    def lp_state(self) -> np.ndarray:
        """Per token (int8): 0 no log-prob recorded, 1 valid (finite, <= 0), 2 invalid (NaN, inf, > 0)."""
        t = self.tokens
        state = ~np.isfinite(t.lp)
        state |= t.lp > 0
        state = state.view(np.int8) + np.int8(1)
        if not t.lp_present.all():
            state *= t.lp_present
        return state

    @cached_property
    def stats(self) -> pl.DataFrame:
        """Per-trajectory token counts, from one bincount over a combined category code."""
        cols = {}
        if not self.ok.any():
            counts = np.zeros((self.n, _NSRC, 2, _NLP), np.int64)
        else:
            t = self.tokens
            per = _NSRC * 2 * _NLP
            code = np.multiply(t.row, per, dtype=np.intp)  # bincount wants intp: no hidden copy
            code += t.source * np.uint8(2 * _NLP)
            code += t.mask.view(np.uint8) * np.uint8(_NLP)
            code += self.lp_state
            counts = np.bincount(code, minlength=self.n * per).reshape(self.n, _NSRC, 2, _NLP)
            del code
        cols["n_tokens"] = counts.sum(axis=(1, 2, 3))
        cols["n_trainable"] = counts[:, :, 1, :].sum(axis=(1, 2))
        cols["n_policy"] = counts[:, S.POLICY].sum(axis=(1, 2))
        for s in (0, 1, 3, 4, 5):
            cols[f"n_trainable_src{s}"] = counts[:, s, 1, :].sum(axis=1)
        cols["n_policy_unmasked"] = counts[:, S.POLICY, 0, :].sum(axis=1)
        cols["n_trainable_bad_lp"] = counts[:, :, 1, 0].sum(axis=1) + counts[:, :, 1, 2].sum(axis=1)
        cols["n_lp_nonpolicy"] = counts[:, :, :, 1:].sum(axis=(2, 3)).sum(axis=1) - counts[:, S.POLICY, :, 1:].sum(
            axis=(1, 2)
        )
        for s in (0, 1, 3, 4, 5):
            cols[f"n_lp_src{s}"] = counts[:, s, :, 1:].sum(axis=(1, 2))
        cols["n_src_invalid"] = counts[:, 5].sum(axis=(1, 2))
        df = pl.DataFrame({k: v.astype(np.int64, copy=False) for k, v in cols.items()})
        if not self.ok.all():  # counts of malformed rows are unknown
            df = df.with_columns(pl.when(pl.Series(self.ok)).then(pl.all()))
        return df

    def any_count(self, *names: str) -> bool:
        """True when one of the per-trajectory count columns `names` of `stats` is non-zero
        somewhere: a cheap test before a check scans the token arrays."""
        st = self.stats
        return any(bool(st[c].sum()) for c in names)

    # ---------------------------------------------------------------- turns

    @cached_property
    def turn_counts(self) -> np.ndarray:
        if "turns" not in self.columns:
            return np.zeros(self.n, np.int64)
        return _np(pc.list_value_length(self.col("turns")), 0).astype(np.int64)

    @cached_property
    def turn_key(self) -> np.ndarray:
        """Per token: index of its turn in `turns` (flattened over the batch), -1 if none."""
        t = self.tokens
        T = self.turn_counts
        n_tok = np.diff(np.append(t.starts, t.row.size))
        dt = np.int32 if int(T.sum()) < 2**31 else np.int64
        base = np.zeros(self.n, dt)
        np.cumsum(T[:-1], out=base[1:])
        key = np.repeat(base, n_tok)
        key += t.turn
        bad = t.turn < 0
        bad |= t.turn >= np.repeat(T.astype(dt), n_tok)
        key[bad] = -1
        return key

    @cached_property
    def policy_by_turn(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(index, count, start): indices into `tokens` of the policy tokens that belong to a
        turn, grouped by turn key in position order; per turn key, how many there are and
        where its first one sits in `index`."""
        key = self.turn_key
        index = np.flatnonzero(self.tokens.policy & (key >= 0))
        kp = key[index]
        if kp.size > 1 and (np.diff(kp) < 0).any():  # token_turn not in turn order: group stably
            order = np.argsort(kp, kind="stable")
            index, kp = index[order], kp[order]
        count = np.bincount(kp, minlength=int(self.turn_counts.sum()))
        start = np.concatenate([[0], np.cumsum(count)])[:-1]
        return index, count, start

    @cached_property
    def turn_parent(self) -> np.ndarray:
        """Per turn (flattened over the batch): its batch row."""
        T = self.turn_counts
        return np.repeat(np.arange(self.n, dtype=np.int64), T)

    @cached_property
    def turns(self) -> pl.DataFrame:
        """One row per turn: `_row`, `_t` (index in the list), trajectory_id, the struct's
        fields (those in `turn_frame_fields`), and recomputed `rc_*` values from the tokens
        of that turn."""
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
            tbl = pa.table({f.name: pa.array([], f.type) for f in lst.type.value_type if f.name in want})
        df = pl.from_arrow(tbl) if want else pl.DataFrame()
        if isinstance(df, pl.Series):
            df = df.to_frame()
        T = self.turn_counts
        n_turns = int(T.sum())
        parent = self.turn_parent
        base = np.zeros(self.n, np.int64)
        np.cumsum(T[:-1], out=base[1:])
        local = np.arange(n_turns, dtype=np.int64) - np.repeat(base, T)
        df = df.with_columns(pl.Series("_row", parent), pl.Series("_t", local), self.ids.gather(parent))
        if self.ok.any() and n_turns:
            t = self.tokens
            key = self.turn_key
            index, count, start = self.policy_by_turn
            good = index[self.lp_state[index] == 1]
            kg = key[good]
            first = np.full(n_turns, -1, np.int64)
            has = count > 0
            first[has] = t.pos[index[start[has]]]
            km = key[t.mask]
            km = km[km >= 0]
            cols = {
                "rc_n_policy": count,
                "rc_n_trainable": np.bincount(km, minlength=n_turns),
                "rc_n_lp_valid": np.bincount(kg, minlength=n_turns),
                "rc_lp_sum": np.bincount(kg, weights=t.lp[good], minlength=n_turns),
            }
            okrow = self.ok[parent]
            nulls = ~okrow
            first_null = nulls | ~has
            rc = [pl.Series(k, v) for k, v in cols.items()]
            if nulls.any():
                ns = pl.Series(nulls)
                rc = [c.set(ns, None) for c in rc]
            rc.append(
                pl.Series("rc_first_policy_pos", first).set(pl.Series(first_null), None)
                if first_null.any()
                else pl.Series("rc_first_policy_pos", first)
            )
            df = df.with_columns(rc)
        return df

    # ---------------------------------------------------------------- summary for log checks

    def summary(self, columns: frozenset[str] | None = None) -> pl.DataFrame:
        """The per-trajectory frame log-level checks see (scalars, counts, versions), restricted
        to `columns` when given (the engine passes what the selected log checks read)."""
        base = self.traj
        df = base.select([c for c in base.columns if columns is None or c in columns or c == "_row"]).with_columns(
            pl.lit(self.file, dtype=pl.Categorical).alias("file"),
            (pl.col("_row") + self.first_row).alias("_row"),
            pl.Series("ok", self.ok),
            pl.Series("n_turns", self.turn_counts),
        )
        per_turn = ("pv_min", "pv_max", "n_versions", "n_turns_trainable")
        if columns is None or any(c in columns for c in per_turn):
            tr = self.turns
            if len(tr) and "policy_version" in tr.columns:
                agg = [
                    pl.col("policy_version").min().alias("pv_min"),
                    pl.col("policy_version").max().alias("pv_max"),
                    pl.col("policy_version").drop_nulls().n_unique().cast(pl.Int64).alias("n_versions"),
                ]
                if "rc_n_trainable" in tr.columns:
                    agg.append((pl.col("rc_n_trainable") > 0).sum().cast(pl.Int64).alias("n_turns_trainable"))
                per = tr.group_by("_row").agg(agg).with_columns((pl.col("_row") + self.first_row).alias("_row"))
                df = df.join(per, on="_row", how="left", maintain_order="left")
        if columns is not None:
            df = df.select([c for c in df.columns if c in columns])
        return df
