"""agent-lightning fixtures: store `Event`s (agentlightning/schemas.py:13-26 at 1.0.2) of rollout attempts:
`model_request` events as the proxy records them (`_capture_event`, server/proxy.py:223-253: the
request it sent upstream after `prepare_body` set the train temperature and `return_token_ids`,
:63-84; the full vLLM chat response) and `reward` events (`RewardData`, schemas.py:56-66). The
proxy's configured train temperature is 1 (config/server.yaml:8-9). The same ChatML-style ids as
the `openai` fixtures. agent-lightning 1.0.2 needs Python >= 3.12, so these are written from its
source, not by its classes."""

from __future__ import annotations

from .openai import HEADER, P0, TOOL


def _request_event(rollout: str, turn: int, prompt: list[int], ids: list[int], lps: list[float], finish: str, *,
                   version: int = 5, temperature: float = 1.0, named: list[int] | None = None) -> dict:  # fmt: skip
    """One model_request event; `named`: the ids the log-prob entries name, when the server returned
    other `token_ids` than it sampled."""
    request = {
        "messages": [{"role": "user", "content": "open the door"}],
        "max_tokens": 16,
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "temperature": temperature,
        "return_token_ids": True,
        "logprobs": True,
        "top_logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    content = [
        {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []} for i, lp in zip(named or ids, lps)
    ]
    response = {
        "id": f"chatcmpl-{rollout}-{turn}",
        "object": "chat.completion",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "open"}, "logprobs": {"content": content},
                     "finish_reason": finish, "token_ids": ids}],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids)},
        "prompt_token_ids": prompt,
    }  # fmt: skip
    server = {"model": "Qwen/Qwen2.5-7B-Instruct", "endpoint": "http://127.0.0.1:8000/v1", "version": version}
    data = {"model": server["model"], "model_version": version, "request": request, "response": response,
            "server": server, "latency_ms": 20.0, "http_status": 200, "status": "ok", "retry_count": 0,
            "routed_experts": None, "usage": response["usage"], "finish_reason": finish}  # fmt: skip
    return {
        "event_type": "model_request",
        "rollout_id": rollout,
        "attempt_id": "0",
        "timestamp": 100.0 + turn,
        "data": data,
    }


def _reward(rollout: str, value: float) -> dict:
    return {"event_type": "reward", "rollout_id": rollout, "attempt_id": "0", "timestamp": 200.0,
            "data": {"value": value, "message": None, "source": "agent", "reason": None}}  # fmt: skip


def _rollout(n: int, reward: float, versions: tuple[int, int] = (5, 5), temperature: float = 1.0) -> list[dict]:
    """Two calls (a tool call, then the answer) and the reward."""
    rid = f"ro-{n}"
    a0, a1 = [50 + n, 51, 2], [60 + n, 61, 62, 2]
    p1 = P0 + a0 + TOOL + HEADER
    return [
        _request_event(rid, 0, P0, a0, [-0.5 - 0.01 * n, -0.25, -0.125], "tool_calls", version=versions[0],
                       temperature=temperature),
        _request_event(rid, 1, p1, a1, [-0.75, -0.375 - 0.01 * n, -0.0625, -0.03125], "stop", version=versions[1],
                       temperature=temperature),
        _reward(rid, reward),
    ]  # fmt: skip


def retried() -> list[dict]:
    """A compliant rollout whose first call was retried by the agent: two requests with the same
    prompt. The trainer keeps the last one (server/routes/events.py:208-228), and so does the reader."""
    first = _request_event("ro-0", 0, P0, [57, 58, 2], [-1.5, -0.5, -0.25], "tool_calls")
    return [first, *_rollout(0, 1.0)]


def control_token_replaced() -> list[dict]:
    """microsoft/agent-lightning#326 itself: with a tool parser, the server returned a wrong id (7) for
    the control token it sampled (2) in `token_ids`; its log-prob entry names the sampled one. The next
    prompt has 2 there: the episode splits (M108), the first segment trains 7 with 2's log-prob (M111)."""
    rid = "ro-0"
    a0, a1 = [50, 51, 2], [60, 61, 62, 2]
    p1 = P0 + a0 + TOOL + HEADER
    return [
        _request_event(rid, 0, P0, [50, 51, 7], [-0.5, -0.25, -0.125], "tool_calls", named=a0),
        _request_event(rid, 1, p1, a1, [-0.75, -0.375, -0.0625, -0.03125], "stop"),
        _reward(rid, 1.0),
    ]


def stale_server_version() -> list[dict]:
    """The pool's servers loaded the new weights at different times: the second call of a rollout was
    answered by a server still at version 4 after the first came from version 5 (P502)."""
    return _rollout(0, 1.0, versions=(5, 4))


def temperature_override() -> list[dict]:
    """The agent asked for temperature 0.7 and the trainer recomputes log-probs at
    actor_rollout_ref.rollout.temperature 0.7 (verl/trainer.py:500), but the proxy sampled at its
    configured train temperature 1 (config/server.yaml:9; server/proxy.py:63-70), recorded in the
    schema's form: the request as the agent sent it, the change in `adjusted_params` (schemas.py:45-46).
    A reader that believed `request.temperature` would see nothing; with --context
    rollout_temperature=0.7 the first such event is refused, naming adjusted_params.temperature."""
    events = _rollout(0, 1.0, temperature=0.7) + _rollout(1, 1.0, temperature=0.7)
    for e in events:
        if e["event_type"] == "model_request":
            e["data"]["adjusted_params"] = {"temperature": 1.0}
    return events


def cases() -> dict[str, list[dict]]:
    return {
        "compliant": _rollout(0, 1.0) + _rollout(1, 1.0),
        "compliant_retried": retried(),
        "control_token_replaced": control_token_replaced(),
        "stale_server_version": stale_server_version(),
        "temperature_override": temperature_override(),
    }
