"""agent-lightning: the events of its store (`Event` lines: `event_type`, `rollout_id`, `attempt_id`,
`timestamp`, `data`; agentlightning/schemas.py:13-26 at 1.0.2) to contract trajectories.

One rollout attempt is one episode. Each `model_request` event is one engine call: `data.response`
is the full response body (vLLM `return_token_ids`: `prompt_token_ids`, `choices[0].token_ids`,
`logprobs`), `data.request` the body the proxy sent upstream, after it replaced `temperature` with
its configured train or val value (server/proxy.py:63-84, sent and recorded as `body` at
server/routes/proxy.py:76-83 and server/proxy.py:134-145). A record with `adjusted_params` (the
schema's "only if param adjustment changed anything", schemas.py:46) ran with those values, not
with the request's. `model_version` is the policy version, a `reward` event's `value` the reward.
As the trainer's triplet export does (server/routes/events.py:208-228), only the last request of
each prompt is kept (a retried call). Failed calls (`status` "error") returned no tokens and are
not turns.

The proxy samples at its own temperature while agent-lightning's verl trainer records
`actor_rollout_ref.rollout.temperature` as its batch's sampling temperature and recomputes log-probs
there (verl/trainer.py:481 at HEAD c632d8d): given as `--context rollout_temperature=...`, it is the
trainer setting `trainer_temperature`, against which L212 judges every call's temperature."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from .base import (
    META_TRAINER_SETTINGS,
    AdapterError,
    at_record,
    context_values,
    mapping,
    need,
    number,
    short,
    whole,
    wholes,
    with_trainer_settings,
)
from .exchanges import Session, entry_logprobs, lacks, table
from .openai import CONTEXT, logprob_ids
from .steps import Call, engine_context, finish_reason, guarded, option

FRAMEWORK = "agent-lightning"
LACKS = {
    **lacks(FRAMEWORK, "pass --context stop_reason=... (a reward event gives the reward, model_version the version)"),
    "reward": f"the attempt has no reward event ({FRAMEWORK} records one with event_type 'reward')",
    "turns.policy_version": f"the model_request events carry no model_version ({FRAMEWORK}'s Model.version)",
}
ACONTEXT = {**CONTEXT, "rollout_temperature": float}


def _session_key(rec: Mapping[str, Any], where: str) -> str:
    return f"{need(rec, 'rollout_id', where)}/{need(rec, 'attempt_id', where)}"


def _sampled_at(data: Mapping[str, Any], key: str, where: str) -> tuple[Any, str]:
    """The value of sampling parameter `key` the engine ran with, and the field it was read from:
    `adjusted_params` when the proxy says it changed it, else the request it sent."""
    adjusted = mapping(data.get("adjusted_params"), "adjusted_params", where)
    if adjusted.get(key) is not None:
        return adjusted[key], f"adjusted_params.{key}"
    request = mapping(data.get("request"), "request", where)
    return request.get(key), f"request.{key}"


def _call(data: Mapping[str, Any], where: str, context: Mapping[str, Any]) -> Call:
    """One `model_request` event's call."""
    response = mapping(need(data, "response", where), "response", where)
    choices = need(response, "choices", f"{where} response")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
        raise AdapterError(f"{where}: response.choices: expected exactly one choice (n=1)")
    choice = choices[0]
    prompt = response.get("prompt_token_ids", choice.get("prompt_token_ids"))
    if not prompt:
        raise AdapterError(f"{where}: response: no prompt_token_ids (the proxy asks return_token_ids)")
    prompt = wholes(prompt, "response.prompt_token_ids", where)
    ids = wholes(need(choice, "token_ids", f"{where} response.choices[0]"), "response.choices[0].token_ids", where)
    lps = entry_logprobs(choice, len(ids), f"{where}: response.choices[0]")
    turn: dict[str, Any] = {
        "finish_reason": finish_reason(data.get("finish_reason", choice.get("finish_reason"))),
        "sampled_token_ids": ids,
        **engine_context(prompt),
    }
    message = mapping(choice.get("message"), "message", where)
    if isinstance(message.get("content"), str):
        turn["action_text"] = message["content"]
    for key in ("temperature", "top_p"):
        value, field = _sampled_at(data, key, where)
        if value is not None:
            turn[key] = number(value, field, where)
        elif context.get(key) is not None:  # the engine's default, as the user states it
            turn[key] = context[key]
    if data.get("model_version") is not None:
        turn["policy_version"] = whole(data["model_version"], "model_version", where)
    elif option(context, "policy_version") is not None:
        turn["policy_version"] = option(context, "policy_version")
    return Call(prompt, ids, lps, turn, logprob_ids=logprob_ids(choice))


def _kept(events: list[tuple[Mapping[str, Any], str]]) -> list[tuple[Mapping[str, Any], str]]:
    """The model requests the trainer keeps: the last one of each prompt (events.py:208-228)."""
    last: dict[tuple[int, ...], int] = {}
    for k, (data, _) in enumerate(events):
        response = data.get("response")
        prompt = response.get("prompt_token_ids") if isinstance(response, Mapping) else None
        if isinstance(prompt, list) and prompt and all(type(i) is int for i in prompt):
            last[tuple(prompt)] = k
    keep = set(last.values())
    return [
        e
        for k, e in enumerate(events)
        if k in keep or not isinstance(e[0].get("response"), Mapping) or not e[0]["response"].get("prompt_token_ids")
    ]


@guarded(FRAMEWORK)
def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """Contract trajectories from agent-lightning events, one per rollout attempt."""
    context = context_values(context, ACONTEXT)
    requests: dict[str, list[tuple[Mapping[str, Any], str]]] = {}
    sessions: dict[str, Session] = {}
    for n, rec in enumerate(records):
        where = getattr(rec, "origin", None) or f"record {n}"
        key = _session_key(rec, where)
        kind = need(rec, "event_type", where)
        data = mapping(need(rec, "data", where), "data", where)
        s = sessions.setdefault(key, Session([], getattr(rec, "origin", None), {}))
        requests.setdefault(key, [])
        if kind == "model_request" and data.get("status", "ok") != "error":
            requests[key].append((data, f"{where}: rollout {key}"))
        elif kind == "reward":
            s.outcome = {**(s.outcome or {}), "reward": number(need(data, "value", where), "data.value", where)}
    for key, s in sessions.items():
        s.outcome = {"task_id": key.split("/", 1)[0], **(s.outcome or {})}
        s.calls = [at_record(d, _call, d, where, context) for d, where in _kept(requests[key])]
    empty = [k for k, s in sessions.items() if not s.calls]
    if empty:
        raise AdapterError(f"rollout {short(empty[0])}: no successful model_request event")
    out = table(sessions, LACKS, FRAMEWORK, context)
    configured = context.get("rollout_temperature")
    if configured is None:
        return out
    declared = json.loads((out.schema.metadata or {}).get(META_TRAINER_SETTINGS) or b"{}")
    said = f"the trainer recomputes log-probs at actor_rollout_ref.rollout.temperature = {configured} (L212)"
    said = f"{declared['said']}; {said}" if declared.get("said") else said
    return with_trainer_settings(out, said, **declared.get("settings", {}), trainer_temperature=float(configured))
