"""SkyRL: `GeneratorOutput` (skyrl/train/generators/base.py) to contract tables.

One record per sample, written by the dump hook (docs/frameworks/skyrl.md): the sample's element of
each `GeneratorOutput` list under the list's own name (`prompt_token_ids`, `response_ids`,
`loss_masks`, `rollout_logprobs`, `rewards`, `stop_reasons`, `trajectory_ids` as
`{instance_id, repetition_id}`), plus `global_step` from the batch's `BatchMetadata`.

Provenance comes from `loss_masks` (1 = sampled by the policy, 0 = observation), the only marker
SkyRL keeps, so M101/M102 hold by construction; the turns are the runs of mask 1. `stop_reasons`
is the finish of the last turn only (or the generator's own `length` when the context is full).

A dump of several steps repeats `instance_id`/`repetition_id` (the dataset index and the sample
number, drawn again every epoch), so the step is part of the identity: trajectory
`{step}/{instance_id}_{repetition_id}`, group `{step}/{instance_id}`, with the step from the
record's `global_step` (the fully-async hook: `global_step_when_scheduled`) or else the dump file's
name (`skyrl-{step}.jsonl`, `global_step_{step}_...`).

The generator's `zero_reward_on_non_stop` and `apply_overlong_filtering` (GeneratorConfig) are
applied before the dump and are not in it: the context gives them, and the trainer policy they
imply is declared with the table (`with_policy`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract.schema import STOP_FLAGS
from .base import (
    AdapterError,
    aligned,
    context_values,
    contract_table,
    flags,
    ints,
    lacks,
    logprobs_column,
    need,
    number,
    numbers,
    rows_of,
    runs,
    short,
    step_of,
    token_columns,
    whole,
    with_context,
    with_policy,
)

# stop_reasons value -> (flag, contract stop_reason): what SkyRL's generator writes
STOPS = {
    "stop": ("terminated", "end_of_sequence"),  # the last turn ended and the environment said done
    "length": ("truncated", "max_tokens"),  # the engine's token limit, or the context budget exceeded
    "abort": ("infra_error", "engine_error"),  # the engine aborted the request
}
# GeneratorConfig (skyrl/train/config/config.py) flags the dump does not carry; both default False
CONTEXT = {"zero_reward_on_non_stop": bool, "apply_overlong_filtering": bool}
_STEP_IN_NAME = re.compile(r"(?:skyrl-|global_step_)(\d+)")
STEP_FIELDS = ("global_step", "global_step_when_scheduled")

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


def _trajectory(rec: Mapping[str, Any], n: int, step: int | None) -> tuple[str, str, str]:
    """(trajectory_id, task_id, group_id): TrajectoryID.to_string() and instance_id, after the step."""
    tid = need(rec, "trajectory_ids", f"record {n}")
    if not isinstance(tid, Mapping):
        raise AdapterError(f"record {n}: trajectory_ids must be {{instance_id, repetition_id}}")
    inst = need(tid, "instance_id", f"record {n} trajectory_ids")
    rep = need(tid, "repetition_id", f"record {n} trajectory_ids")
    at = "" if step is None else f"{step}/"
    return f"{at}{inst}_{rep}", str(inst), f"{at}{inst}"


def policy(ctx: Mapping[str, Any]) -> str:
    """The trainer policy for episodes that did not stop, in one sentence (SkyRL never drops one)."""
    zero, overlong = ctx.get("zero_reward_on_non_stop", False), ctx.get("apply_overlong_filtering", False)
    given = "as given" if any(k in ctx for k in CONTEXT) else "SkyRL's defaults"
    reward = "get reward 0" if zero else "keep their reward"
    loss = (
        "have every token masked out of the loss while the reward still counts in the group statistics"
        if overlong
        else "are trained"
    )
    return (
        f"SkyRL zero_reward_on_non_stop={zero}, apply_overlong_filtering={overlong} ({given}): episodes that did "
        f"not stop {reward} and {loss}: truncation = 'penalize'"
    )


def _reward(value: Any, where: str) -> float | None:
    """A scalar reward, or per-token rewards summed as SkyRL's outcome estimators sum them."""
    if value is None:
        return None
    if isinstance(value, list):
        return float(sum(number(v, "rewards", where) for v in value))
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise AdapterError(f"{where}: rewards must be a number or a list of numbers")
    return number(value, "rewards", where)


def row(rec: Mapping[str, Any], n: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """One SkyRL sample as a contract row."""
    step = step_of(rec, STEP_FIELDS, _STEP_IN_NAME, f"record {n}")
    traj, task, group = _trajectory(rec, n, step)
    where = f"record {n} ({traj})"
    prompt = ints(rec, "prompt_token_ids", where)
    resp = ints(rec, "response_ids", where)
    mask = flags(aligned(rec, "loss_masks", resp, where), "loss_masks", where)
    turns = runs(mask)
    out: dict[str, Any] = {
        "trajectory_id": traj,
        "task_id": task,
        "group_id": group,
        **token_columns(prompt, resp, mask, mask, [a for a, _ in turns]),
        "turns": [{"turn_id": t} for t in range(len(turns))],
        "reward": _reward(need(rec, "rewards", where), where),
    }
    key = "global_step_when_scheduled" if rec.get("global_step_when_scheduled") is not None else "global_step"
    if rec.get(key) is not None:
        version = whole(rec[key], key, where)
        for t in out["turns"]:
            t["policy_version"] = version
    if rec.get("rollout_logprobs") is not None:
        lp = numbers(aligned(rec, "rollout_logprobs", mask, where), "rollout_logprobs", where)
        out["behavior_logprobs"] = logprobs_column(len(prompt), lp, mask)
    if rec.get("stop_reasons") is not None:
        stop = rec["stop_reasons"]
        if not isinstance(stop, str) or stop not in STOPS:
            raise AdapterError(f"{where}: stop_reasons {short(stop)} is not one SkyRL writes ({', '.join(STOPS)})")
        flag, out["stop_reason"] = STOPS[stop]
        out.update({f: f == flag for f in STOP_FLAGS})
        if ctx.get("apply_overlong_filtering") and stop != "stop":
            # the generator zeroed every loss mask and kept the reward in the group statistics
            out["loss_excluded"] = True
    return with_context(out, ctx)


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """SkyRL per-sample records as contract trajectories (context: the generator's
    zero_reward_on_non_stop and apply_overlong_filtering, which the dump does not carry)."""
    ctx = context_values(context, CONTEXT)
    table = contract_table(rows_of(records, row, ctx), LACKS)
    return with_policy(table, policy(ctx), truncation="penalize")
