"""rLLM: `Episode.to_dict()` records (one a line) to contract trajectories.

Each rLLM `Trajectory` of an episode becomes one contract trajectory (or one per segment when a step's
prompt does not extend the running sequence, as rLLM's verl transform splits it). Each `Step` with a
`model_output` is one turn: its engine prompt (`model_output.prompt_ids`) gives the turn's engine
context, its `completion_ids` the sampled ids, `logprobs` the behaviour log-probs (a short list leaves
the rest null: rLLM's transform pads it with 0.0), `weight_version` the policy version, `finish_reason`
the engine's stop. `Episode.termination_reason` and `is_correct` give the stop cause."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from .base import AdapterError, contract_table, need, origin
from .steps import (
    Call,
    engine_context,
    episode_rows,
    finish_reason,
    guarded,
    identity,
    identity_lacks,
    merge,
    option,
    stop_columns,
)

# Episode.termination_reason (rllm/workflows/workflow.py TerminationReason) -> (flag, stop_reason);
# env_done becomes success or failure by the episode's is_correct.
TERMINATION = {
    "max_prompt_length_exceeded": ("truncated", "max_tokens"),
    "max_response_length_exceeded": ("truncated", "max_tokens"),
    "max_turns_exceeded": ("truncated", "max_turns"),
    "timeout": ("truncated", "timeout"),
    "error": ("infra_error", "env_error"),
}

LACKS = {
    **identity_lacks(
        "rLLM",
        {
            "environment_id": "the environment identity",
            "environment_version": "the environment version",
            "verifier_version": "the reward function's version",
            "reset_seed": "a reset seed",
            "tokenizer_id": "the tokenizer identity",
        },
    ),
    "turns.temperature": "rLLM's Step does not record the sampling temperature (it lives in the rollout "
    "engine's sampling params); pass --context temperature=...",
    "turns.top_p": "rLLM's Step does not record top_p (it lives in the rollout engine's sampling params); "
    "pass --context top_p=...",
    "turns.logprob": "rLLM records token log-probs, not a per-turn log-prob",
    "turns.num_policy_tokens": "rLLM does not count policy tokens per step",
    "num_trainable_tokens": "rLLM does not count trainable tokens per trajectory",
    "initial_state_checksum": "rLLM does not record environment state",
    "wall_clock_s": "rLLM does not record an episode's wall-clock time",
}


def _stop(episode: Mapping[str, Any]) -> dict[str, Any]:
    """Flags and stop_reason from termination_reason; an unknown or missing reason sets no flag
    and stop_reason "unknown" (T301/T302 then say so instead of a guess)."""
    reason = episode.get("termination_reason")
    flag: str | None
    if reason == "env_done":
        flag, stop = "terminated", ("success" if episode.get("is_correct") else "failure")
    else:
        flag, stop = TERMINATION.get(str(reason), (None, "unknown"))
    return stop_columns(flag, stop)


def _call(step: Mapping[str, Any], where: str, context: Mapping[str, Any]) -> Call | None:
    """A step as an engine call (None when it has no model_output: rLLM's transform skips it)."""
    out = need(step, "model_output", where)
    if out is None:
        return None
    if not isinstance(out, Mapping):
        raise AdapterError(f"{where}: model_output is not an object")
    prompt = need(out, "prompt_ids", f"{where}.model_output")
    sampled = need(out, "completion_ids", f"{where}.model_output")
    if prompt is None or sampled is None:  # rLLM's transform skips such a step too
        return None
    version = step.get("weight_version", out.get("weight_version"))
    action = step.get("action")
    turn = {
        "policy_version": version,
        "finish_reason": finish_reason(out.get("finish_reason")),
        "sampled_token_ids": list(sampled),
        "reward": step.get("reward"),
        "action_text": step.get("model_response"),
        "parsed_action": None if action is None else json.dumps(action, sort_keys=True),
        **engine_context(prompt),
        **{k: option(context, k) for k in ("temperature", "top_p") if context.get(k) is not None},
    }
    return Call(prompt, sampled, out.get("logprobs"), turn)


def _trajectories(episode: Mapping[str, Any], n: int, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Contract records of one episode."""
    eid = str(need(episode, "id", f"episode {n}"))
    task_id = eid.split(":")[0]
    stop = _stop(episode)
    out = []
    for k, traj in enumerate(need(episode, "trajectories", f"episode {eid}")):
        name = str(traj.get("name", k))
        where = f"episode {eid} trajectory {name}"
        calls = [c for i, s in enumerate(need(traj, "steps", where)) if (c := _call(s, f"{where} step {i}", context))]
        segments = merge(calls, where)
        common = {"task_id": task_id, "group_id": f"{task_id}:{name}", **identity(context)}
        outcome = {**stop, "reward": traj.get("reward"), "verifier_success": bool(episode.get("is_correct"))}
        out += [{**common, **row} for row in episode_rows(f"{eid}/{name}", segments, outcome)]
    return out


@guarded("rLLM")
def to_contract(records: Iterable[dict], **context: Any) -> pa.Table:
    """Contract trajectories from rLLM `Episode.to_dict()` records."""
    rows: list[Mapping[str, Any]] = [
        {**r, **origin(ep)} for n, ep in enumerate(records) for r in _trajectories(ep, n, context)
    ]
    return contract_table(rows, LACKS, "rLLM")
