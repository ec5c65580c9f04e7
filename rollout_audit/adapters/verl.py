"""verl (agent loop): `AgentLoopOutput` (verl/experimental/agent_loop/agent_loop.py) to contract tables.

One record per sample, written by the dump hook (docs/frameworks/verl.md,
`rollout_audit.integrations.verl.dump`): the output's own fields (`prompt_ids`, `response_ids`,
`response_mask`, `response_logprobs`, `reward_score`, `num_turns`, `extra_fields`), the sample's
`request_id` and `uid`, and `engine_calls`: per `server_manager.generate` call the `prompt_ids` the
engine was given and the `token_ids` it returned.

With `engine_calls`, provenance comes from the engine (call t's tokens sit right after its
prompt), independently of `response_mask`, so M101/M102 compare the trainer's mask with what was
sampled, M105 the engine's context with the trainer's sequence, M106 the sampled ids. Without
them, provenance falls back to `response_mask` (M101/M102 then hold by construction).
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
    ints,
    lacks,
    logprobs_column,
    need,
    rows_of,
    runs,
    sha256_ids,
    token_columns,
    with_context,
)

_NO_STOP = (
    "verl's agent loop does not record why an episode stopped: every exit is AgentState.TERMINATED "
    "and the engine's finish reason (length vs stop) is not forwarded"
)
_NO_CALLS = "the records carry no engine_calls (add the hook's line in ToolAgentLoop._handle_generating_state)"
_NO_TEMPLATE = "the engine_calls carry no template_ids (the hook's optional render of the conversation)"
LACKS = {
    **lacks("verl"),
    "turns.policy_version": "verl's synchronous agent loop does not record the weight version that sampled a turn "
    "(only fully-async mode has param_version_start/end)",
    "behavior_logprobs": "verl records response_logprobs only with actor_rollout_ref.rollout.calculate_log_probs=True",
    "reward": "the records carry no reward_score (verl scored them after the agent loop)",
    "terminated": _NO_STOP,
    "truncated": _NO_STOP,
    "infra_error": _NO_STOP,
    "stop_reason": _NO_STOP,
    "turns.finish_reason": "verl's TokenOutput.stop_reason folds length into 'completed'",
    "turns.context_length": _NO_CALLS,
    "turns.context_sha256": _NO_CALLS,
    "turns.sampled_token_ids": _NO_CALLS,
    "turns.template_context_length": _NO_TEMPLATE,
    "turns.template_context_sha256": _NO_TEMPLATE,
}


def _engine_turns(calls: list[Any], n_prompt: int, n_resp: int, where: str) -> tuple[list[int], list[dict]]:
    """(response positions sampled by the engine, one turn per call with its context and ids).
    Call t's returned tokens start where its prompt ends; the response may be cut at response_length."""
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
        policy += range(start, min(start + len(ids), n_resp))
        turn = {"turn_id": t, "context_length": len(ctx), "context_sha256": sha256_ids(ctx), "sampled_token_ids": ids}
        if call.get("template_ids") is not None:
            tmpl = ints(call, "template_ids", w)
            turn.update(template_context_length=len(tmpl), template_context_sha256=sha256_ids(tmpl))
        turns.append(turn)
    return policy, turns


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
    if calls:
        policy, turns = _engine_turns(calls, len(prompt), len(resp), where)
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
        lp = aligned(rec, "response_logprobs", resp, where)
        out["behavior_logprobs"] = logprobs_column(len(prompt), lp, sampled)
    if rec.get("reward_score") is not None:
        out["reward"] = float(rec["reward_score"])
    return with_context(out, ctx)


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """verl agent-loop records as contract trajectories."""
    ctx = context_values(context)
    return contract_table(rows_of(records, row, ctx), LACKS)
