"""verifiers: `RolloutOutput` records with their `trajectory` (`vf-eval --state-columns trajectory`,
results.jsonl; verifiers/types.py) to contract trajectories.

Each `TrajectoryStep` is one turn: `tokens.prompt_ids` / `completion_ids` / `completion_mask` /
`completion_logprobs` are what the trainer gets, merged cumulatively as prime-rl does (a step whose
prompt extends the running sequence adds its new prompt tokens as observation); the step's raw
`response` gives the engine's side: `prompt_token_ids` (vLLM `return_token_ids`, the context the engine
really had, for M105) and `choices[0].finish_reason`. The rollout's `stop_condition`, `is_truncated`
and `error` give the stop cause; `sampling_args` the decoding parameters when recorded."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from . import verifiers_v1 as v1
from .base import (
    AdapterError,
    at_record,
    context_values,
    contract_table,
    need,
    objects,
    origin,
    short,
    wholes,
    with_trainer_settings,
)
from .steps import (
    Call,
    engine_context,
    finish_reason,
    guarded,
    identity,
    identity_lacks,
    merge,
    option,
    stop_columns,
)

# stop_condition (the name of the @vf.stop method that ended the rollout) -> (flag, stop_reason)
STOP = {
    "has_error": ("infra_error", "env_error"),
    "prompt_too_long": ("truncated", "max_tokens"),
    "max_turns_reached": ("truncated", "max_turns"),
    "timeout_reached": ("truncated", "timeout"),
    "no_tools_called": ("terminated", "end_of_sequence"),
}

# verifiers' own keyword context: the weight version that sampled the rollouts (it records none), and
# the trainer the rollouts feed, whose truncation policy the audit then follows (a trace does not say)
OWN_CONTEXT: dict[str, type] = {"policy_version": int, "trainer": str}

# trainer -> (what it does with a truncated trace, the audit's truncation policy), read at prime-rl
# 559b447: `iter_trainable_traces` (orchestrator/algo/base.py:35-42) drops only errored traces and
# untrainable agents, and every algorithm scores the rest from `Trace.reward` (algo/grpo.py:25-45,
# max_rl.py:22-28, rae.py, hierarchical_grpo.py): a truncated trace is trained with its score.
TRAINERS = {
    "prime-rl": (
        "prime-rl trains every error-free trace of a trainable agent with its reward, truncated or not "
        "(orchestrator/algo/base.py:35-42 drops only has_error and untrainable traces; algo/grpo.py:25-45 "
        "credits Trace.reward): a reward on a truncated trace is the trainer's choice",
        "penalize",
    ),
}


def trainer_truncation(context: Mapping[str, Any]) -> tuple[str, str] | None:
    """(said, truncation) of the trainer named by `--context trainer=...`, None when none is named;
    an unknown trainer is an AdapterError naming the ones known (never a guessed policy)."""
    name = context.get("trainer")
    if name is None:
        return None
    if name not in TRAINERS:
        raise AdapterError(f"context 'trainer': unknown trainer {name!r}; known: {', '.join(TRAINERS)}")
    said, truncation = TRAINERS[name]
    return f"{said}: truncation = {truncation!r} (--context trainer={name})", truncation


LOSS_LACKS = (
    "node loss_weights are named by the trainer that stamps them: pass --context trainer=prime-rl to read "
    "them as prime-rl trains them (rl: the policy-gradient loss, ce: the echo cross-entropy)"
)
CONTEXT_LACKS = (
    "the engine's own prompt ids are not recorded (a legacy step's response without vLLM prompt_token_ids; "
    "a v1 Trace keeps the tokens on its nodes, not the engine's context per call)"
)
LACKS = {
    **identity_lacks(
        "verifiers",
        {
            "environment_id": "an environment id per rollout",
            "environment_version": "an environment version per rollout",
            "verifier_version": "a rubric version",
            "reset_seed": "a reset seed",
            "tokenizer_id": "the tokenizer identity",
        },
    ),
    "turns.policy_version": "verifiers does not record the policy version that sampled a turn; "
    "pass --context policy_version=...",
    "turns.context_length": CONTEXT_LACKS,
    "turns.context_sha256": CONTEXT_LACKS,
    "turns.temperature": "the rollout has no sampling_args; pass --context temperature=...",
    "turns.top_p": "the rollout has no sampling_args; pass --context top_p=...",
    "turns.logprob": "verifiers records token log-probs, not a per-turn log-prob",
    "turns.num_policy_tokens": "verifiers does not count policy tokens per step",
    "num_trainable_tokens": "verifiers does not count trainable tokens per rollout",
    "verifier_success": "verifiers records rewards and metrics, not a verdict",
    "initial_state_checksum": "verifiers does not record environment state",
    "loss_stream": LOSS_LACKS,
    "loss_weight": LOSS_LACKS,
    "routed_experts_version": "no node carries routed_experts, or the version of the engine calls is not "
    "recorded: a Trace has none, and an Episode's run.work.policy gives one only when it starts and ends "
    "at one version (its routes then keep only routed_experts_sha256)",
    "routed_experts_sha256": "no node carries routed_experts, or the nodes' routes do not tile the branch "
    "(verifiers' Branch.routed_experts is then None and the trainer replays none)",
}


def _stop(rollout: Mapping[str, Any]) -> dict[str, Any]:
    """Flags and stop_reason: an error is infra_error; a named stop condition maps by STOP; otherwise
    is_truncated says truncated (max_tokens), else the condition's own name is kept (or "unknown")
    with the rollout terminated, so T302 asks for it in extra_stop_reasons rather than a guess."""
    cond = rollout.get("stop_condition")
    if cond is not None and not isinstance(cond, str):
        raise AdapterError(f"stop_condition: expected a condition's name, got {short(cond)}")
    if rollout.get("error"):
        flag, stop = "infra_error", "env_error"
    elif cond in STOP:
        flag, stop = STOP[cond]
    elif rollout.get("is_truncated"):
        flag, stop = "truncated", "max_tokens"
    else:
        flag, stop = "terminated", str(cond or "unknown")
    return stop_columns(flag, stop)


def _sampling(rollout: Mapping[str, Any], context: Mapping[str, Any]) -> dict[str, Any]:
    """temperature / top_p of the rollout's sampling_args when recorded, else from the context."""
    args = rollout.get("sampling_args") or {}
    out = {}
    for k in ("temperature", "top_p"):
        v = args.get(k) if isinstance(args, Mapping) else None
        v = option({k: v}, k, "sampling_args") if v is not None else option(context, k)
        if v is not None:
            out[k] = v
    return out


def _call(step: Mapping[str, Any], where: str, turn: dict[str, Any]) -> Call:
    """A TrajectoryStep as an engine call (its tokens, and the engine's context from its response)."""
    tokens = need(step, "tokens", where)
    if not isinstance(tokens, Mapping):
        raise AdapterError(f"{where}: tokens is {'null' if tokens is None else 'not an object'} (no token data)")
    sampled = need(tokens, "completion_ids", f"{where}.tokens")
    raw = step.get("response")
    response: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    choices = response.get("choices") or [{}]
    first = choices[0] if isinstance(choices, list) and isinstance(choices[0], Mapping) else {}
    turn = {
        **turn,
        "finish_reason": finish_reason(first.get("finish_reason")),
        "sampled_token_ids": wholes(sampled, "completion_ids", f"{where}.tokens"),
        "reward": step.get("reward"),
        **engine_context(response.get("prompt_token_ids")),
    }
    return Call(
        need(tokens, "prompt_ids", f"{where}.tokens"),
        sampled,
        need(tokens, "completion_logprobs", f"{where}.tokens"),
        turn,
        need(tokens, "completion_mask", f"{where}.tokens"),
    )


def _trajectories(rollout: Mapping[str, Any], n: int, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Contract records of one rollout."""
    example = need(rollout, "example_id", f"rollout {n}")
    tid = str(rollout.get("trajectory_id") or f"example-{example}/rollout-{n}")
    where = f"rollout {tid}"
    turn: dict[str, Any] = _sampling(rollout, context)
    if context.get("policy_version") is not None:
        turn["policy_version"] = option(context, "policy_version")
    steps = objects(need(rollout, "trajectory", where), "trajectory", where)
    calls = [_call(s, f"{where} step {i}", turn) for i, s in enumerate(steps)]
    segments = merge(calls, where)
    stop = _stop(rollout)
    return [
        {
            "trajectory_id": tid + (f"#{j}" if len(segments) > 1 else ""),
            "task_id": str(example),
            "group_id": str(example),
            **identity(context),
            **seg.columns(),
            **stop,
            "reward": need(rollout, "reward", where),
        }
        for j, seg in enumerate(segments)
    ]


def _reader(record: Mapping[str, Any]):
    """The reader of a record: a v1 Episode (its `traces`), a v1 Trace (its `nodes`), else a legacy rollout."""
    return v1.episode if "traces" in record else v1.trajectories if "nodes" in record else _trajectories


@guarded("verifiers")
def to_contract(records: Iterable[dict], **context: Any) -> pa.Table:
    """Contract trajectories from verifiers `RolloutOutput` records with a `trajectory`, or v1 `Trace` records."""
    context = context_values(context, allowed=OWN_CONTEXT)
    rows: list[dict[str, Any]] = [
        {**r, **origin(ro)} for n, ro in enumerate(records) for r in at_record(ro, _reader(ro), ro, n, context)
    ]
    second = [r.pop(v1.TRAINER_LOGPROBS, None) for r in rows]
    table = contract_table(rows, LACKS, "verifiers")
    settings: dict[str, Any] = {}
    said = []
    if any(x is not None for x in second):  # L207: the engine's log-probs against the trainer's
        table = table.append_column(v1.TRAINER_LOGPROBS, pa.array(second, pa.list_(pa.float32())))
        settings["compare_logprobs"] = v1.TRAINER_LOGPROBS
        said.append("the trace's trainer_logprobs are compared with its engine log-probs (compare_logprobs)")
    policy = trainer_truncation(context)
    if policy is not None:
        said.insert(0, policy[0])
        settings["truncation"] = policy[1]
    return with_trainer_settings(table, "; ".join(said), **settings) if settings else table
