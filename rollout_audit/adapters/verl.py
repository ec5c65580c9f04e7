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

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract import schema as S
from ..contract.config import LOG_BOUNDS
from ..contract.schema import context_sha256
from ..reading.records import records_to_table
from .base import (
    CRITIC,
    UNRECORDED,
    AdapterError,
    aligned,
    context_values,
    contract_table,
    declared,
    flags,
    in_range,
    integer,
    ints,
    lacks,
    logprobs_column,
    mapping,
    need,
    number,
    numbers,
    rows_of,
    runs,
    sha256_hex,
    short,
    token_columns,
    token_ids,
    with_context,
    with_trainer_settings,
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
        "routed_experts",
    },
    "verl.workers.rollout.replica.TokenOutput": {"token_ids", "stop_reason", "extra_fields", "routed_experts"},
}
VERSIONS = ("global_steps", "min_global_steps", "max_global_steps")  # TokenOutput.extra_fields keys
# what the hook's `attempt` records in TokenOutput.extra_fields inside a resuming client's loop: each
# attempt's [new tokens, global_steps], and the merged routes' rows as runs [rows, global_steps]
ATTEMPTS, ROUTE_RUNS = "attempts", "routed_experts_versions"
# DAPO's reward_extra_info keys (reward_manager/dapo.py, overlong_buffer.log): the penalty added to the score
OVERLONG = ("overlong_reward", "overlong")
# The trainer-side hook (`integrations.verl.dump_batch`, after compute_advantage in RayPPOTrainer.fit):
# the DataProto's tensor keys it writes per row, and the `config.algorithm` settings it copies
BATCH_TENSORS = (
    "responses",
    "response_mask",
    "token_level_scores",
    "token_level_rewards",
    "advantages",
    "returns",
    "old_log_probs",
    "rollout_log_probs",
    "values",
)
# the V1 trainer's record (`integrations.verl_v1`) also names the local update within the step
# (`local_trigger_step`, one per `_step_once`, `parameter_sync_step` of them per step)
V1_STEP = "local_trigger_step"
ALGORITHM = ("adv_estimator", "norm_adv_by_std_in_grpo", "gamma", "lam", "use_kl_in_reward")
READS_BATCH = {
    "verl.protocol.DataProto": {"batch", "non_tensor_batch", "meta_info"},
    "verl.trainer.config.AlgoConfig": set(ALGORITHM),
}
# verl's own keyword context: the loop's limits (actor_rollout_ref.rollout.response_length,
# .multi_turn.max_assistant_turns / max_user_turns) and top_k (-1 or 0: off)
OWN_CONTEXT: dict[str, type] = {"response_length": int, "max_assistant_turns": int, "max_user_turns": int, "top_k": int}
# DAPO's overlong penalty settings (reward.reward_kwargs: max_resp_len, overlong_buffer_cfg.len and
# .penalty_factor) -> the audit's configuration keys R414 reads
OVERLONG_CONTEXT = {
    "max_resp_len": "max_response_tokens",
    "overlong_buffer_len": "overlong_buffer",
    "overlong_penalty_factor": "overlong_penalty_factor",
}
OWN_CONTEXT |= {"max_resp_len": int, "overlong_buffer_len": int, "overlong_penalty_factor": float}
# what each limit may be: a response of at least one token, a turn limit of 0 (off, as verl reads it) or
# more, top_k -1 or 0 (off) or a cut-off, DAPO's budget within what an audit configuration accepts
BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "response_length": (1, None),
    "max_assistant_turns": (0, None),
    "max_user_turns": (0, None),
    "top_k": (-1, 2**31 - 1),
    "max_resp_len": (1, LOG_BOUNDS["max_response_tokens"]),
    "overlong_buffer_len": (1, LOG_BOUNDS["max_response_tokens"]),
    "overlong_penalty_factor": (0, None),
}
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
    "routed_experts_version": "the records carry no routes' provenance: no routed_experts (R3 off), or the last "
    "engine call was resumed across a weight update without the hook's `attempt` line",
    "routed_experts_sha256": "the records carry no routed_experts (actor_rollout_ref.rollout.enable_rollout_routing_replay off)",
    "overlong_penalty": "the records carry no overlong_reward (DAPO reward manager with overlong_buffer.log)",
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


def _cut(ids: list[int], at: int, resp: list[int], cap: int | None) -> list[int]:
    """The ids of the last call that verl kept: `ToolAgentLoop` cuts the response at `response_length`
    (`cap`, from the context), so a last turn that ran past it keeps a prefix of the engine's ids. Only
    that cut is read as one (the response is `cap` tokens long and ends with a prefix of the ids); any
    other difference stays, for M106 to report."""
    kept = len(resp) - at
    if cap is None or len(resp) != cap or not 0 < kept < len(ids) or resp[at:] != ids[:kept]:
        return ids
    return ids[:kept]


def _pairs(call: Mapping[str, Any], key: str, where: str) -> list[tuple[int, int | None]] | None:
    """A hook list of [count, global_steps] pairs (`attempts`, `routed_experts_versions`); None when absent."""
    raw = call.get(key)
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise AdapterError(f"{where}: {key} must be a list of [count, global_steps]")
    out: list[tuple[int, int | None]] = []
    for pair in raw:
        ok = isinstance(pair, list) and len(pair) == 2
        ok = ok and all(
            isinstance(x, int) and not isinstance(x, bool) for x in pair[:1] + [y for y in pair[1:] if y is not None]
        )
        if not ok or pair[0] < 0:
            raise AdapterError(f"{where}: {key} must be a list of [count, global_steps] (integers, count >= 0)")
        out.append((pair[0], pair[1]))
    return out


def _attempt_turns(call: Mapping[str, Any], ctx: list[int], ids: list[int], kept: list[int], w: str) -> list[dict]:
    """A call the fully-async client resumed, as one turn per attempt that returned tokens (the hook's
    `attempts`: [new tokens, global_steps]): attempt k's context is the call's prompt with the tokens
    of the attempts before it (llm_server.py resubmits prompt_ids + final_output.token_ids), its
    version its own. Without them (or one attempt), the call is one turn at its oldest version."""
    parts = _pairs(call, ATTEMPTS, w)
    if parts is not None and sum(n for n, _ in parts) != len(ids):
        raise AdapterError(f"{w}: attempts count {sum(n for n, _ in parts)} tokens, the call returned {len(ids)}")
    parts = [p for p in parts or () if p[0]]
    if len(parts) < 2:
        version = _version(call, w) if not parts or parts[0][1] is None else parts[0][1]
        return [{"context": ctx, "ids": kept, "version": version}]
    out, off = [], 0
    for n, version in parts:
        if off >= len(kept):
            break
        out.append({"context": ctx + ids[:off], "ids": kept[off : off + n], "version": version})
        off += n
    return out


def _routes(rec: Mapping[str, Any], calls: list[Any], n_tok: int, where: str) -> dict[str, Any]:
    """Contract 1.3 routed_experts_version and _sha256 of a sample whose agent loop kept the engine's routes
    (R3): `AgentLoopOutput.routed_experts` is the last routed call's routes (ToolAgentLoop replaces them at
    every call, tool_agent_loop.py:274-275), cut at prompt + response_length (:197-198); each of its rows
    has the version of the attempt that produced it (the hook's `routed_experts_versions`, or the call's
    one version when it was not resumed). Rows past the array (the last sampled token, tool output after
    the last generation) are replayed as zeros, masked (agent_loop.py:126-138): null. Unknown
    provenance (a resumed call without `attempt`'s record) writes no versions."""
    out: dict[str, Any] = {}
    sha = rec.get("routed_experts_sha256")
    if sha is not None:
        out["routed_experts_sha256"] = sha256_hex(sha, "routed_experts_sha256", where)
    if rec.get("routed_experts_rows") is None:
        return out
    rows = integer(rec, "routed_experts_rows", where)
    last = next(
        (c for c in reversed(calls) if isinstance(c, Mapping) and c.get("routed_experts_rows") is not None), None
    )
    if last is None:
        return out
    w = f"{where} engine_calls[{calls.index(last)}]"
    have = integer(last, "routed_experts_rows", w)
    # an attempt's routes cover at most the call's context and tokens; a merge may append each attempt's
    seq = len(last.get("prompt_ids") or ()) + len(last.get("token_ids") or ())
    if not 0 <= have <= seq * max(1, len(last.get(ATTEMPTS) or ())) or not 0 <= rows <= have:
        raise AdapterError(
            f"{w}: routed_experts_rows {have} (the sample's {rows}) is not a count of rows the call's attempts routed"
        )
    runs = _pairs(last, ROUTE_RUNS, w)
    if runs is None:
        lo, hi = last.get("min_global_steps"), last.get("max_global_steps")
        version = _version(last, w)
        if version is None or (lo is not None and hi is not None and lo != hi):
            return out  # resumed across an update: which rows each version produced is not recorded
        runs = [(have, version)]
    if sum(n for n, _ in runs) != have:
        raise AdapterError(
            f"{w}: routed_experts_versions cover {sum(n for n, _ in runs)} rows, the call's routes have {have}"
        )
    versions: list[int | None] = []
    for n, v in runs:  # the sample's rows: the call's, cut at prompt + response_length
        versions += [v] * min(n, rows - len(versions))
    out["routed_experts_version"] = versions + [None] * (n_tok - rows)
    return out


def _engine_turns(
    calls: list[Any],
    n_prompt: int,
    resp: list[int],
    mask: list[bool],
    edits: set[int],
    where: str,
    cap: int | None = None,
) -> tuple[list[int], list[dict]]:
    """(response positions sampled by the engine, one turn per call with its context, ids, finish
    reason and weight version). Call t's returned tokens start where its prompt ends; the last call's
    may be cut at response_length (`cap`: its turn then has the ids verl kept); a declared boundary edit
    removes the call's last id from the sequence."""
    policy: list[int] = []
    turns: list[dict[str, Any]] = []
    for t, call in enumerate(calls):
        w = f"{where} engine_calls[{t}]"
        if not isinstance(call, Mapping):
            raise AdapterError(f"{w}: must be {{prompt_ids, token_ids}}")
        ctx = token_ids(need(call, "prompt_ids", w), "prompt_ids", w)
        ids = token_ids(need(call, "token_ids", w), "token_ids", w)
        start = len(ctx) - n_prompt
        if start < 0:
            raise AdapterError(f"{w}: prompt_ids shorter than the sample's prompt_ids")
        last = t == len(calls) - 1
        kept = ids[:-1] if not last and _boundary_edit(ids, start, resp, mask, edits) else ids
        if last:
            kept = _cut(kept, start, resp, cap)
        policy += range(start, min(start + len(kept), len(resp)))
        stop = call.get("stop_reason")
        if stop is not None and not isinstance(stop, str):
            raise AdapterError(f"{w}: stop_reason must be a string")
        parts = _attempt_turns(call, ctx, ids, kept, w)
        for k, part in enumerate(parts):
            turn = {
                "turn_id": len(turns),
                "context_length": len(part["context"]),
                "context_sha256": context_sha256(part["context"]),
                "sampled_token_ids": part["ids"],
            }
            if k == 0 and call.get("template_ids") is not None:
                tmpl = token_ids(call["template_ids"], "template_ids", w)
                turn.update(template_context_length=len(tmpl), template_context_sha256=context_sha256(tmpl))
            if k == len(parts) - 1 and FINISH.get(stop or ""):
                turn["finish_reason"] = FINISH[stop or ""]
            if part["version"] is not None:
                turn["policy_version"] = part["version"]
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
        policy, turns = _engine_turns(calls, len(prompt), resp, mask, edits, where, ctx.get("response_length"))
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
    extra = mapping(rec.get("extra_fields"), "extra_fields", where)
    info = mapping(extra.get("reward_extra_info"), "extra_fields.reward_extra_info", where)
    if info.get("overlong_reward") is not None:
        out["overlong_penalty"] = number(info["overlong_reward"], "reward_extra_info.overlong_reward", where)
    if calls:
        out |= _routes(rec, calls, len(prompt) + len(resp), where)
    n_calls = len(calls) if calls else len(turns)
    out |= _stop(turns[-1].get("finish_reason") if turns else None, n_calls, len(resp), ctx)
    return with_context(out, ctx)


# verl's agent loop keeps a sample cut at response_length with the score the reward function gave
# it, and trains its tokens: nothing drops or re-scores a truncation
POLICY = (
    "verl trains a response cut at response_length with the reward it was scored: truncation = 'penalize' "
    "(set `truncation` in [tool.rollout-audit] if your reward function or filter says otherwise)"
)
# verl's GRPO: (R - mean) / (torch.std + epsilon), torch.std unbiased (ddof 1), epsilon 1e-6
# (core_algos.compute_grpo_outcome_advantage); RLOO: R minus the mean of the others
GRPO_EPSILON = 1e-6
# estimators that group by uid over the whole batch: every row's reward enters its group's statistics,
# whatever its response_mask (core_algos: scores = token_level_rewards.sum(-1), grouped by index)
GROUPED = {
    "grpo",
    "grpo_vectorized",
    "grpo_passk",
    "rloo",
    "rloo_vectorized",
    "opo",
    "gpg",
    "reinforce_plus_plus_baseline",
}
OLD_LOGPROBS = "old_log_probs"  # the actor's recomputation, a second log-prob column (L207: compare_logprobs)
_NO_RETURNS = (
    "verl's `returns` are its estimator's (GRPO/RLOO: the advantages; GAE: advantages + values), not reward-to-go; "
    "the trainer-side record carries them as token_returns only for reinforce_plus_plus at gamma 1"
)
_NO_CRITIC = (
    "verl's batch holds critic values only with a critic (algorithm.adv_estimator=gae, ray_trainer.py:1624-1628); "
    "dump_batch then records values, returns and algorithm.lam"
)
_NO_BATCH = "the dump holds no trainer-side records (add dump_batch after compute_advantage; docs/frameworks/verl.md)"
_MINI = (
    "verl splits the step's batch into ppo_mini_batch_size mini-batches (and ppo_epochs passes), each an "
    "optimizer step with its own denominator; the step-level hook records the numerator tokens, not those denominators"
)
UPDATE_LACKS = {k: _MINI for c in ("reduction", "loss_denominator") for k in (c, f"updates.{c}")}


_SESSIONS = (
    "verl's V1 GRPO forms each group from every session's final output and gives that output's advantage to "
    "the session's other outputs (v1/utils.py:148-217): no per-trajectory group advantage to recompute"
)


def _statistics_rows(members: list[tuple[int, Mapping[str, Any]]]) -> tuple[list[str], bool]:
    """(the rows whose rewards entered the step's group statistics, whether a session has several rows).
    The legacy trainer's estimators read every row; V1's GRPO (`compute_advantage_for_multi_trajectories`,
    v1/utils.py:178-207) reads only each `{uid}_{session_id}` session's final output (its largest index)."""
    ids = [str(rec["request_id"]) for _, rec in members]
    v1_grpo = [rec.get(V1_MODE) is not None and rec.get("adv_estimator") == "grpo" for _, rec in members]
    if not all(v1_grpo):
        return ids, False
    final: dict[str, tuple[int, str]] = {}
    for rid in ids:
        session, _, index = rid.rpartition("_")
        if not session or not index.isdigit():
            return ids, False  # not a TransferQueue key: read as the legacy trainer's rows
        if session not in final or final[session][0] < int(index):
            final[session] = (int(index), rid)
    return [rid for _, rid in final.values()], len(final) < len(ids)


def _estimator(name: str, norm: Any) -> str | None:
    """verl's adv_estimator (and norm_adv_by_std_in_grpo) as the contract's estimator, None when none matches."""
    if name in ("grpo", "grpo_vectorized"):
        return "grpo_no_std" if norm is False else "grpo"
    return "rloo" if name in ("rloo", "rloo_vectorized") else None


def _batch_rows(records: list[tuple[int, Mapping[str, Any]]]) -> dict[str, tuple[int, Mapping[str, Any]]]:
    """The trainer-side records by request_id (with their 1-based position); AdapterError on a record
    without one or a request_id trained twice in one step."""
    out: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for n, rec in records:
        where = getattr(rec, "origin", None) or f"record {n}"
        if "advantages" not in rec:  # the V1 trainer could not read its step back: say which, and why
            said = mapping(rec.get(UNRECORDED), UNRECORDED, where).get("updates")
            raise AdapterError(
                f"{where}: the verl V1 trainer recorded no update for global_steps {short(rec.get('global_steps'))}"
                + (f": {said[:500]!r}" if isinstance(said, str) else "")
            )
        rid = need(rec, "request_id", where)
        if rid is None:
            raise AdapterError(
                f"{where}: request_id is null (the batch's non_tensor_batch has no request_id: "
                "the sampler hook's dump puts it in AgentLoopOutput.extra_fields)"
            )
        if str(rid) in out:
            raise AdapterError(f"{where}: request_id {str(rid)!r} appears in two trainer-side records")
        out[str(rid)] = (n, rec)
    return out


# verl's own generations file, `{global_steps}.jsonl` under trainer.rollout_data_dir: one row per trained
# sample with its decoded `input` / `output`, `gts`, `score` and `step` (legacy ray_trainer.py:454-475,
# the score token_level_scores.sum(-1), :527, and `request_id` when the batch has it, :533-537; V1
# trainer_base.py:1226-1258, the score rm_scores.sum(1), :1308, and `uid` the TransferQueue key, :1331)
GENERATIONS = ("output", "score", "step")
GENERATION_KEYS = ("request_id", "uid")  # the join field: legacy's request_id, else V1's uid (the key)
V1_MODE = "trainer_mode"  # on every record of the V1 trainer (integrations.verl_v1)


def _kind(rec: Any) -> str:
    """Which writer a record is from: the trainer-side record (`advantages`, or the V1 trainer's
    `trainer_mode`), verl's generations file (its `output`, `score`, `step`, no `prompt_ids`), or the
    agent loop (anything else, read as a sample)."""
    if not isinstance(rec, Mapping):
        return "sampler"
    if "advantages" in rec or V1_MODE in rec:
        return "trainer"
    if "prompt_ids" not in rec and all(k in rec for k in GENERATIONS):
        return "generations"
    return "sampler"


Numbered = list[tuple[int, Mapping[str, Any]]]


def _split(records: Iterable[Mapping[str, Any]]) -> tuple[list[Mapping[str, Any]], Numbered, Numbered]:
    """(sampler records, trainer-side records, verl's generations rows), the last two with their position."""
    sampler: list[Mapping[str, Any]] = []
    trainer: Numbered = []
    generations: Numbered = []
    for n, rec in enumerate(records, 1):
        kind = _kind(rec)
        if kind == "sampler":
            sampler.append(rec)
        else:
            (trainer if kind == "trainer" else generations).append((n, rec))
    return sampler, trainer, generations


def _where(rec: Mapping[str, Any], n: int) -> str:
    return getattr(rec, "origin", None) or f"record {n}"


def _same_score(a: float, b: float) -> bool:
    """Equal up to float32 rounding: verl sums float32 token scores (`rm_scores`) for its `score`."""
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _with_generations(rows: list[dict[str, Any]], generations: Numbered) -> list[dict[str, Any]]:
    """The rows with verl's generations file joined by request id (`request_id`, else V1's `uid`): its
    `score` is the sample's reward where the agent loop recorded none (verl scores after the loop
    returns, agent_loop.py:694-695, :822; v1/agent_loop_tq.py:160) and must agree with the one recorded.
    A row that names no sample, names none, or names one twice is an AdapterError naming file, record
    and field."""
    by_id = {r["trajectory_id"]: r for r in rows}
    seen: dict[str, str] = {}
    for n, rec in generations:
        where = _where(rec, n)
        field = next((k for k in GENERATION_KEYS if rec.get(k) is not None), None)
        if field is None:
            raise AdapterError(
                f"{where}: verl generations row has neither request_id (legacy trainer: the agent-loop wrapper "
                "puts it in extra_fields) nor uid (V1 trainer: the TransferQueue key), so it joins no sample"
            )
        key = str(rec[field])
        if key in seen:
            raise AdapterError(f"{where}: {field} {short(key)} is also the row of {seen[key]}")
        seen[key] = where
        row = by_id.get(key)
        if row is None:
            raise AdapterError(f"{where}: {field} {short(key)} matches no agent-loop record's request_id")
        score = number(rec["score"], "score", where)
        if "reward" not in row:
            row["reward"] = score
        elif row["reward"] is not None and not _same_score(row["reward"], score):
            raise AdapterError(
                f"{where}: score {score} differs from the sample's reward {row['reward']} ({field} {key!r})"
            )
    return rows


def _trained(row: dict[str, Any], rec: Mapping[str, Any], n_prompt: int, where: str) -> None:
    """`row` (a sampler row) with what the trainer trained, from its trainer-side record: the mask after
    rollout correction (a token rejection sampling removed is not trainable; a row it removed entirely
    is excluded: null reward), the token reward, KL and (REINFORCE++ at gamma 1) returns, and the
    actor's old log-probs."""
    resp = row["token_ids"][n_prompt:]
    if ints(rec, "responses", where) != resp:
        raise AdapterError(f"{where}: responses differ from the sampler record's response_ids")
    trained = flags(aligned(rec, "response_mask", resp, where), "response_mask", where)
    before = row["loss_mask"][n_prompt:]
    row["loss_mask"] = [False] * n_prompt + [a and b for a, b in zip(before, trained)]
    scores = numbers(aligned(rec, "token_level_scores", resp, where), "token_level_scores", where)
    rewards = numbers(aligned(rec, "token_level_rewards", resp, where), "token_level_rewards", where)
    if "reward" not in row:  # verl scored the sample after its agent loop: its score is the sum (ray_trainer.py:527)
        row["reward"] = sum(x or 0.0 for x in scores)
    if any(before) and not any(trained):
        row["reward"] = None  # rejected whole by rollout correction: neither trained nor a valid outcome
    row["token_reward"] = [0.0] * n_prompt + [s or 0.0 for s in scores]
    row["token_kl"] = [0.0] * n_prompt + [(s or 0.0) - (r or 0.0) for s, r in zip(scores, rewards)]
    if rec.get("adv_estimator") == "reinforce_plus_plus" and rec.get("gamma") in (1, 1.0):
        ret = numbers(aligned(rec, "returns", resp, where), "returns", where)
        row["token_returns"] = [0.0] * n_prompt + [r or 0.0 for r in ret]
    if rec.get("adv_estimator") == "gae" and rec.get("values") is not None:  # the critic's values and GAE's targets
        vals = numbers(aligned(rec, "values", resp, where), "values", where)
        ret = numbers(aligned(rec, "returns", resp, where), "returns", where)
        row["token_values"] = [None] * n_prompt + vals
        row["token_value_targets"] = [None] * n_prompt + ret
        row["gamma"] = number(need(rec, "gamma", where), "gamma", where)
        row["gae_lambda"] = number(need(rec, "lam", where), "lam", where)
    if rec.get("overlong_reward") is not None:  # DAPO's penalty as the trainer's reward manager computed it
        row["overlong_penalty"] = number(rec["overlong_reward"], "overlong_reward", where)
    if rec.get("routed_experts_sha256") is not None:  # the routes the actor replays, as the trainer holds them
        row["routed_experts_sha256"] = sha256_hex(rec["routed_experts_sha256"], "routed_experts_sha256", where)
    if rec.get(OLD_LOGPROBS) is not None:
        old = numbers(aligned(rec, OLD_LOGPROBS, resp, where), OLD_LOGPROBS, where)
        sampled = [s == 2 for s in row["token_source"][n_prompt:]]
        row[OLD_LOGPROBS] = logprobs_column(n_prompt, old, sampled)


def _advantage(rec: Mapping[str, Any], where: str, outcome: bool) -> tuple[float | None, bool]:
    """(the row's advantage, whether it is one value): an outcome estimator writes one value on every
    trained token (None when no token is trained); a per-token estimator (GAE, REINFORCE++) several.
    Under an outcome estimator (`outcome`: one U603 recomputes) a row with several values (another
    row's advantages written under its key, verl#7956) has no advantage of its own: NaN, which U603
    reports against the recomputed one instead of the step losing its advantages."""
    adv = numbers(need(rec, "advantages", where), "advantages", where)
    mask = flags(need(rec, "response_mask", where), "response_mask", where)
    seen = {a for a, m in zip(adv, mask) if m and a is not None}
    if len(seen) > 1:
        return (math.nan, True) if outcome else (None, False)
    return (seen.pop() if seen else None), True


def _with_trainer(rows: list[dict[str, Any]], trainer: list[tuple[int, Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The sampler rows with their trainer-side records applied (rows the trainer has no record of kept as sampled)."""
    by_id = _batch_rows(trainer)
    for row in rows:
        hit = by_id.get(row["trajectory_id"])
        if hit is None:
            continue
        n, rec = hit
        where = f"{getattr(rec, 'origin', None) or f'record {n}'} ({row['trajectory_id']})"
        _trained(row, rec, row["token_source"].count(1), where)
    return rows


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """verl agent-loop records as contract trajectories; with trainer-side records (`dump_batch`), what
    the trainer trained of them."""
    ctx = context_values(context, allowed=OWN_CONTEXT)
    in_range(ctx, BOUNDS)
    sampler, trainer, generations = _split(list(records))
    rows = with_top_k(rows_of(sampler, row, ctx), ctx.get("top_k"))
    settings: dict[str, Any] = {"truncation": "penalize"}
    said = POLICY
    if all(k in ctx for k in OVERLONG_CONTEXT):  # DAPO's overlong buffer, as the run configured it
        settings |= {key: ctx[k] for k, key in OVERLONG_CONTEXT.items()}
        said += "; R414 recomputes DAPO's overlong penalty from max_resp_len, overlong_buffer_len and overlong_penalty_factor"
    if trainer:
        rows = _with_trainer(rows, trainer)
        if any(OLD_LOGPROBS in r for r in rows):
            settings["compare_logprobs"] = OLD_LOGPROBS
            said += "; L207 compares the engine's log-probs with the actor's old_log_probs (compare_logprobs)"
        if any(r[1].get("adv_estimator") in ("grpo", "grpo_vectorized") for r in trainer):
            settings["grpo_epsilon"] = GRPO_EPSILON
    if generations:
        rows = _with_generations(rows, generations)
    old = [r.pop(OLD_LOGPROBS, None) for r in rows]
    lacks_ = {**LACKS, "token_returns": _NO_RETURNS, **{k: _NO_CRITIC for k in CRITIC}} if trainer else LACKS
    # a recorder's own reasons (the agent loop's, the V1 trainer's) in place of the adapter's
    table = contract_table(rows, declared([*sampler, *(r for _, r in trainer)], lacks_))
    if any(o is not None for o in old):
        meta = table.schema.metadata
        table = table.append_column(OLD_LOGPROBS, pa.array(old, pa.list_(pa.float32()))).replace_schema_metadata(meta)
    return with_trainer_settings(table, said, **settings)


def updates(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table | None:
    """One update record per `global_steps` of the trainer-side records (None without them): the rows
    the step trained (request_id) with their advantage (one value per row for outcome estimators), the
    tokens each put in the loss's numerator (`response_mask` after rollout correction), and the rows whose
    rewards entered the group statistics (every row of the batch, for estimators that group by uid)."""
    context_values(context, allowed=OWN_CONTEXT)
    _, trainer, _ = _split(list(records))
    if not trainer:
        return None
    _batch_rows(trainer)  # one record per request_id, each named
    steps: dict[tuple[int, int], list[tuple[int, Mapping[str, Any]]]] = {}
    sync: dict[tuple[int, int], int] = {}
    for n, rec in trainer:
        where = getattr(rec, "origin", None) or f"record {n}"
        key = (integer(rec, "global_steps", where), integer(rec, V1_STEP, where) if rec.get(V1_STEP) is not None else 0)
        steps.setdefault(key, []).append((n, rec))
        if rec.get("parameter_sync_step") is not None:
            sync[key] = integer(rec, "parameter_sync_step", where)
    rows: list[Mapping[str, Any]] = []
    lacks_ = dict(UPDATE_LACKS)
    for (step, local), members in sorted(steps.items()):
        ids, advs, counts, scalar = [], [], [], True
        names = {str(r.get("adv_estimator")) for _, r in members}
        norms = {r.get("norm_adv_by_std_in_grpo") for _, r in members}
        stat, shared = _statistics_rows(members)
        name = names.pop() if len(names) == 1 else None
        kl = any(r.get("use_kl_in_reward") for _, r in members)
        estimator = _estimator(name, norms.pop() if len(norms) == 1 else None) if name else None
        for n, rec in members:
            where = getattr(rec, "origin", None) or f"record {n}"
            count = sum(flags(need(rec, "response_mask", where), "response_mask", where))
            if not count:  # rejected whole (or nothing to train): the loss reads none of its tokens
                continue
            ids.append(str(rec["request_id"]))
            adv, one = _advantage(rec, where, estimator is not None)
            scalar &= one
            advs.append(adv)
            counts.append(count)
        u: dict[str, Any] = {
            # one update per advantage step: V1 runs parameter_sync_step of them per global step (`_step_once`)
            "update_step": (step - 1) * sync[(step, local)] + local + 1 if (step, local) in sync else step,
            # the weights the step starts from were pushed to the engines as version global_steps - 1
            # (legacy and V1 `update_weights(global_steps)` after each step, v1/trainer_sync.py:33, :36-38)
            "trainer_version": step - 1,
            "trajectory_ids": ids,
            "numerator_tokens": counts,
        }
        if scalar:
            u["advantages"] = advs
        if estimator and scalar and not kl and not shared:
            u["advantage_estimator"] = estimator
        else:
            why = (
                "algorithm.use_kl_in_reward: the estimator's input is the reward minus the KL, not the episode reward"
                if kl
                else _SESSIONS
                if shared
                else f"verl's estimator {name!r} has no contract counterpart (U603 recomputes grpo, grpo_no_std, rloo)"
            )
            lacks_ |= {"advantage_estimator": why, "updates.advantage_estimator": why}
        if name in GROUPED:
            u["stat_trajectory_ids"] = stat
        rows.append(u)
    table = records_to_table(rows, kind="updates")
    meta = {**(table.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(lacks_, sort_keys=True).encode()}
    return table.replace_schema_metadata(meta)


def with_top_k(rows: list[dict[str, Any]], top_k: int | None) -> list[dict[str, Any]]:
    """Each turn's top-k cut-off (contract 1.3 turns.top_k), from the run's `rollout.top_k`: verl sends
    that one value to the engine with every generate call (agent_loop.py:593), so every turn of every
    sample was sampled under it. Not given: not recorded (replay then assumes none)."""
    if top_k is None:
        return rows
    for r in rows:
        for turn in r.get("turns") or ():
            turn["top_k"] = top_k
    return rows
