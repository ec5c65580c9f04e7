"""slime without a source edit: functions named by slime's own options that record both halves of
the run into a rollout-audit dump directory, for `rollout-audit check --from slime DIR`.

    ROLLOUT_AUDIT_DIR=rollout_dumps python train.py ... \\
        --custom-generate-function-path rollout_audit.integrations.slime.generate \\
        --rollout-sample-hook-path rollout_audit.integrations.slime.sample_hook \\
        --custom-rollout-log-function-path rollout_audit.integrations.slime.log_rollout \\
        --custom-convert-samples-to-train-data-path rollout_audit.integrations.slime.convert \\
        --rollout-data-postprocess-path rollout_audit.integrations.slime.postprocess

Read at THUDM/slime 624b824 (slime is not on the package index; no slime import at module level:
`convert` imports slime's converter when slime calls it). Each function forwards to the one it
stands in for (yours, named by the environment variables below, or slime's own) and returns what
that returned, unchanged; recording is on the side:

- `generate` (`--custom-generate-function-path`, `slime/utils/arguments.py:477-484`, called at
  `slime/rollout/sglang_rollout.py:251-260`): calls `ROLLOUT_AUDIT_SLIME_GENERATE` (default slime's
  `slime.rollout.sglang_rollout:generate`, one engine call that appends exactly the ids SGLang
  returned, :152-221). Around slime's own generate it records that call: the `response_length`
  before it, the ids it added, the `weight_version` slime appended for it (`types.py:397-398`). A generate of your own makes its own
  calls: record each with `engine_call(sample, tokens, meta_info)` right before its
  `append_response_tokens(..., trainable=True)`; a sample whose response grew without a recorded
  call is marked (below), never given calls derived from its tokens or mask.
- `sample_hook` (`--rollout-sample-hook-path`, `arguments.py:486-494`, applied before the reward at
  `sglang_rollout.py:262`, `sample_hooks.py:42-60`): marks a sample that no recording generate saw
  (a per-sample `generate_function_path` from an eval dataset config bypasses the option,
  `sglang_rollout.py:251-252`). Returns None: the sample is unchanged.
- `log_rollout` (`--custom-rollout-log-function-path`, `arguments.py:496-503`, called with every
  sample of a rollout at `slime/observability/rollout_metrics.py:257-260`, before the samples are
  converted, `slime/ray/rollout.py:506-510`): writes one sampler record per sample, in
  `Sample.to_dict()`'s names, the top-p nucleus (`rollout_top_p_token_ids`, `_offsets`) included.
  Calls `ROLLOUT_AUDIT_SLIME_LOG_FUNCTION` if set and returns its answer (else False: slime's own
  logging runs).
- `convert` (`--custom-convert-samples-to-train-data-path`, `arguments.py:1379-1387`, called at
  `rollout.py:639-640`): runs `ROLLOUT_AUDIT_SLIME_CONVERT` if set, else slime's default converter
  (`RolloutManager._convert_samples_to_train_data`, :635-745, with the manager state it reads:
  `args`, the reward post-process function, :388-395, and `_post_process_rewards`, :608-633), and
  writes the train data record (the whole batch: the normalisation groups are positions in it).
- `postprocess` (`--rollout-data-postprocess-path`, `arguments.py:549-556`, called after
  `compute_advantages_and_returns` on every data-parallel rank, `backends/megatron_utils/actor.py:
  196-199, 503-506`): writes the actor record of the rank (last pipeline stage only: the others
  have no `returns`), then calls `ROLLOUT_AUDIT_SLIME_POSTPROCESS` if set.

The evidence is kept beside each sample, in this process (generate, the sample hooks and the log
function all run in slime's rollout manager), never in it: the sample slime trains is the one it
made. The sampler record carries the calls in its copy of `metadata` as `engine_calls`, where the
adapter reads them. The dump directory is `ROLLOUT_AUDIT_DIR` (slime's parser takes no option of
ours); the rollout manager and the actor ranks must all see it. What the functions cannot record is
written on the record (`rollout_audit_unrecorded`) and named by `check` in "not run": per-call
routes (the wrapper does not see SGLang's `meta_info`), a call's context. Evaluation samples are
neither recorded nor dumped.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..adapters.base import UNRECORDED

ENV_DIR = "ROLLOUT_AUDIT_DIR"
ENV_GENERATE = "ROLLOUT_AUDIT_SLIME_GENERATE"
ENV_LOG = "ROLLOUT_AUDIT_SLIME_LOG_FUNCTION"
ENV_CONVERT = "ROLLOUT_AUDIT_SLIME_CONVERT"
ENV_POSTPROCESS = "ROLLOUT_AUDIT_SLIME_POSTPROCESS"
SLIME_GENERATE = "slime.rollout.sglang_rollout.generate"
# slime's options and the function of this module each names
OPTIONS = {
    "--custom-generate-function-path": "generate",
    "--rollout-sample-hook-path": "sample_hook",
    "--custom-rollout-log-function-path": "log_rollout",
    "--custom-convert-samples-to-train-data-path": "convert",
    "--rollout-data-postprocess-path": "postprocess",
}
# Sample.to_dict() keys of the sampler record (slime/utils/types.py:93-146): what adapters/slime.py reads
SAMPLE_KEYS = (
    "group_index",
    "index",
    "rollout_id",
    "tokens",
    "response_length",
    "reward",
    "loss_mask",
    "weight_versions",
    "rollout_log_probs",
    "rollout_top_p_token_ids",
    "rollout_top_p_token_offsets",
    "remove_sample",
    "status",
    "metadata",
    "rollout_routed_experts",
)
TRAIN_KEYS = ("sample_indices", "rollout_ids", "rollout_mask_sums", "rewards", "raw_reward", "loss_masks")
# slime arguments that decided the train data (slime/ray/rollout.py:608-633), and those that decide
# how the loss divides it and what its ratio is anchored to (loss.py:965-986, :1317-1366)
TRAIN_ARGS = (
    "advantage_estimator",
    "rewards_normalization",
    "grpo_std_normalization",
    "normalize_advantages",
    "n_samples_per_prompt",
    "rollout_batch_size",
    "calculate_per_token_loss",
    "use_rollout_logprobs",
    "keep_old_actor",
    "use_tis",
    "tis_clip",
)
ACTOR_KEYS = ("sample_indices", "loss_masks", "rewards", "kl", "returns")
ACTOR_ARGS = ("advantage_estimator", "kl_coef", "gamma", "lambd")
CRITIC_KEY = "values"  # with --advantage-estimator ppo: the critic's values, recorded when the batch holds them
# what slime names and this module relies on, for the drift test
RELIES = {
    "slime/utils/arguments.py": set(OPTIONS),
    "slime/ray/rollout.py": {
        "RolloutManager._convert_samples_to_train_data": {
            "args",
            "custom_convert_samples_to_train_data_func",
            "_post_process_rewards",
        },
        "RolloutManager._post_process_rewards": {"args", "custom_reward_post_process_func"},
    },
    "slime/utils/types.py": {"Sample": set(SAMPLE_KEYS)},
}
NO_ROUTES = (
    "the slime generate wrapper does not see SGLang's meta_info, so it records no per-call routed_experts_start_len, "
    "_rows and _len"
)
_KEEP = 1 << 17  # samples recorded and never logged (filtered, evaluation) are forgotten past this many
_lock = threading.Lock()
_last_rollout: dict[str, int] = {}


@dataclass
class Evidence:
    """What the functions recorded for one sample, kept beside it (never in it: a recorder does not
    change what it forwards): its engine calls, and what could not be recorded, with why."""

    sample: Any
    calls: list[dict[str, Any]] = field(default_factory=list)
    unrecorded: dict[str, str] = field(default_factory=dict)
    seen: bool = False  # a recording generate ran on it


_evidence: dict[int, Evidence] = {}  # id(sample) -> its evidence, the sample held so the id stays its own


def evidence(sample: Any) -> Evidence:
    """The sample's evidence (made on first use)."""
    with _lock:
        ev = _evidence.get(id(sample))
        if ev is None or ev.sample is not sample:
            ev = _evidence[id(sample)] = Evidence(sample)
            while len(_evidence) > _KEEP:
                del _evidence[next(iter(_evidence))]
        return ev


def _take(sample: Any) -> Evidence | None:
    with _lock:
        ev = _evidence.pop(id(sample), None)
    return ev if ev is not None and ev.sample is sample else None


def _dir() -> Path:
    value = os.environ.get(ENV_DIR)
    if not value:
        raise RuntimeError(f"rollout-audit: set {ENV_DIR} to the dump directory before slime starts")
    return Path(value)


def _append(name: str, records: Sequence[Mapping[str, Any]]) -> None:
    if not records:
        return
    text = "".join(json.dumps(r, default=_plain) + "\n" for r in records)
    directory = _dir()
    with _lock:
        directory.mkdir(parents=True, exist_ok=True)
        with open(directory / name, "a", encoding="utf-8") as fh:
            fh.write(text)


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "value"):  # Sample.Status
        return value.value
    return str(value)


@functools.cache
def load(path: str) -> Any:
    """A function by slime's import path (`package.module.function`, as slime's `load_function`)."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def engine_call(sample: Any, tokens: Sequence[int], meta_info: Mapping[str, Any] | None = None) -> None:
    """Record one engine call of your own generate, right before its
    `sample.append_response_tokens(..., trainable=True)`: the sample's response length before it, the
    ids SGLang returned, and its weight version."""
    evidence(sample).calls.append(
        {
            "response_length": sample.response_length,
            "tokens": list(tokens),
            "weight_version": (meta_info or {}).get("weight_version"),
        }
    )


async def generate(args: Any, sample: Any, sampling_params: dict[str, Any], evaluation: bool = False) -> Any:
    """slime's generate (or yours, `ROLLOUT_AUDIT_SLIME_GENERATE`), recording its engine calls."""
    path = os.environ.get(ENV_GENERATE) or SLIME_GENERATE
    inner = load(path)
    if evaluation:  # not trained, not dumped
        return (
            await inner(args, sample, sampling_params, evaluation=True)
            if _takes_evaluation(inner)
            else (await inner(args, sample, sampling_params))
        )
    ev = evidence(sample)
    before = (sample.response_length, len(sample.weight_versions), len(ev.calls))
    if _takes_evaluation(inner):  # as slime calls it (sglang_rollout.py:255-258)
        result = await inner(args, sample, sampling_params, evaluation=False)
    else:
        result = await inner(args, sample, sampling_params)
    for s in result if isinstance(result, list) else [result]:
        _after(s, sample, before, path)
    return result


def _takes_evaluation(function: Any) -> bool:
    return "evaluation" in inspect.signature(function).parameters


def _after(sample: Any, given: Any, before: tuple[int, int, int], path: str) -> None:
    """Record the call slime's own generate made, or check that yours recorded its calls."""
    ev = evidence(sample)
    ev.seen = True
    if sample is not given:  # a generate that returned other samples: nothing to compare with
        if not ev.calls:
            ev.unrecorded["token_source"] = f"{path} returned a new sample and recorded no engine_call for it"
        return
    n0, v0, c0 = before
    grew = sample.response_length - n0
    if path == SLIME_GENERATE:
        if grew > 0:  # one call, its ids appended as SGLang returned them (sglang_rollout.py:200-219)
            versions = sample.weight_versions
            ev.calls.append(
                {
                    "response_length": n0,
                    "tokens": list(sample.tokens[len(sample.tokens) - grew :]),
                    "weight_version": versions[v0] if len(versions) > v0 else None,
                }
            )
    elif grew > 0 and len(ev.calls) == c0:
        ev.unrecorded["token_source"] = (
            f"{path} added {grew} response tokens and recorded no engine_call "
            "(rollout_audit.integrations.slime.engine_call)"
        )
    if sample.rollout_routed_experts is not None:
        ev.unrecorded["routed_experts_version"] = NO_ROUTES


def sample_hook(args: Any, sample: Any, *, rollout_id: int | None = None, evaluation: bool = False) -> None:
    """Mark a sample no recording generate saw (its provenance is then declared not recorded)."""
    if evaluation:
        return None
    ev = evidence(sample)
    if not ev.seen and not ev.calls:
        ev.unrecorded["token_source"] = (
            "the sample was generated without rollout_audit.integrations.slime.generate (a per-sample "
            "generate_function_path, slime/rollout/sglang_rollout.py:251-252, or the option not set)"
        )
    return None


def sample_record(sample: Any) -> dict[str, Any]:
    """One sampler record: `Sample.to_dict()`'s keys the adapter reads, the recorded engine calls in
    its `metadata` (the record's copy), and what was not recorded."""
    d = sample.to_dict()
    rec = {k: d.get(k) for k in SAMPLE_KEYS}
    meta = dict(rec.get("metadata") or {})
    ev = _take(sample)
    said = dict(ev.unrecorded) if ev is not None else {}
    if ev is not None and ev.calls:
        meta["engine_calls"] = ev.calls
    elif not meta.get("engine_calls") and "token_source" not in said:
        said["token_source"] = "the sample went through no recording generate or sample hook"
    rec["metadata"] = meta
    if said:
        rec[UNRECORDED] = said
    return rec


def log_rollout(
    rollout_id: int, args: Any, samples: Sequence[Any], rollout_extra_metrics: Any, rollout_time: Any
) -> bool:
    """Write the rollout's sampler records; then your log function, whose answer is returned."""
    _append(f"slime-{rollout_id}.jsonl", [sample_record(s) for s in samples])
    _last_rollout["rollout_id"] = int(rollout_id)
    inner = os.environ.get(ENV_LOG)
    if inner:
        return bool(load(inner)(rollout_id, args, samples, rollout_extra_metrics, rollout_time))
    return False


def default_converter(args: Any, samples: list[Any]) -> Any:
    """slime's default `_convert_samples_to_train_data` on the manager state it reads
    (slime/ray/rollout.py:388-395, :608-645), the custom converter left out (it is this module)."""
    from slime.ray.rollout import RolloutManager

    # the class under `@ray.remote` (rollout.py:366-367): Ray keeps it as __ray_actor_class__
    manager = getattr(RolloutManager, "__ray_actor_class__", RolloutManager)
    post = getattr(args, "custom_reward_post_process_path", None)
    state: Any = type("ManagerState", (), {})()
    state.args = args
    state.custom_convert_samples_to_train_data_func = None
    state.custom_reward_post_process_func = load(post) if post else None
    state._post_process_rewards = functools.partial(manager._post_process_rewards, state)
    return manager._convert_samples_to_train_data(state, samples)


def train_record(args: Any, train_data: Mapping[str, Any], rollout_id: int | None) -> dict[str, Any]:
    """The train data record: what the trainer trains, and the arguments that decided it."""
    rec: dict[str, Any] = {k: train_data[k] for k in TRAIN_KEYS if k in train_data}
    rec["args"] = {k: getattr(args, k, None) for k in TRAIN_ARGS}
    if rollout_id is not None:
        rec["rollout_id"] = rollout_id
    return rec


def convert(args: Any, samples: list[Any]) -> Any:
    """The samples as train data (your converter, `ROLLOUT_AUDIT_SLIME_CONVERT`, or slime's), and the
    train data record."""
    inner = os.environ.get(ENV_CONVERT)
    train_data = load(inner)(args, samples) if inner else default_converter(args, samples)
    rollout_id = _last_rollout.get("rollout_id")
    name = f"slime-train-{rollout_id}.jsonl" if rollout_id is not None else "slime-train.jsonl"
    _append(name, [train_record(args, train_data, rollout_id)])
    return train_data


def actor_record(args: Any, rollout_id: int, rollout_data: Mapping[str, Any]) -> dict[str, Any]:
    def rows(k: str) -> list[Any]:
        return [_plain(x) if hasattr(x, "tolist") else x for x in rollout_data[k]]

    return {
        "rollout_id": rollout_id,
        **{k: rows(k) for k in ACTOR_KEYS},
        **({CRITIC_KEY: rows(CRITIC_KEY)} if rollout_data.get(CRITIC_KEY) is not None else {}),
        "args": {k: getattr(args, k, None) for k in ACTOR_ARGS},
    }


def postprocess(args: Any, rollout_id: int, rollout_data: Mapping[str, Any]) -> None:
    """The actor record of this rank, then your postprocess function."""
    if all(k in rollout_data for k in ACTOR_KEYS):  # the last pipeline stage
        rank = _rank()
        _append(
            f"slime-actor-{rollout_id}-{rank}-{socket.gethostname()}.jsonl",
            [actor_record(args, rollout_id, rollout_data)],
        )
    inner = os.environ.get(ENV_POSTPROCESS)
    if inner:
        load(inner)(args, rollout_id, rollout_data)


def _rank() -> int:
    try:
        import torch.distributed as dist
    except ImportError:
        return 0
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
