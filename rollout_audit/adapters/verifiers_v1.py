"""verifiers v1: a `Trace.to_record()` (verifiers/v1/trace.py, nodes in v1/graph.py) to contract records.

Each root-to-leaf path of the message graph (a `Branch`, one training sample) is one trajectory: the
nodes' `token_ids` concatenated, `mask` the loss mask (the sampled completion span of an assistant
node), `logprobs` on the masked positions (a short list leaves the rest null: `Branch.spread` pads it
with 0.0). Provenance by node: masked tokens policy, the rest of a sampled node template (the generation
prompt), system 0, user 1, tool 3, prompt-supplied assistant messages 1. Each sampled node is a turn,
with its `ModelCall` (`calls[].node`) giving `sampling` and `finish_reason`."""

from __future__ import annotations

import base64
import binascii
import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..contract import schema as S
from .base import AdapterError, flags, mapping, need, number, numbers, objects, short, whole, wholes
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
        "is_content",
        "loss_weights",
        "routed_experts",
    },
    "verifiers.v1.episode.Episode": {"traces", "run", "group"},
    "verifiers.v1.episode.TrainWorkInfo": {"policy"},
    "verifiers.v1.episode.PolicySpan": {"start", "end"},
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


# prime-rl's loss components over a node's named `loss_weights` (trainer/rl/loss.py:379-392 at 559b447):
# `rl`, the policy-gradient loss, on `mask & (weight != 0)` (an absent stream: weight 1.0 on the mask,
# :379-380); `ce`, a masked NLL, on `weight != 0` whatever the mask (:385-388): the echo algorithm's
# stream on environment text (orchestrator/algo/echo.py:41-90). `ref_kl` is a KL term on the action
# tokens, not a contract stream.
PRIME_RL_STREAMS = {"rl": 0, "ce": 1}
# the routes of a node as the engine's `generate` payload encodes them (prime-rl
# inference/vllm/routed_experts.py:11-33: base64 of a [tokens, layers, top_k] array of uint8 or uint16)
ROUTE_DTYPES = {"uint8": np.uint8, "uint16": np.uint16}


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


def _calls(trace: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The trace's engine calls (none when absent), or AdapterError naming the field and the trace."""
    calls = trace.get("calls")
    return [] if calls is None else objects(calls, "calls", f"trace {trace.get('id')}")


def _stop(trace: Mapping[str, Any]) -> dict[str, Any]:
    """The stop flags and stop_reason of a trace (see `stop_of`)."""
    calls = [c for c in _calls(trace) if c.get("error") is None]
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


def _content(node: Mapping[str, Any], n: int, at: str) -> list[tuple[int, int, bool]]:
    """[lo, hi, body] runs of a node's tokens by `is_content` (a60a606 graph.py:92-100: the renderer's
    message body against its template scaffold); one body run when the renderer did not attribute it
    (an empty list, as the default Jinja renderer leaves it)."""
    raw = node.get("is_content")
    if not raw:
        return [(0, n, True)]
    content = flags(raw, "is_content", at)
    if len(content) != n:
        raise AdapterError(f"{at}: is_content of {len(content)} for {n} token ids")
    cuts = [0, *[i for i in range(1, n) if content[i] != content[i - 1]], n]
    return [(a, b, content[a]) for a, b in zip(cuts, cuts[1:]) if b > a]


def _segment(
    trace: Mapping[str, Any], path: list[int], where: str, context: Mapping[str, Any], version: int | None = None
) -> Segment:
    """The branch's sequence, provenance, mask, log-probs and turns."""
    nodes, seg = trace["nodes"], Segment()
    calls = {}
    for c in _calls(trace):
        if not isinstance(c.get("node"), (int, str, type(None))):
            raise AdapterError(f"{where}: calls: node: expected a node id, got {short(c.get('node'))}")
        calls[c.get("node")] = c
    for nid in path:
        node, at = nodes[nid], f"{where} node {nid}"
        ids, mask = wholes(need(node, "token_ids", at), "token_ids", at), flags(need(node, "mask", at), "mask", at)
        if len(mask) != len(ids):
            raise AdapterError(f"{at}: a mask of {len(mask)} for {len(ids)} token ids")
        role = str(mapping(node.get("message"), "message", at).get("role"))
        if not node.get("sampled"):
            content = _content(node, len(ids), at)
            for lo, hi, body in content:  # the renderer's scaffold (is_content false) is template
                seg.add(ids[lo:hi], ROLE_SOURCE.get(role, 1) if body else 4, mask=mask[lo:hi])
            continue
        sampled = [i for i, m in zip(ids, mask) if m]
        call = calls.get(nid) or {}
        sampling = mapping(call.get("sampling"), "sampling", f"{at} call")
        turn = {"turn_id": len(seg.turns), "sampled_token_ids": sampled}
        turn["finish_reason"] = finish_reason(call.get("finish_reason"))
        turn |= {
            k: option(sampling, k, f"{at} sampling") for k in ("temperature", "top_p") if sampling.get(k) is not None
        }
        if sampling.get("top_k") is not None:  # extra="allow" keeps a provider's top_k (0.4.0 types.py:274-299)
            turn["top_k"] = whole(sampling["top_k"], "top_k", f"{at} sampling")
        if version is not None:
            turn["policy_version"] = version
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


def _loss(trace: Mapping[str, Any], path: list[int], where: str) -> dict[str, list[Any]]:
    """loss_mask, loss_stream and loss_weight of a branch as prime-rl trains it from its nodes' named
    `loss_weights` (PRIME_RL_STREAMS): a token with a non-zero `ce` weight is in the echo stream (1)
    at that weight, whatever its mask (a sampled token there is trained twice: M110 says so); another
    token of the node's mask is in the policy-gradient stream (0) at its `rl` weight (1.0 when the
    node has none; 0 is a token prime-rl drops, M110 again); the rest is outside the loss, weight 0
    (an `rl` weight there is gated off by the mask, loss.py:382)."""
    nodes = trace["nodes"]
    out: dict[str, list[Any]] = {"loss_mask": [], "loss_stream": [], "loss_weight": []}
    for nid in path:
        node, at = nodes[nid], f"{where} node {nid}"
        mask = flags(need(node, "mask", at), "mask", at)
        named = mapping(node.get("loss_weights"), "loss_weights", at)
        got: dict[str, list[float]] = {}
        for name in PRIME_RL_STREAMS:
            if named.get(name) is None:
                continue
            w = numbers(named[name], f"loss_weights.{name}", at)
            if len(w) != len(mask) or any(v is None for v in w):
                raise AdapterError(f"{at}: loss_weights.{name}: expected one number per token id ({len(mask)})")
            got[name] = [float(v) for v in w if v is not None]
        rl = got.get("rl") or [1.0] * len(mask)
        ce = got.get("ce") or [0.0] * len(mask)
        for m, r, c in zip(mask, rl, ce):
            echo = c != 0.0  # NaN too: prime-rl's `ce_w != 0` trains it
            out["loss_mask"].append(echo or m)
            out["loss_stream"].append(1 if echo else 0)
            out["loss_weight"].append(c if echo else r if m else 0.0)
    return out


def _routes(node: Mapping[str, Any], at: str) -> np.ndarray | None:
    """A node's `routed_experts` as the hook writes them: the engine's payload encoding (ROUTE_DTYPES),
    decoded and checked ([rows, layers, top_k], the bytes the shape says); None when absent."""
    raw = node.get("routed_experts")
    if raw is None:
        return None
    rec = mapping(raw, "routed_experts", at)
    kind = ROUTE_DTYPES.get(str(rec.get("dtype", "uint8")))
    shape = wholes(need(rec, "shape", f"{at} routed_experts"), "routed_experts.shape", at)
    data = need(rec, "data", f"{at} routed_experts")
    if kind is None:
        raise AdapterError(f"{at}: routed_experts.dtype: expected uint8 or uint16, got {short(rec.get('dtype'))}")
    if len(shape) != 3 or min(shape) < 0 or not isinstance(data, str):
        raise AdapterError(f"{at}: routed_experts: expected base64 data of a [tokens, layers, top_k] array")
    try:
        buf = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise AdapterError(f"{at}: routed_experts.data is not base64") from None
    size = math.prod(shape) * np.dtype(kind).itemsize
    try:  # numpy refuses a shape whose size overflows its index type, even with no rows ([0, 10^18, 10^18])
        if size != len(buf):
            raise ValueError
        return np.frombuffer(buf, dtype=kind).reshape(shape)
    except ValueError:
        raise AdapterError(
            f"{at}: routed_experts: {len(buf)} bytes for a shape {short(shape)} of {np.dtype(kind).name}"
        ) from None


def _replayed(trace: Mapping[str, Any], path: list[int], where: str, version: int | None) -> dict[str, Any]:
    """The branch's expert routes (contract 1.3): `routed_experts_version`, one entry per row of the
    nodes' routes in path order (null for the tokens of a node that has none), when the version of
    every engine call is known; `routed_experts_sha256` of the array the trainer replays when the
    nodes tile the branch exactly (`Branch.routed_experts`, 0.4.0 trace.py:320-326: else it replays
    none). Nothing when no node of the trace carries routes (not a routing-replay run)."""
    nodes = trace["nodes"]
    arrays = [(nid, _routes(nodes[nid], f"{where} node {nid}")) for nid in path]
    if all(a is None for _, a in arrays) and all(n.get("routed_experts") is None for n in nodes):
        return {}
    out: dict[str, Any] = {}
    sized = [(len(nodes[nid].get("token_ids") or []), a) for nid, a in arrays]
    if version is not None:
        out["routed_experts_version"] = [
            v for n, a in sized for v in ([None] * n if a is None else [version] * a.shape[0])
        ]
    tiles = [a for n, a in sized if n or a is not None]  # Branch.routed_experts skips nodes without tokens
    present = [a for a in tiles if a is not None]
    if tiles and len(present) == len(tiles) and len({a.shape[1:] for a in present}) == 1:
        arr: np.ndarray = np.concatenate(present, axis=0)
        if arr.shape[0] == sum(n for n, _ in sized):
            out["routed_experts_sha256"] = hashlib.sha256(arr.astype("<i4").tobytes()).hexdigest()
    return out


def trajectories(
    trace: Mapping[str, Any], n: int, context: Mapping[str, Any], version: int | None = None
) -> list[dict[str, Any]]:
    """Contract records of one v1 trace: one per branch. `version`: the policy version of every engine
    call of the trace, when its episode says (`episode`)."""
    tid = str(trace.get("id") or f"trace-{n}")
    task = mapping(trace.get("task"), "task", f"trace {tid}")
    key = str(task.get("key") or task.get("hash") or tid)
    paths = _paths(objects(need(trace, "nodes", f"trace {tid}"), "nodes", f"trace {tid}"))
    stop, reward = _stop(trace), _reward(trace)
    streams = context.get("trainer") == "prime-rl"
    return [
        {
            "trajectory_id": tid + (f"#{j}" if len(paths) > 1 else ""),
            "task_id": key,
            "group_id": str(context.get(GROUP) or key),
            **identity(context),
            **_segment(trace, path, f"trace {tid}", context, version).columns(),
            **(_loss(trace, path, f"trace {tid}") if streams else {}),
            **_replayed(trace, path, f"trace {tid}", version),
            **stop,
            "reward": reward,
            **({TRAINER_LOGPROBS: lps} if (lps := _trainer_logprobs(trace, path, f"trace {tid}")) is not None else {}),
        }
        for j, path in enumerate(paths)
    ]


GROUP = "_group"  # an episode's group id, handed to its traces


def span_version(episode: Mapping[str, Any], where: str) -> int | None:
    """The policy version of every engine call of an episode: `run.work.policy` (a `PolicySpan`, the
    live policy versions spanned while generating it, stamped by prime-rl's dispatcher.py:627-646)
    when it starts and ends at one version; None when it spans several (which call ran at which is
    not recorded) or is absent (a frozen policy, an eval run, another consumer)."""
    run = mapping(episode.get("run"), "run", where)
    work = mapping(run.get("work"), "run.work", where)
    span = mapping(work.get("policy"), "run.work.policy", where)
    if not span:
        return None
    start = whole(need(span, "start", f"{where} run.work.policy"), "run.work.policy.start", where)
    end = whole(need(span, "end", f"{where} run.work.policy"), "run.work.policy.end", where)
    return start if start == end else None


def episode(record: Mapping[str, Any], n: int, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Contract records of one v1 `Episode.to_record()` (what prime-rl's file monitor writes, one a line:
    monitors/file.py:43-55): its traces, grouped by the episode's `group.id` when it has one, each
    engine call at the episode's policy version when its span says (`span_version`)."""
    where = f"episode {short(record.get('id'))}"
    version = span_version(record, where)
    given = context.get("policy_version")
    if version is not None and given is not None and int(given) != version:
        raise AdapterError(f"{where}: run.work.policy says version {version}, --context policy_version says {given}")
    group = mapping(record.get("group"), "group", where).get("id")
    ctx = {**context, GROUP: group} if group is not None else context
    traces = objects(need(record, "traces", where), "traces", where)
    return [row for k, tr in enumerate(traces) for row in trajectories(tr, n * 1000 + k, ctx, version)]
