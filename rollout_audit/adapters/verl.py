"""verl (agent loop): `AgentLoopOutput` (verl/experimental/agent_loop/agent_loop.py) to contract tables.

One record per sample, written by the dump hook (docs/frameworks/verl.md,
`rollout_audit.integrations.verl.dump`): the output's own fields (`prompt_ids`, `response_ids`,
`response_mask`, `response_logprobs`, `reward_score`, `num_turns`, `extra_fields`), the sample's
`request_id` and `uid`, `engine_calls`: per `server_manager.generate` call the `prompt_ids` the
engine was given, and from its `TokenOutput` the `token_ids` it returned, its `stop_reason` and the
weight versions (`global_steps`, `min_global_steps`, `max_global_steps`), and `boundary_ids`: the
stop tokens verl's continuous-token builder drops at a turn boundary (GLM).

With `engine_calls`, provenance comes from the engine (call t's tokens sit right after its
prompt), independently of `response_mask`, so M101/M102 compare the trainer's mask with what was
sampled, M105 the engine's context with the trainer's sequence, M106 the sampled ids. Without
them, provenance falls back to `response_mask` (M101/M102 then hold by construction).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract.schema import context_sha256
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
    with_context,
    with_policy,
)

# What the hook and this adapter read from verl's own classes (verl 0.9.1; tests/test_framework_drift.py
# fails, naming the field, when one of them disappears from the installed verl).
READS = {
    "verl.experimental.agent_loop.agent_loop.AgentLoopOutput": {
        "prompt_ids",
        "response_ids",
        "response_mask",
        "response_logprobs",
        "reward_score",
        "num_turns",
        "extra_fields",
    },
    "verl.workers.rollout.replica.TokenOutput": {"token_ids", "stop_reason", "extra_fields"},
}
VERSIONS = ("global_steps", "min_global_steps", "max_global_steps")  # TokenOutput.extra_fields keys
# verl's own keyword context: the loop's limits (actor_rollout_ref.rollout.response_length,
# .multi_turn.max_assistant_turns / max_user_turns) and top_k (-1 or 0: off)
OWN_CONTEXT: dict[str, type] = {"response_length": int, "max_assistant_turns": int, "max_user_turns": int, "top_k": int}
# TokenOutput.stop_reason -> the contract's finish_reason: vLLM folds stop and length into
# "completed" (not mapped: it says neither); SGLang passes its own; fully-async resumes set "length"
FINISH = {"stop": "stop", "length": "length", "abort": "abort", "aborted": "abort"}

_NO_STOP = (
    "verl's agent loop does not record why an episode stopped (every exit is AgentState.TERMINATED); "
    "pass --context response_length=... (and max_assistant_turns / max_user_turns when set) to derive it"
)
_NO_CALLS = "the records carry no engine_calls (add the hook's line in ToolAgentLoop._handle_generating_state)"
_NO_TEMPLATE = "the engine_calls carry no template_ids (the hook's optional render of the conversation)"
LACKS = {
    **lacks("verl"),
    "turns.policy_version": "the engine_calls carry no global_steps (TokenOutput.extra_fields; record them with the "
    "hook's engine_call)",
    "behavior_logprobs": "verl records response_logprobs only with actor_rollout_ref.rollout.calculate_log_probs=True",
    "reward": "the records carry no reward_score (verl scored them after the agent loop)",
    "terminated": _NO_STOP,
    "truncated": _NO_STOP,
    "infra_error": _NO_STOP,
    "stop_reason": _NO_STOP,
    "turns.finish_reason": "verl's vLLM server folds stop and length into TokenOutput.stop_reason 'completed'",
    "turns.context_length": _NO_CALLS,
    "turns.context_sha256": _NO_CALLS,
    "turns.sampled_token_ids": _NO_CALLS,
    "turns.template_context_length": _NO_TEMPLATE,
    "turns.template_context_sha256": _NO_TEMPLATE,
}


def _version(call: Mapping[str, Any], where: str) -> int | None:
    """The weight version that sampled a call: the oldest of a call resumed across a weight update
    (fully-async partial rollout: min_global_steps), else global_steps; None when not recorded."""
    for key in ("min_global_steps", "global_steps"):
        value = call.get(key)
        if value is not None:
            return integer(call, key, where)
    return None


def _boundary_edit(ids: list[int], at: int, resp: list[int], mask: list[bool], edits: set[int]) -> bool:
    """Whether verl's continuous-token builder dropped the call's last sampled id at the turn boundary
    (GLM: `<|observation|>` / `<|user|>` end a turn and also open the next message; the builder drops the
    sampled one before appending the context, so the trainer's sequence has the context's token, mask 0,
    there): the last id is one of `edits`, the rest sits at `at` in the response, the next is unmasked."""
    end = at + len(ids) - 1
    return bool(ids and ids[-1] in edits and end < len(resp) and not mask[end] and resp[at:end] == ids[:-1])


def _engine_turns(
    calls: list[Any], n_prompt: int, resp: list[int], mask: list[bool], edits: set[int], where: str
) -> tuple[list[int], list[dict]]:
    """(response positions sampled by the engine, one turn per call with its context, ids, finish
    reason and weight version). Call t's returned tokens start where its prompt ends; the response may
    be cut at response_length; a declared boundary edit removes the call's last id from the sequence."""
    policy: list[int] = []
    turns = []
    for t, call in enumerate(calls):
        w = f"{where} engine_calls[{t}]"
        if not isinstance(call, Mapping):
            raise AdapterError(f"{w}: must be {{prompt_ids, token_ids}}")
        ctx, ids = ints(call, "prompt_ids", w), ints(call, "token_ids", w)
        start = len(ctx) - n_prompt
        if start < 0:
            raise AdapterError(f"{w}: prompt_ids shorter than the sample's prompt_ids")
        kept = ids[:-1] if t < len(calls) - 1 and _boundary_edit(ids, start, resp, mask, edits) else ids
        policy += range(start, min(start + len(kept), len(resp)))
        turn = {
            "turn_id": t,
            "context_length": len(ctx),
            "context_sha256": context_sha256(ctx),
            "sampled_token_ids": kept,
        }
        if call.get("template_ids") is not None:
            tmpl = ints(call, "template_ids", w)
            turn.update(template_context_length=len(tmpl), template_context_sha256=context_sha256(tmpl))
        stop = call.get("stop_reason")
        if stop is not None and not isinstance(stop, str):
            raise AdapterError(f"{w}: stop_reason must be a string")
        if FINISH.get(stop or ""):
            turn["finish_reason"] = FINISH[stop or ""]
        version = _version(call, w)
        if version is not None:
            turn["policy_version"] = version
        turns.append(turn)
    return policy, turns


def _stop(last: str | None, n_calls: int, n_resp: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """Why the episode stopped, as ToolAgentLoop decides it (tool_agent_loop.py, _handle_generating_state):
    the engine's own stop of the last call (`length`: the budget ran out; `abort`: the engine cancelled it),
    the response at response_length, max_assistant_turns or max_user_turns reached; otherwise the model
    ended its turn without a tool call. Empty without `response_length` in the context (not guessed)."""
    if "response_length" not in ctx:
        return {}
    turns_cap = ctx.get("max_assistant_turns") and n_calls >= ctx["max_assistant_turns"]
    user_cap = ctx.get("max_user_turns") and n_calls - 1 >= ctx["max_user_turns"]
    if last == "abort":
        flag, reason = "infra_error", "engine_error"
    elif last == "length" or n_resp >= ctx["response_length"]:
        flag, reason = "truncated", "max_tokens"
    elif turns_cap or user_cap:
        flag, reason = "truncated", "max_turns"
    else:
        flag, reason = "terminated", "end_of_sequence"
    return {f: f == flag for f in ("terminated", "truncated", "infra_error")} | {"stop_reason": reason}


def row(rec: Mapping[str, Any], n: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """One verl agent-loop sample as a contract row."""
    traj = str(need(rec, "request_id", f"record {n}"))
    where = f"record {n} ({traj})"
    prompt = ints(rec, "prompt_ids", where)
    resp = ints(rec, "response_ids", where)
    mask = flags(aligned(rec, "response_mask", resp, where), "response_mask", where)
    uid = need(rec, "uid", where)
    if uid is None:
        raise AdapterError(f"{where}: uid is null (pass the batch's uid to the hook)")
    calls = rec.get("engine_calls")
    if calls is not None and not isinstance(calls, list):
        raise AdapterError(f"{where}: engine_calls must be a list, got {type(calls).__name__}")
    if calls:
        edits = set(ints(rec, "boundary_ids", where)) if rec.get("boundary_ids") is not None else set()
        policy, turns = _engine_turns(calls, len(prompt), resp, mask, edits, where)
        starts = [t["context_length"] - len(prompt) for t in turns]
    else:
        spans = runs(mask)
        policy = [i for a, b in spans for i in range(a, b)]
        turns, starts = [{"turn_id": t} for t in range(len(spans))], [a for a, _ in spans]
    sampled = [False] * len(resp)
    for i in policy:
        sampled[i] = True
    out: dict[str, Any] = {
        "trajectory_id": traj,
        "task_id": str(uid),
        "group_id": str(uid),
        **token_columns(prompt, resp, sampled, mask, starts),
        "turns": turns,
    }
    if rec.get("response_logprobs") is not None:
        lp = numbers(aligned(rec, "response_logprobs", resp, where), "response_logprobs", where)
        out["behavior_logprobs"] = logprobs_column(len(prompt), lp, sampled)
    if rec.get("reward_score") is not None:
        out["reward"] = number(rec["reward_score"], "reward_score", where)
    out |= _stop(turns[-1].get("finish_reason") if turns else None, len(turns), len(resp), ctx)
    return with_context(out, ctx)


# verl's agent loop keeps a sample cut at response_length with the score the reward function gave
# it, and trains its tokens: nothing drops or re-scores a truncation
POLICY = (
    "verl trains a response cut at response_length with the reward it was scored: truncation = 'penalize' "
    "(set `truncation` in [tool.rollout-audit] if your reward function or filter says otherwise)"
)


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """verl agent-loop records as contract trajectories."""
    ctx = context_values(context, allowed=OWN_CONTEXT)
    if ctx.get("top_k", 0) > 0:
        raise AdapterError(
            f"context top_k={ctx['top_k']}: the contract records no top-k cutoff, so replay (L205-L207) would "
            "score the log-probs without it; only -1 or 0 (off, verl's default) can be audited"
        )
    table = contract_table(rows_of(records, row, ctx), LACKS)
    return with_policy(table, POLICY, truncation="penalize")
