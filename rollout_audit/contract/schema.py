"""The log contract, read from `schemas/rollout_log_v1.json`: the one source of truth.

Arrow schemas, type compatibility rules and the `schema` command's table are all
built from that file, so a collector in another language validates against the same data.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

SCHEMA_VERSION = "1"  # what a writer records when the file uses no column added later
CONTRACT_VERSION = "1.5"  # the newest version of the contract: v1 to v1.4 files are valid v1.5 files
META_VERSION = b"rollout_log.schema_version"
META_KIND = b"rollout_log.kind"
META_NOT_RECORDED = b"rollout_log.not_recorded"  # JSON {column: why the producer's framework lacks it}
META_TOKENIZER = b"rollout_log.tokenizer"  # JSON {"name": ..., "vocabulary": [...]}: how to decode token_ids
META_REWARD_COMPONENTS = b"rollout_log.reward_components"  # JSON {component: how it is paid (PAYMENTS)}
# How a reward component is paid, as its producer declares it. R408 checks the ones paid at most once.
PAYMENTS = ("first_visit", "terminal", "per_step")
# the versions that identify what an episode ran against (E801), and with the reset seed, what a
# trainer's dump seldom records: each one a `--context KEY=VALUE` of every adapter
VERSIONS = ("environment_version", "verifier_version")
IDENTITY = (*VERSIONS, "reset_seed")
PAID_ONCE = ("first_visit", "terminal")

# the per-token lists of a trajectory, aligned one entry per token
TOKEN_LISTS = ("token_ids", "token_source", "loss_mask", "behavior_logprobs", "token_turn")
POLICY = 2  # token_source value of a token sampled by the behaviour policy
SOURCE_NAMES = {0: "system", 1: "user", 2: "policy", 3: "observation", 4: "template"}


@dataclass(frozen=True)
class Column:
    """One column (or struct field) of the contract."""

    name: str
    type: str
    requirement: str  # R, C or O
    meaning: str
    since: str = "1"  # contract version that added the column
    domain: tuple[tuple[str, Any], ...] = ()  # value domain: ("ge"|"gt"|"le", bound), ("finite", True)

    @property
    def bounds(self) -> dict[str, Any]:
        return dict(self.domain)

    @property
    def arrow_type(self) -> pa.DataType:
        return parse_type(self.type)


def _contract_path() -> Path:
    here = Path(__file__).resolve().parent.parent
    for cand in (here / "schemas", here.parent / "schemas"):
        p = cand / "rollout_log_v1.json"
        if p.exists():
            return p
    raise FileNotFoundError("rollout_log_v1.json not found next to the package")


@cache
def contract() -> dict:
    """The raw contract document."""
    return json.loads(_contract_path().read_text())


# the episode's stop flags (exactly one is true), in the contract's order
STOP_FLAGS: tuple[str, ...] = tuple(contract()["stop_reasons"])


@cache  # the contract is read once; every audit asks for its columns many times
def columns(table: str) -> tuple[Column, ...]:
    """Columns of `trajectories`, `turn` (the turn struct) or `updates`."""
    return tuple(Column(**{**c, "domain": tuple(c.get("domain", {}).items())}) for c in contract()["tables"][table])


# per-trajectory counts the audit recomputes (not contract columns), with their value domains:
# n_src_invalid counts token_source values outside the contract's 0..4
RECOMPUTED_DOMAINS: dict[str, dict[str, Any]] = {"n_tokens": {"ge": 0}, "n_src_invalid": {"eq": 0}}


def domains(table: str) -> dict[str, dict[str, Any]]:
    """The value domain of each column (or turn field) of `table` that has one."""
    return {c.name: c.bounds for c in columns(table) if c.domain}


def column(table: str, name: str) -> Column:
    return {c.name: c for c in columns(table)}[name]


def required(table: str) -> tuple[str, ...]:
    return tuple(c.name for c in columns(table) if c.requirement == "R")


_SCALARS = {
    "string": pa.string(),
    "bool": pa.bool_(),
    "uint8": pa.uint8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
}


@cache
def parse_type(t: str) -> pa.DataType:
    """Parse the contract's type notation (`list<int32>`, `map<string,float64>`...)."""
    t = t.replace(" ", "")
    if t == "list<struct>":
        return pa.list_(turn_struct())
    if t.startswith("list<") and t.endswith(">"):
        return pa.list_(parse_type(t[5:-1]))
    if t.startswith("map<") and t.endswith(">"):
        k, v = t[4:-1].split(",", 1)
        return pa.map_(parse_type(k), parse_type(v))
    return _SCALARS[t]


@cache
def turn_struct() -> pa.StructType:
    return pa.struct([pa.field(c.name, c.arrow_type) for c in columns("turn")])


@cache
def arrow_schema(table: str, version: str = SCHEMA_VERSION) -> pa.Schema:
    """The full Arrow schema of `trajectories` or `updates` as of contract `version` (v1 by
    default: a writer of every column states the version it writes), with contract metadata."""
    meta = {META_VERSION: version.encode(), META_KIND: table.encode()}
    cols = [c for c in columns(table) if _vkey(c.since) <= _vkey(version)]
    return pa.schema([pa.field(c.name, c.arrow_type) for c in cols], metadata=meta)


def _vkey(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def newer(a: str, b: str) -> bool:
    """True when contract version `a` is later than `b`."""
    return _vkey(a) > _vkey(b)


def version_for(table: str, names: Iterable[str]) -> str:
    """The contract version a file with these columns needs: the newest `since` among them."""
    have = set(names)
    return max((c.since for c in columns(table) if c.name in have), key=_vkey, default=SCHEMA_VERSION)


def meta_object(meta: Mapping[bytes, bytes] | None, key: bytes) -> dict:
    """The JSON object stored under a file-metadata key; {} when absent, not JSON, or not an object."""
    raw = (meta or {}).get(key)
    if not raw:
        return {}
    try:
        d = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return {}
    return d if isinstance(d, dict) else {}


# Required columns a file's `not_recorded` waives only together (configuration
# `denominator_not_recorded` says both): a log that states its reduction states its denominator too
USER_WAIVED = frozenset({"reduction", "loss_denominator"})


def waivable_names() -> frozenset[str]:
    """The required columns the contract lets a producer leave out (`not_recorded_waivable`)."""
    return frozenset(contract().get("not_recorded_waivable", {}))


def not_recorded(meta: Mapping[bytes, bytes] | None, believed: Collection[str]) -> dict[str, str]:
    """Columns a file declares its framework does not record, with the reason (empty when the
    metadata is absent or not a JSON object of strings: a hostile value is ignored, not trusted).
    The one rule of trust for a file's word on itself: a required column is waived only when it is
    in `believed`, what the user's configuration says the trainer does not record (`Config.waived`)
    or, for a table an adapter built in memory, every waivable column (`waivable_names()`). A
    file on disk never waives a required column on its own word; optional ones it may name freely
    (that only gives the reason a check is not run)."""
    d = meta_object(meta, META_NOT_RECORDED)
    said = {str(k)[:200]: str(v)[:500] for k, v in d.items() if isinstance(k, str) and isinstance(v, str)}
    return {k: v for k, v in said.items() if waivable(k, said, believed)}


def waivable(name: str, declared: Mapping[str, str], believed: Collection[str]) -> bool:
    """A file's `not_recorded` may name `name`: an optional or recommended column, or a required one
    the contract lists in `not_recorded_waivable` that `believed` holds (reduction and
    loss_denominator only together: rLLM records neither; a log that states its reduction states
    its denominator too)."""
    bare = name.removeprefix("updates.")
    if bare not in _required_names():
        return True
    if bare not in waivable_names() or bare not in believed:
        return False
    pair = {"reduction": "loss_denominator", "loss_denominator": "reduction"}.get(bare)
    return pair is None or pair in declared or f"updates.{pair}" in declared


@cache
def _required_names() -> frozenset[str]:
    return frozenset([*required("trajectories"), *required("updates"), *(f"turns.{c}" for c in required("turn"))])


def reward_components(meta: Mapping[bytes, bytes] | None) -> dict[str, str]:
    """A file's declaration of how each reward component is paid ({component: one of PAYMENTS});
    entries that are not strings naming a known payment are ignored, as is a malformed value."""
    raw = (meta or {}).get(META_REWARD_COMPONENTS)
    try:
        d = json.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(d, dict):
        return {}
    return {k[:200]: v for k, v in d.items() if isinstance(k, str) and v in PAYMENTS}


def context_sha256(token_ids: Sequence[int] | np.ndarray, length: int | None = None) -> str:
    """The contract's context hash: hex SHA-256 of the first `length` token ids (all when None)
    as little-endian int32 bytes (`context_sha256`, `template_context_sha256`)."""
    ids = token_ids if length is None else token_ids[:length]
    return hashlib.sha256(np.asarray(ids, dtype="<i4").tobytes()).hexdigest()


def stop_reasons() -> dict[str, str]:
    """stop_reason -> the flag that must be true."""
    return {r: flag for flag, rs in contract()["stop_reasons"].items() for r in rs}


def _kind(t: pa.DataType) -> str:
    if pa.types.is_integer(t):
        return "int"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_null(t):
        return "null"
    return str(t)


def compatible(found: pa.DataType, expected: pa.DataType) -> bool:
    """True when `found` can be read as `expected` without changing meaning.

    Integer widths, float widths, large/view variants and all-null columns are accepted
    (they are cast on read); a float where an int is expected is not.
    """
    if pa.types.is_null(found):
        return True
    if pa.types.is_dictionary(found):  # pandas category, polars Categorical: the values are what counts
        return compatible(found.value_type, expected)
    if pa.types.is_map(expected):
        return (
            pa.types.is_map(found)
            and compatible(found.key_type, expected.key_type)
            and compatible(found.item_type, expected.item_type)
        )
    if pa.types.is_list(expected):
        if not (
            pa.types.is_list(found)
            or pa.types.is_large_list(found)
            or pa.types.is_list_view(found)
            or pa.types.is_large_list_view(found)
            or pa.types.is_fixed_size_list(found)
        ):
            return False
        return compatible(found.value_type, expected.value_type)
    if pa.types.is_struct(expected):
        if not pa.types.is_struct(found):
            return False
        exp = {f.name: f.type for f in expected}
        return all(compatible(f.type, exp[f.name]) for f in found if f.name in exp)
    k = _kind(found)
    e = _kind(expected)
    return k == e or (e == "float" and k == "int")
