"""verifiers v1: a `Trace.to_record()` (verifiers/v1/trace.py, nodes in v1/graph.py) to contract records.

Each root-to-leaf path of the message graph (a `Branch`, one training sample) is one trajectory: the
nodes' `token_ids` concatenated, `mask` the loss mask (the sampled completion span of an assistant
node), `logprobs` on the masked positions (a short list leaves the rest null: `Branch.spread` pads it
with 0.0). Provenance by node: masked tokens policy, the rest of a sampled node template (the generation
prompt), system 0, user 1, tool 3, prompt-supplied assistant messages 1. Each sampled node is a turn,
with its `ModelCall` (`calls[].node`) giving `sampling` and `finish_reason`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..contract import schema as S
from .base import AdapterError, flags, mapping, need, number, objects, short, wholes
from .steps import Call, Segment, finish_reason, identity, option, recorded_logprobs, stop_columns

ROLE_SOURCE = {"system": 0, "user": 1, "tool": 3, "assistant": 1}
# What this adapter reads from verifiers' own classes (verifiers 0.4.0, also at a60a606);
# tests/test_framework_drift.py fails, naming the field, when one of them disappears.
READS = {
    "verifiers.v1.trace.Trace": {"id", "task", "nodes", "calls", "rewards", "stop_condition", "is_timeout", "errors"},
    "verifiers.v1.trace.Error": {"type"},
    "verifiers.v1.trace.TraceTask": {"key", "hash"},
    "verifiers.v1.trace.Reward": {"score", "weight"},
    "verifiers.v1.trace.ModelCall": {"node", "sampling", "finish_reason", "error"},
    "verifiers.v1.types.SamplingConfig": {"temperature", "top_p"},
    "verifiers.v1.graph.MessageNode": {
        "parent",
        "message",
        "sampled",
        "token_ids",
        "mask",
        "logprobs",
        "trainer_logprobs",
    },
}
# A trainer's recomputation of the sampled tokens' log-probs (`MessageNode.trainer_logprobs`, verifiers
# 0.4.0 graph.py:146, the compact layout of `logprobs`), carried as a second per-token log-prob column
# that L207 compares with the engine's (`compare_logprobs`)
TRAINER_LOGPROBS = "trainer_logprobs"
# Trace.stop_condition -> (flag, stop_reason), every value verifiers sets (a60a606 and 0.4.0):
# Trace.is_truncated's limits (trace.py:621-632 in 0.4.0; session.py RolloutLimits; RLM harness),
# a60a606's context_length (interception/server.py: an overlong prompt, "a clean truncation"),
# and the endings of a rollout that reached no limit (agent.py: the harness finished, the user closed
# the interaction; the OpenEnv taskset: an empty action), which carry no verdict of their own.
STOP = {
    "max_turns": ("truncated", "max_turns"),
    "max_input_tokens": ("truncated", "max_tokens"),
    "max_output_tokens": ("truncated", "max_tokens"),
    "max_total_tokens": ("truncated", "max_tokens"),
    "context_length": ("truncated", "max_tokens"),
    "compaction_failed": ("truncated", "max_tokens"),
    "error": ("infra_error", "env_error"),
    "agent_completed": ("terminated", "end_of_sequence"),  # the harness program exited on its own
    "user_closed": ("terminated", "end_of_sequence"),  # Interaction.close: the user ended the dialogue
    "empty_action": ("terminated", "end_of_sequence"),  # OpenEnv: the policy's action was empty
}
# `<boundary>_error` (errors.py stop_condition: ProviderError -> provider_error, ...) -> stop_reason;
# any other boundary is the environment's side
ERROR_REASON = {"provider_error": "engine_error", "toolset_error": "tool_error"}
# a60a606 stops every failure with the plain "error" (trace.py:585-600) and keeps the exception's class
# name in `Trace.errors[-1].type` (errors.py:34-81): the same boundaries, told by the class
ERROR_TYPE = {
    "ProviderError": "provider_error",
    "OverlongPromptError": "provider_error",
    "ToolsetError": "toolset_error",
}


def _paths(nodes: Sequence[Mapping[str, Any]]) -> list[list[int]]:
    """Root-to-leaf node indices of every leaf (a node no other node names as parent)."""
    for i, n in enumerate(nodes):
        parent = n.get("parent")
        if parent is not None and (isinstance(parent, bool) or not isinstance(parent, int)):
            raise AdapterError(
                f"nodes[{i}]: parent: expected a node index, got {type(parent).__name__} {short(parent)}"
            )
    parents = {n.get("parent") for n in nodes}
    out: list[list[int]] = []
    for leaf in (i for i in range(len(nodes)) if i not in parents):
        path: list[int] = []
        seen: set[int] = set()
        nid: Any = leaf
        while nid is not None:
            if not isinstance(nid, int) or not 0 <= nid < len(nodes) or nid in seen:
                raise AdapterError(f"node {leaf}: parent chain broken at {nid!r}")
            seen.add(nid)
            path.append(nid)
            nid = nodes[nid].get("parent")
        out.append(path[::-1])
    return out


def stop_of(cond: Any, timeout: bool = False, last_finish: Any = None) -> tuple[str, str]:
    """(flag, stop_reason) of a stop condition: STOP's limits and errors; `<stage>_timeout`
    (Trace.record_timeout: a stage deadline, a stop and not a failure) truncated by timeout;
    `<boundary>_error` (Trace.record_error) infra_error; otherwise `Trace.is_truncated`'s rule (the last
    error-free call finished by length, whatever ended the rollout) truncated, else STOP's endings, else
    terminated with the condition's own name (a user's @stop function: T302 asks to declare it in
    extra_stop_reasons), "unknown" when there is none."""
    name = cond if isinstance(cond, str) else None
    if name in STOP and STOP[name][0] != "terminated":
        return STOP[name]
    if timeout or (name or "").endswith("_timeout"):
        return "truncated", "timeout"
    if (name or "").endswith("_error"):
        return "infra_error", ERROR_REASON.get(name or "", "env_error")
    if last_finish == "length":  # also after agent_completed: the harness ran on after a cut answer
        return "truncated", "max_tokens"
    return STOP.get(name or "", ("terminated", name or "unknown"))


def _stop(trace: Mapping[str, Any]) -> dict[str, Any]:
    """The stop flags and stop_reason of a trace (see `stop_of`)."""
    calls = [c for c in trace.get("calls") or [] if isinstance(c, Mapping) and c.get("error") is None]
    last = calls[-1].get("finish_reason") if calls else None
    cond = trace.get("stop_condition")
    errors = trace.get("errors")
    if cond == "error" and isinstance(errors, list) and errors and isinstance(errors[-1], Mapping):
        cond = ERROR_TYPE.get(str(errors[-1].get("type")), cond)
    return stop_columns(*stop_of(cond, bool(trace.get("is_timeout")), last))


def _reward(trace: Mapping[str, Any]) -> float | None:
    """`Trace.reward`: Σ score × weight of the rewards scored; null when none was (scoring did not run)."""
    where = f"trace {trace.get('id')}"
    scored = [(k, r) for k, r in mapping(trace.get("rewards"), "rewards", where).items() if isinstance(r, Mapping)]
    if not scored:
        return None
    return sum(
        number(need(r, "score", f"{where} rewards.{k}"), "score", f"{where} rewards.{k}")
        * number(r.get("weight", 1.0), "weight", f"{where} rewards.{k}")
        for k, r in scored
    )


def _segment(trace: Mapping[str, Any], path: list[int], where: str, context: Mapping[str, Any]) -> Segment:
    """The branch's sequence, provenance, mask, log-probs and turns."""
    nodes, seg = trace["nodes"], Segment()
    calls = {c.get("node"): c for c in trace.get("calls") or [] if isinstance(c, Mapping)}
    for nid in path:
        node, at = nodes[nid], f"{where} node {nid}"
        ids, mask = wholes(need(node, "token_ids", at), "token_ids", at), flags(need(node, "mask", at), "mask", at)
        if len(mask) != len(ids):
            raise AdapterError(f"{at}: a mask of {len(mask)} for {len(ids)} token ids")
        role = str(mapping(node.get("message"), "message", at).get("role"))
        if not node.get("sampled"):
            seg.add(ids, ROLE_SOURCE.get(role, 1), mask=mask)
            continue
        sampled = [i for i, m in zip(ids, mask) if m]
        call = calls.get(nid) or {}
        sampling = mapping(call.get("sampling"), "sampling", f"{at} call")
        turn = {"turn_id": len(seg.turns), "sampled_token_ids": sampled}
        turn["finish_reason"] = finish_reason(call.get("finish_reason"))
        turn |= {
            k: option(sampling, k, f"{at} sampling") for k in ("temperature", "top_p") if sampling.get(k) is not None
        }
        turn |= {k: option(context, k) for k in ("temperature", "top_p", "policy_version") if k not in turn}
        start = mask.index(True) if True in mask else len(ids)
        seg.add(ids[:start], 4)  # the generation prompt: template, before the turn's sampled span
        seg.turns.append({k: v for k, v in turn.items() if v is not None})
        lps = iter(recorded_logprobs(Call([], sampled, node.get("logprobs")), at))
        for i, m in zip(ids[start:], mask[start:]):
            seg.add([i], S.POLICY if m else 4, [next(lps)] if m else None, [m])
    return seg


def _trainer_logprobs(trace: Mapping[str, Any], path: list[int], where: str) -> list[float | None] | None:
    """The branch's `trainer_logprobs` aligned to its tokens (null off the sampled span), None when no
    node of the branch carries them."""
    nodes = trace["nodes"]
    if all(nodes[nid].get(TRAINER_LOGPROBS) is None for nid in path):
        return None
    out: list[float | None] = []
    for nid in path:
        node, at = nodes[nid], f"{where} node {nid}"
        mask = flags(need(node, "mask", at), "mask", at)
        values = node.get(TRAINER_LOGPROBS)
        if values is not None and (not isinstance(values, list) or len(values) != sum(mask)):
            raise AdapterError(f"{at}: {TRAINER_LOGPROBS}: expected one per masked token ({sum(mask)})")
        vals = iter(values or [])
        out += [(number(next(vals), TRAINER_LOGPROBS, at) if values is not None else None) if m else None for m in mask]
    return out


def trajectories(trace: Mapping[str, Any], n: int, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Contract records of one v1 trace: one per branch."""
    tid = str(trace.get("id") or f"trace-{n}")
    task = mapping(trace.get("task"), "task", f"trace {tid}")
    key = str(task.get("key") or task.get("hash") or tid)
    paths = _paths(objects(need(trace, "nodes", f"trace {tid}"), "nodes", f"trace {tid}"))
    stop, reward = _stop(trace), _reward(trace)
    return [
        {
            "trajectory_id": tid + (f"#{j}" if len(paths) > 1 else ""),
            "task_id": key,
            "group_id": key,
            **identity(context),
            **_segment(trace, path, f"trace {tid}", context).columns(),
            **stop,
            "reward": reward,
            **({TRAINER_LOGPROBS: lps} if (lps := _trainer_logprobs(trace, path, f"trace {tid}")) is not None else {}),
        }
        for j, path in enumerate(paths)
    ]
