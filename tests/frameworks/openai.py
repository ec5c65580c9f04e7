"""OpenAI-compatible fixtures: sessions as `rollout_audit.integrations.openai.SessionRecorder` writes them,
vLLM chat completions with `return_token_ids` (top-level `prompt_token_ids`, `choices[].token_ids`) and
`logprobs.content[].logprob` (vllm/entrypoints/openai/chat_completion/protocol.py). ChatML-style ids:
1 <|im_start|>, 2 <|im_end|>, 3 newline, 30 assistant, 31 user, 33 tool. The bug these sessions stand for (raw
log-probs sampled at temperature 0.7) needs a model to be seen: tests/test_adapters_openai.py records it
from a real server on loopback."""

from __future__ import annotations

HEADER = [1, 30, 3]
P0 = [1, 31, 3, 22, 23, 24, 2, 3, *HEADER]
TOOL = [3, 1, 33, 3, 40, 41, 2, 3]  # the tool's reply as the template renders it


def _pair(
    session: str,
    turn: int,
    prompt: list[int],
    ids: list[int],
    lps: list[float],
    finish: str,
    named: list[int] | None = None,
) -> dict:
    """One request/response pair of a session; `named`: the ids the log-prob entries name, when the
    server returned other `token_ids` than it sampled."""
    request = {
        "messages": [{"role": "user", "content": "open the door"}],
        "logprobs": True,
        "top_logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "temperature": 0.7,
        "top_p": 1.0,
        "max_tokens": 16,
        "model": "policy",
    }
    response = {
        "id": f"chatcmpl-{session}-{turn}",
        "object": "chat.completion",
        "created": 0,
        "model": "policy",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "open"},
                "logprobs": {
                    "content": [
                        {"token": f"token_id:{i}", "logprob": lp, "bytes": None, "top_logprobs": []}
                        for i, lp in zip(named or ids, lps)
                    ]
                },
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": ids,
            }
        ],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)},
        "prompt_logprobs": None,
        "prompt_token_ids": prompt,
    }
    return {"session": session, "turn": turn, "endpoint": "chat/completions", "request": request,
            "response": response, "logprobs_mode": "processed_logprobs"}  # fmt: skip


def _session(n: int, reward: float) -> list[dict]:
    """Two turns (a tool call, then the answer) and the end record the agent loop wrote."""
    sid = f"episode-{n}"
    a0, a1 = [50 + n, 51, 2], [60 + n, 61, 62, 2]
    p1 = P0 + a0 + TOOL + HEADER
    return [
        _pair(sid, 0, P0, a0, [-0.5 - 0.01 * n, -0.25, -0.125], "tool_calls"),
        _pair(sid, 1, p1, a1, [-0.75, -0.375 - 0.01 * n, -0.0625, -0.03125], "stop"),
        {"session": sid, "end": {"stop_reason": "success" if reward else "failure", "reward": reward,
                                 "policy_version": 5, "task_id": "door-3", "group_id": "door-3"}},
    ]  # fmt: skip


def retokenized() -> list[dict]:
    """Retokenization drift (vLLM blog 2025-10-22, "No More Retokenization Drift"): the agent loop sends
    the conversation back as text, and the server tokenizes turn 0's action `51 2` as `52 2` (a merge
    across the boundary). The second prompt no longer extends the first turn's sequence: the trainer
    starts a new sequence there (M108), and the episode's success still counts once."""
    sid = "episode-0"
    a0, a1 = [50, 51, 2], [60, 61, 62, 2]
    p1 = P0 + [50, 52, 2] + TOOL + HEADER
    return [
        _pair(sid, 0, P0, a0, [-0.5, -0.25, -0.125], "tool_calls"),
        _pair(sid, 1, p1, a1, [-0.75, -0.375, -0.0625, -0.03125], "stop"),
        {"session": sid, "end": {"stop_reason": "success", "reward": 1.0, "policy_version": 5, "task_id": "door-3",
                                 "group_id": "door-3"}},
    ]  # fmt: skip


def control_token_replaced() -> list[dict]:
    """microsoft/agent-lightning#326: streaming with a tool parser, the server returned a wrong id (7)
    for the control token it sampled (2, <|im_end|>) in `token_ids`, while its log-prob entry names
    the sampled one ("token_id:2"). The next prompt, rendered from the text, has 2 there: the trainer
    starts a new sequence (M108), and the first segment trains 7 with the log-prob of 2 (M111)."""
    sid = "episode-0"
    a0, a1 = [50, 51, 2], [60, 61, 62, 2]
    p1 = P0 + a0 + TOOL + HEADER
    return [
        _pair(sid, 0, P0, [50, 51, 7], [-0.5, -0.25, -0.125], "tool_calls", named=a0),
        _pair(sid, 1, p1, a1, [-0.75, -0.375, -0.0625, -0.03125], "stop"),
        {"session": sid, "end": {"stop_reason": "success", "reward": 1.0, "policy_version": 5, "task_id": "door-3",
                                 "group_id": "door-3"}},
    ]  # fmt: skip


def cases() -> dict[str, list[dict]]:
    return {
        "compliant": _session(0, 1.0) + _session(1, 0.0),
        "retokenized": retokenized(),
        "control_token_replaced": control_token_replaced(),
    }
