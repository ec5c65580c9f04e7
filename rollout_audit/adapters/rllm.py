"""rLLM: `Episode.to_dict()` records (one a line) to contract trajectories.

Each rLLM `Trajectory` of an episode becomes one contract trajectory (or one per segment when a step's
prompt does not extend the running sequence, as rLLM's verl transform splits it). Each `Step` with a
`model_output` is one turn: its engine prompt (`model_output.prompt_ids`) gives the turn's engine
context, its `completion_ids` the sampled ids, `logprobs` the behaviour log-probs (a short list leaves
the rest null: rLLM's transform pads it with 0.0), `weight_version` the policy version, `finish_reason`
the engine's stop. `Episode.termination_reason` and `is_correct` give the stop cause.

rLLM's compact filtering (`rllm.compact_filtering`, `CompactFilteringConfig` in
rllm/trainer/algorithms/config.py) drops episodes by termination reason before grouping: such an
episode is neither trained nor counted in its group's statistics, so it is written with a null
reward (the contract's "excluded"). rLLM does not dump its configuration with the episodes: the
context gives it (`compact_filtering=true`, `mask_<reason>=...`, defaults those of rLLM's
base.yaml), and the policy assumed is stated in the table metadata (`rollout_audit.trainer_settings`).

`updates` writes one update record per training step from `Step.advantage` (set by
`compute_advantages`, so only a dump taken after it has them; docs/frameworks/rllm.md)."""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..contract import schema as S
from ..reading.records import records_to_table
from .base import (
    AdapterError,
    at_record,
    context_values,
    contract_table,
    flags,
    need,
    numbers,
    objects,
    origin,
    short,
    step_of,
    wholes,
    with_trainer_settings,
)
from .routes import INT32, digest
from .steps import (
    Call,
    engine_context,
    episode_rows,
    finish_reason,
    guarded,
    identity,
    identity_lacks,
    merge,
    option,
    stop_columns,
)

# Episode.termination_reason (rllm/workflows/workflow.py TerminationReason) -> (flag, stop_reason);
# env_done becomes success or failure by the episode's is_correct.
TERMINATION = {
    "max_prompt_length_exceeded": ("truncated", "max_tokens"),
    "max_response_length_exceeded": ("truncated", "max_tokens"),
    "max_turns_exceeded": ("truncated", "max_turns"),
    "timeout": ("truncated", "timeout"),
    "error": ("infra_error", "env_error"),
}

# CompactFilteringConfig's flags with the defaults of rllm/trainer/config/rllm/base.yaml (the
# trainer reads config.rllm.compact_filtering from it); `compact_filtering` is its `enable`
FILTER_DEFAULTS = {
    "max_prompt_length_exceeded": True,
    "max_response_length_exceeded": True,
    "env_done": False,
    "max_turns_exceeded": True,
    "timeout": True,
    "unknown": False,
    "error": True,
}
# rLLM's algorithm.adv_estimator (and norm_adv_by_std_in_grpo) -> the contract's estimator; rLLM's
# normalised GRPO divides by the population std (np.std, ddof 0): the contract's grpo_population_std
ESTIMATORS = {"grpo": "grpo_no_std", "rloo": "rloo", "reinforce": "reinforce"}
CONTEXT: dict[str, type] = {
    "compact_filtering": bool,
    **{f"mask_{r}": bool for r in FILTER_DEFAULTS},
    "adv_estimator": str,
    "norm_adv_by_std_in_grpo": bool,
}

# The trainer-side hook (`integrations.rllm.dump_batch`): the DataProto row's identity (non_tensor_batch,
# rllm/trainer/verl/transform.py `_batch_tensors_and_build_data_proto`) and the tensors it writes
BATCH_ROWS = ("step_ids", "episode_ids", "group_roles", "is_pad_step", "trajectory_ids", "uid", "is_last_step")
MISSING = "rollout_audit_missing"  # a line `integrations.rllm.AuditedBackend` writes for what it lost
BATCH_TENSORS = (
    "prompts",
    "responses",
    "response_mask",
    "traj_rewards",
    "advantages",
    "rollout_log_probs",
    "step_rewards",
    "token_level_rewards",
)
# The settings record `integrations.rllm.AuditedWorkflowTrainer` writes beside the rows it trains: the
# trainer, the rLLM version and what the trainer read from its configuration (`workflow_settings`)
SETTINGS = "rollout_audit_trainer_settings"
WORKFLOW_TRAINER = "AgentWorkflowPPOTrainer"
TESTED_RLLM = ("0.3.0.pre",)  # rLLM's pyproject version at 9beb6e0, the commit the integration was read at
# AgentWorkflowPPOTrainer's advantages are verl's compute_advantage (agent_workflow_trainer.py:425-433):
# verl's GRPO divides by torch.std (Bessel's correction, ddof 1), verl's RLOO is R minus the others' mean
VERL_ESTIMATORS = {
    ("grpo", True): "grpo",
    ("grpo", False): "grpo_no_std",
    ("rloo", True): "rloo",
    ("rloo", False): "rloo",
}

LACKS = {
    **identity_lacks(
        "rLLM",
        {
            "environment_id": "the environment identity",
            "environment_version": "the environment version",
            "verifier_version": "the reward function's version",
            "reset_seed": "a reset seed",
            "tokenizer_id": "the tokenizer identity",
        },
    ),
    "turns.temperature": "rLLM's Step does not record the sampling temperature (it lives in the rollout "
    "engine's sampling params); pass --context temperature=...",
    "turns.top_p": "rLLM's Step does not record top_p (it lives in the rollout engine's sampling params); "
    "pass --context top_p=...",
    "turns.logprob": "rLLM records token log-probs, not a per-turn log-prob",
    "turns.num_policy_tokens": "rLLM does not count policy tokens per step",
    "num_trainable_tokens": "rLLM does not count trainable tokens per trajectory",
    "initial_state_checksum": "rLLM does not record environment state",
    "wall_clock_s": "rLLM does not record an episode's wall-clock time",
    "routed_experts_version": "the steps carry no routing_matrices in the verl engine's [header, base64] form "
    "(R3 off, or a Fireworks/Tinker engine's per-token strings), or no weight_version",
    "routed_experts_sha256": "the steps carry no routing_matrices in the verl engine's [header, base64] form",
    "overlong_penalty": "rLLM has no overlong penalty (no reward shaping by response length in rllm/)",
}
# the dtypes rLLM's verl engine writes in a routing header (verl's routed_experts: int16 since verl#7407, int32)
ROUTE_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
MAX_HEADER = 4096  # characters of a routing header (an engine's are a few dozen)
_ROUTES = "_routes"  # a turn's decoded routes while its trajectory is merged (not a contract field)


def filtered(context: Mapping[str, Any]) -> frozenset[str]:
    """The termination reasons rLLM's compact filtering drops, from the context (none unless enabled)."""
    if not context.get("compact_filtering", False):
        return frozenset()
    return frozenset(r for r, on in FILTER_DEFAULTS.items() if context.get(f"mask_{r}", on))


_STEP_IN_NAME = re.compile(r"step-(\d+)")  # the hooks' rollout_dumps/step-{global_step:06d}.jsonl


def _at(episode: Mapping[str, Any], n: int) -> str:
    """The identity prefix `{step}/` of an episode (its `global_step`, else its dump file's name):
    rLLM's episode ids (`{task_id}:{rollout_idx}`) recur at every step that draws the task again."""
    step = step_of(episode, ("global_step",), _STEP_IN_NAME, f"episode {n}")
    return "" if step is None else f"{step}/"


TRUNCATIONS = ("max_prompt_length_exceeded", "max_response_length_exceeded", "max_turns_exceeded", "timeout")


def policy(context: Mapping[str, Any]) -> tuple[str, str]:
    """The trainer policy the conversion assumed, in one sentence, and the audit's truncation policy
    it implies: `exclude` when compact filtering drops every truncation reason, else `penalize`
    (rLLM trains the truncated episodes it keeps with the reward the workflow gave them)."""
    drop = filtered(context)
    kept = [r for r in TRUNCATIONS if r not in drop]
    said = "as given" if any(k in context for k in CONTEXT if k.startswith(("compact", "mask_"))) else "rLLM's default"
    truncation = "penalize" if kept else "exclude"
    if not drop:
        head = (
            f"rLLM compact filtering off ({said}; pass --context compact_filtering=true when the run enabled "
            "it): every episode is trained with its reward"
        )
    else:
        head = (
            f"rLLM compact filtering on ({said}; base.yaml defaults for flags not given): episodes ending in "
            f"{', '.join(sorted(drop))} are excluded (null reward, in no group), as rLLM drops them before grouping"
        )
    tail = f"; truncated episodes ending in {', '.join(kept)} are trained with their reward" if kept else ""
    return f"{head}{tail}: truncation = {truncation!r}", truncation


def _stop(episode: Mapping[str, Any]) -> dict[str, Any]:
    """Flags and stop_reason from termination_reason; an unknown or missing reason sets no flag
    and stop_reason "unknown" (T301/T302 then say so instead of a guess)."""
    reason = episode.get("termination_reason")
    flag: str | None
    if reason == "env_done":
        flag, stop = "terminated", ("success" if episode.get("is_correct") else "failure")
    else:
        flag, stop = TERMINATION.get(str(reason), (None, "unknown"))
    return stop_columns(flag, stop)


def _routing(step: Mapping[str, Any], out: Mapping[str, Any], where: str) -> np.ndarray | None:
    """A step's expert routes (positions × layers × top-k) from `routing_matrices` in the wire form of
    rLLM's verl engine, [shape header JSON, base64 of the array's bytes] (verl_engine.py:144-148); None
    without them or in another engine's per-token form (Fireworks, Tinker: one string per token)."""
    rm = step.get("routing_matrices", out.get("routing_matrices"))
    if rm is None:
        return None
    if not (isinstance(rm, list) and all(isinstance(x, str) for x in rm)):
        kind = "a list holding non-strings" if isinstance(rm, list) else f"of type {type(rm).__name__}"
        raise AdapterError(
            f"{where}: routing_matrices is {kind}, neither [{{shape, dtype}}, base64] nor one string per token"
        )
    if not rm or not rm[0].startswith("{"):  # another engine's per-token form: no routes this adapter reads
        return None
    if len(rm) != 2:
        raise AdapterError(
            f"{where}: routing_matrices starts with a {{shape, dtype}} header but has {len(rm)} items, not 2"
        )
    if len(rm[0]) > MAX_HEADER:  # a shape and a dtype name: a few dozen characters
        raise AdapterError(
            f"{where}: routing_matrices header is {len(rm[0])} characters, not a {{shape, dtype}} header"
        )
    try:
        header = json.loads(rm[0])
        layers, topk = header["shape"]
        name = header["dtype"]
        raw = base64.b64decode(rm[1], validate=True)
    except (ValueError, TypeError, KeyError, binascii.Error, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else short(str(e))
        raise AdapterError(f"{where}: routing_matrices is not [{{shape, dtype}}, base64]: {why}") from None
    ok = all(isinstance(x, int) and not isinstance(x, bool) and 0 < x < INT32 for x in (layers, topk))
    if not ok or not isinstance(name, str) or name not in ROUTE_DTYPES:
        raise AdapterError(
            f"{where}: routing_matrices header must give shape [layers, topk] (positive integers) and an integer "
            f"dtype ({', '.join(ROUTE_DTYPES)}), got shape {short(header.get('shape'))} dtype {short(name)}"
        )
    dtype = np.dtype(name)
    try:  # numpy refuses a shape whose size overflows its index type, rows or none
        if len(raw) % (layers * topk * dtype.itemsize):
            raise ValueError
        arr = np.frombuffer(raw, dtype).reshape(-1, layers, topk)
    except ValueError:
        raise AdapterError(
            f"{where}: routing_matrices holds {len(raw)} bytes, not whole rows of {layers} × {topk} {name}"
        ) from None
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= INT32):
        raise AdapterError(f"{where}: routing_matrices: expert ids must lie in 0 .. 2^31 - 1")
    return arr


def _with_routes(rows: list[dict[str, Any]], segments: list[Any]) -> None:
    """Each segment's row with the routes rLLM's trainer replays (transform.py:336-360): the last step of
    the segment that has routes, whose array covers the segment's prompt and response up to that step and is
    placed from the prompt's first position (transform.py:215-226): its digest over the row's positions (zero
    where none) and, when the step has a weight_version, that version on each of its rows (the version rLLM
    recorded for the call, rollout_engine.py:88-90); null on the positions past the array."""
    for row, seg in zip(rows, segments):
        found = [t.pop(_ROUTES) for t in seg.turns if _ROUTES in t]
        routes = next((r for r in reversed(found) if r is not None), None)
        if routes is None:
            continue
        arr, version = routes
        n = len(row["token_ids"])
        row["routed_experts_sha256"] = digest(arr[:n])  # the rows transform.py places, cut at the row's end
        if version is not None:
            row["routed_experts_version"] = [version] * len(arr) + [None] * (n - len(arr))


def _call(step: Mapping[str, Any], where: str, context: Mapping[str, Any]) -> Call | None:
    """A step as an engine call (None when it has no model_output: rLLM's transform skips it)."""
    out = need(step, "model_output", where)
    if out is None:
        return None
    if not isinstance(out, Mapping):
        raise AdapterError(f"{where}: model_output is not an object")
    prompt = need(out, "prompt_ids", f"{where}.model_output")
    sampled = need(out, "completion_ids", f"{where}.model_output")
    if prompt is None or sampled is None:  # rLLM's transform skips such a step too
        return None
    version = step.get("weight_version", out.get("weight_version"))
    action = step.get("action")
    turn = {
        "policy_version": version,
        "finish_reason": finish_reason(out.get("finish_reason")),
        "sampled_token_ids": wholes(sampled, "completion_ids", f"{where}.model_output"),
        "reward": step.get("reward"),
        "action_text": step.get("model_response"),
        "parsed_action": None if action is None else json.dumps(action, sort_keys=True),
        **engine_context(prompt, "prompt_ids"),
        **{k: option(context, k) for k in ("temperature", "top_p") if context.get(k) is not None},
    }
    routes = _routing(step, out, where)
    if routes is not None:
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise AdapterError(f"{where}: weight_version must be an integer")
        turn[_ROUTES] = (routes, version)
    return Call(prompt, sampled, out.get("logprobs"), turn)


def _trajectories(episode: Mapping[str, Any], n: int, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Contract records of one episode."""
    eid = str(need(episode, "id", f"episode {n}"))
    task_id = eid.split(":")[0]
    at = _at(episode, n)
    stop = _stop(episode)
    dropped = str(episode.get("termination_reason") or "unknown") in filtered(context)
    out = []
    for k, traj in enumerate(
        objects(need(episode, "trajectories", f"episode {eid}"), "trajectories", f"episode {eid}")
    ):
        name = str(traj.get("name", k))
        where = f"episode {eid} trajectory {name}"
        steps = objects(need(traj, "steps", where), "steps", where)
        calls = [c for i, s in enumerate(steps) if (c := _call(s, f"{where} step {i}", context))]
        segments = merge(calls, where)
        common = {"task_id": task_id, "group_id": f"{at}{task_id}:{name}", **identity(context)}
        reward = None if dropped else traj.get("reward")
        outcome = {**stop, "reward": reward, "verifier_success": bool(episode.get("is_correct"))}
        rows = [{**common, **row} for row in episode_rows(f"{at}{eid}/{name}", segments, outcome)]
        _with_routes(rows, segments)
        out += rows
    return out


def _split(records: Iterable[dict]) -> tuple[list[dict], list[dict], dict[str, Any] | None]:
    """(episode records, trainer-side rows, the workflow trainer's settings or None): a trainer-side row
    carries the batch's `responses`, a settings record `SETTINGS`."""
    episodes: list[dict] = []
    rows: list[dict] = []
    settings: list[tuple[str, Any]] = []
    for rec in records:
        if isinstance(rec, Mapping) and MISSING in rec:
            where = getattr(rec, "origin", None) or "the dump"
            raise AdapterError(
                f"{where}: the recorder did not record {short(rec[MISSING])}: this run's record is incomplete"
            )
        if isinstance(rec, Mapping) and SETTINGS in rec:
            settings.append((getattr(rec, "origin", None) or "the dump", rec[SETTINGS]))
            continue
        (rows if isinstance(rec, Mapping) and "responses" in rec else episodes).append(rec)
    return episodes, rows, _settings(settings)


_SETTING_TYPES: dict[str, type | tuple[type, ...]] = {
    "trainer": str,
    "rllm_version": (str, type(None)),
    "loss_agg_mode": str,
    "adv_estimator": str,
    "norm_adv_by_std_in_grpo": bool,
    "use_kl_in_reward": bool,
    "distill_enable": bool,
}


def _settings(found: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """The workflow trainer's settings records, one per step, as one: each an object naming
    `WORKFLOW_TRAINER`, with the types the adapter reads, and the same at every step (one run, one
    configuration); `not_recorded` an object of strings."""
    if not found:
        return None
    first_where, first = found[0]
    for where, value in found:
        if not isinstance(value, Mapping):
            raise AdapterError(f"{where}: {SETTINGS} is not an object")
        if value.get("trainer") != WORKFLOW_TRAINER:
            raise AdapterError(f"{where}: {SETTINGS}.trainer is {short(value.get('trainer'))}, not {WORKFLOW_TRAINER}")
        for key, kind in _SETTING_TYPES.items():
            if key in value and not isinstance(value[key], kind):
                raise AdapterError(f"{where}: {SETTINGS}.{key} has type {type(value[key]).__name__}")
        lacks = value.get("not_recorded", {})
        if not isinstance(lacks, Mapping) or not all(isinstance(v, str) for v in lacks.values()):
            raise AdapterError(f"{where}: {SETTINGS}.not_recorded must be an object of strings")
        if value != first:
            key = next(k for k in sorted(set(value) | set(first), key=str) if value.get(k) != first.get(k))
            raise AdapterError(
                f"{where}: {SETTINGS}.{short(key)} is {short(value.get(key))}, but {short(first.get(key))} in "
                f"{first_where}: one run's trainer has one configuration"
            )
    return dict(first)


def _with_settings(context: dict[str, Any], settings: Mapping[str, Any] | None) -> dict[str, Any]:
    """The context with the advantage settings the workflow trainer recorded from its configuration (a
    context option that says otherwise is refused: the trainer's own record is what it trained with).
    AgentWorkflowPPOTrainer applies no compact filtering (agent_workflow_trainer.py at 9beb6e0 reads no
    `rllm.compact_filtering`), so a context that enables it is refused too."""
    if settings is None:
        return context
    out = dict(context)
    for key in ("adv_estimator", "norm_adv_by_std_in_grpo"):
        if key not in settings:
            continue
        if key in out and out[key] != settings[key]:
            raise AdapterError(
                f"--context {key}={out[key]!r} contradicts the trainer's record ({key} = {settings[key]!r}, "
                "read from its configuration)"
            )
        out[key] = settings[key]
    if out.get("compact_filtering"):
        raise AdapterError(
            f"--context compact_filtering=true: {WORKFLOW_TRAINER} applies no compact filtering (it reads no "
            "rllm.compact_filtering); every episode it trains keeps its reward"
        )
    return out


MAX_REASON = 400  # characters of a reason the recorder wrote (its own are one sentence)


def _reason(text: Any) -> str:
    """A reason from the dump as the report shows it: a string, cut at MAX_REASON characters."""
    text = str(text)
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


def _workflow_said(settings: Mapping[str, Any], estimator: str | None) -> str:
    """The sentence naming what the workflow trainer's record says it trained with."""
    version = settings.get("rllm_version")
    known = "" if version in TESTED_RLLM else f" (outside the tested range {', '.join(TESTED_RLLM)})"
    read = ", ".join(
        f"{k} {short(settings[k])}"
        for k in ("loss_agg_mode", "adv_estimator", "norm_adv_by_std_in_grpo")
        if k in settings
    )
    lacks = sorted(str(k) for k in settings.get("not_recorded", {}) if k not in UPDATE_COLUMNS)
    missing = f"; not in its record: {_reason(', '.join(lacks))}" if lacks else ""
    return (
        f"{WORKFLOW_TRAINER} of rLLM {_reason(version) if version else '(version unknown)'}{known} trained with "
        f"{read or 'no setting recorded'} (its own configuration, in the dump), advantages declared "
        f"{estimator or 'not recomputable'}{missing}; it applies no compact filtering: every episode is "
        "trained with its reward: truncation = 'penalize'"
    )


def _row_ids(episodes: list[dict], context: Mapping[str, Any]) -> dict[tuple[int | None, str], list[str]]:
    """(step, trajectory uid) -> the contract ids of its segments, in order: rLLM emits one batch row per
    segment of a trajectory, with the trajectory's uid as `step_ids` (transform.py `_emit`)."""
    out: dict[tuple[int | None, str], list[str]] = {}
    for n, ep in enumerate(episodes):
        eid = str(need(ep, "id", f"episode {n}"))
        step = step_of(ep, ("global_step",), _STEP_IN_NAME, f"episode {n}")
        ids = [r["trajectory_id"] for r in _trajectories(ep, n, context)]
        for k, traj in enumerate(objects(need(ep, "trajectories", f"episode {eid}"), "trajectories", f"episode {eid}")):
            base = f"{_at(ep, n)}{eid}/{traj.get('name', k)}"
            if traj.get("uid") is not None:
                out[(step, str(traj["uid"]))] = [i for i in ids if i == base or i.startswith(base + "#")]
    return out


def _matched(rows: list[dict], ids: dict[tuple[int | None, str], list[str]]) -> dict[str, tuple[int, dict]]:
    """Contract id -> (position, trainer-side row): the k-th row of a trajectory uid at a step is its k-th
    segment; padding rows (`is_pad_step`) are none. A row of no dumped trajectory is left out (named by U605
    through the update that trains it)."""
    seen: dict[tuple[int | None, str], int] = {}
    out: dict[str, tuple[int, dict]] = {}
    for n, row in enumerate(rows, 1):
        if row.get("is_pad_step"):
            continue
        key = (row.get("global_step"), str(need(row, "step_ids", f"batch row {n}")))
        k = seen[key] = seen.get(key, -1) + 1
        segments = ids.get(key, [])
        if k < len(segments):
            out[segments[k]] = (n, row)
    return out


def _trained(row: dict[str, Any], batch: Mapping[str, Any], where: str) -> None:
    """`row` with what rLLM trains of it: the batch row's response is the first tokens of the segment's
    (transform.py `_pad_sequence_batch` cuts it at the cap), so tokens past it are not trainable, and the
    reward is where the batch placed it (`traj_rewards`: on the last response token, nowhere when the
    response was cut, transform.py `_build_step_and_trajectory_rewards`)."""
    first = row["token_source"].index(2) if 2 in row["token_source"] else len(row["token_ids"])
    resp = row["token_ids"][first:]
    kept = wholes(need(batch, "responses", where), "responses", where)
    if resp[: len(kept)] != kept:
        raise AdapterError(f"{where}: responses are not the first tokens of the trajectory's response")
    mask = flags(need(batch, "response_mask", where), "response_mask", where)
    placed = need(batch, "traj_rewards", where)
    if len(mask) != len(kept) or not isinstance(placed, list) or len(placed) != len(kept):
        raise AdapterError(f"{where}: response_mask and traj_rewards must have one value per response token")
    cut = [False] * (len(resp) - len(kept))
    row["loss_mask"] = row["loss_mask"][:first] + [a and b for a, b in zip(row["loss_mask"][first:], mask)] + cut
    rewards = [0.0 if v is None else v for v in numbers(placed, "traj_rewards", where)]
    row["token_reward"] = [0.0] * first + rewards + [0.0] * len(cut)


@guarded("rLLM")
def to_contract(records: Iterable[dict], **context: Any) -> pa.Table:
    """Contract trajectories from rLLM `Episode.to_dict()` records; with trainer-side rows (`dump_batch`),
    what rLLM trains of them."""
    context = context_values(context, CONTEXT)
    episodes, batch, settings = _split(records)
    context = _with_settings(context, settings)
    rows: list[dict[str, Any]] = [
        {**r, **origin(ep)} for n, ep in enumerate(episodes) for r in at_record(ep, _trajectories, ep, n, context)
    ]
    if batch:
        matched = _matched(batch, _row_ids(episodes, context))
        for r in rows:
            if r["trajectory_id"] in matched:
                n, b = matched[r["trajectory_id"]]
                at_record(b, _trained, r, b, f"batch row {n} ({r['trajectory_id']})")
    said, truncation = policy(context)
    if settings is not None:
        said, truncation = _workflow_said(settings, _estimator(context, settings)[0]), "penalize"
    return with_trainer_settings(contract_table(rows, LACKS, "rLLM"), said, truncation=truncation)


def _advantage(steps: list[Any], where: str) -> float | None:
    """The trajectory's advantage: rLLM broadcasts one float to every step (a per-token list of
    one value is the same); None when no step has one. Different values are not a group advantage."""
    seen: set[float] = set()
    for i, step in enumerate(steps):
        a = step.get("advantage") if isinstance(step, Mapping) else None
        if a is None:
            continue
        values = a if isinstance(a, list) else [a]
        if any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in values):
            raise AdapterError(f"{where} step {i}: advantage must be a number or a list of numbers")
        seen.update(float(v) for v in values)
    if seen and all(v != v for v in seen):  # NaN is not equal to itself: one NaN advantage, not several
        return float("nan")
    if len(seen) > 1:
        raise AdapterError(
            f"{where}: advantage differs between steps or tokens ({len(seen)} values): per-token advantages "
            "(use_precomputed_advantage) are not group advantages; dump before compute_advantages instead"
        )
    return seen.pop() if seen else None


_NO_LOSS = "rLLM's episodes do not record how its backend reduced the loss, nor the denominator"
_NO_VERSION = "rLLM's episodes do not record the trainer's weight version at the update"
# declared by column name (the schema check) and as the checks name their inputs (the not-run reason)
UPDATE_LACKS = {
    **{k: _NO_LOSS for c in ("reduction", "loss_denominator") for k in (c, f"updates.{c}")},
    **{k: _NO_VERSION for k in ("trainer_version", "updates.trainer_version")},
}


@guarded("rLLM")
def updates(records: Iterable[dict], **context: Any) -> pa.Table | None:
    """One update record per training step (the records' `global_step`, as the post-advantage hook
    writes it, else the step in the dump file's name; 0 when neither says) from `Step.advantage`: the trajectories that carry one, in dump order, with their
    advantage (a filtered episode that carries one is listed too: U606 then says it was trained). None when no step has an advantage (a dump taken before compute_advantages).
    trainer_version is the newest weight_version of the step's batch (rLLM's episodes do not
    record the trainer's: exact for synchronous training, a lower bound otherwise)."""
    context = context_values(context, CONTEXT)
    records, batch, settings = _split(records)
    context = _with_settings(context, settings)
    if batch:
        return _batch_updates(records, batch, context, settings)
    steps: dict[int, dict[str, Any]] = {}
    for n, ep in enumerate(records):
        eid = str(need(ep, "id", f"episode {n}"))
        step = step_of(ep, ("global_step",), _STEP_IN_NAME, f"episode {n}")
        u = steps.setdefault(0 if step is None else step, {"ids": [], "adv": []})
        ids = [r["trajectory_id"] for r in _trajectories(ep, n, context)]
        for k, traj in enumerate(need(ep, "trajectories", f"episode {eid}")):
            name = str(traj.get("name", k))
            where = f"episode {eid} trajectory {name}"
            adv = _advantage(need(traj, "steps", where), where)
            if adv is None:
                continue
            base = f"{_at(ep, n)}{eid}/{name}"
            segments = [i for i in ids if i == base or i.startswith(base + "#")]  # rLLM trains each with it
            u["ids"] += segments
            u["adv"] += [adv] * len(segments)
    return _update_table(
        [
            {"update_step": step, "trajectory_ids": u["ids"], "advantages": u["adv"]}
            for step, u in sorted(steps.items())
            if u["ids"]
        ],
        context,
    )


def _batch_updates(
    episodes: list[dict], batch: list[dict], context: Mapping[str, Any], settings: Mapping[str, Any] | None
) -> pa.Table | None:
    """One update per `global_step` of the trainer-side rows: the segments trained (rows with a trainable
    token), each with its advantage (one value on its trainable tokens) and the tokens it puts in the loss."""
    matched = _matched(batch, _row_ids(episodes, context))
    by_row = {id(b): tid for tid, (_, b) in matched.items()}
    steps: dict[int, dict[str, list]] = {}
    for n, b in enumerate(batch, 1):
        where = getattr(b, "origin", None) or f"batch row {n}"
        mask = flags(need(b, "response_mask", where), "response_mask", where)
        if b.get("is_pad_step") or not any(mask):
            continue
        adv = {a for a, m in zip(numbers(need(b, "advantages", where), "advantages", where), mask) if m}
        if len(adv) != 1:
            raise AdapterError(f"{where}: advantages differ between trainable tokens: not a broadcast advantage")
        tid = by_row.get(id(b), f"{b.get('global_step')}/{b.get('step_ids')}")  # unknown: U605 names it
        u = steps.setdefault(int(b.get("global_step") or 0), {"ids": [], "adv": [], "num": []})
        u["ids"].append(tid)
        u["adv"].append(adv.pop())
        u["num"].append(sum(mask))
    return _update_table(
        [
            {"update_step": k, "trajectory_ids": u["ids"], "advantages": u["adv"], "numerator_tokens": u["num"]}
            for k, u in sorted(steps.items())
        ],
        context,
        settings,
    )


UPDATE_COLUMNS = ("reduction", "loss_denominator", "trainer_version", "advantage_estimator")


def _estimator(context: Mapping[str, Any], settings: Mapping[str, Any] | None) -> tuple[str | None, str]:
    """The contract estimator of the run's advantages, and why there is none. The unified trainer's are
    rLLM's own (population std); the workflow trainer's are verl's `compute_advantage` (`VERL_ESTIMATORS`),
    not recomputable from the episode rewards when the KL penalty is in the reward or distillation set them."""
    name = str(context.get("adv_estimator", "grpo"))
    norm = bool(context.get("norm_adv_by_std_in_grpo", True))
    why = f"rLLM's estimator {name!r} has no contract counterpart"
    if settings is None:
        return ("grpo_population_std" if name == "grpo" and norm else ESTIMATORS.get(name)), why
    if "adv_estimator" not in settings:
        return None, _reason(settings.get("not_recorded", {}).get("adv_estimator", "the record has no adv_estimator"))
    if settings.get("use_kl_in_reward"):
        return (
            None,
            "the advantages were computed from rewards with the KL penalty in them (algorithm.use_kl_in_reward)",
        )
    if settings.get("distill_enable"):
        return None, "distillation set the advantages (rllm.distill.enable): teacher minus student log-probs"
    return VERL_ESTIMATORS.get((name, norm)), f"verl's estimator {name!r} has no contract counterpart"


def _update_table(
    updates: list[dict[str, Any]], context: Mapping[str, Any], settings: Mapping[str, Any] | None = None
) -> pa.Table | None:
    """The update records with the declared estimator and what rLLM does not record (the workflow trainer's
    record says what it lacks itself, and the loss aggregation it read)."""
    estimator, why = _estimator(context, settings)
    rows: list[Mapping[str, Any]] = [
        {**u, **({"advantage_estimator": estimator} if estimator else {})} for u in updates
    ]
    if not rows:
        return None
    table = records_to_table(rows, kind="updates")
    lacks = dict(UPDATE_LACKS)
    if settings is not None:
        said = settings.get("not_recorded", {})
        mode = settings.get("loss_agg_mode")
        denominator = _reason(said.get("loss_denominator", _NO_LOSS))
        loss = (
            f"loss_agg_mode {short(mode)} is recorded (actor_rollout_ref.actor.loss_agg_mode), but not the "
            f"denominator: {denominator}"
            if mode is not None
            else f"{_reason(said.get('loss_agg_mode', 'no loss_agg_mode in the record'))}; {denominator}"
        )
        version = _reason(said.get("trainer_version", _NO_VERSION))
        lacks = {k: v for c, v in (("reduction", loss), ("loss_denominator", loss), ("trainer_version", version))
                 for k in (c, f"updates.{c}")}  # fmt: skip
    if estimator is None:
        lacks |= {"advantage_estimator": why, "updates.advantage_estimator": why}
    meta = {**(table.schema.metadata or {}), S.META_NOT_RECORDED: json.dumps(lacks, sort_keys=True).encode()}
    return table.replace_schema_metadata(meta)
