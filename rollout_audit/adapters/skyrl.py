"""SkyRL: `GeneratorOutput` (skyrl/train/generators/base.py) to contract tables.

One record per sample, written by the dump hook (docs/frameworks/skyrl.md): the sample's element of
each `GeneratorOutput` list under the list's own name (`prompt_token_ids`, `response_ids`,
`loss_masks`, `rollout_logprobs`, `rewards`, `stop_reasons`, `trajectory_ids` as
`{instance_id, repetition_id}`), plus `global_step` from the batch's `BatchMetadata`.

Provenance comes from `loss_masks` (1 = sampled by the policy, 0 = observation), the only marker
SkyRL keeps, so M101/M102 hold by construction; the turns are the runs of mask 1. `stop_reasons`
is the finish of the last turn only (or the generator's own `length` when the context is full).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

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
    rows_of,
    runs,
    token_columns,
    with_context,
)

# stop_reasons value -> (flag, contract stop_reason): what SkyRL's generator writes
STOPS = {
    "stop": ("terminated", "end_of_sequence"),  # the last turn ended and the environment said done
    "length": ("truncated", "max_tokens"),  # the engine's token limit, or the context budget exceeded
    "abort": ("infra_error", "engine_error"),  # the engine aborted the request
}
FLAGS = ("terminated", "truncated", "infra_error")

LACKS = {
    **lacks("SkyRL"),
    "turns.policy_version": "SkyRL records the trainer's global_step per batch only; the hook adds it as global_step",
    "behavior_logprobs": "SkyRL records rollout_logprobs only when sampling_params.logprobs is set",
    "terminated": "the records carry no stop_reasons",
    "truncated": "the records carry no stop_reasons",
    "infra_error": "the records carry no stop_reasons",
    "stop_reason": "the records carry no stop_reasons",
    "turns.finish_reason": "SkyRL keeps one stop reason per episode (the last turn's, or its own context-length cut), "
    "none per turn",
    "turns.context_length": "SkyRL does not record the context the engine was given for each turn",
    "turns.context_sha256": "SkyRL does not record the context the engine was given for each turn",
    "turns.sampled_token_ids": "SkyRL does not record the engine's token ids per turn apart from the trainer's",
}


def _trajectory(rec: Mapping[str, Any], n: int) -> tuple[str, str]:
    """(trajectory_id, task_id) from `trajectory_ids`: TrajectoryID.to_string() and instance_id."""
    tid = need(rec, "trajectory_ids", f"record {n}")
    if not isinstance(tid, Mapping):
        raise AdapterError(f"record {n}: trajectory_ids must be {{instance_id, repetition_id}}")
    inst = need(tid, "instance_id", f"record {n} trajectory_ids")
    rep = need(tid, "repetition_id", f"record {n} trajectory_ids")
    return f"{inst}_{rep}", str(inst)


def _reward(value: Any, where: str) -> float | None:
    """A scalar reward, or per-token rewards summed as SkyRL's outcome estimators sum them."""
    if value is None:
        return None
    if isinstance(value, list):
        return float(sum(value))
    if not isinstance(value, (int, float)):
        raise AdapterError(f"{where}: rewards must be a number or a list of numbers")
    return float(value)


def row(rec: Mapping[str, Any], n: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """One SkyRL sample as a contract row."""
    traj, task = _trajectory(rec, n)
    where = f"record {n} ({traj})"
    prompt = ints(rec, "prompt_token_ids", where)
    resp = ints(rec, "response_ids", where)
    mask = flags(aligned(rec, "loss_masks", resp, where), "loss_masks", where)
    turns = runs(mask)
    out: dict[str, Any] = {
        "trajectory_id": traj,
        "task_id": task,
        "group_id": task,
        **token_columns(prompt, resp, mask, mask, [a for a, _ in turns]),
        "turns": [{"turn_id": t} for t in range(len(turns))],
        "reward": _reward(need(rec, "rewards", where), where),
    }
    if rec.get("global_step") is not None:
        for t in out["turns"]:
            t["policy_version"] = integer(rec, "global_step", where)
    if rec.get("rollout_logprobs") is not None:
        lp = aligned(rec, "rollout_logprobs", mask, where)
        out["behavior_logprobs"] = logprobs_column(len(prompt), lp, mask)
    if rec.get("stop_reasons") is not None:
        stop = rec["stop_reasons"]
        if stop not in STOPS:
            raise AdapterError(f"{where}: stop_reasons {stop!r} is not one SkyRL writes ({', '.join(STOPS)})")
        flag, out["stop_reason"] = STOPS[stop]
        out.update({f: f == flag for f in FLAGS})
    return with_context(out, ctx)


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """SkyRL per-sample records as contract trajectories."""
    ctx = context_values(context)
    return contract_table(rows_of(records, row, ctx), LACKS)
