"""slime: `Sample.to_dict()` (slime/utils/types.py) to contract tables.

One record per sample, written by the dump hook (docs/frameworks/slime.md) with slime's own field
names: `index`, `group_index`, `tokens` (prompt then response), `response_length`, `loss_mask` and
`rollout_log_probs` over the response, `reward`, `status`, `weight_versions` (one per engine call).

Provenance comes from `loss_mask` (slime appends engine output with 1 and tool output with 0), so
M101/M102 hold by construction; the turns are the runs of mask 1, and turn t's policy version is
the t-th of `weight_versions` when there is one per turn (null otherwise: nothing is guessed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from .base import (
    AdapterError,
    aligned,
    context_values,
    contract_table,
    flags,
    integer,
    ints,
    lacks,
    logprobs_column,
    need,
    rows_of,
    runs,
    token_columns,
    with_context,
)

# Sample.Status value -> (flag, contract stop_reason)
STATUS = {
    "completed": ("terminated", "end_of_sequence"),  # the last engine call finished with "stop"
    "truncated": ("truncated", "max_tokens"),  # the last engine call finished with "length", or no budget left
    "aborted": ("infra_error", "engine_error"),  # the engine aborted the request
    "failed": ("infra_error", "tool_error"),  # slime: tool call failure, external API or parsing error
}
FLAGS = ("terminated", "truncated", "infra_error")

LACKS = {
    **lacks("slime"),
    "turns.policy_version": "the records carry no weight_versions (SGLang returned no weight_version)",
    "behavior_logprobs": "slime records rollout_log_probs only when the engine returned them",
    "turns.finish_reason": "slime keeps the last engine call's finish reason only, as the sample's status",
    "turns.context_length": "slime does not record the context the engine was given for each call",
    "turns.context_sha256": "slime does not record the context the engine was given for each call",
    "turns.sampled_token_ids": "slime does not record the engine's token ids per call apart from tokens",
}


def _reward(value: Any, where: str, key: str | None) -> float | None:
    """The scalar reward; a dict reward needs slime's --reward-key (context reward_key)."""
    if isinstance(value, Mapping):
        if key is None:
            raise AdapterError(f"{where}: reward is a dict; pass --context reward_key=KEY (slime's --reward-key)")
        value = need(value, key, f"{where} reward")
    if value is not None and not isinstance(value, (int, float)):
        raise AdapterError(f"{where}: reward must be a number, not {type(value).__name__}")
    return None if value is None else float(value)


def _versions(rec: Mapping[str, Any], n_turns: int) -> list[int | None] | None:
    """Turn t's policy version: the t-th weight_version when there is one per turn and it is an integer."""
    wv = rec.get("weight_versions")
    if not wv:
        return None
    if not isinstance(wv, list):
        raise AdapterError(f"record index {rec.get('index')}: weight_versions must be a list")
    if len(wv) != n_turns:
        return [None] * n_turns
    try:
        return [int(v) for v in wv]
    except (TypeError, ValueError):
        return [None] * n_turns


def row(rec: Mapping[str, Any], n: int, ctx: Mapping[str, Any]) -> dict[str, Any]:
    """One slime sample as a contract row."""
    index = need(rec, "index", f"record {n}")
    where = f"record {n} (index {index})"
    tokens = ints(rec, "tokens", where)
    n_resp = integer(rec, "response_length", where)
    if not 0 <= n_resp <= len(tokens):
        raise AdapterError(f"{where}: response_length {n_resp} outside the {len(tokens)} tokens")
    n_prompt = len(tokens) - n_resp
    raw_mask = rec.get("loss_mask")
    mask = (
        [True] * n_resp
        if raw_mask is None
        else flags(aligned(rec, "loss_mask", range(n_resp), where), "loss_mask", where)
    )
    turns = runs(mask)
    status = need(rec, "status", where)
    if status not in STATUS:
        raise AdapterError(f"{where}: status {status!r} is not a finished sample ({', '.join(STATUS)})")
    flag, stop = STATUS[status]
    out: dict[str, Any] = {
        "trajectory_id": str(index),
        "task_id": str(need(rec, "group_index", where)),
        "group_id": str(rec["group_index"]),
        **token_columns(tokens[:n_prompt], tokens[n_prompt:], mask, mask, [a for a, _ in turns]),
        "turns": [{"turn_id": t} for t in range(len(turns))],
        **{f: f == flag for f in FLAGS},
        "stop_reason": stop,
        "reward": _reward(need(rec, "reward", where), where, ctx.get("reward_key")),
    }
    versions = _versions(rec, len(turns))
    if versions is not None:
        for t, v in zip(out["turns"], versions):
            t["policy_version"] = v
    if rec.get("rollout_log_probs") is not None:
        lp = aligned(rec, "rollout_log_probs", mask, where)
        out["behavior_logprobs"] = logprobs_column(n_prompt, lp, mask)
    return with_context(out, ctx)


def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """slime per-sample records as contract trajectories (context reward_key picks a dict reward)."""
    ctx = context_values(context, allowed=("reward_key",))
    return contract_table(rows_of(records, row, ctx), LACKS)
