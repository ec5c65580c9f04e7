"""What every adapter shares: reading a dump (JSON Lines or Parquet), required-field access that
names what is missing, and turning a framework's placeholders into nulls."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..contract.errors import AdapterError

_MISSING = object()


def need(record: Mapping[str, Any], field: str, where: str) -> Any:
    """`record[field]`, or AdapterError naming the field and the record (`where`)."""
    value = record.get(field, _MISSING) if isinstance(record, Mapping) else _MISSING
    if value is _MISSING:
        raise AdapterError(f"{where}: missing field {field!r}")
    return value


def nulls_where(values: Sequence[float] | None, keep: Sequence[Any]) -> list[float | None] | None:
    """`values` with None wherever `keep` is falsy: a framework's placeholder (0.0 on tokens the
    policy did not sample) is not a recorded log-prob. None stays None."""
    if values is None:
        return None
    if len(values) != len(keep):
        raise AdapterError(f"{len(values)} values against a mask of {len(keep)}")
    return [float(v) if k else None for v, k in zip(values, keep)]


class Record(dict):
    """One record of a dump, and where it came from: `origin` is "FILE:LINE" (JSON Lines) or
    "FILE:ROW" (Parquet, 1-based), so a finding on its trajectory can name it."""

    origin: str | None = None


def located(record: dict[str, Any], origin: str | None) -> Record:
    """`record` as a Record from `origin`."""
    out = Record(record)
    out.origin = origin
    return out


def origin(record: Mapping[str, Any]) -> dict[str, Any]:
    """The `_origin` entry a contract row carries from the dump record it was built from (none for a plain dict)."""
    where = getattr(record, "origin", None)
    return {ORIGIN: where} if where else {}


ORIGIN = "_origin"  # a row's dump record; `contract_table` moves it to the table's metadata
META_ORIGINS = b"rollout_audit.origins"  # JSON list: the dump record of each trajectory row


def read_records(path: str | os.PathLike) -> Iterator[Record]:
    """Records from a dump file: JSON Lines (`.jsonl`, `.json` with one object per line) or Parquet."""
    p = Path(path)
    if p.suffix == ".parquet":
        n = 0
        for batch in pq.ParquetFile(p).iter_batches():
            for rec in batch.to_pylist():
                n += 1
                yield located(rec, f"{p}:{n}")
        return
    with p.open(encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise AdapterError(f"{p.name}:{n}: not a JSON object ({e.msg})") from None
            if not isinstance(rec, dict):
                raise AdapterError(f"{p.name}:{n}: a record must be a JSON object, not {type(rec).__name__}")
            yield located(rec, f"{p}:{n}")


def read_dump(path: str | os.PathLike) -> list[Record]:
    """Every record of a dump file or of the dump files (`*.jsonl`, `*.parquet`) in a directory, in name order."""
    p = Path(path)
    files = sorted(x for x in p.iterdir() if x.suffix in (".jsonl", ".json", ".parquet")) if p.is_dir() else [p]
    if not files:
        raise AdapterError(f"{p}: no *.jsonl or *.parquet dump files")
    return [r for f in files for r in read_records(f)]


# ---------------------------------------------------------------- shared by the verl, SkyRL and slime adapters

# Context a trainer does not record, from keyword arguments (CLI `--context KEY=VALUE`): name -> type.
CONTEXT: dict[str, type] = {
    "environment_id": str,
    "environment_version": str,
    "verifier_version": str,
    "reset_seed": int,
    "tokenizer_id": str,
    "temperature": float,
    "top_p": float,
}
TURN_CONTEXT = ("temperature", "top_p")  # context that belongs on every turn


def context_values(context: Mapping[str, Any], allowed: Sequence[str] | Mapping[str, type] = ()) -> dict[str, Any]:
    """The keyword context in the contract's types; AdapterError for an unknown key or a bad value.
    `allowed` names an adapter's own extra keys: kept as strings, or {key: type} to convert them."""
    extra = dict(allowed) if isinstance(allowed, Mapping) else dict.fromkeys(allowed, str)
    out: dict[str, Any] = {}
    for key, value in context.items():
        kind = CONTEXT.get(key, extra.get(key))
        if kind is None:
            raise AdapterError(f"unknown context {key!r}; known: {', '.join([*CONTEXT, *extra])}")
        try:
            if kind is int and isinstance(value, float) and not value.is_integer():
                raise ValueError(value)
            out[key] = kind(value)
        except (TypeError, ValueError):
            raise AdapterError(f"context {key}={value!r} is not {kind.__name__}") from None
    return out


def runs(mask: Sequence[Any]) -> list[tuple[int, int]]:
    """[start, end) of every maximal run of truthy values: the turns of a framework whose only
    turn marker is its loss mask."""
    out: list[tuple[int, int]] = []
    start = None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i))
            start = None
    if start is not None:
        out.append((start, len(mask)))
    return out


def turn_of(n: int, starts: Sequence[int]) -> list[int]:
    """token_turn for `n` tokens whose turns begin at `starts` (increasing): -1 before the first
    turn, then the last turn that began at or before the position."""
    out, t = [], -1
    nxt = iter([*starts, n + 1])
    edge = next(nxt)
    for i in range(n):
        while i >= edge:
            t += 1
            edge = next(nxt)
        out.append(t)
    return out


def contract_table(rows: Sequence[Mapping[str, Any]], lacks: Mapping[str, str], framework: str = "") -> pa.Table:
    """Contract 1.1 trajectories from rows, naming in the file metadata (`rollout_log.not_recorded`)
    every column or turn field of `lacks` the rows do not have, with the framework's reason."""
    from ..contract import schema as S
    from ..reading.records import records_to_table

    if not rows:
        raise AdapterError(f"{framework + ': ' if framework else ''}no trajectories in the records")
    origins = [r.get(ORIGIN) for r in rows]
    mapped: list[Mapping] = [{k: v for k, v in r.items() if k != ORIGIN} if ORIGIN in r else r for r in rows]
    table = records_to_table(mapped)
    have = set(table.column_names)
    turn_fields = {f.name for f in table.schema.field("turns").type.value_type} if "turns" in have else set()
    absent = {k: v for k, v in lacks.items() if (k[6:] not in turn_fields if k.startswith("turns.") else k not in have)}
    meta = dict(table.schema.metadata or {})
    meta[S.META_VERSION] = S.CONTRACT_VERSION.encode()
    meta[S.META_NOT_RECORDED] = json.dumps(absent, sort_keys=True).encode()
    if any(origins):
        meta[META_ORIGINS] = json.dumps(origins).encode()
    return table.replace_schema_metadata(meta)


def with_context(row: dict[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """`row` with the keyword context: decoding parameters on every turn, the rest as columns."""
    for key, value in context.items():
        if key in TURN_CONTEXT:
            for turn in row["turns"]:
                turn[key] = value
        elif key in CONTEXT:
            row[key] = value
    return row


def context_lacks(framework: str) -> dict[str, str]:
    """Why each context column may be absent: the framework does not record it, and how to pass it."""
    what = {
        "environment_id": "the environment identity",
        "environment_version": "the environment version",
        "verifier_version": "the verifier (reward function) version",
        "reset_seed": "a reset seed",
        "tokenizer_id": "the tokenizer and chat template identity",
        "temperature": "the sampling temperature in its records",
        "top_p": "top_p in its records",
    }
    return {
        (f"turns.{k}" if k in TURN_CONTEXT else k): f"{framework} does not record {v}; pass --context {k}=..."
        for k, v in what.items()
    }


def aligned(record: Mapping[str, Any], field: str, like: Sequence[Any], where: str) -> list[Any]:
    """`record[field]` as a list of the same length as `like` (one value per response token)."""
    values = need(record, field, where)
    if not isinstance(values, (list, tuple)):
        raise AdapterError(f"{where}: {field} must be a list")
    if len(values) != len(like):
        raise AdapterError(f"{where}: {len(values)} {field} for {len(like)} response tokens")
    return list(values)


def reward_lacks(framework: str) -> dict[str, str]:
    """Why the per-turn reward fields are absent: the framework records one reward per sample."""
    why = f"{framework} records one reward per sample: no per-turn rewards, components, shaping, potentials or values"
    fields = ("reward", "reward_components", "shaping", "potential_before", "potential_after", "value", "td_residual")
    return {**{f"turns.{f}": why for f in fields}, "final_value": why, "discounted_return": why}


def logprobs_column(n_prompt: int, values: Sequence[float], sampled: Sequence[bool]) -> list[float | None]:
    """behavior_logprobs: null over the prompt and wherever the policy did not sample the token
    (the frameworks' 0.0 placeholder on observation tokens is not a log-prob)."""
    return [None] * n_prompt + [float(v) if k else None for v, k in zip(values, sampled)]


def lacks(framework: str) -> dict[str, str]:
    """What none of these trainers records, with the reason: the context (`context_lacks`), per-turn
    rewards (`reward_lacks`), per-turn and per-sample counts, verifier verdicts, state, parsed actions."""
    return {
        **context_lacks(framework),
        **reward_lacks(framework),
        "turns.logprob": f"{framework} records no per-turn log-prob",
        "turns.num_policy_tokens": f"{framework} does not count policy tokens per turn",
        "num_trainable_tokens": f"{framework} does not record a trainable-token count per sample",
        "verifier_success": f"{framework} records a reward, not a verifier verdict",
        "initial_state_checksum": f"{framework} does not record environment state",
        "turns.parsed_action": f"{framework} does not record parsed actions",
        "turns.template_context_length": f"{framework} does not record the chat template's render of each turn's context",
        "turns.template_context_sha256": f"{framework} does not record the chat template's render of each turn's context",
        **loss_evidence_lacks(framework),
    }


def loss_evidence_lacks(framework: str) -> dict[str, str]:
    """Why the contract 1.2 per-token loss evidence is absent from a rollout dump: the trainer builds
    token rewards, KL and returns after the rollout, from the sample's one reward."""
    why = f"{framework}'s rollout dump holds one reward per sample; its trainer builds the token-level {{}} later"
    return {
        "token_reward": why.format("rewards"),
        "token_kl": why.format("KL penalty"),
        "token_returns": why.format("returns"),
    }


def token_columns(
    prompt: Sequence[int], response: Sequence[int], sampled: Sequence[bool], mask: Sequence[bool], starts: Sequence[int]
) -> dict[str, list[Any]]:
    """The token lists of a prompt-then-response sample: the prompt is user input (1; these
    trainers do not tell system from user), response tokens are policy (2) where `sampled`, else
    observation (3; tool and template are not told apart); turns begin at `starts` in the response."""
    n = len(prompt)
    return {
        "token_ids": [*prompt, *response],
        "token_source": [1] * n + [2 if s else 3 for s in sampled],
        "loss_mask": [False] * n + [bool(m) for m in mask],
        "token_turn": [-1] * n + turn_of(len(response), starts),
    }


def ints(record: Mapping[str, Any], field: str, where: str) -> list[int]:
    """`record[field]` as a list of integers, or AdapterError naming the field."""
    values = need(record, field, where)
    try:
        if isinstance(values, (str, bytes, Mapping)):
            raise TypeError
        return [int(v) for v in values]
    except (TypeError, ValueError):
        raise AdapterError(f"{where}: {field} must be a list of integers") from None


def integer(record: Mapping[str, Any], field: str, where: str) -> int:
    """`record[field]` as an integer, or AdapterError naming the field."""
    value = need(record, field, where)
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise AdapterError(f"{where}: {field} must be an integer")
    try:
        return int(value)
    except ValueError:
        raise AdapterError(f"{where}: {field} must be an integer") from None


def rows_of(records: Iterable[Mapping[str, Any]], row: Callable[..., dict[str, Any]], ctx: Mapping[str, Any]) -> list:
    """`row(record, n, ctx)` for every record; a record of the wrong shape the adapter did not
    foresee is still an AdapterError naming the record, never a crash."""
    out = []
    for n, rec in enumerate(records, 1):
        try:
            out.append({**row(rec, n, ctx), **origin(rec)})
        except AdapterError:
            raise
        except (TypeError, ValueError, KeyError, AttributeError) as e:
            raise AdapterError(f"record {n}: a field has the wrong shape ({type(e).__name__}: {e})") from None
    return out
