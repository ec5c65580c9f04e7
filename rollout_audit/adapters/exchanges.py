"""What the readers of capture layers' exchange records share (rllm-model-gateway traces,
agent-lightning `model_request` events, ART trajectories): a call's log-probs aligned with its
sampled ids or refused, the evidence a streamed response without its raw body loses (M111), a
session of calls as contract trajectories, and the join of calls to trainer rows by the digest of
their token prefix.

A capture layer that filters null log-probs (rllm-model-gateway keeps only entries whose
`logprob` is not null) leaves a list shorter than the completion with no position marker: padding
its tail would shift every later log-prob onto the wrong token, so a list of another length than
the ids is refused, naming the record and the field."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..contract import schema as S
from .base import ORIGIN, AdapterError, contract_table, numbers, with_trainer_settings
from .openai import trainer_truncation
from .steps import Call, engine_context, episode_rows, identity_lacks, merge, outcome

# what M111 reads: the ids the engine's own log-prob entries name at a split (contract 1.3)
EXPOSED = ("split_exposed_position", "split_exposed_logprob_id")


def aligned_logprobs(values: Any, n: int, field: str, where: str, why: str = "") -> list[float | None] | None:
    """`values` (log-probs, nulls kept) when there is one per sampled id; None when absent. A list of
    another length cannot be placed on the ids: AdapterError naming the record and the field (`why`
    says how the layer loses positions)."""
    if values is None:
        return None
    lps = numbers(values, field, where)
    if len(lps) != n:
        raise AdapterError(f"{where}: {field}: {len(lps)} log-probs for {n} sampled token ids, cannot be aligned{why}")
    return lps


def entry_logprobs(choice: Mapping[str, Any], n: int, where: str) -> list[float | None] | None:
    """The per-entry log-probs of a raw chat (`logprobs.content[].logprob`) or completions
    (`logprobs.token_logprobs`) choice, nulls kept where the engine returned null; None when the
    choice has no log-probs. One entry per sampled id, else AdapterError naming the field."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping):
        return None
    if isinstance(lp.get("content"), list):
        values = [e.get("logprob") if isinstance(e, Mapping) else None for e in lp["content"]]
        return aligned_logprobs(values, n, "logprobs.content", where)
    if isinstance(lp.get("token_logprobs"), list):
        return aligned_logprobs(lp["token_logprobs"], n, "logprobs.token_logprobs", where)
    return None


def stream_cost(framework: str, streamed: int, calls: int, first: str) -> dict[str, str]:
    """The `not_recorded` entries of M111's evidence when `streamed` of `calls` responses were kept
    without their raw body: the engine's `token_id:N` log-prob entries went with it, so a split
    that exposes a replaced control token cannot be told from retokenization drift."""
    why = (
        f"{framework} kept {streamed} of {calls} responses without their raw body (streamed; first: {first}): "
        "the engine's token_id:N log-prob entries are lost, so M111 cannot tell a replaced control token "
        "(microsoft/agent-lightning#326) from retokenization drift; call without stream to keep them"
    )
    return dict.fromkeys(EXPOSED, why)


def lacks(framework: str, outcome: str) -> dict[str, str]:
    """What a capture layer's exchange records do not say, with the reason; `outcome` says how the
    user gives the stop cause, reward and policy version instead."""
    stop = f"{framework} does not record why the episode ended; {outcome}"
    return {
        **identity_lacks(
            framework,
            {
                "environment_id": "the environment",
                "environment_version": "the environment version",
                "verifier_version": "the verifier version",
                "reset_seed": "a reset seed",
                "tokenizer_id": "the tokenizer identity",
            },
        ),
        **dict.fromkeys(("stop_reason", "terminated", "truncated", "infra_error"), stop),
        "reward": f"{framework} records no reward here; {outcome}",
        "turns.policy_version": f"{framework} does not say which weights answered; {outcome}",
        "turns.temperature": "the requests did not set temperature (the server's default is not in the response)",
        "turns.top_p": "the requests did not set top_p (the server's default is not in the response); "
        "pass --context top_p=... for the server's",
        "turns.logprob": f"{framework} keeps token log-probs, not a per-turn log-prob",
        "turns.num_policy_tokens": f"{framework} does not count policy tokens per turn",
        "num_trainable_tokens": f"{framework} does not count trainable tokens",
        "verifier_success": f"{framework} records no verdict",
        "initial_state_checksum": f"{framework} does not see environment state",
    }


@dataclass
class Session:
    """The calls of one session (an episode) and its outcome as recorded."""

    calls: list[Call]
    origin: str | None = None  # the record the first call came from
    outcome: dict[str, Any] | None = None  # stop_reason, reward, policy_version, task_id, group_id


def table(
    sessions: Mapping[str, Session],
    lacks: Mapping[str, str],
    framework: str,
    context: Mapping[str, Any],
    streamed: tuple[int, int, str] | None = None,
) -> pa.Table:
    """Contract trajectories of the sessions: each session's calls merged as the cumulative trainers
    merge them (`steps.merge`), its outcome from the session or the context; with M111's evidence
    declared lost when some responses were kept without their raw body (`streamed`: count, calls,
    first record), and the trainer's truncation policy when the context names it."""
    rows: list[dict[str, Any]] = []
    for sid, s in sessions.items():
        out = {k: v for k, v in (s.outcome or {}).items() if v is not None}
        extra, common = outcome(sid, out, context)
        where = {ORIGIN: s.origin} if s.origin else {}
        version = out.get("policy_version")
        for call in s.calls:  # the weights the session's outcome names, on every turn that names none
            if version is not None and call.turn.get("policy_version") is None:
                call.turn["policy_version"] = version
        for row in episode_rows(sid, merge(s.calls, f"session {sid}"), extra):
            if streamed is not None:
                for k in EXPOSED:
                    row.pop(k, None)
            rows.append({**common, **row, **where})
    declared = {**lacks, **(stream_cost(framework, *streamed) if streamed is not None else {})}
    out_table = contract_table(rows, declared, framework)
    said, truncation = trainer_truncation(context)
    return with_trainer_settings(out_table, said, truncation=truncation) if truncation else out_table


# ---------------------------------------------------------------- joining calls to trainer rows


def prefix_key(ids: Sequence[int] | np.ndarray) -> str:
    """The join key of a token prefix: `context_sha256` of the ids (hex SHA-256 of little-endian
    int32), the contract's digest of an engine context."""
    return S.context_sha256(ids)


@dataclass(frozen=True)
class Joined:
    """Which trainer row each call belongs to (by index; None when its prefix is the prefix of no
    row), and the rows no call reached."""

    row_of_call: list[int | None]
    rows_without_calls: list[int]

    @property
    def unjoined(self) -> list[int]:
        """The calls that met no row."""
        return [k for k, r in enumerate(self.row_of_call) if r is None]


def join(rows: Sequence[Sequence[int]], calls: Sequence[Call]) -> Joined:
    """Each call to the trainer row whose token ids begin with exactly the call's context and
    sampled ids: the digest (`prefix_key`) of row[:len(prompt) + len(completion)] equals that of
    prompt + completion, and the ids are then compared in full (a digest never stands for the ids
    alone). Calls carry no row ids (a proxy in front of slime's router or TRL's server), so the
    token prefix is the only key; nothing near is accepted: one id different, and the call meets no
    row. Rows that share the whole prefix (two samples with the same completion so far) hold the
    same evidence: the call goes to the first such row not yet holding a call of that prefix, so
    each of n identical calls meets one of n identical rows."""
    by_key: dict[tuple[int, str], list[int]] = {}
    arrays = [np.asarray(r, dtype=np.int64) for r in rows]
    want = sorted({len(c.prompt_ids) + len(c.completion_ids) for c in calls})
    for i, ids in enumerate(arrays):
        for n in want:
            if n <= len(ids):
                by_key.setdefault((n, prefix_key(ids[:n])), []).append(i)
    taken: dict[tuple[int, str], int] = {}
    out: list[int | None] = []
    for c in calls:
        whole = np.asarray([*c.prompt_ids, *c.completion_ids], dtype=np.int64)
        key = (len(whole), prefix_key(whole))
        candidates = [i for i in by_key.get(key, []) if np.array_equal(arrays[i][: len(whole)], whole)]
        k = taken.get(key, 0)
        if not candidates:
            out.append(None)
            continue
        out.append(candidates[min(k, len(candidates) - 1)])
        taken[key] = k + 1
    reached = {r for r in out if r is not None}
    return Joined(out, [i for i in range(len(rows)) if i not in reached])


# what a joined call adds to a trainer's turn, where the trainer's record has none (the engine's own)
CALL_FIELDS = (
    "context_length",
    "context_sha256",
    "sampled_token_ids",
    "temperature",
    "top_p",
    "finish_reason",
    "policy_version",
)


def _first_policy(row: Mapping[str, Any]) -> dict[int, int]:
    """Each turn's first policy token position in a trainer row."""
    out: dict[int, int] = {}
    for i, (src, t) in enumerate(zip(row.get("token_source") or [], row.get("token_turn") or [])):
        if src == S.POLICY and t is not None and t >= 0:
            out.setdefault(t, i)
    return out


def _policy_ids(row: Mapping[str, Any], turn: int) -> list[int]:
    ids, src, tt = row["token_ids"], row["token_source"], row["token_turn"]
    return [i for i, s, t in zip(ids, src, tt) if s == S.POLICY and t == turn]


def with_calls(table: pa.Table, calls: Sequence[tuple[Call, str]], origins: Sequence[str | None]) -> pa.Table:
    """A trainer's trajectories with the engine's record of each of their turns, from calls that carry
    no row id (a capture proxy in front of slime's router or TRL's server): each call meets the row
    whose token ids begin with exactly its context and sampled ids (`join`), at the turn whose first
    policy token follows its context; the turn takes the call's context (`context_length`,
    `context_sha256`), its sampled ids and its sampling parameters, finish reason and weight version
    where the trainer recorded none, and the row the call's log-probs where it has none. Nothing the
    trainer recorded is replaced.

    A turn no call meets exactly is not left without evidence: the one call that met no row and
    sampled exactly the turn's policy ids gives it its context, which then differs from the row's
    prefix (M105 names where); with no such call, or more than one, the join is refused naming the
    row, the turn and its position (one line, exit 2)."""
    rows = table.to_pylist()
    joined = join([r["token_ids"] for r in rows], [c for c, _ in calls])
    firsts = [_first_policy(r) for r in rows]
    met: dict[tuple[int, int], int] = {}  # (row, turn) -> call
    for k, r in enumerate(joined.row_of_call):
        if r is None:
            continue
        turn = rows[r]["token_turn"][len(calls[k][0].prompt_ids)] if calls[k][0].completion_ids else None
        if turn is not None and firsts[r].get(turn) == len(calls[k][0].prompt_ids):
            met.setdefault((r, turn), k)
    used = set(met.values())  # a second call of a prefix one row holds met that row's turn already
    spare = [k for k in range(len(calls)) if k not in used]
    for r, row in enumerate(rows):
        for turn, pos in sorted(firsts[r].items()):
            if (r, turn) in met:
                continue
            ids = _policy_ids(row, turn)
            same = [k for k in spare if list(calls[k][0].completion_ids) == ids]
            if len(same) != 1:
                where = f"{origins[r]}: " if r < len(origins) and origins[r] else ""
                why = "no recorded call" if not same else f"{len(same)} recorded calls, none with its prefix,"
                raise AdapterError(
                    f"{where}trajectory {rows[r]['trajectory_id']} turn {turn} (position {pos}): {why} sampled "
                    f"its {len(ids)} policy token(s) after sha256 of token_ids[:{pos}] = "
                    f"{S.context_sha256(row['token_ids'][:pos])[:16]}... ({len(spare)} of {len(calls)} recorded "
                    "calls met no turn)"
                )
            met[(r, turn)] = same[0]
            spare.remove(same[0])
    for (r, turn), k in met.items():
        _take(rows[r], turn, firsts[r][turn], calls[k][0])
    out = contract_table(rows, {}, "calls joined")
    meta = dict(table.schema.metadata or {})
    have = {f.name for f in out.schema.field("turns").type.value_type}
    lacks = json.loads(meta.get(S.META_NOT_RECORDED) or b"{}")
    meta[S.META_NOT_RECORDED] = json.dumps(
        {k: v for k, v in lacks.items() if not (k.startswith("turns.") and k[6:] in have)}, sort_keys=True
    ).encode()
    return out.replace_schema_metadata(meta)


def _take(row: dict[str, Any], turn: int, pos: int, call: Call) -> None:
    """The engine's record of `call` on the row's turn and policy tokens, where the trainer has none."""
    rec = row["turns"][turn]
    engine = {**call.turn, **engine_context(call.prompt_ids), "sampled_token_ids": list(call.completion_ids)}
    for key in CALL_FIELDS:
        if rec.get(key) is None and engine.get(key) is not None:
            rec[key] = engine[key]
    lps = row.get("behavior_logprobs")
    if call.logprobs is None or lps is None:
        return
    for i, lp in enumerate(call.logprobs):
        at = pos + i
        if at < len(lps) and lps[at] is None and row["token_source"][at] == S.POLICY:
            lps[at] = lp
