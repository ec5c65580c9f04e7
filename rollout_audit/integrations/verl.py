"""verl: the dump hooks' writers. `dump` (sampler side) appends one JSON Lines record per agent-loop
sample, in `AgentLoopOutput`'s own field names, to a file per process under a directory (agent-loop
workers are separate Ray processes); `dump_batch` (trainer side) appends one record per row of the
`DataProto` the trainer is about to train, after rollout correction and advantages, in the batch's own
key names. Both go to the same directory, for `rollout-audit check --from verl DIR`. No verl import:
they read attributes and tensors (`tolist`), so they run wherever verl runs."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..adapters.routes import rows_digest
from ..adapters.verl import ALGORITHM, ATTEMPTS, BATCH_TENSORS, OVERLONG, READS, ROUTE_RUNS, VERSIONS

__all__ = [
    "ATTEMPTS",
    "ROUTE_RUNS",
    "attempt",
    "batch_records",
    "boundary_ids",
    "dump",
    "dump_batch",
    "engine_call",
    "record",
    "write_records",
]

# AgentLoopOutput fields the adapter reads (verl/experimental/agent_loop/agent_loop.py), extra_fields apart
FIELDS = tuple(
    sorted(READS["verl.experimental.agent_loop.agent_loop.AgentLoopOutput"] - {"extra_fields", "routed_experts"})
)
# the JSON-safe part of extra_fields that ToolAgentLoop sets: scores, and the weight versions of the
# episode's first call (global_steps, min_global_steps) and of its last (max_global_steps)
EXTRA = ("turn_scores", "tool_rewards", *VERSIONS)


def engine_call(prompt_ids: Sequence[int], output: Any, template_ids: Sequence[int] | None = None) -> dict[str, Any]:
    """One `server_manager.generate` call as the hook records it: the ids the engine was given, and
    from its `TokenOutput` the ids it returned, its `stop_reason` and the weight versions in
    `extra_fields` (`global_steps`; `min_global_steps` / `max_global_steps` differ when a fully-async
    call was resumed across a weight update); with `template_ids`, the chat template's render."""
    extra = getattr(output, "extra_fields", None) or {}
    call: dict[str, Any] = {
        "prompt_ids": list(prompt_ids),
        "token_ids": list(output.token_ids),
        "stop_reason": getattr(output, "stop_reason", None),
        **{k: extra.get(k) for k in VERSIONS},
    }
    if template_ids is not None:
        call["template_ids"] = list(template_ids)
    routes = getattr(output, "routed_experts", None)
    if routes is not None:  # R3: the rows of the engine's routes (its context and its tokens)
        call["routed_experts_rows"] = len(routes)
    for key in (ATTEMPTS, ROUTE_RUNS):  # recorded by `attempt` inside a resuming client's loop
        if extra.get(key) is not None:
            call[key] = extra[key]
    return call


def attempt(final_output: Any, output: Any, routes_before: Any) -> None:
    """One attempt of a call that the fully-async client resumes after an abort (the loop of
    `FullyAsyncLLMServerClient.generate`, llm_server.py, after it merged `output` into `final_output`;
    `routes_before` is `final_output.routed_experts` before that merge). Records in
    `final_output.extra_fields` the attempt's new tokens and weight version (`attempts`), and which
    version produced each row of the merged routes, as runs [rows, version] (`routed_experts_versions`):
    routes the merge took whole from this attempt are all of its version, rows it appended are."""
    extra = final_output.extra_fields
    version = (getattr(output, "extra_fields", None) or {}).get("global_steps")
    extra.setdefault(ATTEMPTS, []).append([len(output.token_ids), version])
    merged: Any = getattr(final_output, "routed_experts", None)
    new: Any = getattr(output, "routed_experts", None)
    if merged is None or merged is routes_before:
        return  # no routes, or the merge kept them as they were
    if merged is new:  # taken whole: every row from this attempt's prefill and decode
        extra[ROUTE_RUNS] = [[len(merged), version]]
        return
    grown = len(merged) - (0 if routes_before is None else len(routes_before))
    extra[ROUTE_RUNS] = [*extra.get(ROUTE_RUNS, []), [grown, version]]


def boundary_ids(builder: Any) -> list[int]:
    """The token ids verl's continuous-token builder drops from the end of an assistant turn when a
    context message follows (`GLMContinuousTokenBuilder`: `<|observation|>` and `<|user|>`, which both
    end a turn and open the next message); empty for builders that drop nothing."""
    return sorted(int(i) for i in getattr(builder, "_ambiguous_boundary_ids", None) or ())


def record(output: Any, **fields: Any) -> dict[str, Any]:
    """The JSON record of one `AgentLoopOutput`, with the hook's own fields (request_id, uid,
    engine_calls) added as given. The request_id is also put in the output's `extra_fields`, which
    verl copies into the batch's `non_tensor_batch` (agent_loop.py, `_postprocess`), so the
    trainer-side record of the same sample names it."""
    if fields.get("request_id") is not None and isinstance(getattr(output, "extra_fields", None), dict):
        output.extra_fields["request_id"] = fields["request_id"]
    rec: dict[str, Any] = {k: getattr(output, k, None) for k in FIELDS}
    extra = getattr(output, "extra_fields", None) or {}
    rec["extra_fields"] = {k: extra[k] for k in EXTRA if k in extra}
    info = extra.get("reward_extra_info")
    if isinstance(info, dict) and any(k in info for k in OVERLONG):  # DAPO's overlong_buffer.log
        rec["extra_fields"]["reward_extra_info"] = {k: info[k] for k in OVERLONG if k in info}
    routes = getattr(output, "routed_experts", None)
    if routes is not None:  # R3: the engine's rows the trainer replays (_postprocess cuts them at the sequence)
        n = len(rec.get("prompt_ids") or ()) + len(rec.get("response_ids") or ())
        rec["routed_experts_rows"] = len(routes)
        rec["routed_experts_sha256"] = rows_digest(routes, n)
        if isinstance(getattr(output, "extra_fields", None), dict):  # to non_tensor_batch, for dump_batch
            output.extra_fields["routed_experts_rows"] = min(len(routes), n)
    rec.update(fields)
    return rec


def dump(directory: str | os.PathLike, output: Any, **fields: Any) -> Path:
    """Append the record of `output` to `directory/verl-<host>-<pid>.jsonl`; returns the file."""
    return write_records(directory, "verl", [record(output, **fields)])


def _setting(config: Any, key: str) -> Any:
    """`config.key` of a verl config (OmegaConf DictConfig, dataclass or dict); None when unset. An
    enum (AdvantageEstimator) is its value."""
    value = config.get(key) if hasattr(config, "get") else getattr(config, key, None)
    return getattr(value, "value", value)


def batch_records(batch: Any, global_steps: int, algorithm: Any) -> list[dict[str, Any]]:
    """One record per row of the `DataProto` the trainer trains (after `compute_advantage`), each
    with the row's own tensors cut to its response (`attention_mask` past the prompt: verl right-pads
    responses), its `request_id` and `uid` from `non_tensor_batch`, the step, and the estimator's
    settings of `algorithm` (`config.algorithm`)."""
    tensors, extra = batch.batch, batch.non_tensor_batch
    n_prompt = int(tensors["prompts"].shape[1])
    lengths = tensors["attention_mask"][:, n_prompt:].sum(-1).tolist()
    present = [k for k in BATCH_TENSORS if k in tensors.keys()]
    columns = {k: tensors[k].tolist() for k in present}
    routes: Any = tensors["routed_experts"] if "routed_experts" in tensors.keys() else None
    valid: Any = tensors["attention_mask"].bool() if routes is not None else None
    settings = {k: _setting(algorithm, k) for k in ALGORITHM}
    out = []
    for i, n in enumerate(lengths):
        rec: dict[str, Any] = {
            "request_id": _plain(extra["request_id"][i]) if "request_id" in extra else None,
            "uid": _plain(extra["uid"][i]) if "uid" in extra else None,
            "global_steps": int(global_steps),
            **settings,
        }
        rec.update({k: columns[k][i][: int(n)] for k in present})
        if "overlong_reward" in extra:  # DAPO's penalty, put in non_tensor_batch (ray_trainer.py:1636)
            rec["overlong_reward"] = _plain(extra["overlong_reward"][i])
        if routes is not None and "routed_experts_rows" in extra:  # the engine's rows the actor replays
            rec["routed_experts_sha256"] = rows_digest(routes[i][valid[i]], int(extra["routed_experts_rows"][i]))
        out.append(rec)
    return out


def dump_batch(directory: str | os.PathLike, batch: Any, global_steps: int, algorithm: Any) -> Path:
    """Append the records of `batch_records` to `directory/verl-batch-<host>-<pid>.jsonl`; returns the file."""
    return write_records(directory, "verl-batch", batch_records(batch, global_steps, algorithm))


def write_records(directory: str | os.PathLike, stem: str, records: Sequence[dict[str, Any]]) -> Path:
    """Append `records`, one JSON line each, to `directory/<stem>-<host>-<pid>.jsonl` (one file per
    process: verl's workers and trainer are separate Ray processes); returns the file."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{stem}-{socket.gethostname()}-{os.getpid()}.jsonl"
    with path.open("a", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec, default=_plain) + "\n")
    return path


def _plain(value: Any) -> Any:
    """Tensors and numpy values as plain lists / numbers (`tolist`), JSON's own types as they are,
    anything else as its string."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return value.tolist() if hasattr(value, "tolist") else str(value)
