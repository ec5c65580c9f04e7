"""TRL: contract records from `GRPOTrainer`'s batch, and the audit policy TRL's configuration implies.

`records_from_batch` reads the dict exactly as `GRPOTrainer._generate_and_score_completions`
returns it (padded tensors and masks) and `update_from_step` the micro-batch `compute_loss`
trains on. They carry only what TRL recorded: a column TRL lacks is left out and named in the
file metadata `rollout_log.not_recorded` with the reason, so the checks that need it are
reported as not run with "TRL does not record ...". `trainer_policy` states the truncation
policy a `GRPOConfig` follows. The in-loop guard is `rollout_audit.integrations.trl`; this
module needs neither TRL nor torch (tensors are read through numpy).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..contract import schema as S

# the fields of TRL's own classes the converter and the guard read (tests/test_framework_drift.py)
READS = {
    "trl.GRPOConfig": {
        "mask_truncated_completions",
        "loss_type",
        "num_generations",
        "steps_per_generation",
        "scale_rewards",
        "max_completion_length",
        "temperature",
        "top_p",
        "num_iterations",
        "gradient_accumulation_steps",
        "vllm_importance_sampling_correction",
    },
}

# Why each column is absent from a TRL record (keys: contract column or turns.field).
TRL_LACKS = {
    "behavior_logprobs": "TRL does not record behaviour log-probs on this path: the batch has no "
    "sampling_per_token_logps (transformers generate; old_per_token_logps is the trainer's "
    "recomputation, not a record of sampling). Use vLLM or a rollout_func that returns logprobs",
    "turns.logprob": "TRL does not record a per-turn log-prob (a rollout_func can return turn_logprob)",
    "turns.context_length": "TRL does not record the context the engine was given for each turn "
    "(a rollout_func can return turn_context_ids)",
    "turns.context_sha256": "TRL does not record the context the engine was given for each turn "
    "(a rollout_func can return turn_context_ids)",
    "turns.sampled_token_ids": "TRL does not record the engine's token ids per turn "
    "(a rollout_func can return turn_sampled_token_ids)",
    "turns.finish_reason": "TRL does not record a finish reason per turn (only the completions/clipped_ratio metric)",
    "turns.num_policy_tokens": "TRL does not count policy tokens per turn",
    "turns.temperature": "TRL's batch does not carry the sampling temperature; pass temperature=",
    "turns.top_p": "TRL's batch does not carry top_p; pass top_p=",
    "num_trainable_tokens": "TRL counts trainable tokens per batch (num_items_in_batch), not per trajectory",
    "verifier_success": "TRL does not record a verifier verdict, only rewards",
    "initial_state_checksum": "TRL does not record environment state",
    "reward": "TRL's batch carries advantages, not rewards; pass rewards= (AuditedGRPOTrainer does)",
    "environment_id": "TRL does not record the environment identity; pass environment_id=",
    "environment_version": "TRL does not record the environment version; pass environment_version=",
    "verifier_version": "TRL does not record the reward functions' version; pass verifier_version=",
    "reset_seed": "TRL does not record a reset seed; pass reset_seed=",
}
_PER_TURN_REWARD = "TRL records one reward per completion: no per-turn rewards, components, shaping or values"
TRL_LACKS.update(
    {
        k: _PER_TURN_REWARD
        for k in (
            "turns.reward",
            "turns.reward_components",
            "turns.shaping",
            "turns.potential_before",
            "turns.potential_after",
            "turns.value",
            "turns.td_residual",
            "final_value",
            "discounted_return",
        )
    }
)
TRL_LACKS["turns.parsed_action"] = "TRL does not record parsed actions"
# The trainer's own recomputation of each completion token's log-prob under the weights that sampled
# it (`old_per_token_logps`), carried as a second per-token log-prob column beside the engine's
# `behavior_logprobs`: L207 compares the two when the configuration names it (`compare_logprobs`).
TRAINER_LOGPROBS = "old_per_token_logps"
_TURN_EXTRAS = ("turn_sampled_token_ids", "turn_logprob", "turn_context_ids")


def _np(x: Any) -> np.ndarray:
    """A tensor (any device) or array-like as a numpy array."""
    if hasattr(x, "detach"):  # a torch tensor
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _lists(flat: np.ndarray, lengths: np.ndarray, typ: pa.DataType, mask: np.ndarray | None = None) -> pa.Array:
    """Flat values cut into one list per row."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    values = pa.array(flat, type=typ, mask=mask)
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), values)


def _turn_extras(extras: Sequence[Mapping] | None, n_turns: np.ndarray) -> dict[str, pa.Array]:
    """Per-turn fields a rollout_func returned (one list per sample, one entry per agent turn)."""
    if not extras:
        return {}
    out: dict[str, pa.Array] = {}
    for key in _TURN_EXTRAS:
        vals = [e.get(key) for e in extras]
        if all(v is None for v in vals):
            continue
        flat: list = []
        for i, v in enumerate(vals):
            if v is None or len(v) != n_turns[i]:
                raise ValueError(
                    f"sample {i}: {key} has {None if v is None else len(v)} entries for {n_turns[i]} agent turns"
                )
            flat.extend(v)
        if key == "turn_sampled_token_ids":
            out["sampled_token_ids"] = pa.array([list(map(int, x)) for x in flat], pa.list_(pa.int32()))
        elif key == "turn_logprob":
            out["logprob"] = pa.array(flat, pa.float64())
        else:
            out["context_length"] = pa.array([len(x) for x in flat], pa.int32())
            out["context_sha256"] = pa.array([S.context_sha256(x) for x in flat], pa.string())
    return out


def _tokenizer_id(tokenizer: Any) -> str:
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    template = getattr(tokenizer, "chat_template", None) or ""
    return f"{name}@{hashlib.sha256(str(template).encode()).hexdigest()[:12]}"


def records_from_batch(
    inputs: Mapping[str, Any],
    *,
    tokenizer: Any,
    policy_version: int,
    batch_id: str,
    group_size: int | None = None,
    rewards: Sequence[float] | Any = None,
    temperature: float | None = None,
    top_p: float | None = None,
    eos_token_ids: Sequence[int] | None = None,
    environment_id: str | None = None,
    environment_version: str | None = None,
    verifier_version: str | None = None,
    reset_seed: int | None = None,
    extras: Sequence[Mapping] | None = None,
    excluded: Sequence[bool] | np.ndarray | None = None,
    mask_truncated_completions: bool = False,
) -> pa.Table:
    """Contract trajectories from the batch `_generate_and_score_completions` returned.

    Row i becomes trajectory `{batch_id}/{i}`: prompt tokens (source 1, no loss) then its
    completion; completion tokens with tool_mask 1 are policy tokens (2), the others
    observation (3); loss_mask = completion_mask × tool_mask; behaviour log-probs from
    `sampling_per_token_logps` on policy tokens only (TRL's 0.0 placeholders elsewhere become
    null), the column left out when the batch has none; the trainer's `old_per_token_logps`
    (present when TRL recomputes them: vLLM importance-sampling correction, or generation not
    aligned with the optimizer step) the same way, as the column `old_per_token_logps`. Each run of policy tokens is an agent
    turn sampled by `policy_version`. A completion whose last id is not eos (or pad) is
    truncated (`max_tokens`); otherwise the policy ended it (`end_of_sequence`). Groups are
    TRL's: `group_size` consecutive rows. `extras` are the per-sample dicts a rollout_func's
    extra fields were merged into (turn_sampled_token_ids, turn_logprob, turn_context_ids, one
    entry per agent turn). `excluded` rows keep their tokens with loss_mask false. Under
    `mask_truncated_completions` (TRL zeroes every token of a truncated completion and keeps its
    reward in the group statistics) truncated rows, like `excluded` ones, are `loss_excluded`
    (contract 1.2).
    """
    pid, pm = _np(inputs["prompt_ids"]), _np(inputs["prompt_mask"]).astype(bool)
    cid, cm = _np(inputs["completion_ids"]), _np(inputs["completion_mask"]).astype(bool)
    n, c = cid.shape
    tm = _np(inputs["tool_mask"]).astype(bool) if inputs.get("tool_mask") is not None else np.ones_like(cm)
    pad = tokenizer.pad_token_id
    eos = list(eos_token_ids) if eos_token_ids is not None else [tokenizer.eos_token_id]
    # completion_mask is a prefix of ones, zeroed whole by mask_truncated_completions: such a
    # row ends with a non-pad id, so its length is up to its last non-pad id
    length = cm.sum(1)
    nonpad = cid != pad if pad is not None else np.ones_like(cm)
    last_nonpad = np.where(nonpad.any(1), c - np.argmax(nonpad[:, ::-1], 1), 0)
    length = np.where(length == 0, last_nonpad, length)
    cvalid = np.arange(c)[None, :] < length[:, None]
    last_id = cid[np.arange(n), np.maximum(length - 1, 0)]
    truncated = (length > 0) & ~np.isin(last_id, [*eos, pad])
    engine = _engine_turns(extras, pm.sum(1), c)
    if engine is None:  # provenance from the trainer's own mask: runs of tool_mask 1 are agent turns
        policy = cvalid & tm
        starts = policy & ~np.concatenate([np.zeros((n, 1), bool), policy[:, :-1]], 1)
        turn_c, n_turns = np.cumsum(starts, 1) - 1, starts.sum(1)
    else:  # provenance from the engine's record of each call, independent of env_mask
        policy, turn_c, n_turns = engine
        policy &= cvalid
    loss = cvalid & cm & tm
    out_of_loss = truncated & mask_truncated_completions
    if excluded is not None:
        out_of_loss = out_of_loss | np.asarray(excluded, dtype=bool)
        loss &= ~np.asarray(excluded, dtype=bool)[:, None]
    valid = np.concatenate([pm, cvalid], 1)
    lengths = valid.sum(1)
    ids = np.concatenate([pid, cid], 1)[valid]
    src = np.concatenate([np.ones_like(pid), np.where(policy, 2, 3)], 1)[valid]
    lmask = np.concatenate([np.zeros_like(pm), loss], 1)[valid]
    tturn = np.concatenate([np.full_like(pid, -1), turn_c], 1)[valid]
    cols: dict[str, pa.Array] = {}
    ids_tr = [f"{batch_id}/{i}" for i in range(n)]
    cols["trajectory_id"] = pa.array(ids_tr, pa.string())
    prompt_rows = np.split(pid[pm], np.cumsum(pm.sum(1))[:-1])
    cols["task_id"] = pa.array([hashlib.sha256(p.astype("<i4").tobytes()).hexdigest()[:16] for p in prompt_rows])
    if group_size:
        cols["group_id"] = pa.array([f"{batch_id}/g{i // group_size}" for i in range(n)], pa.string())
    for name, val in (
        ("environment_id", environment_id),
        ("environment_version", environment_version),
        ("verifier_version", verifier_version),
    ):
        if val is not None:
            cols[name] = pa.array([val] * n, pa.string())
    if reset_seed is not None:
        cols["reset_seed"] = pa.array([reset_seed] * n, pa.int64())
    cols["tokenizer_id"] = pa.array([_tokenizer_id(tokenizer)] * n, pa.string())
    cols["token_ids"] = _lists(ids, lengths, pa.int32())
    cols["token_source"] = _lists(src, lengths, pa.uint8())
    cols["loss_mask"] = _lists(lmask, lengths, pa.bool_())
    present = np.concatenate([np.zeros_like(pm), policy], 1)[valid]
    for key, column in (("sampling_per_token_logps", "behavior_logprobs"), (TRAINER_LOGPROBS, TRAINER_LOGPROBS)):
        if inputs.get(key) is not None:  # on policy tokens only: TRL's 0.0 elsewhere is no log-prob
            lp = _np(inputs[key]).astype(np.float32)
            lp_full = np.concatenate([np.zeros(pid.shape, np.float32), lp], 1)[valid]
            cols[column] = _lists(lp_full, lengths, pa.float32(), mask=~present)
    cols["token_turn"] = _lists(tturn, lengths, pa.int16())
    cols["turns"] = _turns(n_turns, policy_version, temperature, top_p, extras)
    cols["terminated"] = pa.array(~truncated)
    cols["truncated"] = pa.array(truncated)
    cols["infra_error"] = pa.array(np.zeros(n, bool))
    cols["stop_reason"] = pa.array(np.where(truncated, "max_tokens", "end_of_sequence"), pa.string())
    if rewards is not None:
        r = _np(rewards).astype(np.float64)
        cols["reward"] = pa.array(r, pa.float64(), mask=np.isnan(r))
    if mask_truncated_completions or excluded is not None:
        cols["loss_excluded"] = pa.array(out_of_loss)
    return _table(cols)


def trainer_policy(args: Any) -> tuple[str, str]:
    """(truncation, why): the audit's truncation policy as a `GRPOConfig` sets it. With
    `mask_truncated_completions` TRL trains none of a truncated completion's tokens and keeps its
    reward in the group mean and std (grpo_trainer.py, `completion_mask * ~is_truncated`): `exclude`,
    the rows recorded as loss_excluded. By default it trains the completion with the reward it was
    given: `penalize`, a reward on a truncated completion being TRL's deliberate choice."""
    if bool(getattr(args, "mask_truncated_completions", False)):
        return "exclude", (
            "truncation = 'exclude' (GRPOConfig.mask_truncated_completions=True: TRL trains none of a "
            "truncated completion's tokens and keeps its reward in the group statistics)"
        )
    return "penalize", (
        "truncation = 'penalize' (GRPOConfig.mask_truncated_completions=False, TRL's default: a completion cut at "
        "max_completion_length is trained with the reward it was given)"
    )


def recomputes_logprobs(args: Any, use_vllm: bool = False) -> bool:
    """Whether `GRPOTrainer` recomputes `old_per_token_logps` for a generation batch under this
    `GRPOConfig` (grpo_trainer.py:2642-2645 in trl 1.16.0): when the gradient accumulation steps are not a
    multiple of steps_per_generation × num_iterations (samples may come from earlier weights), or under
    vLLM with its importance-sampling correction. Otherwise TRL's old log-probs are the current ones,
    detached in the loss, and no second column exists."""
    every = int(args.steps_per_generation) * int(args.num_iterations)
    vllm_is = use_vllm and bool(getattr(args, "vllm_importance_sampling_correction", False))
    return int(args.gradient_accumulation_steps) % every != 0 or vllm_is


def _engine_turns(
    extras: Sequence[Mapping] | None, prompt_len: np.ndarray, c: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(policy, token_turn, turns per row) over the completion from the engine's record of each
    call (turn_context_ids, turn_sampled_token_ids): turn t's sampled ids start where its
    context ends. None when a rollout_func did not return both."""
    if not extras or any(e.get("turn_context_ids") is None or e.get("turn_sampled_token_ids") is None for e in extras):
        return None
    n = len(extras)
    policy = np.zeros((n, c), bool)
    turn = np.full((n, c), -1, np.int64)
    n_turns = np.zeros(n, np.int64)
    for i, e in enumerate(extras):
        ctx, smp = e["turn_context_ids"], e["turn_sampled_token_ids"]
        if len(ctx) != len(smp):
            raise ValueError(f"sample {i}: {len(ctx)} turn_context_ids for {len(smp)} turn_sampled_token_ids")
        n_turns[i] = len(ctx)
        for t, (x, y) in enumerate(zip(ctx, smp)):
            a = max(len(x) - int(prompt_len[i]), 0)
            policy[i, a : a + len(y)] = True
            turn[i, a:] = t
    return policy, turn, n_turns


def _turns(
    n_turns: np.ndarray,
    policy_version: int,
    temperature: float | None,
    top_p: float | None,
    extras: Sequence[Mapping] | None,
) -> pa.Array:
    """The turns column: one struct per agent turn."""
    total = int(n_turns.sum())
    offsets = np.concatenate([[0], np.cumsum(n_turns)]).astype(np.int32)
    fields: dict[str, pa.Array] = {
        "turn_id": pa.array(np.arange(total) - np.repeat(offsets[:-1], n_turns), pa.int16()),
        "policy_version": pa.array(np.full(total, policy_version), pa.int64()),
    }
    if temperature is not None:
        fields["temperature"] = pa.array(np.full(total, temperature), pa.float32())
    if top_p is not None:
        fields["top_p"] = pa.array(np.full(total, top_p), pa.float32())
    fields.update(_turn_extras(extras, n_turns))
    struct = pa.StructArray.from_arrays(list(fields.values()), names=list(fields))
    return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), struct)


def _table(cols: dict[str, pa.Array]) -> pa.Table:
    """A contract table whose metadata names what TRL does not record."""
    turn_fields = {f.name for f in cols["turns"].type.value_type}
    lacks = {
        k: v for k, v in TRL_LACKS.items() if (k[6:] not in turn_fields if k.startswith("turns.") else k not in cols)
    }
    meta = {
        S.META_VERSION: S.CONTRACT_VERSION.encode(),
        S.META_KIND: b"trajectories",
        S.META_NOT_RECORDED: json.dumps(lacks, sort_keys=True).encode(),
    }
    order = [c.name for c in S.columns("trajectories") if c.name in cols]
    order += [TRAINER_LOGPROBS] if TRAINER_LOGPROBS in cols else []
    return pa.table({k: cols[k] for k in order}).replace_schema_metadata(meta)


# ---------------------------------------------------------------- updates


def _reduction(
    loss_type: str,
    *,
    n_seq: int,
    n_tokens: float,
    window_tokens: float,
    ga: int,
    spg: int,
    processes: int,
    max_completion_length: int | None,
) -> tuple[str, float, float]:
    """(reduction, loss_denominator, denominator_scale) of one micro-batch, as TRL's
    `_compute_loss` divides it in training mode."""
    if loss_type in ("dapo", "cispo", "vespo"):
        scale = ga / (spg * processes)
        return "token_window", max(window_tokens, 1.0) * scale, scale
    if loss_type == "bnpo":
        return "token", max(n_tokens, 1.0) * ga, float(ga)
    if loss_type in ("grpo", "sapo"):
        return "seq_mean_token_mean", float(n_seq * ga), float(ga)
    if loss_type == "luspo":
        return "seq_mean_token_sum", float(n_seq * ga), float(ga)
    if loss_type == "dr_grpo":
        if max_completion_length is None:
            raise ValueError("dr_grpo divides by max_completion_length: pass it")
        scale = float(max_completion_length * ga)
        return "constant", n_seq * scale, scale
    raise ValueError(f"unknown TRL loss_type {loss_type!r}")


def update_from_step(
    inputs: Mapping[str, Any],
    *,
    trajectory_ids: Sequence[str],
    loss_type: str,
    update_step: int,
    trainer_version: int,
    gradient_accumulation_steps: int = 1,
    steps_per_generation: int = 1,
    num_processes: int = 1,
    max_completion_length: int | None = None,
    window_trajectory_ids: Sequence[str] | None = None,
    advantage_estimator: str | None = None,
    max_policy_lag: int | None = None,
) -> dict:
    """The update record of one micro-batch `compute_loss` trains on (rows = `trajectory_ids`).

    The denominator is the one TRL divides the micro-batch's summed loss by, declared as what
    it is: dapo/cispo/vespo `token_window` over the generation batch (`num_items_in_batch`,
    counted over every process) scaled by GA / (steps_per_generation × processes); bnpo
    `token` × GA; grpo/sapo `seq_mean_token_mean` B × GA; luspo `seq_mean_token_sum`;
    dr_grpo `constant` B × max_completion_length × GA. `window_trajectory_ids` (the generation
    batch) is where TRL formed the advantage groups, whatever the loss type.
    """
    cm = _np(inputs["completion_mask"]).astype(bool)
    tm = _np(inputs["tool_mask"]).astype(bool) if inputs.get("tool_mask") is not None else np.ones_like(cm)
    window = float(_np(inputs["num_items_in_batch"]).sum())
    reduction, denom, scale = _reduction(
        loss_type,
        n_seq=len(trajectory_ids),
        n_tokens=float((cm & tm).sum()),
        window_tokens=window,
        ga=gradient_accumulation_steps,
        spg=steps_per_generation,
        processes=num_processes,
        max_completion_length=max_completion_length,
    )
    rec: dict[str, Any] = {
        "update_step": int(update_step),
        "trainer_version": int(trainer_version),
        "trajectory_ids": list(trajectory_ids),
        "reduction": reduction,
        "loss_denominator": float(denom),
        "denominator_scale": float(scale),
        "advantages": _np(inputs["advantages"]).astype(np.float64).reshape(-1).tolist(),
    }
    if reduction == "token_window":
        rec["window_tokens"] = window
    if window_trajectory_ids is not None:  # TRL normalises rewards into advantages over the generation batch
        rec["window_trajectory_ids"] = list(window_trajectory_ids)
    if advantage_estimator is not None:
        rec["advantage_estimator"] = advantage_estimator
    if max_policy_lag is not None:
        rec["max_policy_lag"] = int(max_policy_lag)
    return rec


def advantage_estimator(trainer: Any) -> str | None:
    """The contract estimator TRL's advantages follow, or None when none matches (batch-level
    std, normalize_then_sum): TRL's group std has Bessel's correction and ε = 1e-4."""
    if getattr(trainer, "multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        return None
    return {"group": "grpo", "none": "grpo_no_std"}.get(str(trainer.scale_rewards))
