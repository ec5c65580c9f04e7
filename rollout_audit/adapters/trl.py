"""TRL: contract records from `GRPOTrainer`'s batch, and the audit policy TRL's configuration implies.

`records_from_batch` reads the dict exactly as `GRPOTrainer._generate_and_score_completions`
returns it (padded tensors and masks) and `update_from_step` the micro-batch `compute_loss`
trains on. They carry only what TRL recorded: a column TRL lacks is left out and named in the
file metadata `rollout_log.not_recorded` with the reason, so the checks that need it are
reported as not run with "TRL does not record ...". `trainer_truncation` states the truncation
policy a `GRPOConfig` follows. The in-loop guard is `rollout_audit.integrations.trl`; this
module needs neither TRL nor torch (tensors are read through numpy).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from ..contract import schema as S
from ..reading.records import records_to_table
from .base import (
    AdapterError,
    context_values,
    flags,
    mapping,
    need,
    number,
    numbers,
    short,
    token_ids,
    whole,
    wholes,
    with_trainer_settings,
)
from .steps import guarded, identity

# the fields of TRL's own classes the converter and the guard read (tests/test_framework_drift.py)
READS = {
    "trl.RLOOConfig": {
        "normalize_advantages",
        "beta",
        "reward_clip_range",
        "num_generations",
        "steps_per_generation",
        "num_iterations",
        "mask_truncated_completions",
        "max_completion_length",
        "temperature",
        "top_p",
        "gradient_accumulation_steps",
    },
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
    if isinstance(tokenizer, _RecordedTokenizer) and tokenizer.tokenizer_id:
        return str(tokenizer.tokenizer_id)
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
            cols[column] = _lists(lp_full, lengths, pa.float32(), mask=~present | np.isnan(lp_full))
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


def trainer_truncation(args: Any) -> tuple[str, str]:
    """(truncation, why): the audit's truncation policy as a `GRPOConfig` or `RLOOConfig` sets it. With
    `mask_truncated_completions` TRL trains none of a truncated completion's tokens and keeps its
    reward in the group statistics (grpo_trainer.py:2489-2495, rloo_trainer.py:1519-1523,
    `completion_mask * ~is_truncated`): `exclude`, the rows recorded as loss_excluded. By default it
    trains the completion with the reward it was given: `penalize`, a reward on a truncated completion
    being TRL's deliberate choice."""
    name = type(args).__name__
    name = name if name.endswith("Config") else "GRPOConfig"  # a recorded run's settings: the recorder is GRPO's
    if bool(getattr(args, "mask_truncated_completions", False)):
        return "exclude", (
            f"truncation = 'exclude' ({name}.mask_truncated_completions=True: TRL trains none of a "
            "truncated completion's tokens and keeps its reward in the group statistics)"
        )
    return "penalize", (
        f"truncation = 'penalize' ({name}.mask_truncated_completions=False, TRL's default: a completion cut at "
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
    if loss_type in ("luspo", "rloo"):  # RLOOTrainer: per-sequence ratio × advantage, mean over sequences
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
    n_items = inputs.get("num_items_in_batch")  # GRPO's generation-window token count; RLOO's batch has none
    window = float((cm & tm).sum()) if n_items is None else float(_np(n_items).sum())
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


# ---------------------------------------------------------------- recorded runs: `--from trl`

# The key and version of a record `integrations.trl.RolloutRecorder` writes: one JSON line per sample a
# rollout_func returned, as it returned it, with the call it came from and the trainer's settings.
ROLLOUT_RECORD = "trl_rollout"
ROLLOUT_VERSION = 1
# A row of TRL's own `log_completions` Parquet (`{output_dir}/completions/completions_{step:05d}.parquet`,
# grpo_trainer.py:3340-3357 in trl 1.16.0): step, prompt, completion, one column per reward function, advantage.
COMPLETION_KEYS = ("step", "prompt", "advantage")
_NO_REWARD = (
    "a rollout_func runs before TRL's reward functions: the rewards are in TRL's log_completions Parquet "
    "(GRPOConfig(log_completions=True)); pass its completions/ directory too"
)
_NO_LOSS = "TRL's records (rollout_func output, log_completions) do not say how the loss was reduced"
_NO_VERSION = "TRL's records do not carry the trainer's weight version at the update"
RECORDED_UPDATE_LACKS = {
    **{k: _NO_LOSS for c in ("reduction", "loss_denominator") for k in (c, f"updates.{c}")},
    **{k: _NO_VERSION for k in ("trainer_version", "updates.trainer_version")},
}


class _RecordedTokenizer:
    """What records_from_batch reads of a tokenizer, from the recorder's `trainer` settings."""

    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.pad_token_id = settings.get("pad_token_id")
        eos = settings.get("eos_token_ids") or []
        self.eos_token_id = eos[0] if eos else None
        self.name_or_path = str(settings.get("tokenizer") or "")
        self.tokenizer_id = settings.get("tokenizer_id")


def _split_recorded(records: Iterable[Mapping[str, Any]]) -> tuple[list[list[Mapping]], list[Mapping]]:
    """(the train-mode rollout_func calls, each its samples in TRL's gathered order; log_completions rows)."""
    calls: dict[int, list[Mapping]] = {}
    rows: list[Mapping] = []
    for n, rec in enumerate(records, 1):
        where = getattr(rec, "origin", None) or f"record {n}"
        if not isinstance(rec, Mapping):
            raise AdapterError(f"{where}: not an object")
        if ROLLOUT_RECORD in rec:
            if rec[ROLLOUT_RECORD] != ROLLOUT_VERSION:
                raise AdapterError(
                    f"{where}: {ROLLOUT_RECORD} record version {short(rec[ROLLOUT_RECORD])}; this rollout-audit "
                    f"reads version {ROLLOUT_VERSION}"
                )
            if "missing" in rec:
                raise AdapterError(
                    f"{where}: the RolloutRecorder did not record {short(rec['missing'])}: this run's record is "
                    "incomplete"
                )
            if rec.get("mode", "train") == "train":
                _check_rollout(rec, where)
                calls.setdefault(whole(need(rec, "call", where), "call", where), []).append(rec)
        elif all(k in rec for k in COMPLETION_KEYS):
            rows.append(rec)
        else:
            raise AdapterError(
                f"{where}: neither a RolloutRecorder record ({ROLLOUT_RECORD!r}) nor a log_completions row "
                f"({', '.join(COMPLETION_KEYS)})"
            )
    ordered = []
    for c in sorted(calls):
        samples = sorted(calls[c], key=lambda r: (r.get("process", 0), r.get("index", 0)))
        ordered.append(samples)
    return ordered, rows


# the recorder's trainer settings and the type each must have when present (records_from_batch reads them)
_SETTINGS = {
    "temperature": "number",
    "top_p": "number",
    "num_generations": "whole",
    "pad_token_id": "whole",
    "eos_token_ids": "wholes",
    "reward_weights": "numbers",
    "reward_func_names": "strings",
    "mask_truncated_completions": "bool",
    "scale_rewards": "string",
    "multi_objective_aggregation": "string",
    "tokenizer": "string",
    "tokenizer_id": "string",
}


def _check_rollout(rec: Mapping[str, Any], where: str) -> None:
    """A RolloutRecorder record of a training call has its fields of their types, named when not: the
    batch TRL built is rebuilt from them as if they were the trainer's tensors."""
    for key in ("step", "process", "index"):
        if rec.get(key) is not None:
            whole(rec[key], key, where)
    settings = mapping(rec.get("trainer"), "trainer", where)
    for key, kind in _SETTINGS.items():
        value, field = settings.get(key), f"trainer.{key}"
        if value is None:
            continue
        if kind == "number":
            number(value, field, where)
        elif kind == "whole":
            whole(value, field, where)
        elif kind == "wholes":
            wholes(value, field, where)
        elif kind == "numbers":
            if any(v is None for v in numbers(value, field, where)):
                raise AdapterError(f"{where}: {field}: a weight is null")
        elif kind == "bool" and not isinstance(value, bool):
            raise AdapterError(f"{where}: {field}: expected true or false, got {short(value)}")
        elif kind == "string" and not isinstance(value, str):
            raise AdapterError(f"{where}: {field}: expected a string, got {short(value)}")
        elif kind == "strings" and (not isinstance(value, list) or not all(isinstance(v, str) for v in value)):
            raise AdapterError(f"{where}: {field}: expected a list of names, got {short(value)}")
    for key in ("prompt_ids", "completion_ids"):
        token_ids(need(rec, key, where), key, where)
    if rec.get("logprobs") is not None:
        numbers(rec["logprobs"], "logprobs", where)
    if rec.get("completion_text") is not None and not isinstance(rec["completion_text"], str):
        raise AdapterError(f"{where}: completion_text: expected a string, got {short(rec['completion_text'])}")
    turns: dict[str, int] = {}
    for key in _TURN_EXTRAS:
        value = rec.get(key)
        if value is None:
            continue
        if not isinstance(value, list):
            raise AdapterError(f"{where}: {key}: expected one entry per agent turn, got {short(value)}")
        if key == "turn_logprob":
            numbers(value, key, where)
        else:
            for t, ids in enumerate(value):
                token_ids(ids, f"{key}[{t}]", where)
        turns[key] = len(value)
    if len(set(turns.values())) > 1:
        said = ", ".join(f"{n} {k}" for k, n in turns.items())
        raise AdapterError(f"{where}: {said}: one entry per agent turn in each")


def _plainer(value: Any) -> Any:
    """A prompt as a comparable value: mappings without null entries (Parquet gives a struct every key)."""
    if isinstance(value, Mapping):
        return {k: _plainer(v) for k, v in value.items() if v is not None}
    if isinstance(value, (list, tuple)) or hasattr(value, "tolist"):
        return [_plainer(v) for v in (value.tolist() if hasattr(value, "tolist") else value)]
    return value


def _matched_rows(calls: list[list[Mapping]], rows: list[Mapping]) -> dict[int, list[Mapping]]:
    """Call index -> its log_completions rows. TRL writes, at every logging step S, the latest generation
    batch (a deque of generation_batch_size rows, grpo_trainer.py:1088-1095): the one generated at the
    newest global step before S. Two logging steps of one generation repeat it; the first is kept. Each
    match is verified: as many rows as samples, and the same prompts in the same order."""
    by_step: dict[int, list[Mapping]] = {}
    for r in rows:
        by_step.setdefault(whole(r["step"], "step", getattr(r, "origin", None) or "log_completions row"), []).append(r)
    steps = [int(s[0].get("step", 0)) for s in calls]
    out: dict[int, list[Mapping]] = {}
    for s, group in sorted(by_step.items()):
        before = [i for i, g in enumerate(steps) if g < s]
        if not before:
            raise AdapterError(
                f"{getattr(group[0], 'origin', None) or 'log_completions'}: rows of step {s}, but no recorded "
                "rollout_func call before that step"
            )
        i = before[-1]
        if i in out:
            continue
        samples = calls[i]
        where = getattr(group[0], "origin", None) or f"log_completions step {s}"
        if len(group) != len(samples):
            raise AdapterError(
                f"{where}: {len(group)} rows at step {s} for {len(samples)} samples of the rollout_func call at "
                f"step {steps[i]} (a run on several processes needs every process's recorder file)"
            )
        for k, (r, smp) in enumerate(zip(group, samples)):
            if _plainer(r["prompt"]) != _plainer(smp.get("prompt")):
                raise AdapterError(
                    f"{getattr(r, 'origin', None) or where}: row {k} has another prompt than sample {k} of the "
                    f"rollout_func call at step {steps[i]}: not that call's completions"
                )
            text = _completion_text(r["completion"])
            if text is not None and smp.get("completion_text") is not None and text != smp["completion_text"]:
                raise AdapterError(
                    f"{getattr(r, 'origin', None) or where}: row {k} has another completion than sample {k} of the "
                    f"rollout_func call at step {steps[i]}: not that call's completions"
                )
        out[i] = group
    return out


def _completion_text(value: Any) -> str | None:
    """The text of a logged completion that is one string or one assistant message (None otherwise: a
    parsed tool call, several messages; then only the prompts join the records)."""
    value = _plainer(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], Mapping):
        content = value[0].get("content")
        return content if isinstance(content, str) and set(value[0]) <= {"role", "content"} else None
    return None


def _pad(lists: list[list[Any]], left: bool, fill: Any, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    width = max((len(x) for x in lists), default=0)
    arr = np.full((len(lists), width), fill, dtype=dtype)
    mask = np.zeros((len(lists), width), bool)
    for i, x in enumerate(lists):
        if not x:
            continue
        sl = slice(width - len(x), width) if left else slice(0, len(x))
        arr[i, sl] = x
        mask[i, sl] = True
    return arr, mask


def _call_batch(samples: list[Mapping], n: int) -> tuple[dict[str, Any], list[Mapping], Mapping[str, Any]]:
    """One recorded call as the padded batch records_from_batch reads (TRL pads the same way:
    prompts left, completions right), the per-sample extras, and the trainer's settings."""
    settings = samples[0].get("trainer") or {}
    where = getattr(samples[0], "origin", None) or f"rollout_func call {n}"
    prompts = [wholes(need(r, "prompt_ids", where), "prompt_ids", where) for r in samples]
    comps = [wholes(need(r, "completion_ids", where), "completion_ids", where) for r in samples]
    pad = settings.get("pad_token_id")
    pid, pm = _pad(prompts, True, 0 if pad is None else pad, np.int64)
    cid, cm = _pad(comps, False, 0 if pad is None else pad, np.int64)
    batch: dict[str, Any] = {"prompt_ids": pid, "prompt_mask": pm, "completion_ids": cid, "completion_mask": cm}
    lps = []
    for r, c in zip(samples, comps):
        lp = need(r, "logprobs", where)
        lp = [] if lp is None else lp
        if len(lp) != len(c):
            raise AdapterError(f"{where}: logprobs has {len(lp)} values for {len(c)} completion_ids")
        lps.append([math.nan if v is None else float(v) for v in lp])
    batch["sampling_per_token_logps"] = _pad(lps, False, math.nan, np.float64)[0]
    if any(r.get("env_mask") is not None for r in samples):
        masks = [flags(need(r, "env_mask", where), "env_mask", where) for r in samples]
        if any(len(m) != len(c) for m, c in zip(masks, comps)):
            raise AdapterError(f"{where}: env_mask must have one value per completion id")
        batch["tool_mask"] = _pad(masks, False, False, bool)[0]
    if settings.get("mask_truncated_completions"):  # TRL zeroes a truncated completion's mask (grpo_trainer.py:2492)
        ends = set(settings.get("eos_token_ids") or []) | ({pad} if pad is not None else set())
        for i, c in enumerate(comps):
            if c and c[-1] not in ends:
                cm[i] = False
    return batch, list(samples), settings


def _recorded(records: Iterable[Mapping[str, Any]]) -> tuple[list[list[Mapping]], dict[int, list[Mapping]]]:
    calls, rows = _split_recorded(records)
    if not calls:
        raise AdapterError("no RolloutRecorder records of a training call (rollout_audit.integrations.trl)")
    return calls, _matched_rows(calls, rows)


def _rewards(rows: list[Mapping], settings: Mapping[str, Any]) -> np.ndarray:
    """The reward TRL normalised: the weighted sum of the reward functions' columns, NaN where every
    function returned None (grpo_trainer.py: `nansum`, unscorable rows NaN)."""
    names = list(settings.get("reward_func_names") or [])
    weights = list(settings.get("reward_weights") or [1.0] * len(names))
    if not names or len(weights) != len(names):
        raise AdapterError("the RolloutRecorder record names no reward functions (trainer.reward_func_names)")
    where = getattr(rows[0], "origin", None) or "log_completions"
    vals = np.array(
        [[math.nan if r.get(k) is None else number(r.get(k), k, where) for k in names] for r in rows], np.float64
    )
    total = np.nansum(vals * np.asarray(weights, np.float64)[None, :], axis=1)
    total[np.isnan(vals).all(axis=1)] = np.nan
    return total


def _batch_id(samples: list[Mapping], n: int) -> str:
    return f"gen{int(samples[0].get('step', 0)):05d}.{n}"


@guarded("TRL")
def to_contract(records: Iterable[dict], **context: Any) -> pa.Table:
    """Contract trajectories from what `RolloutRecorder` recorded of each rollout_func call (train mode),
    with the rewards of TRL's log_completions rows of that call when they are given. Each call becomes
    the batch TRL built from it (records_from_batch) under the trainer settings the recorder wrote."""
    given = identity(context_values(context))
    calls, matched = _recorded(records)
    tables = []
    said, truncation = "", "penalize"
    for n, samples in enumerate(calls):
        batch, extras, settings = _call_batch(samples, n)
        rows = matched.get(n)
        where = getattr(samples[0], "origin", None) or f"rollout_func call {n}"
        try:  # a sample whose per-turn fields disagree with its turns: the record named
            t = records_from_batch(
                batch,
                tokenizer=_RecordedTokenizer(settings),
                policy_version=int(samples[0].get("step", 0)),
                batch_id=_batch_id(samples, n),
                group_size=settings.get("num_generations"),
                rewards=None if rows is None else _rewards(rows, settings),
                temperature=settings.get("temperature"),
                top_p=settings.get("top_p"),
                eos_token_ids=settings.get("eos_token_ids"),
                environment_id=given.get("environment_id"),
                environment_version=given.get("environment_version"),
                verifier_version=given.get("verifier_version"),
                reset_seed=given.get("reset_seed"),
                extras=extras,
                mask_truncated_completions=bool(settings.get("mask_truncated_completions", False)),
            )
        except ValueError as e:
            raise AdapterError(f"{where}: {e}") from None
        truncation, said = trainer_truncation(_Args(settings))
        tables.append(t)
    meta = tables[0].schema.metadata or {}
    lacks = json.loads(meta.get(S.META_NOT_RECORDED, b"{}"))
    if "reward" in lacks:
        lacks["reward"] = _NO_REWARD
    table = pa.concat_tables(tables, promote_options="permissive")
    table = table.replace_schema_metadata({**meta, S.META_NOT_RECORDED: json.dumps(lacks, sort_keys=True).encode()})
    return with_trainer_settings(table, said, truncation=truncation, grpo_epsilon=1e-4)


class _Args:
    def __init__(self, settings: Mapping[str, Any]) -> None:
        self.mask_truncated_completions = bool(settings.get("mask_truncated_completions", False))


@guarded("TRL")
def updates(records: Iterable[dict], **context: Any) -> pa.Table | None:
    """One update record per rollout_func call whose log_completions rows were given: the advantages TRL
    logged for that generation batch (gathered over processes), the batch as the window TRL normalised
    rewards over, and the estimator its settings follow (`scale_rewards`). None without those rows."""
    context_values(context)
    calls, matched = _recorded(records)
    recs: list[Mapping[str, Any]] = []
    for n, samples in enumerate(calls):
        rows = matched.get(n)
        if rows is None:
            continue
        settings = samples[0].get("trainer") or {}
        ids = [f"{_batch_id(samples, n)}/{i}" for i in range(len(samples))]
        where = getattr(rows[0], "origin", None) or "log_completions"
        rec: dict[str, Any] = {
            "update_step": int(rows[0]["step"]),
            "trajectory_ids": ids,
            "advantages": [number(r["advantage"], "advantage", where) for r in rows],
            "window_trajectory_ids": ids,
        }
        est = _estimator(settings)
        if est is not None:
            rec["advantage_estimator"] = est
        recs.append(rec)
    if not recs:
        return None
    table = records_to_table(recs, kind="updates")
    lacks = dict(RECORDED_UPDATE_LACKS)
    if any("advantage_estimator" not in r for r in recs):
        why = "TRL's settings (scale_rewards='batch' or normalize_then_sum) follow no contract estimator"
        lacks |= {"advantage_estimator": why, "updates.advantage_estimator": why}
    meta = {**(table.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(lacks, sort_keys=True).encode()}
    return table.replace_schema_metadata(meta)


def _estimator(settings: Mapping[str, Any]) -> str | None:
    if settings.get("multi_objective_aggregation", "sum_then_normalize") != "sum_then_normalize":
        return None
    return {"group": "grpo", "none": "grpo_no_std"}.get(str(settings.get("scale_rewards", "group")))
