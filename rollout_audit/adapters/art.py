"""OpenPipe ART: `TokenizedTrajectory` and `TokenizedTrajectoryGroup` records (their
`model_dump(mode="json")`, one a line; art/trajectories/__init__.py:1192-1260, :1366 at 0.5.23) to
contract trajectories.

A tokenized trajectory is the row ART trains: `tokens`, `logprobs` and per-token `flags`, a
`TokenFlag` bitmask (:155-175). ART's trainer masks the tokens that carry `SAMPLED`
(`first_occurrence_masks(..., where=TokenFlag.SAMPLED)`, art/preprocessing/tokenize.py:818, :845),
so `loss_mask` is SAMPLED and so is provenance: policy (2) where the server returned the id, user
(1) before the first sampled token, observation (3) after. Each run of sampled tokens is a turn.
The engine's own record of each call is in `trajectory.exchanges.chat_completions` (request and
vLLM response: `prompt_token_ids`, `choices[0].token_ids`, `logprobs`); a call carries no link to
the tokenized row, so it is joined to the row by the digest of its token prefix
(`exchanges.join`): a joined call's context and sampled ids are the turn's that starts where its
prompt ends. A call that meets no row was not what ART trained on: its evidence is put on the turn
of the same rank, so M105/M106 say where the row departs from what the engine saw.
`initial_policy_version` equal to `final_policy_version` is every turn's version; when they
differ ART does not say which weights sampled which turn (P501). The reward is
`trajectory.reward`; ART records no stop cause."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract import schema as S
from .base import (
    AdapterError,
    at_record,
    context_values,
    contract_table,
    mapping,
    need,
    objects,
    origin,
    runs,
    short,
    whole,
    wholes,
    with_trainer_settings,
)
from .exchanges import join, lacks
from .openai import CONTEXT, trainer_truncation
from .steps import Call, engine_context, finish_reason, guarded, identity, option, stop_columns

FRAMEWORK = "ART"
EXACT, SAMPLED = 1 << 0, 1 << 1
LACKS = {
    **lacks(FRAMEWORK, "pass --context stop_reason=..."),
    "turns.policy_version": "the trajectory has no initial_policy_version, or its initial and final versions "
    "differ (ART does not say which weights sampled which turn)",
    "turns.temperature": "the trajectory has no chat_completions exchange with a temperature",
    "turns.top_p": "the trajectory has no chat_completions exchange with top_p",
}
_SPECIAL = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}  # ser_json_inf_nan="strings"


def _logprob(v: Any, where: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, str) and v in _SPECIAL:
        v = _SPECIAL[v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise AdapterError(f"{where}: logprobs: expected a number, got {type(v).__name__} {short(v)}")
    return None if math.isnan(v) else float(v)


def _calls(traj: Mapping[str, Any], where: str) -> list[Call]:
    """The engine calls of a trajectory's chat_completions exchanges that carry token ids."""
    ex = mapping(traj.get("exchanges"), "trajectory.exchanges", where)
    out = []
    for k, e in enumerate(objects(ex.get("chat_completions") or [], "exchanges.chat_completions", where)):
        w = f"{where} exchanges.chat_completions[{k}]"
        request, response = mapping(e.get("request"), "request", w), mapping(e.get("response"), "response", w)
        choices = response.get("choices")
        if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], Mapping):
            raise AdapterError(f"{w}: response.choices: expected exactly one choice (n=1)")
        choice = choices[0]
        prompt = response.get("prompt_token_ids", choice.get("prompt_token_ids"))
        if prompt is None or choice.get("token_ids") is None:
            continue  # a provider that returned no ids: nothing of this call to join
        prompt = wholes(prompt, "prompt_token_ids", w)
        ids = wholes(choice["token_ids"], "token_ids", w)
        turn = {
            "finish_reason": finish_reason(choice.get("finish_reason")),
            "sampled_token_ids": ids,
            **engine_context(prompt),
            **{
                k2: option(request, k2, f"{w}.request")
                for k2 in ("temperature", "top_p")
                if request.get(k2) is not None
            },
        }
        out.append(Call(prompt, ids, None, turn))
    return out


def _row(rec: Mapping[str, Any], where: str, tid: str, group: str | None, context: Mapping[str, Any]) -> dict[str, Any]:
    """One tokenized trajectory as a contract row."""
    tokens = wholes(need(rec, "tokens", where), "tokens", where)
    flags = wholes(need(rec, "flags", where), "flags", where)
    raw = need(rec, "logprobs", where)
    if not isinstance(raw, list):
        raise AdapterError(f"{where}: logprobs must be a list")
    if not len(tokens) == len(raw) == len(flags):
        raise AdapterError(
            f"{where}: tokens, logprobs and flags differ in length ({len(tokens)}, {len(raw)}, {len(flags)}); "
            "ART's own validator refuses this (TokenizedHistory.validate_tokenwise_lengths)"
        )
    sampled = [bool(f & SAMPLED) for f in flags]
    bad = next((i for i, f in enumerate(flags) if f & SAMPLED and not f & EXACT), None)
    if bad is not None:
        raise AdapterError(
            f"{where}: flags[{bad}]: SAMPLED without EXACT (ART refuses it: regenerate the tokenization)"
        )
    traj = mapping(need(rec, "trajectory", where), "trajectory", where)
    turns_at = runs(sampled)
    first = turns_at[0][0] if turns_at else len(tokens)
    source = [S.POLICY if s else (1 if i < first else 3) for i, s in enumerate(sampled)]
    token_turn, t = [], -1
    starts = {a: k for k, (a, _) in enumerate(turns_at)}
    for i in range(len(tokens)):
        t = starts.get(i, t)
        token_turn.append(t)
    lo, hi = traj.get("initial_policy_version"), traj.get("final_policy_version")
    version = whole(lo, "initial_policy_version", where) if lo is not None and lo == hi else None
    turns: list[dict[str, Any]] = [
        {"turn_id": k, **({"policy_version": version} if version is not None else {})} for k in range(len(turns_at))
    ]
    calls = _calls(traj, where)
    joined = join([tokens], calls)
    by_start = {a: k for k, (a, _) in enumerate(turns_at)}
    for k, (call, row) in enumerate(zip(calls, joined.row_of_call)):
        at = by_start.get(len(call.prompt_ids)) if row is not None else None
        turn = at if at is not None else (k if k < len(turns) else None)
        if turn is None:
            raise AdapterError(
                f"{where}: exchanges.chat_completions: call {k} meets no turn of the tokenized row "
                f"({len(calls)} calls with token ids, {len(turns)} runs of SAMPLED tokens)"
            )
        turns[turn] |= call.turn
    reward = traj.get("reward")
    stop = option(context, "stop_reason")
    return {
        "trajectory_id": tid,
        "task_id": option(context, "task_id") or group or tid,
        **({"group_id": group} if group is not None else {}),
        **identity(context),
        "token_ids": tokens,
        "token_source": source,
        "loss_mask": sampled,
        "behavior_logprobs": [_logprob(v, where) if s else None for v, s in zip(raw, sampled)],
        "token_turn": token_turn,
        "turns": turns,
        **({"reward": float(reward)} if isinstance(reward, (int, float)) and not isinstance(reward, bool) else {}),
        **({} if stop is None else stop_columns(S.stop_reasons().get(stop), stop)),
    }


def _rows(rec: Mapping[str, Any], n: int, context: Mapping[str, Any]) -> list[dict[str, Any]]:
    where = getattr(rec, "origin", None) or f"record {n}"
    if rec.get("format") == "art.trajectories":
        raise AdapterError(f"{where}: an ART compact payload (compact_dump()): dump with model_dump(mode='json')")
    at = origin(rec)
    if "trajectories" in rec:  # a TokenizedTrajectoryGroup
        group = f"group {n}"
        members = objects(rec["trajectories"], "trajectories", where)
        return [
            {**_row(t, f"{where} trajectories[{k}]", f"{group}/{k}", group, context), **at}
            for k, t in enumerate(members)
        ]
    return [{**_row(rec, where, f"trajectory {n}", option(context, "group_id"), context), **at}]


@guarded(FRAMEWORK)
def to_contract(records: Iterable[Mapping[str, Any]], **context: Any) -> pa.Table:
    """Contract trajectories from ART tokenized trajectories (or groups of them)."""
    context = context_values(context, CONTEXT)
    rows = [r for n, rec in enumerate(records) for r in at_record(rec, _rows, rec, n, context)]
    table = contract_table(rows, LACKS, FRAMEWORK)
    said, truncation = trainer_truncation(context)
    return with_trainer_settings(table, said, truncation=truncation) if truncation else table
