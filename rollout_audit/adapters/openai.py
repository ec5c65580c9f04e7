"""OpenAI-compatible servers (vLLM, SGLang): a session's request/response pairs to contract trajectories.

Records are lines `{"session", "turn", "endpoint", "request", "response", "logprobs_mode"}` as
`rollout_audit.integrations.openai.SessionRecorder` writes them, plus an optional `{"session", "end": {…}}`.
One session is one episode, one request one turn: the response's `prompt_token_ids` (vLLM
`return_token_ids`; top level for chat, per choice for completions) is the engine's context,
`choices[0].token_ids` the sampled ids, `choices[0].logprobs` their log-probs (chat `content[].logprob`,
completions `token_logprobs`), `finish_reason` the engine's stop, the request's `temperature` / `top_p`
the decoding parameters. The numbers are carried as the server returned them: vLLM V1 returns raw
log-probs unless started with `--logprobs-mode processed_logprobs` (L206 with replay tells them apart).
The stop cause, reward and policy version come from the `end` record or the context options."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa

from ..contract import capture as C
from .base import (
    META_INCOMPLETE,
    AdapterError,
    at_record,
    context_values,
    contract_table,
    mapping,
    need,
    origin,
    short,
    wholes,
    with_trainer_settings,
)
from .captured import pair as exchange_pair
from .captured import version_error
from .steps import (
    Call,
    engine_context,
    episode_rows,
    finish_reason,
    guarded,
    identity_lacks,
    merge,
    option,
    outcome,
    recorded_logprobs,
)

LACKS = {
    **identity_lacks(
        "an OpenAI-compatible server",
        {
            "environment_id": "the environment",
            "environment_version": "the environment version",
            "verifier_version": "the verifier version",
            "reset_seed": "a reset seed",
            "tokenizer_id": "the tokenizer identity",
        },
    ),
    "stop_reason": "an OpenAI-compatible server does not know why the episode ended; record it with "
    "SessionRecorder.end(stop_reason=...) or pass --context stop_reason=...",
    "terminated": "the episode's stop cause was not recorded (SessionRecorder.end(stop_reason=...))",
    "truncated": "the episode's stop cause was not recorded (SessionRecorder.end(stop_reason=...))",
    "infra_error": "the episode's stop cause was not recorded (SessionRecorder.end(stop_reason=...))",
    "reward": "an OpenAI-compatible server records no reward; SessionRecorder.end(reward=...) or --context reward=...",
    "turns.policy_version": "an OpenAI-compatible server does not say which weights answered; "
    "SessionRecorder.end(policy_version=...) or --context policy_version=...",
    "turns.temperature": "the requests did not set temperature (the server's default is not in the response)",
    "turns.top_p": "the requests did not set top_p (the server's default is not in the response)",
    "turns.logprob": "the server returns token log-probs, not a per-turn log-prob",
    "turns.num_policy_tokens": "the server does not count policy tokens per turn",
    "num_trainable_tokens": "the server does not count trainable tokens",
    "verifier_success": "an OpenAI-compatible server records no verdict",
    "initial_state_checksum": "an OpenAI-compatible server does not see environment state",
}
END_FIELDS = ("reward", "policy_version", "stop_reason", "task_id", "group_id")
# what a session's `end` record says, also accepted as context for every session (base.CONTEXT besides)
CONTEXT = {"reward": float, "policy_version": int, "stop_reason": str, "task_id": str, "group_id": str}
# the trainer the sessions feed, as context: a server knows nothing of what trains on its answers
CONTEXT |= {"trainer": str, "truncation": str}
TRUNCATIONS = ("exclude", "penalize", "bootstrap")


def trainer_truncation(context: Mapping[str, Any]) -> tuple[str, str]:
    """(said, truncation): the truncation policy of the trainer the sessions feed, from `--context
    truncation=...` or a known `--context trainer=...` (verifiers' TRAINERS); without either the
    route assumes none ("" for truncation): the configuration's `truncation` applies (the project
    default `exclude`: a truncated episode carries no reward)."""
    from .verifiers import TRAINERS

    truncation, name = context.get("truncation"), context.get("trainer")
    if truncation is not None and truncation not in TRUNCATIONS:
        raise AdapterError(f"context 'truncation': {truncation!r} is not one of {', '.join(TRUNCATIONS)}")
    if name is not None and name not in TRAINERS:
        raise AdapterError(f"context 'trainer': unknown trainer {name!r}; known: {', '.join(TRAINERS)}")
    if name is not None:
        said, known = TRAINERS[name]
        if truncation is not None and truncation != known:
            raise AdapterError(f"context 'truncation': {truncation!r}, but {name} follows {known!r}")
        return f"{said}: truncation = {known!r} (--context trainer={name})", known
    if truncation is not None:
        return (
            f"the trainer's truncation policy as given: truncation = {truncation!r} (--context truncation)",
            truncation,
        )
    return (
        "an OpenAI-compatible server does not know the trainer: no truncation policy assumed, the configuration's "
        "applies (pass --context trainer=NAME or --context truncation=exclude|penalize|bootstrap)",
        "",
    )


def _logprobs(choice: Mapping[str, Any]) -> list[float | None] | None:
    """The sampled tokens' log-probs of a choice (chat or completions format); None when absent."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping):
        return None
    if isinstance(lp.get("content"), list):
        return [e.get("logprob") if isinstance(e, Mapping) else None for e in lp["content"]]
    if isinstance(lp.get("token_logprobs"), list):
        return list(lp["token_logprobs"])
    return None


def _call(line: Mapping[str, Any], where: str, version: int | None) -> Call:
    """One request/response pair as an engine call."""
    request, response = need(line, "request", where), need(line, "response", where)
    if not isinstance(request, Mapping) or not isinstance(response, Mapping):
        raise AdapterError(f"{where}: request and response must be objects")
    choices = need(response, "choices", f"{where}.response")
    if not isinstance(choices, list):
        raise AdapterError(f"{where}.response: choices must be a list, got {type(choices).__name__}")
    if len(choices) != 1 or not isinstance(choices[0], Mapping):
        raise AdapterError(f"{where}: expected exactly one choice (n=1), found {len(choices)}")
    choice = choices[0]
    prompt = response.get("prompt_token_ids", choice.get("prompt_token_ids"))
    if prompt is None:
        raise AdapterError(f"{where}.response: missing field 'prompt_token_ids' (request return_token_ids)")
    sampled = wholes(
        need(choice, "token_ids", f"{where}.response.choices[0]"), "token_ids", f"{where}.response.choices[0]"
    )
    turn = {
        "finish_reason": finish_reason(choice.get("finish_reason")),
        "sampled_token_ids": list(sampled),
        "action_text": choice.get("text")
        or mapping(choice.get("message"), "message", f"{where}.response.choices[0]").get("content"),
        **engine_context(prompt),
        **{k: option(request, k, f"{where}.request") for k in ("temperature", "top_p") if request.get(k) is not None},
        **({"policy_version": version} if version is not None else {}),
    }
    call = Call(prompt, sampled, _logprobs(choice), turn, logprob_ids=logprob_ids(choice))
    recorded_logprobs(call, where)  # checked here, where the record is known (the session merges its calls later)
    return call


NO_END = "no end record (POST /sessions/ID/end never came: the session ran on, or the recorder stopped)"


def _sessions(records: Iterable[dict]) -> tuple[dict[str, tuple[list[dict], dict[str, Any]]], dict[str, str]]:
    """Pairs and end record of each session, in the order first seen; and for each session the
    capture recorder wrote (`rollout-audit capture`), why it is incomplete, when it is: no end
    record, an incomplete marker, a torn last line."""
    out: dict[str, tuple[list[dict], dict[str, Any]]] = {}
    captured: dict[str, list[str]] = {}  # session -> what makes it incomplete
    ended: set[str] = set()
    failed: dict[str, list[str]] = {}  # session -> its recorded exchanges that are not turns
    for n, rec in enumerate(records):
        where = getattr(rec, "origin", None) or f"record {n}"
        if C.KEY in rec and (refused := version_error(rec, where)):
            raise AdapterError(refused)
        sid = str(need(rec, "session", where))
        pairs, end = out.setdefault(sid, ([], {}))
        kind = rec.get("kind") if C.KEY in rec else None
        if C.KEY in rec:
            gaps = captured.setdefault(sid, [])
            if kind == "incomplete":
                gaps.append(f"{where}: {short(rec.get('reason'))}")
            elif kind == "torn":
                gaps.append(f"{where}: a torn last line ({rec.get('bytes')} bytes: the recorder stopped mid-write)")
            elif kind == "exchange":
                if unrecorded := [k for k in ("request_body", "response_body") if rec.get(k) is None]:
                    gaps.append(f"{where}: {' and '.join(unrecorded)} not recorded (over the recorder's body limit)")
                    continue
                got = at_record(rec, exchange_pair, rec, where)
                if got is not None:
                    pairs.append(got)
                else:
                    failed.setdefault(sid, []).append(_failure(rec, where))
                continue
            elif kind not in ("start", "end"):
                raise AdapterError(f"{where}: kind: {short(kind)} is not one of {', '.join(C.KINDS)}")
        if "end" in rec:
            ended.add(sid)
            fields = rec["end"]
            if not isinstance(fields, Mapping):
                raise AdapterError(f"{where}: end: expected an object, got {type(fields).__name__} {short(fields)}")
            end.update({k: option(fields, k, f"{where}: end") for k in END_FIELDS if fields.get(k) is not None})
        elif kind is None:
            pairs.append(rec)
    for sid, why in failed.items():  # a recorded session is never dropped in silence for lack of a turn
        if not out[sid][0]:
            more = f"; and {len(why) - 1} more" if len(why) > 1 else ""
            captured[sid].append(f"no exchange was a turn: {why[0]}{more}")
    incomplete = {sid: "; ".join(gaps or [NO_END]) for sid, gaps in captured.items() if gaps or sid not in ended}
    for pairs, _ in out.values():  # a recorder numbers a session's exchanges as it dispatched them
        if pairs and "weight_version" in pairs[0]:
            pairs.sort(key=_turn)
    return out, incomplete


def _failure(rec: Mapping[str, Any], where: str) -> str:
    """Why a recorded exchange is not a turn: its error, its status, or its endpoint."""
    if rec.get("error") is not None:
        return f"{where}: status {short(rec.get('status'))}: {short(rec.get('error'))}"
    if rec.get("status") != 200:
        return f"{where}: status {short(rec.get('status'))}"
    return f"{where}: endpoint {short(rec.get('endpoint'))} (not a model call) or an error response"


def _turn(pair: Mapping[str, Any]) -> int:
    """The turn a recorder gave an exchange (0 when it gave none)."""
    t = pair.get("turn")
    return t if isinstance(t, int) else 0


def _episode(sid: str, pairs: list[dict], end: Mapping[str, Any], context: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Contract records of one session."""
    version = end.get("policy_version", option(context, "policy_version"))
    calls = [at_record(p, _call, p, f"session {sid} record {k}", _dispatched(p, version)) for k, p in enumerate(pairs)]
    segments = merge(calls, f"session {sid}")
    extra, common = outcome(sid, end, context)
    return [{**common, **row} for row in episode_rows(sid, segments, extra)]


@guarded("openai")
def to_contract(records: Iterable[dict], **context: Any) -> pa.Table:
    """Contract trajectories from recorded OpenAI-compatible sessions."""
    context = context_values(context, CONTEXT)
    sessions, incomplete = _sessions(records)
    rows: list[Mapping[str, Any]] = [
        {**r, **origin(pairs[0] if pairs else {})}
        for sid, (pairs, end) in sessions.items()
        if sid not in incomplete
        for r in _episode(sid, pairs, end, context)
    ]
    said, truncation = trainer_truncation(context)
    if incomplete and not rows:
        raise AdapterError(incomplete_line(incomplete, len(sessions)))
    table = contract_table(rows, LACKS, "openai")
    if incomplete:  # the complete sessions are audited; the audit cannot be "ok" (session.dumps)
        meta = {**(table.schema.metadata or {}), META_INCOMPLETE: incomplete_line(incomplete, len(sessions)).encode()}
        table = table.replace_schema_metadata(meta)
    return with_trainer_settings(table, said, truncation=truncation) if truncation else table


def recorded_calls(records: Iterable[dict]) -> list[tuple[Call, str]]:
    """Every engine call of the recorded sessions, with the record it was read from, for a join to a
    trainer's rows (`exchanges.with_calls`): the session's outcome is the trainer's there, so a session
    with no end record is read; one that lost or tore a record is refused (a call may be missing).
    A response of several choices is one call per choice (`per_choice`): each is a sample of its own,
    joined to its row by its own prefix."""
    sessions, incomplete = _sessions(records)
    lost = {sid: why for sid, why in incomplete.items() if why != NO_END}
    if lost:
        raise AdapterError(incomplete_line(lost, len(sessions)).replace("not run: ", "", 1))
    out = []
    for sid, (pairs, end) in sessions.items():
        version = end.get("policy_version")
        for k, p in enumerate(pairs):
            where = getattr(p, "origin", None) or f"session {sid} record {k}"
            for j, one in per_choice(p):
                said = f"session {sid} record {k}" + ("" if j is None else f" choice {j}")
                call = at_record(p, _call, one, said, _dispatched(p, version))
                out.append((call, where if j is None else f"{where} choice {j}"))
    return out


def per_choice(pair: Mapping[str, Any]) -> list[tuple[int | None, Mapping[str, Any]]]:
    """A request/response pair as one pair per choice of its response, with the choice's index (None
    when there is one choice or none: the pair as it is). A client that batches prompts or asks for n
    samples in one request (TRL's server mode: `VLLMClient.generate` posts every prompt of a generation
    batch with `n` = num_generations to `/v1/completions`) gets one choice per sample, prompt-major;
    vLLM puts each choice's `prompt_token_ids` on the choice for completions and on the response for
    chat, where they are kept."""
    response = pair.get("response")
    if not isinstance(response, Mapping) or not isinstance(response.get("choices"), list):
        return [(None, pair)]
    choices = response["choices"]
    if len(choices) <= 1:
        return [(None, pair)]
    return [(j, {**pair, "response": {**response, "choices": [c]}}) for j, c in enumerate(choices)]


def incomplete_line(incomplete: Mapping[str, str], sessions: int, shown: int = 5) -> str:
    """'not run: capture incomplete: 2 of 64 recorded sessions: s3 (…); s9 (…)'."""
    named = "; ".join(f"session {sid}: {why}" for sid, why in list(incomplete.items())[:shown])
    more = f"; and {len(incomplete) - shown} more" if len(incomplete) > shown else ""
    return f"not run: capture incomplete: {len(incomplete)} of {sessions} sessions not audited: {named}{more}"


def _dispatched(pair: Mapping[str, Any], version: int | None) -> int | None:
    """The policy version a recorded exchange was dispatched under (the trainer's header or the
    version posted to the recorder, else the engine's `weight_version` field) when it is an
    integer; else the session's (its end record, the context). SGLang's default "default" names none."""
    said = pair.get("weight_version")
    if isinstance(said, int) and not isinstance(said, bool):
        return said
    if isinstance(said, str) and said.isdigit() and len(said) <= 18:
        return int(said)
    return version


def logprob_ids(choice: Mapping[str, Any]) -> list[int | None] | None:
    """Per sampled token, the id its log-prob entry names: vLLM writes an entry's token as
    "token_id:N" when the request sets return_tokens_as_token_ids (chat `content[].token`,
    completions `tokens`). None when no entry names an id; an entry in another form names none.
    This is the engine's own record of which token each log-prob is for, independent of
    `token_ids` (the ids a server bug can replace, microsoft/agent-lightning#326)."""
    lp = choice.get("logprobs")
    if not isinstance(lp, Mapping):
        return None
    if isinstance(lp.get("content"), list):
        tokens = [e.get("token") if isinstance(e, Mapping) else None for e in lp["content"]]
    elif isinstance(lp.get("tokens"), list):
        tokens = list(lp["tokens"])
    else:
        return None
    out = [_named_id(t) for t in tokens]
    return out if any(i is not None for i in out) else None


def _named_id(token: Any) -> int | None:
    """N of a "token_id:N" entry (a non-negative integer of at most 10 digits), else None."""
    if not isinstance(token, str) or not token.startswith("token_id:"):
        return None
    digits = token[len("token_id:") :]
    return int(digits) if digits.isdigit() and len(digits) <= 10 and int(digits) < 2**31 else None
