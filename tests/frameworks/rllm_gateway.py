"""rllm-model-gateway fixtures: `TraceRecord.model_dump()` lines (rllm_model_gateway/models.py:9-29 at
0.1.0) as `data_process.build_trace_record` (:130-165) and `build_trace_record_from_chunks` (:168-249)
build them from vLLM chat completions with `return_token_ids` (top-level `prompt_token_ids`,
`choices[0].token_ids`) and `logprobs.content[]`, plus the end line that gives a session's outcome.
`raw_request` is the body after the gateway's middleware added `logprobs` and `return_token_ids`
(middleware.py:114-125). The same ChatML-style ids as the `openai` fixtures. The tests write these
records into a SQLite store with the gateway's own `SqliteTraceStore` as well."""

from __future__ import annotations

from .openai import HEADER, P0, TOOL, _pair


def _trace(
    session: str,
    turn: int,
    prompt: list[int],
    ids: list[int],
    lps: list[float | None],
    finish: str,
    *,
    named: list[int] | None = None,
    stream: bool = False,
    logprobs: bool = True,
) -> dict:
    """One trace; `named`: the ids the log-prob entries name when the server returned other
    `token_ids` than it sampled; `stream`: built from chunks (no raw body; nulls dropped from the
    log-probs, data_process.py:89); `logprobs`: False when the client asked for none (the gateway
    adds `logprobs` only when the request has no such key, middleware.py:116)."""
    pair = _pair(session, turn, prompt, ids, lps, finish, named)  # the vLLM request/response of the openai fixtures
    request = {**pair["request"], "logprobs": logprobs, "extra_body": {"return_token_ids": True}}
    request |= {"stream": True} if stream else {}
    response = pair["response"]
    if not logprobs:
        response["choices"][0]["logprobs"] = None
    kept = [float(lp) for lp in lps if lp is not None] if logprobs else []
    return {
        "trace_id": f"{session}-t{turn}",
        "session_id": session,
        "model": "policy",
        "messages": request["messages"],
        "prompt_token_ids": prompt,
        "response_message": {"role": "assistant", "content": "open"},
        "completion_token_ids": ids,
        "logprobs": kept or None,
        "finish_reason": finish,
        "latency_ms": 12.5,
        "token_counts": {"prompt": len(prompt), "completion": len(ids)},
        "timestamp": 1000.0 + turn,
        "metadata": {},
        "raw_request": request,
        "raw_response": None if stream else response,
    }


def _end(session: str, reward: float) -> dict:
    return {"session_id": session, "end": {"stop_reason": "success" if reward else "failure", "reward": reward,
                                           "policy_version": 5, "task_id": "door-3", "group_id": "door-3"}}  # fmt: skip


def _session(n: int, reward: float, **kw: bool) -> list[dict]:
    """Two turns (a tool call, then the answer) and the session's end line."""
    sid = f"episode-{n}"
    a0, a1 = [50 + n, 51, 2], [60 + n, 61, 62, 2]
    p1 = P0 + a0 + TOOL + HEADER
    return [
        _trace(sid, 0, P0, a0, [-0.5 - 0.01 * n, -0.25, -0.125], "tool_calls", **kw),
        _trace(sid, 1, p1, a1, [-0.75, -0.375 - 0.01 * n, -0.0625, -0.03125], "stop", **kw),
        _end(sid, reward),
    ]


def control_token_replaced() -> list[dict]:
    """microsoft/agent-lightning#326 through the gateway: the server returned a wrong id (7) for the
    control token it sampled (2) in `token_ids`, while the raw body's log-prob entry names the sampled
    one ("token_id:2"). The next prompt has 2 there: the episode splits (M108) and the first segment
    trains 7 with the log-prob of 2 (M111)."""
    sid = "episode-0"
    a0, a1 = [50, 51, 2], [60, 61, 62, 2]
    p1 = P0 + a0 + TOOL + HEADER
    return [
        _trace(sid, 0, P0, [50, 51, 7], [-0.5, -0.25, -0.125], "tool_calls", named=a0),
        _trace(sid, 1, p1, a1, [-0.75, -0.375, -0.0625, -0.03125], "stop"),
        _end(sid, 1.0),
    ]


def logprobs_false_kept() -> list[dict]:
    """The agent's client sent `logprobs: false`: the gateway adds `logprobs` only when the key is
    absent (middleware.py:116), so no log-prob is recorded and every trained token lacks one (L201)."""
    return _session(0, 1.0, logprobs=False)


def null_logprob_dropped() -> list[dict]:
    """A streamed call whose engine returned a null log-prob for one sampled token: the gateway keeps
    the non-null entries only (data_process.py:89) and no raw body (:248), so the list is one short
    with no position marker. Refused (exit 2), never shifted: written by the test, not as a fixture
    (every fixture of fixtures/frameworks audits through every entry point)."""
    sid = "episode-0"
    return [_trace(sid, 0, P0, [50, 51, 2], [-0.5, None, -0.125], "stop", stream=True), _end(sid, 1.0)]


def cases() -> dict[str, list[dict]]:
    return {
        "compliant": _session(0, 1.0) + _session(1, 0.0),
        "compliant_streamed": _session(0, 1.0, stream=True) + _session(1, 0.0, stream=True),
        "control_token_replaced": control_token_replaced(),
        "logprobs_false_kept": logprobs_false_kept(),
    }
