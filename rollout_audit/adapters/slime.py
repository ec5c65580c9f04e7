"""slime: `Sample.to_dict()` (slime/utils/types.py) to contract tables.

One record per sample, written by the dump hook (docs/frameworks/slime.md) with slime's own field
names: `index`, `group_index`, `tokens` (prompt then response), `response_length`, `loss_mask` and
`rollout_log_probs` over the response, `reward`, `status`, `weight_versions` (one per engine call).

Provenance comes from `loss_mask` (slime appends engine output with 1 and tool output with 0), so
M101/M102 hold by construction; the turns are the runs of mask 1. `weight_versions` has one entry
per engine call, and under `--partial-rollout` an aborted sample is resumed by another call, so a
turn may own several: turn t's policy version is the version of its first call (the oldest weights
that sampled any of it), which the list fixes for turn 0 always, for every turn when there is one
call per turn or one version in all, and for turn t otherwise when calls t .. t+extra agree; a
turn the list cannot place is null (P501 names it). With `--mask-offpolicy-in-partial-rollout`
(context `mask_offpolicy_in_partial_rollout=true`) the resumed sample's first calls are masked out:
that leading run of mask 0 was still sampled by the policy (source 2, outside the loss).

`remove_sample` (set by `--rollout-sample-filter-path` before the dump) is applied by slime after
the dump point (`loss_mask` all 0, slime/ray/rollout.py:680-681) while the sample stays in reward
normalisation: the adapter writes its loss mask all false, keeping the provenance the dump shows.

`rollout_id` (Sample.rollout_id; None gets a fresh id) groups the samples whose summed loss slime
divides by one denominator, `rollout_mask_sums` (rollout.py:647-700). `updates` reads the train
data record the second hook writes (`sample_indices`, `rollout_ids`, `rollout_mask_sums`) and
writes one token-reduced update per rollout id, so U601 recomputes the denominator.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract import schema as S
from ..contract.schema import STOP_FLAGS
from ..reading.records import records_to_table
from .base import (
    AdapterError,
    aligned,
    context_values,
    contract_table,
    flags,
    integer,
    ints,
    lacks,
    logprobs_column,
    need,
    number,
    numbers,
    rows_of,
    runs,
    token_columns,
    whole,
    with_context,
)

# Sample.Status value -> (flag, contract stop_reason)
STATUS = {
    "completed": ("terminated", "end_of_sequence"),  # the last engine call finished with "stop"
    "truncated": ("truncated", "max_tokens"),  # the last engine call finished with "length", or no budget left
    "aborted": ("infra_error", "engine_error"),  # the engine aborted the request
    "failed": ("infra_error", "tool_error"),  # slime: tool call failure, external API or parsing error
}
# slime's own options the dump does not carry (--reward-key, --mask-offpolicy-in-partial-rollout)
CONTEXT = {"reward_key": str, "mask_offpolicy_in_partial_rollout": bool}
TRAIN_DATA = ("sample_indices", "rollout_ids", "rollout_mask_sums")  # the second hook's record

LACKS = {
    **lacks("slime"),
    "turns.policy_version": "the records carry no weight_versions (SGLang returned no weight_version)",
    "behavior_logprobs": "slime records rollout_log_probs only when the engine returned them",
    "turns.finish_reason": "slime keeps the last engine call's finish reason only, as the sample's status",
    "turns.context_length": "slime does not record the context the engine was given for each call",
    "turns.context_sha256": "slime does not record the context the engine was given for each call",
    "turns.sampled_token_ids": "slime does not record the engine's token ids per call apart from tokens",
}


def _reward(value: Any, where: str, key: str | None) -> float | None:
    """The scalar reward; a dict reward needs slime's --reward-key (context reward_key)."""
    if isinstance(value, Mapping):
        if key is None:
            raise AdapterError(f"{where}: reward is a dict; pass --context reward_key=KEY (slime's --reward-key)")
        value = need(value, key, f"{where} reward")
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise AdapterError(f"{where}: reward must be a number, not {type(value).__name__}")
    return None if value is None else number(value, "reward", where)


def _versions(rec: Mapping[str, Any], n_turns: int, where: str) -> list[int | None] | None:
    """Each turn's policy version from the per-call `weight_versions`: the version of the turn's
    first call where the list fixes it, else None (module docstring)."""
    wv = rec.get("weight_versions")
    if not wv:
        return None
    if not isinstance(wv, list):
        raise AdapterError(f"{where}: weight_versions must be a list")
    calls = []
    for v in wv:
        if isinstance(v, (int, float)):  # a number is a whole one within int64 (bools and 2.5 refused)
            calls.append(whole(v, "weight_versions", where))
            continue
        try:
            calls.append(int(v))
        except (TypeError, ValueError):
            return [None] * n_turns  # SGLang's version is a free string: not a number the audit can order
    if n_turns == 0:
        return []
    if len(set(calls)) == 1:
        return [calls[0]] * n_turns
    extra = len(calls) - n_turns
    if extra < 0:  # fewer calls than runs of mask 1: the list cannot be placed on the turns
        return [calls[0]] + [None] * (n_turns - 1)
    # turn t's first call is call t at the earliest and call t + extra at the latest
    return [calls[0]] + [calls[t] if calls[t] == calls[t + extra] else None for t in range(1, n_turns)]


def row(rec: Mapping[str, Any], n: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """One slime sample as a contract row."""
    index = need(rec, "index", f"record {n}")
    where = f"record {n} (index {index})"
    tokens = ints(rec, "tokens", where)
    n_resp = integer(rec, "response_length", where)
    if not 0 <= n_resp <= len(tokens):
        raise AdapterError(f"{where}: response_length {n_resp} outside the {len(tokens)} tokens")
    n_prompt = len(tokens) - n_resp
    raw_mask = rec.get("loss_mask")
    mask = (
        [True] * n_resp
        if raw_mask is None
        else flags(aligned(rec, "loss_mask", range(n_resp), where), "loss_mask", where)
    )
    sampled = list(mask)
    calls = rec.get("weight_versions")
    if ctx.get("mask_offpolicy_in_partial_rollout") and isinstance(calls, list) and len(calls) > len(runs(mask)):
        lead = next((i for i, m in enumerate(mask) if m), n_resp)  # the resumed sample's masked stale prefix
        sampled[:lead] = [True] * lead
    removed = rec.get("remove_sample", False)
    if not isinstance(removed, bool):
        raise AdapterError(f"{where}: remove_sample must be true or false")
    turns = runs(sampled)
    status = need(rec, "status", where)
    if not isinstance(status, str) or status not in STATUS:
        raise AdapterError(f"{where}: status {status!r} is not a finished sample ({', '.join(STATUS)})")
    flag, stop = STATUS[status]
    out: dict[str, Any] = {
        "trajectory_id": str(index),
        "task_id": str(need(rec, "group_index", where)),
        "group_id": str(rec["group_index"]),
        **token_columns(
            tokens[:n_prompt], tokens[n_prompt:], sampled, [m and not removed for m in mask], [a for a, _ in turns]
        ),
        "turns": [{"turn_id": t} for t in range(len(turns))],
        **{f: f == flag for f in STOP_FLAGS},
        "stop_reason": stop,
        "reward": _reward(need(rec, "reward", where), where, ctx.get("reward_key")),
    }
    if removed:  # out of the loss, still in its group's reward normalisation (contract 1.2)
        out["loss_excluded"] = True
    versions = _versions(rec, len(turns), where)
    if versions is not None:
        for t, v in zip(out["turns"], versions):
            t["policy_version"] = v
    if rec.get("rollout_log_probs") is not None:
        lp = numbers(aligned(rec, "rollout_log_probs", mask, where), "rollout_log_probs", where)
        out["behavior_logprobs"] = logprobs_column(n_prompt, lp, sampled)
    return with_context(out, ctx)


def _samples(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Sample records of a dump (the train data records of the second hook left out)."""
    return [r for r in records if not all(k in r for k in TRAIN_DATA)]


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """slime per-sample records as contract trajectories (context reward_key picks a dict reward)."""
    ctx = context_values(context, CONTEXT)
    return contract_table(rows_of(_samples(records), row, ctx), LACKS)


_NO_TRAINER_VERSION = "slime's train data does not record the actor's weight version"
UPDATE_LACKS = {"trainer_version": _NO_TRAINER_VERSION, "updates.trainer_version": _NO_TRAINER_VERSION}


def updates(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table | None:
    """One update per rollout id of each train data record: the samples slime divides by one
    denominator (`rollout_mask_sums`, the same for every sample of the rollout) as a `token`
    reduction over their trajectories. None when the dump has no train data record."""
    context_values(context, CONTEXT)
    rows: list[Mapping[str, Any]] = []
    for n, rec in enumerate(records, 1):
        if not all(k in rec for k in TRAIN_DATA):
            continue
        where = f"{getattr(rec, 'origin', None) or f'record {n}'}: train data record"
        index, rid, sums = (ints(rec, k, where) for k in TRAIN_DATA)
        if not len(index) == len(rid) == len(sums):
            raise AdapterError(f"{where}: sample_indices, rollout_ids and rollout_mask_sums differ in length")
        step = integer(rec, "rollout_id", where) if "rollout_id" in rec else len(rows)
        members: dict[tuple[int, int], list[str]] = {}
        for i, r, d in zip(index, rid, sums):  # a rollout whose samples disagree on D is an update per D
            members.setdefault((r, d), []).append(str(i))
        rows += [
            {"update_step": step, "trajectory_ids": ids, "reduction": "token", "loss_denominator": float(d)}
            for (_, d), ids in members.items()
        ]
    if not rows:
        return None
    table = records_to_table(rows, kind="updates")
    meta = {**(table.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(UPDATE_LACKS, sort_keys=True).encode()}
    return table.replace_schema_metadata(meta)
