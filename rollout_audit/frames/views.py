"""What one check sees: a view of a batch (or of the log summary) and of the configuration
that holds only the inputs the check declared.

Every check runs through these views, in the audit and in tests alike, so a check that
reads an undeclared column, token list, turn field, update column or configuration key
fails (`UndeclaredInput`) instead of silently seeing nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from ..contract.config import Config
from ..contract.registry import Rule, UndeclaredInput
from .batch import STAT_INPUTS, TOKEN_LISTS, TURN_INPUTS, Batch, Tokens

# Token array attributes and the list each one exposes
_TOKEN_FIELDS = {
    "source": "token_source",
    "policy": "token_source",
    "policy_index": "token_source",
    "mask": "loss_mask",
    "lp": "behavior_logprobs",
    "lp_present": "behavior_logprobs",
    "lp_state": "behavior_logprobs",
    "turn": "token_turn",
    "ids": "token_ids",
    "ids_le_bytes": "token_ids",
    "prefix_digests": "token_ids",
}


def frame_of(cols: dict[str, pl.Series]) -> pl.DataFrame:
    """A frame of existing columns (a later one of a name replaces an earlier one), without a
    polars query: views are built for every check of every batch, and a `select` or
    `with_columns` costs several times more than putting the columns side by side."""
    return pl.DataFrame(list(cols.values()))


def _undeclared(rule: Rule, what: str) -> UndeclaredInput:
    return UndeclaredInput(f"{rule.code} reads {what} without declaring it (add it to requires or optional)")


class TokenView:
    """The flattened token arrays of a batch, limited to the lists the check declared."""

    def __init__(self, tokens: Tokens, lists: frozenset[str], rule: Rule) -> None:
        self._t = tokens
        self._lists = lists
        self._rule = rule

    def __getattr__(self, name: str) -> Any:
        need = _TOKEN_FIELDS.get(name)
        if need is not None and need not in self._lists:
            raise _undeclared(self._rule, need)
        if name == "turn_key" and "token_turn" not in self._lists:
            raise _undeclared(self._rule, "token_turn")
        if name == "policy_by_turn" and not {"token_source", "token_turn"} <= self._lists:
            raise _undeclared(self._rule, "token_source and token_turn")
        if name == "stats":
            raise AttributeError("per-trajectory counts are columns of `traj`")
        return getattr(self._t, name)


@dataclass
class BatchView:
    """One batch as a check sees it: declared columns, turn fields and token lists only."""

    batch: Batch
    rule: Rule
    lists: frozenset[str] = field(init=False)
    fields: frozenset[str] = field(init=False)
    cols: frozenset[str] = field(init=False)
    used_tokens: bool = field(init=False, default=False)  # the check saw only the rows whose lists line up

    def __post_init__(self) -> None:
        reads = set(self.rule.reads)
        self.fields = frozenset(q[6:] for q in reads if q.startswith("turns."))
        self.cols = frozenset(q for q in reads if "." not in q) | ({"turns"} if self.fields else set())
        self.lists = frozenset(c for c in self.cols if c in TOKEN_LISTS) & self.batch.token_lists

    # ------------------------------------------------------------ identity
    @property
    def n(self) -> int:
        return self.batch.n

    @property
    def file(self) -> str:
        return self.batch.file

    @property
    def ids(self) -> pl.Series:
        return self.batch.ids

    @property
    def schema_problems(self) -> list[tuple[str, str]]:
        return self.batch.schema_problems

    @property
    def columns(self) -> frozenset[str]:
        return self.batch.columns & self.cols

    def has(self, req: str) -> bool:
        return self.batch.has(req)

    def col(self, name: str) -> pa.Array:
        if name not in self.cols:
            raise _undeclared(self.rule, name)
        return self.batch.col(name)

    # ------------------------------------------------------------ tokens
    def _tok(self) -> Tokens:
        if not self.lists:
            raise _undeclared(self.rule, "a token list")
        self.used_tokens = True
        return self.batch.tokens(self.lists)

    @property
    def tokens(self) -> TokenView:
        return TokenView(self._tok(), self.lists, self.rule)

    @property
    def ok(self) -> np.ndarray:
        """Rows whose declared token lists are present, non-null and of one length."""
        return self._tok().ok

    @property
    def lengths(self) -> dict[str, np.ndarray]:
        return {c: v for c, v in self.batch.lengths.items() if c in self.lists}

    def locate(self, where: np.ndarray) -> pl.DataFrame:
        return self._tok().locate(where, with_turn="token_turn" in self.lists)

    def first_position(self, where: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return self._tok().first_position(where)

    @property
    def lp_state(self) -> np.ndarray:
        return self.tokens.lp_state

    @property
    def turn_key(self) -> np.ndarray:
        return self.tokens.turn_key

    @property
    def policy_by_turn(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return self.tokens.policy_by_turn

    @property
    def ids_le_bytes(self) -> memoryview:
        return self.tokens.ids_le_bytes

    def _derived(self, table: dict[str, tuple[str, ...]]) -> list[str]:
        return [k for k, need in table.items() if set(need) <= self.lists]

    def any_count(self, *names: str) -> bool:
        """True when one of the per-trajectory counts `names` is non-zero somewhere."""
        allowed = set(self._derived(STAT_INPUTS))
        bad = [n for n in names if n not in allowed]
        if bad:
            raise _undeclared(self.rule, f"the inputs of {', '.join(bad)}")
        st = self._tok().stats
        return any(bool(st[c].sum()) for c in names)

    def shared(self, name: str, inputs: tuple[str, ...], make: Callable[[], Any]) -> Any:
        """A value several checks of this batch compute alike, made once per batch: `name`, from
        the declared `inputs` (with the name, its key)."""
        missing = [q for q in inputs if q not in self.rule.reads]
        if missing:
            raise _undeclared(self.rule, ", ".join(missing))
        cache = self.batch.__dict__.setdefault("_shared", {})
        if (name, inputs) not in cache:
            cache[(name, inputs)] = make()
        return cache[(name, inputs)]

    # ------------------------------------------------------------ frames
    @cached_property
    def traj(self) -> pl.DataFrame:
        """`_row`, trajectory_id, the declared scalar columns, and the counts `n_*` whose
        token lists were declared (built once per view: checks read it several times)."""
        sc = self.batch.scalars
        cols = {c: sc.get_column(c) for c in sc.columns if c in self.cols or c in ("_row", "trajectory_id")}
        derived = self._derived(STAT_INPUTS)
        if derived:
            st = self._tok().stats
            cols.update((c, st.get_column(c)) for c in derived)
        return frame_of(cols)

    @property
    def turn_counts(self) -> np.ndarray:
        if "turns" not in self.cols:
            raise _undeclared(self.rule, "turns")
        return self.batch.turn_counts

    @property
    def turn_parent(self) -> np.ndarray:
        """Per turn (flattened over the batch, the order of `turns`): its batch row."""
        if "turns" not in self.cols:
            raise _undeclared(self.rule, "turns")
        return self.batch.turn_parent

    @property
    def turn_start(self) -> np.ndarray:
        """Per row: the index in `turns` of its first turn."""
        if "turns" not in self.cols:
            raise _undeclared(self.rule, "turns")
        return self.batch.turn_start

    @cached_property
    def turns(self) -> pl.DataFrame:
        """One row per turn: `_row`, `_t`, trajectory_id, the declared turn fields, and the
        recomputed `rc_*` values whose token lists were declared (built once per view)."""
        if "turns" not in self.cols:
            raise _undeclared(self.rule, "turns")
        ts = self.batch.turn_struct
        if not len(ts.columns):
            return ts
        cols = {c: ts.get_column(c) for c in ts.columns if c in self.fields or c in ("_row", "_t", "trajectory_id")}
        derived = self._derived(TURN_INPUTS)
        if derived and self.lists:
            cols.update((s.name, s) for s in self._tok().turn_values if s.name in derived)
        return frame_of(cols)


@dataclass
class LogView:
    """What log checks share: the per-trajectory summary of the whole log, update records,
    files that could not be read, and where checks put statistics for the JSON summary."""

    traj: pl.DataFrame
    updates: pl.DataFrame | None
    broken: list[tuple[str, str]]
    update_files: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    cache: dict[Any, dict[str, Any]] = field(default_factory=dict)
    part: bool = False  # one partition of the log: a check's statistics may keep what its `merge` needs
    # in-memory trajectory tables by file name (`<memory>`): what a check that reads the log's rows
    # again (a second log-prob column, L207) reads instead of a file
    memory: dict[str, Any] = field(default_factory=dict)

    @property
    def height(self) -> int:
        """Trajectory rows of the log."""
        return self.traj.height

    def has(self, req: str) -> bool:
        if req == "updates":
            return self.updates is not None
        if req.startswith("updates."):
            return self.updates is not None and req[8:] in self.updates.columns
        return req in self.traj.columns


@dataclass
class LogCheckView:
    """The log as one log check sees it: declared summary and update columns only."""

    log: LogView
    rule: Rule

    @property
    def traj(self) -> pl.DataFrame:
        t = self.log.traj
        keep = set(self.rule.reads) | {"trajectory_id", "file", "_row", "_ord"}  # `_ord`: log order, in a partition
        return t.select([c for c in t.columns if c in keep])

    @property
    def updates(self) -> pl.DataFrame | None:
        u = self.log.updates
        if u is None:
            return None
        if not any(q.startswith("updates") for q in self.rule.reads):
            raise _undeclared(self.rule, "updates")
        keep = {q[8:] for q in self.rule.reads if q.startswith("updates.")} | {"file"}
        return u.select([c for c in u.columns if c in keep])

    @property
    def broken(self) -> list[tuple[str, str]]:
        return self.log.broken

    @property
    def update_files(self) -> list[str]:
        return self.log.update_files

    @property
    def stats(self) -> dict[str, Any]:
        return self.log.stats

    @property
    def part(self) -> bool:
        return self.log.part

    @property
    def memory(self) -> dict[str, Any]:
        return self.log.memory

    @property
    def cache(self) -> dict[str, Any]:
        """Frames several log checks share, kept apart per set of declared inputs."""
        return self.log.cache.setdefault(frozenset(self.rule.reads), {})

    def has(self, req: str) -> bool:
        return self.log.has(req)


class ConfigView:
    """The configuration as one check sees it: the keys it declared."""

    def __init__(self, cfg: Config, rule: Rule) -> None:
        self._cfg = cfg
        self._keys = frozenset(rule.config)
        self._rule = rule

    def __getattr__(self, name: str) -> Any:
        if name not in self._keys:
            raise _undeclared(self._rule, f"configuration key {name!r}")
        return getattr(self._cfg, name)
