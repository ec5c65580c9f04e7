"""SkyRL: `GeneratorOutput` (skyrl/train/generators/base.py) and the trainer's `TrainingInputBatch`
(skyrl/train/trainer.py) to contract tables.

Sampler side: one record per row of the generator's output, written by the dump hook
(docs/frameworks/skyrl.md): the row's element of each `GeneratorOutput` list under the list's own
name (`prompt_token_ids`, `response_ids`, `loss_masks`, `rollout_logprobs`, `rewards`,
`stop_reasons`, `is_last_step`, `trajectory_ids` as `{instance_id, repetition_id}`), `global_step`
from the batch's `BatchMetadata`, and `engine_calls`: per inference-engine call of the agent loop the
`prompt_token_ids` it was given and the `response_ids` it returned, before SkyRL appends anything.

Provenance comes from `engine_calls` (call t's ids sit right after its prompt), independently of
`loss_masks`, so M101/M102 compare the trainer's mask with what the engine sampled. A record without
`engine_calls` has no provenance: `token_source` is declared not recorded and the checks that need
it do not run (never derived from the mask under test).

A dump of several steps repeats `instance_id`/`repetition_id` (the dataset index and the sample
number, drawn again every epoch), so the step is part of the identity: trajectory
`{step}/{instance_id}_{repetition_id}`, group `{step}/{instance_id}`, with the step from the
record's `global_step` (the fully-async hook: `global_step_when_scheduled`) or else the dump
file's name (`skyrl-{step}.jsonl`, `global_step_{step}_...`).

Step-wise training (`generator.step_wise_trajectories`) writes one row per turn, the episode's rows
sharing its trajectory id, its last row `is_last_step`. Each row is a sequence the trainer trains on
its own, so it becomes one segment of the episode (contract 1.2 `split_from`): `{episode}#{k}`, the
outcome (stop cause, reward) on the last row only, as SkyRL uses the last step's reward.

Trainer side: one record per row of the `TrainingInputBatch` after `compute_advantages_and_returns`
(`advantages`, `loss_mask`, `response_mask` over the row's response, the row's `trajectory_ids` and
`is_last_step`, the algorithm's `advantage_estimator` and `grpo_norm_by_std`): `updates` writes one
update per step with each row's advantage, its trainable-token count and the rows whose rewards
formed the group statistics.

Contract 1.3: `rollout_expert_indices` gives `routed_experts_sha256`, and with the agent-loop hook's
per-call route fields `routed_experts_version` (`_routes`, routes.py); the DAPO example trainer's
`overlong_penalty` is read as recorded, its settings (`max_generate_length`, `overlong_buffer_len`,
`overlong_buffer_penalty_factor`) taken as context and declared with the policy for R414.

The generator's `zero_reward_on_non_stop` and `apply_overlong_filtering` (GeneratorConfig) are
applied before the dump and are not in it: the context gives them, and the trainer settings they
imply is declared with the table (`with_trainer_settings`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract import schema as S
from ..contract.config import LOG_BOUNDS
from ..contract.schema import STOP_FLAGS, context_sha256
from ..reading.records import records_to_table
from .base import (
    AdapterError,
    aligned,
    context_values,
    contract_table,
    declared,
    flags,
    in_range,
    ints,
    lacks,
    logprobs_column,
    need,
    number,
    numbers,
    objects,
    rows_of,
    runs,
    short,
    step_of,
    token_columns,
    token_ids,
    whole,
    with_context,
    with_trainer_settings,
)
from .routes import call_routes, digest, expert_array, replayed
from .steps import divergence

# stop_reasons value -> (flag, contract stop_reason): what SkyRL's generator writes
STOPS = {
    "stop": ("terminated", "end_of_sequence"),  # the last turn ended and the environment said done
    "length": ("truncated", "max_tokens"),  # the engine's token limit, or the context budget exceeded
    "abort": ("infra_error", "engine_error"),  # the engine aborted the request
}
# SkyRL's names of the DAPO settings -> the audit configuration keys R414 reads
DAPO = {"max_generate_length": int, "overlong_buffer_len": int, "overlong_buffer_penalty_factor": float}
# what each may be: a budget and a buffer of at least one token, within what an audit configuration
# accepts; a factor of 0 or more
DAPO_BOUNDS: dict[str, tuple[float | None, float | None]] = {
    "max_generate_length": (1, LOG_BOUNDS["max_response_tokens"]),
    "overlong_buffer_len": (1, LOG_BOUNDS["max_response_tokens"]),
    "overlong_buffer_penalty_factor": (0, None),
}
DAPO_SETTINGS = {
    "max_generate_length": "max_response_tokens",
    "overlong_buffer_len": "overlong_buffer",
    "overlong_buffer_penalty_factor": "overlong_penalty_factor",
}
# GeneratorConfig (skyrl/train/config/config.py) flags the dump does not carry; both default False
CONTEXT = {
    "zero_reward_on_non_stop": bool,
    "apply_overlong_filtering": bool,
    # the DAPO example's soft overlong punishment (examples/train/algorithms/dapo/main_dapo.py:21-25, :59)
    **DAPO,
}
_STEP_IN_NAME = re.compile(r"(?:skyrl-|global_step_)(\d+)")
STEP_FIELDS = ("global_step", "global_step_when_scheduled")
TRAINER = "advantages"  # a trainer-side record (TrainingInputBatch row) carries it; a generator row does not
OUTCOME = ("terminated", "truncated", "infra_error", "stop_reason", "reward")

_NO_CALLS = "the records carry no engine_calls (add the hook's lines in SkyRLGymGenerator.agent_loop)"
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
    "token_source": "provenance not recorded: " + _NO_CALLS + "; SkyRL's loss_masks is the mask under test",
    "turns.context_length": _NO_CALLS,
    "turns.context_sha256": _NO_CALLS,
    "turns.sampled_token_ids": _NO_CALLS,
    "routed_experts_sha256": "the records carry no rollout_expert_indices (SkyRL returns them with "
    "generator.inference_engine.enable_return_routed_experts)",
    "routed_experts_version": "the records carry no rollout_expert_indices, or their engine calls no "
    "rollout_expert_indices_start, _rows and _len (the agent-loop hook's lines)",
    "overlong_penalty": "SkyRL adds no overlong penalty to the reward; its apply_overlong_filtering masks instead "
    "(generators/utils.py:349-371); the DAPO example's trainer records it with the hook in its "
    "postprocess_generator_output",
    "loss_weight": "SkyRL weighs every loss-mask token alike: no per-token loss weight (generators/base.py:37-63)",
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


def _engine_turns(calls: Any, n_prompt: int, n_resp: int, where: str) -> tuple[list[bool], list[dict], list[int]]:
    """(response positions the engine sampled, one turn per call, where each turn starts). Call t's
    `response_ids` start where its `prompt_token_ids` end: the agent loop's context is the prompt
    and the response so far (token-in-token-out)."""
    sampled = [False] * n_resp
    turns, starts = [], []
    for t, call in enumerate(objects(calls, "engine_calls", where)):
        w = f"{where} engine_calls[{t}]"
        ctx = token_ids(need(call, "prompt_token_ids", w), "prompt_token_ids", w)
        ids = token_ids(need(call, "response_ids", w), "response_ids", w)
        start = len(ctx) - n_prompt
        if not 0 <= start <= n_resp:
            raise AdapterError(f"{w}: prompt_token_ids ({len(ctx)}) do not end inside the row's response")
        end = min(start + len(ids), n_resp)
        sampled[start:end] = [True] * (end - start)
        turns.append(
            {"turn_id": t, "context_length": len(ctx), "context_sha256": context_sha256(ctx), "sampled_token_ids": ids}
        )
        starts.append(start)
    return sampled, turns, starts


def row(rec: Mapping[str, Any], n: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """One SkyRL generator row as a contract row."""
    step = step_of(rec, STEP_FIELDS, _STEP_IN_NAME, f"record {n}")
    traj, task, group = _trajectory(rec, n, step)
    where = f"record {n} ({traj})"
    prompt = ints(rec, "prompt_token_ids", where)
    resp = ints(rec, "response_ids", where)
    mask = flags(aligned(rec, "loss_masks", resp, where), "loss_masks", where)
    if rec.get("engine_calls") is not None:
        sampled, turns, starts = _engine_turns(rec["engine_calls"], len(prompt), len(resp), where)
    else:  # no provenance: the turns are the runs of the mask, token_source is not written
        spans = runs(mask)
        sampled, turns, starts = mask, [{"turn_id": t} for t in range(len(spans))], [a for a, _ in spans]
    out: dict[str, Any] = {
        "trajectory_id": traj,
        "task_id": task,
        "group_id": group,
        **token_columns(prompt, resp, sampled, mask, starts),
        "turns": turns,
        "reward": _reward(need(rec, "rewards", where), where),
    }
    if rec.get("engine_calls") is None:
        del out["token_source"]
    key = "global_step_when_scheduled" if rec.get("global_step_when_scheduled") is not None else "global_step"
    if rec.get(key) is not None:
        version = whole(rec[key], key, where)
        for t in out["turns"]:
            t["policy_version"] = version
    if rec.get("rollout_logprobs") is not None:
        lp = numbers(aligned(rec, "rollout_logprobs", mask, where), "rollout_logprobs", where)
        out["behavior_logprobs"] = logprobs_column(len(prompt), lp, sampled)
    out.update(_routes(rec, len(prompt) + len(resp), out["turns"], where))
    if rec.get("overlong_penalty") is not None:
        out["overlong_penalty"] = number(rec["overlong_penalty"], "overlong_penalty", where)
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


def _routes(rec: Mapping[str, Any], n_tokens: int, turns: list[dict], where: str) -> dict[str, Any]:
    """Routing replay (contract 1.3) from the row's `rollout_expert_indices` (GeneratorOutput,
    base.py:54): the digest of its rows always; each row's version when every engine call carries
    the hook's `rollout_expert_indices_start` (the first position the engine routed: 0 at a956457,
    which routes the call's whole input), `rollout_expert_indices_rows` (the rows it returned) and
    `rollout_expert_indices_len` (the agent loop's row count after its update, routes.py) and the row
    its policy version (SkyRL records one per batch, so every call has it). The trainer places the
    rows from the sequence's start and pads the rest (skyrl/train/dataset/preprocess.py:256-272)."""
    value = rec.get("rollout_expert_indices")
    if value is None:
        return {}
    arr = expert_array(value, "rollout_expert_indices", where)
    out: dict[str, Any] = {"routed_experts_sha256": digest(arr)}
    version = turns[0].get("policy_version") if turns else None
    calls = rec.get("engine_calls")
    if calls and version is not None:
        calls = objects(calls, "engine_calls", where)
        keys = ("rollout_expert_indices_start", "rollout_expert_indices_rows", "rollout_expert_indices_len")
        rows = call_routes(calls, [version] * len(calls), keys, where, n_tokens + len(arr))
        if rows is not None:
            out["routed_experts_version"] = replayed(rows, len(arr), n_tokens, True, where)
    return out


def _last_step(rec: Mapping[str, Any], where: str) -> bool | None:
    value = rec.get("is_last_step")
    if value is not None and not isinstance(value, bool):
        raise AdapterError(f"{where}: is_last_step must be true or false, got {short(value)}")
    return value


def _segments(rows: list[dict[str, Any]], records: list[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Step-wise rows as segments of their episodes: an episode is the rows of one trajectory id, in
    order, ending with the one row marked `is_last_step`; each row is trained as its own sequence."""
    by_episode: dict[str, list[int]] = {}
    for i, r in enumerate(rows):
        by_episode.setdefault(r["trajectory_id"], []).append(i)
    for episode, members in by_episode.items():
        last = [_last_step(records[i], f"record {i + 1}") for i in members]
        if last[-1] is not True or any(last[:-1]):
            at = getattr(records[members[-1]], "origin", None) or f"record {members[-1] + 1}"
            raise AdapterError(
                f"{at}: step-wise rows of trajectory {episode}: is_last_step must be true on its last row only "
                f"(got {last}); SkyRL assigns each step to its episode by is_last_step, so the dump is not read"
            )
        if len(members) == 1:
            continue
        prev: list[int] | None = None
        for k, i in enumerate(members):
            r = rows[i]
            r["trajectory_id"], r["split_from"], r["split_continues"] = f"{episode}#{k}", episode, k < len(members) - 1
            if prev is not None and r["token_ids"][: len(prev)] != prev:  # the context did not extend the last row
                r.update(divergence(prev, r["token_ids"]))
            prev = r["token_ids"]
            if r["split_continues"]:
                r.update({f: None for f in OUTCOME if f in r})
                r.pop("loss_excluded", None)
    return rows


def _samples(records: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The generator rows of a dump (the trainer-side records left out)."""
    return [r for r in records if TRAINER not in r]


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """SkyRL generator rows as contract trajectories (context: the generator's
    zero_reward_on_non_stop and apply_overlong_filtering, which the dump does not carry)."""
    ctx = context_values(context, CONTEXT)
    in_range(ctx, DAPO_BOUNDS)
    recs = _samples(records)
    rows = rows_of(recs, row, ctx)
    if any(r.get("is_last_step") is not None for r in recs):
        rows = _segments(rows, recs)
    _zero_variance_filtered(rows, list(records))
    table = contract_table(rows, declared(recs, LACKS))
    return with_trainer_settings(table, policy(ctx), truncation="penalize", **dapo_settings(ctx))


def dapo_settings(ctx: Mapping[str, Any]) -> dict[str, Any]:
    """The audit settings of the DAPO trainer's soft overlong punishment, when the context gives all
    three (main_dapo.py:46-47, :59: the budget is `generator.sampling_params.max_generate_length`)."""
    if not all(k in ctx for k in DAPO):
        return {}
    return {DAPO_SETTINGS[k]: ctx[k] for k in DAPO}


def _zero_variance_filtered(rows: list[dict[str, Any]], records: list[Mapping[str, Any]]) -> None:
    """Rows SkyRL's `trainer.algorithm.zero_variance_filter` took out of the loss after the sampler hook
    (trainer.py:1086-1101): the trainer's `loss_mask` is all 0 where the generator's was not, and the
    row's group has no reward spread among its live rows (trainer_utils.py:629-670, tolerance 1e-6 by
    default). They are recorded as the trainer trains them: loss mask all false, `loss_excluded` (the
    reward stays in the group statistics). A row zeroed otherwise is left as dumped, for U607 to report."""
    trainer = _trainer_rows(records)
    if not trainer:
        return
    zeroed = {
        ids[0]
        for (_, rec, where), ids in zip(trainer, _row_ids(trainer))
        if not any(flags(need(rec, "loss_mask", where), "loss_mask", where))
    }
    live: dict[str, list[float]] = {}
    for r in rows:
        if any(r["loss_mask"]) and r.get("reward") is not None:
            live.setdefault(r["group_id"], []).append(r["reward"])
    for r in rows:
        rewards = live.get(r["group_id"], [])
        flat = len(rewards) > 1 and max(rewards) - min(rewards) <= 1e-6
        if r["trajectory_id"] in zeroed and any(r["loss_mask"]) and flat:
            r["loss_mask"] = [False] * len(r["loss_mask"])
            r["loss_excluded"] = True


# ---------------------------------------------------------------- the trainer side

# trainer.algorithm.advantage_estimator (and grpo_norm_by_std) -> the contract's estimator
ESTIMATORS = {("grpo", True): "grpo", ("grpo", False): "grpo_no_std", ("rloo", True): "rloo", ("rloo", False): "rloo"}
_NO_REDUCTION = (
    "SkyRL's trainer-side record carries the advantages and loss masks, not the loss reduction's denominator "
    "(trainer.algorithm.loss_reduction over each micro-batch)"
)
_NO_VERSION = "SkyRL's training batch does not record the weight version the update starts from"
UPDATE_LACKS = {
    "reduction": _NO_REDUCTION,
    "loss_denominator": _NO_REDUCTION,
    "updates.reduction": _NO_REDUCTION,
    "updates.loss_denominator": _NO_REDUCTION,
    "trainer_version": _NO_VERSION,
    "updates.trainer_version": _NO_VERSION,
}


def _trainer_rows(records: Iterable[Mapping[str, Any]]) -> list[tuple[int, Mapping[str, Any], str]]:
    """(step, record, where) of every trainer-side record."""
    out = []
    for n, rec in enumerate(records, 1):
        if TRAINER not in rec:
            continue
        where = f"{getattr(rec, 'origin', None) or f'record {n}'}: trainer record"
        step = step_of(rec, ("global_step",), _STEP_IN_NAME, where)
        out.append((-1 if step is None else step, rec, where))
    return out


def _row_ids(rows: list[tuple[int, Mapping[str, Any], str]]) -> list[tuple[str, str, bool, str]]:
    """(contract trajectory id, instance id, whether the row's reward formed the statistics, contract
    group id) of each trainer row, named as `to_contract` names the generator's rows (step-wise:
    `{episode}#{k}`)."""
    ids: list[tuple[str, str, bool | None, int, str]] = []
    counts: dict[str, int] = {}
    for step, rec, where in rows:
        # the fully-async trainer trains a group at a later step than the one that named its rows
        named = rec.get("global_step_when_scheduled")
        at = whole(named, "global_step_when_scheduled", where) if named is not None else step
        traj, task, group = _trajectory(rec, 0, None if at < 0 else at)
        last = _last_step(rec, where)
        k = counts.get(traj, 0)
        counts[traj] = k + 1
        ids.append((traj, task, last, k, group))
    totals = dict(counts)
    return [
        (f"{traj}#{k}" if last is not None and totals[traj] > 1 else traj, task, last is not False, group)
        for traj, task, last, k, group in ids
    ]


def _advantage(rec: Mapping[str, Any], where: str) -> float:
    """The row's advantage: SkyRL's outcome estimators give one value per row, broadcast over its
    response mask (trainer.py:1179); the value on its first response token (0.0 when it has none)."""
    adv = numbers(need(rec, "advantages", where), "advantages", where)
    resp = flags(aligned(rec, "response_mask", adv, where), "response_mask", where)
    first = next((i for i, m in enumerate(resp) if m), None)
    value = None if first is None else adv[first]
    return 0.0 if value is None else float(value)


def updates(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table | None:
    """One update per training step from the trainer-side records: each row's advantage (for an
    outcome estimator the audit can recompute), its trainable-token count (`loss_mask`, the numerator
    of SkyRL's masked loss) and the rows whose rewards formed the group statistics (step-wise: the
    last steps, trainer.py:1159-1170). None when the dump has no trainer-side record."""
    context_values(context, CONTEXT)
    rows = _trainer_rows(records)
    if not rows:
        return None
    named = _row_ids(rows)
    out: list[Mapping[str, Any]] = []
    for step in dict.fromkeys(s for s, _, _ in rows):
        members = [(rec, where, ids) for (s, rec, where), ids in zip(rows, named) if s == step]
        rec0, where0 = members[0][0], members[0][1]
        upd: dict[str, Any] = {
            "update_step": max(step, 0),
            "trajectory_ids": [ids[0] for _, _, ids in members],
            "numerator_tokens": [
                sum(flags(need(rec, "loss_mask", where), "loss_mask", where)) for rec, where, _ in members
            ],
            "stat_trajectory_ids": [ids[0] for _, _, ids in members if ids[2]],
        }
        est = (rec0.get("advantage_estimator"), bool(rec0.get("grpo_norm_by_std", True)))
        groups: dict[str, int] = {}
        named_as: dict[str, set[str]] = {}
        for _, _, ids in members:
            if ids[2]:
                groups[ids[1]] = groups.get(ids[1], 0) + 1
                named_as.setdefault(ids[1], set()).add(ids[3])
        # SkyRL's GRPO gives a group of one mean 0 and std 1 (ppo_utils.py:1378-1380), where the
        # contract's GRPO gives 0; and it groups a batch by uid, the instance id (trainer.py:1151-1215):
        # the fully-async trainer can train two groups of one prompt, scheduled at different steps
        # (two contract groups), as one. Such an update's advantages are not written
        pooled = any(len(g) > 1 for g in named_as.values())
        if est in ESTIMATORS and all(c > 1 for c in groups.values()) and not pooled:
            upd["advantages"] = [_advantage(rec, where) for rec, where, _ in members]
            upd["advantage_estimator"] = ESTIMATORS[est]
        elif est[0] is None:
            raise AdapterError(f"{where0}: missing field 'advantage_estimator'")
        out.append(upd)
    table = records_to_table(out, kind="updates")
    meta = {**(table.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(UPDATE_LACKS, sort_keys=True).encode()}
    return table.replace_schema_metadata(meta)
